"""Frozen configuration blocks: model presets, data, optimizer, training.

The dataclasses here are the one source of truth for defaults. Experiment configs
(`experiments/configs/*.py`) start from `PretrainConfig().to_dict()` as an
ml_collections ConfigDict and turn the result back with `PretrainConfig.from_dict`,
which rejects unknown keys with a message naming them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from bert_jax.errors import CheckpointError, ConfigError

# name: (num_layers, hidden_size, num_heads, intermediate_size)
PRESETS: dict[str, tuple[int, int, int, int]] = {
    'tiny': (2, 64, 2, 256),
    'mini': (4, 256, 4, 1024),
    'small': (4, 512, 8, 2048),
    'medium': (8, 512, 8, 2048),
    'base': (12, 768, 12, 3072),
    'large': (24, 1024, 16, 4096),
}


# data.objective and data.masking (DataConfig).
OBJECTIVES = ('nsp', 'sop', 'none')
MASKINGS = ('token', 'whole_word', 'span')
# model.attention_impl: '' chooses per call (layers.choose_attention); the others force a kernel.
ATTENTION_IMPLS = ('', 'xla', 'cudnn', 'einsum')
# model.remat_policy: what each encoder layer keeps for the backward pass (model.REMAT_POLICIES).
REMAT_POLICIES = ('none', 'full', 'dots', 'dots_no_batch')
# model.dropout_impl: hashed masks (bert_jax/dropout.py) or jax.random.bernoulli, as nnx.Dropout.
DROPOUT_IMPLS = ('hash', 'threefry')
# Architecture switches (ModelConfig); the first value of each is BERT's.
NORM_POSITIONS = ('post', 'pre')
POSITION_EMBEDDINGS = ('learned', 'rotary')
MLPS = ('gelu', 'geglu')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """BERT architecture and how it is computed.

  The architecture switches (`norm_position` to `global_attention_every`) default to BERT; together
  (pre-LN, rotary, GeGLU, no token types) they give a ModernBERT-shaped encoder. `dtype` is the
  compute dtype; parameters stay float32. `attention_impl`, `remat_policy` and `scan_layers` are
  speed switches: each computes the same function (tests/model/test_speed_switches.py) and none
  changes the parameter tree, so checkpoints move freely between settings.
  """

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  # The longest sequence: the rows of the learned position table, a bound on inputs with rotary positions.
  max_position_embeddings: int = 512
  type_vocab_size: int = 2  # token type (segment A/B) embeddings; 0 = none (ModernBERT), token_type_ids ignored
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  # [PAD]'s id: without an explicit attention mask, tokens attend to every non-[PAD] token.
  pad_token_id: int = 0
  # --- Architecture switches: the defaults are BERT's (tests/model/test_architecture.py). Each changes the
  # function the parameters compute, so checkpoints carry them; Hugging Face export: bert_jax.interop.modernbert.
  # 'post': x = LN(x + f(x)) after each sub-layer (BERT). 'pre': x = x + f(LN(x)) and a final LayerNorm after the
  # last layer; the embeddings keep their LayerNorm, so the first layer has no LayerNorm before its attention
  # (it would normalise a normalised input), as in ModernBERT.
  norm_position: str = 'post'
  # 'learned': a max_position_embeddings x hidden table added to the embeddings (BERT). 'rotary': RoPE on every
  # layer's queries and keys (rotate-half layout, as RoFormer and ModernBERT): no table, attention scores depend
  # on relative positions only.
  position_embedding: str = 'learned'
  # RoPE base of global-attention layers, and of local-window ones (ModernBERT: 160000 and 10000).
  rope_theta: float = 10000.0
  local_rope_theta: float = 10000.0
  # 'gelu': dense -> exact GELU -> dense (BERT). 'geglu': GELU(x W) * (x V) -> dense, with W and V side by side
  # in one intermediate kernel [hidden, 2, intermediate_size] (ModernBERT).
  mlp: str = 'gelu'
  # False: no bias in any dense layer or LayerNorm of the encoder (pooler included) or of the MLM transform. The
  # output layers keep theirs: the MLM decoder's per-token bias, the NSP and task classifiers (as ModernBERT).
  use_bias: bool = True
  # 0: every layer attends to the whole sequence. > 0 (even): local layers attend only to keys at most
  # attention_window / 2 positions away (the window of Longformer and ModernBERT's local_attention).
  attention_window: int = 0
  # With an attention_window: layers 0, N, 2N, ... stay global (ModernBERT: N = 3) and the others are local;
  # 0 = every layer local.
  global_attention_every: int = 0
  # 'float32' or 'bfloat16': matmul dtype; LayerNorm, softmax, logits and losses stay float32.
  dtype: str = 'float32'
  # Attention kernel. '' = automatic, logged when a model is built: 'cudnn' (flash) on an NVIDIA
  # GPU in bfloat16 with head_dim <= 128, else 'xla' (both jax.nn.dot_product_attention), and
  # 'einsum' (explicit softmax, the only path with dropout on the probabilities) while training
  # with attention_dropout > 0. 'xla'/'cudnn' force that kernel wherever no attention dropout is
  # active; 'einsum' forces the explicit path everywhere.
  attention_impl: str = ''
  # Rematerialisation of each encoder layer in the backward pass: 'none' keeps every activation;
  # 'full' recomputes the layer (least memory); 'dots' keeps matmul outputs and recomputes the
  # elementwise ops; 'dots_no_batch' keeps only matmuls without batch dimensions (the weight
  # matmuls, not attention's QK^T and PV). Maps to jax.checkpoint_policies.
  remat_policy: str = 'none'
  # Dropout masks: 'hash' (a counter-based hash of each element's index, ~10x cheaper than threefry
  # on CPU, where per-element threefry is half of a BERT-base step; bert_jax/dropout.py) or
  # 'threefry' (jax.random.bernoulli, as flax's nnx.Dropout). Same rates, different masks.
  dropout_impl: str = 'hash'
  # Runs the encoder layers as one jax.lax.scan over their stacked parameters: compile time
  # independent of depth. The parameter tree (layers/0, layers/1, ...) is unchanged.
  scan_layers: bool = False

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ConfigError(f'model.hidden_size={self.hidden_size} is not divisible by '
                        f'model.num_heads={self.num_heads}')
    if self.dtype not in ('float32', 'bfloat16'):
      raise ConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ConfigError(f'model.attention_impl must be one of {ATTENTION_IMPLS} (\'\' = automatic), '
                        f'got {self.attention_impl!r}')
    if self.dropout_impl not in DROPOUT_IMPLS:
      raise ConfigError(f'model.dropout_impl must be one of {", ".join(DROPOUT_IMPLS)}, got {self.dropout_impl!r}')
    if self.remat_policy not in REMAT_POLICIES:
      raise ConfigError(f'model.remat_policy must be one of {", ".join(REMAT_POLICIES)}, '
                        f'got {self.remat_policy!r}')
    for name in ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                 'max_position_embeddings'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'model.{name} must be positive, got {getattr(self, name)}')
    for name, choices in (('norm_position', NORM_POSITIONS), ('position_embedding', POSITION_EMBEDDINGS),
                          ('mlp', MLPS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f'model.{name} must be one of {", ".join(choices)}, got {getattr(self, name)!r}')
    for name in ('type_vocab_size', 'attention_window', 'global_attention_every'):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ConfigError(f'model.{name} must be a non-negative integer, got {getattr(self, name)!r}')
    if self.attention_window % 2:
      raise ConfigError(f'model.attention_window={self.attention_window} must be even: local layers attend '
                        f'attention_window / 2 positions to each side')
    if self.global_attention_every and not self.attention_window:
      raise ConfigError(f'model.global_attention_every={self.global_attention_every} needs model.attention_window '
                        '> 0: without a window every layer is global')
    for name in ('rope_theta', 'local_rope_theta'):
      if not getattr(self, name) > 0:
        raise ConfigError(f'model.{name} must be positive, got {getattr(self, name)}')
    if self.position_embedding == 'rotary' and self.head_dim % 2:
      raise ConfigError(f'model.position_embedding=rotary needs an even head dim (hidden_size / num_heads = '
                        f'{self.head_dim})')

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def layer_windows(self) -> tuple[int, ...]:
    """Each layer's attention window: 0 = global, else `attention_window` (local)."""
    every = self.global_attention_every
    return tuple(0 if not self.attention_window or (every and i % every == 0) else self.attention_window
                 for i in range(self.num_layers))

  @classmethod
  def from_saved(cls, d: dict[str, Any]) -> 'ModelConfig':
    """From a workdir's saved model dict; keys of fields no longer defined are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def preset(name: str, **overrides: Any) -> ModelConfig:
  """Returns the ModelConfig of a named preset with `overrides` applied."""
  if name not in PRESETS:
    raise ConfigError(f'unknown model preset {name!r}; choose from {", ".join(PRESETS)}')
  layers, hidden, heads, inter = PRESETS[name]
  fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=inter)
  fields.update(overrides)
  return ModelConfig(**fields)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Pretraining corpus, its preparation (bert_jax/data/prepare.py) and example construction."""

  # Comma-separated files, globs or directories; gzip/bz2/xz files are read as they are.
  train_files: str = 'data/wikitext-2-raw'
  # Held-out files; when empty, documents are held out by a keyed hash of their text with
  # probability `eval_fraction`.
  eval_files: str = ''
  eval_fraction: float = 0.05
  # Corpus format (readers.FORMATS): 'auto' detects wikiextractor, jsonl, wikitext or plain per file.
  format: str = 'auto'
  text_field: str = 'text'  # jsonl: the field that holds a document's text
  # Plain/jsonl text wrapped at a fixed width: a paragraph is the lines up to a blank line (and
  # in plain files a document ends at two blank lines) instead of one line each.
  hard_wrapped: bool = False
  # A SentencePiece .model, or a Hugging Face WordPiece tokenizer (a checkpoint directory, its
  # tokenizer.json or vocab.txt: the ids of that checkpoint's own tokenizer). Empty: train a
  # SentencePiece model (vocab = model.vocab_size) on a sample of the training sentences.
  tokenizer: str = ''
  tokenizer_sample_sentences: int = 1_000_000
  lower_case: bool = True  # for a trained tokenizer; a given one keeps its own normalisation
  # Where prepared records (and a trained tokenizer) are cached, keyed by a fingerprint.
  cache_dir: str = 'data/cache'
  # Preparation works on units of whole documents of about this many MB of input, one worker
  # process each: memory grows with unit_mb x num_workers, not with the corpus.
  unit_mb: int = 16
  num_workers: int = 0  # preparation worker processes per host; 0 = every local core
  max_seq_length: int = 128
  # Masked-LM slots per sequence; 0 = derived: ceil(masked_lm_prob * max_seq_length) (20 at 128).
  max_predictions_per_seq: int = 0
  masked_lm_prob: float = 0.15
  # > 0: a mask-rate schedule, the rate moving linearly from masked_lm_prob at the first step to
  # this at the last (Ankner et al. 2023: 0.3 -> 0.15); held-out batches are masked at this rate.
  masked_lm_prob_end: float = 0.0
  # The sentence-level objective beside masked LM, on records built for it (its own cache):
  # 'nsp': BERT's pairs, B the next segment or (half of the time) one from another document;
  # 'sop': ALBERT's sentence order, A and B always consecutive and swapped half of the time
  #   (the same two-way head; label 1 = swapped; reported as sop_*);
  # 'none': masked LM only, on RoBERTa's FULL-SENTENCES inputs ([CLS] contiguous sentences [SEP],
  #   crossing document boundaries with a [SEP]; built once, as masking is dynamic), no pair head.
  objective: str = 'nsp'
  short_seq_prob: float = 0.1  # NSP/SOP pairs only
  # Passes over the documents when building NSP/SOP pairs (each pass pairs differently).
  dupe_factor: int = 5
  # What masked LM predicts: 'token' (BERT: any tokens), 'whole_word' (every piece of the words
  # chosen), 'span' (SpanBERT: runs of whole words, lengths geometric with span_p, at most
  # span_max_words; one 80/10/10 choice per span).
  masking: str = 'token'
  span_p: float = 0.2
  span_max_words: int = 10
  # Processes that build training batches beside the training loop (grain's multiprocessing
  # prefetch); 0 builds them in a thread of the training process; -1 = automatic: none on a
  # CPU backend (its cores train), else one per local accelerator, at most half the cores.
  loader_workers: int = -1
  # Training batches only: pack each global batch's examples (the same examples and masks as
  # unpacked) several per row, with per-example attention, positions and [CLS] pooling — the same
  # function on fewer rows. BERT pairs mostly fill max_seq_length, so the gain depends on the data
  # (bundled corpus, batch 32, pack_rows_multiple=1: seq 128 31.3 rows instead of 32; seq 512 26.8).
  pack: bool = False
  # Packed rows are rounded up to a multiple of this (few shapes to compile, but fewer rows saved:
  # 8 saves nothing at seq 128 batch 32); times the process count it must be a multiple of
  # optim.grad_accum_steps x the batch shards (mesh data x fsdp).
  pack_rows_multiple: int = 8
  # At most this many examples share a row (the width of the per-row NSP arrays). Rows hold as
  # many masked-LM slots as any such examples can need (data.loader.packed_mlm_width: 21 at
  # seq 128 with 20 predictions; 20 with 2 per row).
  max_segments_per_row: int = 4

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ConfigError(f'data.objective must be one of {", ".join(OBJECTIVES)}, got {self.objective!r}')
    if self.masking not in MASKINGS:
      raise ConfigError(f'data.masking must be one of {", ".join(MASKINGS)}, got {self.masking!r}')
    for name in ('masked_lm_prob', 'masked_lm_prob_end'):
      if not 0 <= getattr(self, name) < 1:
        raise ConfigError(f'data.{name} must lie in [0, 1), got {getattr(self, name)}')
    if not 0 < self.span_p <= 1 or self.span_max_words < 1:
      raise ConfigError(f'data.span_p must lie in (0, 1] and data.span_max_words be >= 1, got '
                        f'{self.span_p} and {self.span_max_words}')
    if self.max_predictions_per_seq == 0:  # frozen: the derived value is set once, here
      object.__setattr__(self, 'max_predictions_per_seq',
                         max(1, math.ceil(self.max_masked_lm_prob * self.max_seq_length - 1e-9)))

  @property
  def sentence_pairs(self) -> bool:
    """Records are sentence pairs with a label (NSP or SOP) and the model has the two-way head."""
    return self.objective != 'none'

  @property
  def max_masked_lm_prob(self) -> float:
    """The highest masking rate of the run (the schedule's start or end)."""
    return max(self.masked_lm_prob, self.masked_lm_prob_end)

  def masked_lm_prob_at(self, fraction: float) -> float:
    """The masking rate `fraction` of the way through training (0 = first step, 1 = last)."""
    if not self.masked_lm_prob_end:
      return self.masked_lm_prob
    return self.masked_lm_prob + (self.masked_lm_prob_end - self.masked_lm_prob) * min(max(fraction, 0.0), 1.0)

  @property
  def eval_masked_lm_prob(self) -> float:
    """Held-out batches are masked at the rate training ends at."""
    return self.masked_lm_prob_end or self.masked_lm_prob


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW (BERT's settings) or LAMB, with linear warmup then linear decay."""

  name: str = 'adamw'  # or 'lamb' (layer-wise trust ratio, for large-batch pretraining)
  learning_rate: float = 1e-4
  warmup_steps: int = 100
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  clip_norm: float = 1.0
  grad_accum_steps: int = 1


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh sizes; -1 means 'all remaining devices'."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  # Overrides of sharding.LOGICAL_AXIS_RULES, comma-separated name=axis[+axis] (empty: replicated), e.g.
  # 'activation_length=tensor,activation_mlp=' shards activations over the sequence instead of the MLP features.
  rules: str = ''


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Everything a pretraining run needs."""

  model: ModelConfig = dataclasses.field(default_factory=lambda: preset('mini', vocab_size=8000))
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  seed: int = 0
  batch_size: int = 32  # global batch per optimizer step
  num_train_steps: int = 1000
  log_every: int = 50
  eval_every: int = 500
  eval_batch_size: int = 64
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  # Resuming refuses a checkpoint whose run differs in data, batch, seed, steps or optimizer;
  # comma-separated fields (or sections, e.g. 'optim') listed here may change deliberately.
  resume_allow: str = ''
  # Continue pretraining from published or earlier weights: a Hugging Face directory or a bert_jax
  # workdir (pretraining or fine-tuning), only ever read. Its architecture, vocabulary and tokenizer
  # replace the config's; the encoder (and the MLM/NSP heads it has) start the run, while the
  # optimizer, step and data position start fresh. Not resuming: that is re-running in one workdir.
  init_checkpoint: str = ''
  init_checkpoint_step: int = -1  # for a bert_jax workdir: -1 = latest

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'PretrainConfig':
    """Builds a config from a (nested) dict, naming any unknown key."""
    return _from_dict(cls, dict(d), prefix='')


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """A fine-tuning run: task, starting checkpoint, data, budget and evaluation."""

  task: str = 'sst2'  # a GLUE task name, 'conll2003', 'squad' or 'squad_v2'
  # A Hugging Face directory or a bert_jax pretraining workdir (never written to).
  init_checkpoint: str = ''
  init_checkpoint_step: int = -1  # for a bert_jax workdir: -1 = latest
  data_dir: str = ''
  train_file: str = ''  # overrides the task's file in data_dir
  eval_file: str = ''
  max_seq_length: int = 128
  batch_size: int = 32
  eval_batch_size: int = 64
  learning_rate: float = 5e-5
  num_train_epochs: float = 3.0
  max_steps: int = 0  # > 0 overrides num_train_epochs
  max_train_samples: int = 0  # > 0: the first N training examples in file order
  warmup_ratio: float = 0.1  # warmup steps = ceil(ratio * total steps)
  weight_decay: float = 0.01
  adam_eps: float = 1e-8
  clip_norm: float = 1.0
  seed: int = 0
  num_seeds: int = 1  # runs seeds seed .. seed + num_seeds - 1, reports each and mean +- std
  shuffle: bool = True  # reshuffle the training set every epoch
  # Packs several examples into each row (per-example attention, restarted positions);
  # the same function as padding each one, with no compute spent on padding.
  pack: bool = True
  dtype: str = 'float32'
  # Restore and evaluate a trained workdir again (the training config is the workdir's own; only the
  # evaluation fields given here apply); results go beside the training ones, in seed_<n>/eval_step<N>[_<file>]/.
  eval_only: bool = False
  eval_step: int = -1  # with eval_only: -1 = latest checkpoint
  eval_every: int = 0  # evaluate the dev set(s) every N steps (metrics_eval.jsonl, curves.png); 0 = at the end
  # Keep the checkpoint with the best main dev metric (needs eval_every; a checkpoint is saved at each
  # evaluation) and report it: the final evaluation, predictions and final_metrics are the best step's.
  keep_best: bool = False
  log_every: int = 25
  checkpoint_every: int = 0  # 0 = only at the end
  keep_checkpoints: int = 1
  resume_allow: str = ''  # fields a resumed seed may change, comma-separated (see PretrainConfig)
  # SQuAD
  doc_stride: int = 128  # overlap in tokens between consecutive windows (HF run_qa convention)
  max_query_length: int = 64
  n_best_size: int = 20
  max_answer_length: int = 30
  null_score_diff_threshold: float = 0.0  # SQuAD 2.0: predict no answer above this
  tune_null_threshold: bool = True  # SQuAD 2.0: also report the best threshold on the eval set
  train_articles: int = 40  # without a train file: the first N articles of dev-v1.1.json train
  eval_articles: int = 8  # ... and the last N evaluate
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'FinetuneConfig':
    return _from_dict(cls, dict(d), prefix='')


def upgrade_saved(config: dict[str, Any]) -> dict[str, Any]:
  """A saved config (config.json, a checkpoint's meta) in today's field names: data.nsp became
  data.objective and data.whole_word_masking data.masking. Returns a new dict when it changes."""
  data = config.get('data')
  if not isinstance(data, dict) or not {'nsp', 'whole_word_masking'} & set(data):
    return config
  data = dict(data)
  if 'nsp' in data:
    data.setdefault('objective', 'nsp' if data.pop('nsp') else 'none')
  if 'whole_word_masking' in data:
    data.setdefault('masking', 'whole_word' if data.pop('whole_word_masking') else 'token')
  return {**config, 'data': data}


def _from_dict(cls, d: dict[str, Any], prefix: str):
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - set(fields))
  if unknown:
    raise ConfigError(f'unknown config key(s): {", ".join(prefix + k for k in unknown)}; '
                      f'valid keys under {prefix or "the top level"}: {", ".join(fields)}')
  kwargs = {}
  for name, value in d.items():
    sub = _DATACLASS_FIELDS.get((cls, name))
    kwargs[name] = _from_dict(sub, dict(value), prefix + name + '.') if sub else value
  try:
    return cls(**kwargs)
  except TypeError as e:
    raise ConfigError(f'bad config under {prefix or "the top level"}: {e}') from None


_DATACLASS_FIELDS = {
    (PretrainConfig, 'model'): ModelConfig,
    (PretrainConfig, 'data'): DataConfig,
    (PretrainConfig, 'optim'): OptimConfig,
    (PretrainConfig, 'mesh'): MeshConfig,
    (FinetuneConfig, 'mesh'): MeshConfig,
}


def diff_model_configs(saved: dict[str, Any], current: ModelConfig) -> list[str]:
  """Lists 'field: saved -> current' for architecture fields that differ."""
  out = []
  for f in dataclasses.fields(ModelConfig):
    if f.name in ('hidden_dropout', 'attention_dropout', 'dtype', 'attention_impl', 'remat_policy',
                  'scan_layers', 'dropout_impl', 'pad_token_id'):
      continue  # do not change parameter shapes
    if f.name in saved and saved[f.name] != getattr(current, f.name):
      out.append(f'{f.name}: {saved[f.name]} (checkpoint) vs {getattr(current, f.name)} (config)')
  return out


# Config fields that hold paths (comma-separated lists too): they compare as the files they name.
PATH_FIELDS = ('init_checkpoint', 'data_dir', 'train_file', 'eval_file', 'data.train_files', 'data.eval_files',
               'data.tokenizer', 'data.cache_dir')


def _same_paths(a: Any, b: Any) -> bool:
  """Whether two path values (comma-separated lists of local paths, globs or URLs) name the same paths."""
  if not (isinstance(a, str) and isinstance(b, str)):
    return a == b
  norm = lambda v: [p.strip() if '://' in p else os.path.realpath(p.strip())  # pylint: disable=unnecessary-lambda-assignment
                    for p in v.split(',') if p.strip()]
  return norm(a) == norm(b)


def config_diffs(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...], prefix: str = '') -> list[str]:
  """'name: old -> new' for every leaf that differs, skipping names (or sections) in `free` and
  fields the old config lacks (added since it was written). Paths (PATH_FIELDS) compare resolved:
  'data/x', './data/x' and its absolute form are the same."""
  out = []
  for key in sorted(set(old) | set(new)):
    name = prefix + key
    if name in free or key not in old or old[key] is None:
      continue
    a, b = old[key], new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_diffs(a, b, free, name + '.')
    elif a != b and not (name in PATH_FIELDS and _same_paths(a, b)):
      out.append(f'{name}: {a!r} -> {b!r}')
  return out


def _field_names(config: dict[str, Any], prefix: str = '') -> list[str]:
  out = []
  for key, value in config.items():
    out.append(prefix + key)
    if isinstance(value, dict):
      out += _field_names(value, prefix + key + '.')
  return out


def check_resume_allow(resume_allow: str, config: dict[str, Any], extra: tuple[str, ...] = ()) -> None:
  """ConfigError naming every comma-separated entry of `resume_allow` that is neither a field nor a
  section of `config` (nor one of `extra`): a misspelt name would otherwise allow nothing, silently."""
  known = set(_field_names(config)) | set(extra)
  unknown = [n.strip() for n in resume_allow.split(',') if n.strip() and n.strip() not in known]
  if unknown:
    sections = sorted(k for k, v in config.items() if isinstance(v, dict))
    raise ConfigError(f'resume_allow names no config field: {", ".join(unknown)}; give fields as in '
                      f'--config.X (e.g. num_train_steps, optim.learning_rate) or sections ({", ".join(sections)})')


def check_resume(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...], resume_allow: str,
                 where: str, step: int | None = None) -> None:
  """Refuses to resume `old` (a checkpoint's config) as `new` when fields outside `free` and the
  comma-separated `resume_allow` differ; the message names each field with its old and new value (and
  the checkpoint's `step`)."""
  allowed = tuple(name.strip() for name in resume_allow.split(',') if name.strip())
  diffs = config_diffs(old, new, free + allowed)
  if diffs:
    at = f' (step {step})' if step is not None else ''
    raise CheckpointError(f'{where} holds another run{at}: ' + '; '.join(diffs)
                          + '. Use a new --workdir, or allow the change with --config.resume_allow='
                          + ','.join(d.split(':')[0] for d in diffs))
