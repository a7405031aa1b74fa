"""Frozen configuration blocks: model presets, data, optimizer, and the two runs' configs.

One schema: `TrainingConfig` is what every run shares (optimizer, mesh, seed, batch sizes, steps or
epochs, log/eval/checkpoint cadence, checkpoints kept, resume rules, the checkpoint to start from);
`PretrainConfig` adds the model and the corpus, `FinetuneConfig` the task and its data. The
dataclasses are the one source of truth for defaults and for the facts about each field, kept as
field metadata (`facts`): free on resume, a path, fixed by a checkpoint, an evaluation setting.

Experiment configs (`experiments/configs/*.py`) start from `PretrainConfig().to_dict()` (or
`FinetuneConfig`) as an ml_collections ConfigDict and turn the result back with `from_dict`, which
rejects unknown keys with a message naming them, and names the new field of a renamed one.
Configs saved by earlier versions load through `upgrade_saved`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from bert_jax.errors import CheckpointError, ConfigError


def _f(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, free: bool = False,
       path: bool = False, checkpoint: str = '', evaluation: bool = False) -> Any:
  """A config field with the facts the runs need about it (its `metadata`, read with `facts`).

  Args:
    default / factory: the field's default (value, or a function making it).
    free: a resumed run may change it (evaluation, logging, checkpoint cadence, mesh, workers, speed).
    path: it names files (comma-separated lists too): it compares as the files it names.
    checkpoint: how a starting checkpoint (init_checkpoint) sets it: 'fixed' (it shapes the
      parameters or the function they compute: the checkpoint's value, a clashing explicit one is
      an error), 'default' (the checkpoint's unless given explicitly); '' the config's.
    evaluation: evaluating a workdir again may set it (experiments/evaluate.py --config.X).
  """
  return dataclasses.field(default=default, default_factory=factory,
                           metadata=dict(free=free, path=path, checkpoint=checkpoint, evaluation=evaluation))


def facts(cls, fact: str, prefix: str = '') -> tuple[str, ...]:
  """The dotted names of `cls`'s fields (nested blocks too) whose metadata `fact` is true (or equal to a
  non-empty string), e.g. facts(PretrainConfig, 'free') -> ('log_every', ..., 'data.cache_dir')."""
  out = []
  for f in dataclasses.fields(cls):
    sub = _block(f)
    if f.metadata.get(fact):
      out.append(prefix + f.name)
    elif sub is not None:
      out += facts(sub, fact, prefix + f.name + '.')
  return tuple(out)

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
# model.dropout_impl: hashed masks (bert_jax/model/dropout.py) or jax.random.bernoulli, as nnx.Dropout.
DROPOUT_IMPLS = ('hash', 'threefry')
# model.fused_mask: how a padded row's mask reaches cuDNN's fused attention.
FUSED_MASKS = ('lengths', 'dense')
# model.logits_backward: the dtype of the backward matmuls of float32-output products (layers.einsum_f32).
LOGITS_BACKWARDS = ('compute', 'float32')
# Architecture switches (ModelConfig); the first value of each is BERT's.
NORM_POSITIONS = ('post', 'pre')
POSITION_EMBEDDINGS = ('learned', 'rotary')
MLPS = ('gelu', 'geglu')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """BERT architecture and how it is computed.

  Every field may change when a run resumes (`free`): the fields that shape the parameters or the
  function they compute (`checkpoint='fixed'`) are checked against the workdir's checkpoints on
  their own, by `architecture_diffs`, and are taken from a starting checkpoint. The architecture
  switches (`norm_position` to `global_attention_every`) default to BERT; together
  (pre-LN, rotary, GeGLU, no token types) they give a ModernBERT-shaped encoder. `dtype` is the
  compute dtype; parameters stay float32. `attention_impl`, `remat_policy` and `scan_layers` are
  speed switches: each computes the same function (tests/model/test_speed_switches.py) and none
  changes the parameter tree, so checkpoints move freely between settings.
  """

  vocab_size: int = _f(30522, free=True, checkpoint='fixed')
  hidden_size: int = _f(768, free=True, checkpoint='fixed')
  num_layers: int = _f(12, free=True, checkpoint='fixed')
  num_heads: int = _f(12, free=True, checkpoint='fixed')
  intermediate_size: int = _f(3072, free=True, checkpoint='fixed')
  # The longest sequence: the rows of the learned position table, a bound on inputs with rotary positions.
  max_position_embeddings: int = _f(512, free=True, checkpoint='fixed')
  # Token type (segment A/B) embeddings; 0 = none (ModernBERT): token_type_ids are ignored.
  type_vocab_size: int = _f(2, free=True, checkpoint='fixed')
  hidden_dropout: float = _f(0.1, free=True, checkpoint='default')
  attention_dropout: float = _f(0.1, free=True, checkpoint='default')
  initializer_range: float = _f(0.02, free=True, checkpoint='fixed')
  layer_norm_eps: float = _f(1e-12, free=True, checkpoint='fixed')
  # [PAD]'s id: without an explicit attention mask, tokens attend to every non-[PAD] token.
  pad_token_id: int = _f(0, free=True, checkpoint='fixed')
  # --- Architecture switches: the defaults are BERT's (tests/model/test_architecture.py). Each changes the
  # function the parameters compute, so checkpoints carry them; Hugging Face export: bert_jax.interop.modernbert.
  # 'post': x = LN(x + f(x)) after each sub-layer (BERT). 'pre': x = x + f(LN(x)) and a final LayerNorm after the
  # last layer; the embeddings keep their LayerNorm, so the first layer has no LayerNorm before its attention
  # (it would normalise a normalised input), as in ModernBERT.
  norm_position: str = _f('post', free=True, checkpoint='fixed')
  # 'learned': a max_position_embeddings x hidden table added to the embeddings (BERT). 'rotary': RoPE on every
  # layer's queries and keys (rotate-half layout, as RoFormer and ModernBERT): no table, attention scores depend
  # on relative positions only.
  position_embedding: str = _f('learned', free=True, checkpoint='fixed')
  # RoPE base of global-attention layers, and of local-window ones (ModernBERT: 160000 and 10000).
  rope_theta: float = _f(10000.0, free=True, checkpoint='fixed')
  local_rope_theta: float = _f(10000.0, free=True, checkpoint='fixed')
  # 'gelu': dense -> exact GELU -> dense (BERT). 'geglu': GELU(x W) * (x V) -> dense, with W and V side by side
  # in one intermediate kernel [hidden, 2, intermediate_size] (ModernBERT).
  mlp: str = _f('gelu', free=True, checkpoint='fixed')
  # False: no bias in any dense layer or LayerNorm of the encoder (pooler included) or of the MLM transform. The
  # output layers keep theirs: the MLM decoder's per-token bias, the NSP and task classifiers (as ModernBERT).
  use_bias: bool = _f(True, free=True, checkpoint='fixed')
  # 0: every layer attends to the whole sequence. > 0 (even): local layers attend only to keys at most
  # attention_window / 2 positions away (the window of Longformer and ModernBERT's local_attention).
  attention_window: int = _f(0, free=True, checkpoint='fixed')
  # With an attention_window: layers 0, N, 2N, ... stay global (ModernBERT: N = 3) and the others are local;
  # 0 = every layer local.
  global_attention_every: int = _f(0, free=True, checkpoint='fixed')
  # 'float32' or 'bfloat16': matmul dtype; LayerNorm, softmax, logits and losses stay float32.
  dtype: str = _f('float32', free=True)
  # Attention kernel. '' = automatic, logged when a model is built: 'cudnn' (flash) on an NVIDIA
  # GPU in bfloat16 with head_dim <= 128, else 'xla' (both jax.nn.dot_product_attention), and
  # 'einsum' (explicit softmax, the only path with dropout on the probabilities) while training
  # with attention_dropout > 0. 'xla'/'cudnn' force that kernel wherever no attention dropout is
  # active; 'einsum' forces the explicit path everywhere.
  attention_impl: str = _f('', free=True)
  # Rematerialisation of each encoder layer in the backward pass: 'none' keeps every activation;
  # 'full' recomputes the layer (least memory); 'dots' keeps matmul outputs and recomputes the
  # elementwise ops; 'dots_no_batch' keeps only matmuls without batch dimensions (the weight
  # matmuls, not attention's QK^T and PV). Maps to jax.checkpoint_policies.
  remat_policy: str = _f('none', free=True)
  # Dropout masks: 'hash' (a counter-based hash of each element's index: one threefry call per
  # dropout site instead of one per element, the bulk of a BERT-base CPU step; bert_jax/model/dropout.py)
  # or 'threefry' (jax.random.bernoulli, as flax's nnx.Dropout). Same rates, different masks.
  dropout_impl: str = _f('hash', free=True)
  # How a padding mask reaches cuDNN flash attention: 'lengths' (each right-padded row's length, cuDNN's padding
  # mask: no [B, 1, T, S] bias is built, read or differentiated) or 'dense' (the boolean mask as an additive
  # bias). Padding masks are right-padded wherever bert_jax builds them (a prefix of ones per row); packed rows
  # (segment ids) and local bands always go dense.
  fused_mask: str = _f('lengths', free=True)
  # The backward matmuls of the products with float32 results (the MLM decoder's logits, the einsum attention
  # paths' scores): 'compute' runs them in the compute dtype as every other matmul's backward (bfloat16 products
  # accumulated in float32); 'float32' in float32 (jax's own transpose of a float32-output product, before
  # 2026-11-28). The same under model.dtype=float32.
  logits_backward: str = _f('compute', free=True)
  # Runs the encoder layers as one jax.lax.scan over their stacked parameters: compile time
  # independent of depth. The parameter tree (layers/0, layers/1, ...) is unchanged.
  scan_layers: bool = _f(False, free=True)

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
    if self.logits_backward not in LOGITS_BACKWARDS:
      raise ConfigError(f'model.logits_backward must be one of {", ".join(LOGITS_BACKWARDS)}, '
                        f'got {self.logits_backward!r}')
    if self.fused_mask not in FUSED_MASKS:
      raise ConfigError(f'model.fused_mask must be one of {", ".join(FUSED_MASKS)}, got {self.fused_mask!r}')
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
  train_files: str = _f('data/wikitext-2-raw', path=True)
  # A mixture: comma-separated weights, one per train_files entry (each entry a corpus, prepared on its own);
  # training rows come from the corpora in these proportions, whatever their sizes. '' = one corpus of all files.
  train_weights: str = ''
  # Held-out files; when empty, documents are held out by a keyed hash of their text with
  # probability `eval_fraction`.
  eval_files: str = _f('', path=True)
  eval_fraction: float = 0.05
  # Corpus format (corpus_formats.FORMATS): 'auto' detects wikiextractor, jsonl, wikitext or plain per file.
  format: str = 'auto'
  text_field: str = 'text'  # jsonl: the field that holds a document's text
  # Plain/jsonl text wrapped at a fixed width: a paragraph is the lines up to a blank line (and
  # in plain files a document ends at two blank lines) instead of one line each.
  hard_wrapped: bool = False
  # A SentencePiece .model, or a Hugging Face WordPiece tokenizer (a checkpoint directory, its
  # tokenizer.json or vocab.txt: the ids of that checkpoint's own tokenizer). Empty: train a
  # SentencePiece model (vocab = model.vocab_size) on a sample of the training sentences.
  tokenizer: str = _f('', path=True)
  tokenizer_sample_sentences: int = 1_000_000
  lower_case: bool = True  # for a trained tokenizer; a given one keeps its own normalisation
  # Where prepared records (and a trained tokenizer) are cached, keyed by a fingerprint.
  cache_dir: str = _f('data/cache', free=True, path=True)
  # Preparation works on units of whole documents of about this many MB of input, one worker
  # process each: memory grows with unit_mb x num_workers, not with the corpus.
  unit_mb: int = 16
  num_workers: int = _f(0, free=True)  # preparation worker processes per host; 0 = every local core
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
  loader_workers: int = _f(-1, free=True)
  # Training batches only: pack each global batch's examples (the same examples and masks as
  # unpacked) several per row, with per-example attention, positions and [CLS] pooling — the same
  # function on fewer rows. BERT pairs mostly fill max_seq_length, so the gain depends on the data
  # (the bundled corpus's: docs/results.md).
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
    problems = []
    if not 8 <= self.max_seq_length <= 65535:  # [CLS] A [SEP] B [SEP] with room for text; uint16 record lengths
      problems.append(f'data.max_seq_length={self.max_seq_length} must be in [8, 65535]')
    if self.max_predictions_per_seq < 0:
      problems.append(f'data.max_predictions_per_seq={self.max_predictions_per_seq} must be >= 0 (0 = derived)')
    if not 0 <= self.short_seq_prob <= 1:
      problems.append(f'data.short_seq_prob={self.short_seq_prob} must be in [0, 1]')
    for name in ('dupe_factor', 'unit_mb', 'tokenizer_sample_sentences'):
      if getattr(self, name) < 1:
        problems.append(f'data.{name}={getattr(self, name)} must be >= 1')
    if self.num_workers < 0:
      problems.append(f'data.num_workers={self.num_workers} must be >= 0 (0 = every local core)')
    if not self.eval_files and not 0 < self.eval_fraction < 1:
      problems.append(f'data.eval_fraction={self.eval_fraction} must be in (0, 1) when data.eval_files is empty')
    if self.pack and (self.pack_rows_multiple < 1 or self.max_segments_per_row < 1):
      problems.append(f'data.pack_rows_multiple={self.pack_rows_multiple} and data.max_segments_per_row='
                      f'{self.max_segments_per_row} must be positive')
    if self.train_weights:
      problems.extend(_weight_problems(self.train_weights, self.train_files))
    if problems:
      raise ConfigError('; '.join(problems))
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
    if self.max_predictions_per_seq > self.max_seq_length:
      raise ConfigError(f'data.max_predictions_per_seq={self.max_predictions_per_seq} must be in '
                        f'(0, max_seq_length={self.max_seq_length}]')

  def mixture(self) -> list[tuple[str, float]]:
    """(files, share) per corpus of a mixture (shares sum to 1); [] without train_weights."""
    if not self.train_weights:
      return []
    weights = [float(w) for w in self.train_weights.split(',')]
    files = [f.strip() for f in self.train_files.split(',') if f.strip()]
    return [(f, w / sum(weights)) for f, w in zip(files, weights)]

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


OPTIMIZERS = ('adamw', 'lamb', 'stable_adamw')
SCHEDULES = ('linear', 'wsd')
DECAYS = ('linear', 'cosine', '1-sqrt')


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW (BERT's settings), LAMB or StableAdamW, with a warmup then linear decay or warmup-stable-decay."""

  # 'adamw'; 'lamb' (layer-wise trust ratio, for large-batch pretraining); 'stable_adamw' (AdamW whose update
  # is scaled per tensor by 1 / max(1, RMS(g^2 / v)), as ModernBERT trains).
  name: str = 'adamw'
  learning_rate: float = 1e-4
  warmup_steps: int = 100
  # > 0: the warmup is this fraction of the run's steps (rounded up) instead of warmup_steps.
  warmup_ratio: float = 0.0
  # 'linear': after the warmup, linear decay to 0 at the last step (BERT). 'wsd': warmup, then stable at the peak,
  # then `decay` down to min_lr_ratio x the peak over the decay phase (a phase with lr='decay'), or over the
  # last decay_fraction of the run without phases.
  schedule: str = 'linear'
  decay: str = 'linear'  # the WSD decay's shape: 'linear', 'cosine' or '1-sqrt'
  decay_fraction: float = 0.1
  min_lr_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  clip_norm: float = 1.0
  grad_accum_steps: int = 1

  def __post_init__(self):
    for name, choices in (('name', OPTIMIZERS), ('schedule', SCHEDULES), ('decay', DECAYS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f'optim.{name} must be one of {", ".join(choices)}, got {getattr(self, name)!r}')
    if not (0 < self.decay_fraction <= 1 and 0 <= self.min_lr_ratio < 1):
      raise ConfigError(f'optim.decay_fraction ({self.decay_fraction}) must be in (0, 1] and optim.min_lr_ratio '
                        f'({self.min_lr_ratio}) in [0, 1)')
    # A negative rate is gradient ascent; NaN trains nothing.
    if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate)
            and self.learning_rate > 0):
      raise ConfigError(f'optim.learning_rate must be a positive number, got {self.learning_rate}')
    if self.warmup_steps < 0 or not 0 <= self.warmup_ratio <= 1:
      raise ConfigError(f'optim.warmup_steps ({self.warmup_steps}) must be >= 0 and optim.warmup_ratio '
                        f'({self.warmup_ratio}) in [0, 1]')
    if self.weight_decay < 0 or self.eps <= 0 or self.clip_norm < 0:
      raise ConfigError(f'optim.weight_decay ({self.weight_decay}) and clip_norm ({self.clip_norm}) must be >= 0 '
                        f'and eps ({self.eps}) > 0')
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
      raise ConfigError(f'optim.b1 ({self.b1}) and b2 ({self.b2}) must be in [0, 1)')
    if self.grad_accum_steps < 1:
      raise ConfigError(f'optim.grad_accum_steps must be >= 1, got {self.grad_accum_steps}')

  def warmup(self, total_steps: int) -> int:
    """Warmup steps of a run of `total_steps`."""
    return math.ceil(self.warmup_ratio * total_steps) if self.warmup_ratio > 0 else self.warmup_steps


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
class TrainingConfig:
  """What every run shares: optimizer, mesh, seed, batch, length, cadence, checkpoints, resume rules and
  the checkpoint it starts from. `PretrainConfig` and `FinetuneConfig` extend it."""

  optim: OptimConfig = _f(factory=OptimConfig)
  mesh: MeshConfig = _f(factory=MeshConfig, free=True, evaluation=True)
  seed: int = 0
  batch_size: int = 32  # global batch per optimizer step
  eval_batch_size: int = _f(64, free=True, evaluation=True)
  # The run's length: num_train_steps when > 0, else num_train_epochs passes over the training examples.
  num_train_steps: int = 1000
  num_train_epochs: float = 0.0
  log_every: int = _f(50, free=True, evaluation=True)
  eval_every: int = _f(500, free=True)  # 0: evaluate at the end only
  checkpoint_every: int = _f(500, free=True)  # 0: save at the end only
  keep_checkpoints: int = _f(3, free=True)
  # Also keep the checkpoint with the best held-out main metric (a checkpoint is saved at each evaluation;
  # needs eval_every > 0); the run's final results are then the best step's.
  keep_best: bool = _f(False, free=True)
  # Resuming refuses a checkpoint whose run differs in data, batch, seed, steps or optimizer;
  # comma-separated fields (or sections, e.g. 'optim') listed here may change deliberately
  # (checked when a run starts, so a saved config naming a field renamed since still loads).
  resume_allow: str = _f('', free=True)
  # The weights a run starts from: a Hugging Face directory or a bert_jax workdir (pretraining or
  # fine-tuning), only ever read. Its architecture, vocabulary and tokenizer replace the config's; the
  # encoder (and the heads it has that the run uses) start the run, while the optimizer, step and data
  # position start fresh. Not resuming: that is re-running in one workdir.
  init_checkpoint: str = _f('', path=True)
  init_checkpoint_step: int = -1  # for a bert_jax workdir: -1 = latest

  def __post_init__(self):
    """The checks that need neither the mesh nor the model (those are the runs' `check`)."""
    for name in ('batch_size', 'eval_batch_size', 'log_every', 'keep_checkpoints'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'{name} must be positive, got {getattr(self, name)}')
    for name in ('eval_every', 'checkpoint_every', 'num_train_steps', 'num_train_epochs'):
      if getattr(self, name) < 0:
        raise ConfigError(f'{name} must be >= 0, got {getattr(self, name)}')
    if self.num_train_steps <= 0 and self.num_train_epochs <= 0:
      raise ConfigError('set num_train_steps > 0 or num_train_epochs > 0' + (' (or phases)' if hasattr(self, 'phases')
                                                                             else ''))
    if self.keep_best and self.eval_every <= 0:
      raise ConfigError(f'eval_every={self.eval_every}: give a positive number of steps between evaluations '
                        '(keep_best ranks the checkpoints saved at each evaluation)')
    if self.batch_size % self.optim.grad_accum_steps:
      raise ConfigError(f'batch_size={self.batch_size} must be a multiple of optim.grad_accum_steps='
                        f'{self.optim.grad_accum_steps}')

  def total_steps(self, num_train_examples: int) -> int:
    """The run's optimizer steps: num_train_steps, or num_train_epochs over `num_train_examples`."""
    if self.num_train_steps > 0:
      return self.num_train_steps
    return max(1, math.ceil(self.num_train_epochs * math.ceil(num_train_examples / self.batch_size)))

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]):
    """Builds a config from a (nested) dict, naming any unknown key (and the new name of a renamed one)."""
    return _from_dict(cls, dict(d), prefix='')


@dataclasses.dataclass(frozen=True)
class PhaseConfig:
  """One phase of a pretraining run: its length and what changes at its start (0 or '': as the phase before;
  the first phase starts from the run's own fields).

  The optimizer state, step, RNG and data position carry across phases; each phase reads records
  prepared at its own sequence length (and files) from the data position its first step is at.
  """

  order: int = 0  # its place in the run: 1, 2, ... (config dicts keep no order of their own)
  steps: int = 0  # the phase's length in optimizer steps (> 0), or:
  # its length in row tokens (batch rows x max_seq_length, its ramp's included): steps = the fewest that train
  # at least this many. The resolved steps are saved beside it.
  tokens: int = 0
  max_seq_length: int = 0  # data.max_seq_length from this phase on (context extension; packing as data.pack)
  batch_size: int = 0
  # A batch-size ramp at the phase's start: from ramp_batch_size rows, doubling, up to batch_size, each size
  # training an equal share of ramp_tokens tokens (rows x max_seq_length, rounded up to whole steps); the
  # phase's steps include the ramp's.
  ramp_batch_size: int = 0
  ramp_tokens: int = 0
  # The masking rate: constant, or a linear ramp over this phase to masked_lm_prob_end (> 0). Unset
  # (-1), a phase masks at the rate the phase before ended with.
  masked_lm_prob: float = -1.0
  masked_lm_prob_end: float = -1.0
  rope_theta: float = 0.0  # RoPE theta of the global layers (context extension raises it)
  local_rope_theta: float = 0.0  # ... and of the local layers
  # '': the run's learning-rate schedule goes on; 'decay': optim.schedule='wsd' decays from this phase's
  # first step to the run's last (the phase after the stable ones).
  lr: str = ''
  # optim.learning_rate (the peak) from this phase on, the schedule scaled by it / the run's (0: the phase before's)
  learning_rate: float = 0.0
  train_files: str = _f('', path=True)  # data.train_files from this phase on (comma-separated files)
  # data.train_weights from this phase on: one weight per train_files entry, each a corpus sampled in that
  # proportion. A phase that gives train_files gives their weights here too ('': one corpus of all of them).
  train_weights: str = ''

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Phase:
  """A phase (or one batch size of its ramp) resolved: its name, 1-based index of `count`, steps [start, end),
  the run's config during it, the examples the run consumed before it, and the steps its phase's
  mask-rate schedule runs over."""

  name: str
  index: int
  count: int
  start: int
  end: int
  cfg: 'PretrainConfig'
  first_example: int = 0
  schedule_start: int = 0
  schedule_steps: int = 0
  ramp: bool = False  # a batch size of the phase's ramp

  @property
  def label(self) -> str:
    return f'phase {self.index}/{self.count} {self.name}' + (f' (batch {self.cfg.batch_size})' if self.ramp else '')

  @property
  def tokens(self) -> int:
    """Row tokens it trains: steps x batch x max_seq_length."""
    return (self.end - self.start) * self.cfg.batch_size * self.cfg.data.max_seq_length


@dataclasses.dataclass(frozen=True)
class PretrainConfig(TrainingConfig):
  """A pretraining run: the shared training block, the model and its corpus, and optionally its phases.

  `phases` (name -> PhaseConfig, run in their `order`; empty: one phase of num_train_steps) lays the run out as
  data: e.g. a stable phase at 128 tokens, an extension to 1,024 with a larger global RoPE theta, then a
  WSD decay. The run's length is then the sum of the phases' steps (num_train_steps 0 or that sum).
  """

  model: ModelConfig = _f(factory=lambda: preset('mini', vocab_size=8000))
  data: DataConfig = _f(factory=DataConfig)
  phases: dict[str, PhaseConfig] = _f(factory=dict)
  # A branch run: this run continues another run's checkpoint (a pretraining workdir, only ever read) with
  # its whole state (parameters, optimizer, step, RNG, data position), e.g. a WSD decay started from a
  # checkpoint of the stable phase. Its config may differ from the other run's in `phases`, the run's
  # length and the schedule's decay; anything else as resume_allow allows.
  branch_from: str = _f('', path=True)
  branch_step: int = -1  # the checkpoint of branch_from: -1 = its latest

  def __post_init__(self):
    phases = {}
    for name, phase in (self.phases or {}).items():
      get = phase.get if isinstance(phase, dict) else lambda k, _, phase=phase: getattr(phase, k)
      steps, tokens = get('steps', 0), get('tokens', 0)
      if not isinstance(tokens, int) or tokens < 0:
        raise ConfigError(f'phases.{name}.tokens must be a whole number of tokens >= 0, got {tokens!r}')
      if not isinstance(steps, int) or steps < 0 or not (steps or tokens):
        raise ConfigError(f'phases.{name}.steps must be a positive number of steps (or give phases.{name}.tokens), '
                          f'got {steps!r}')
      if isinstance(phase, dict):
        try:
          phase = PhaseConfig(**phase)
        except TypeError:
          known = ', '.join(f.name for f in dataclasses.fields(PhaseConfig))
          raise ConfigError(f'phases.{name}: unknown key(s) '
                            f'{", ".join(sorted(set(phase) - set(known.split(", "))))}; a phase takes {known}') from None
      phases[name] = phase
    orders = sorted(p.order for p in phases.values())
    if orders != list(range(1, len(phases) + 1)):
      raise ConfigError('phases: give each phase its place in the run, order=1, 2, ... '
                        f'({", ".join(f"{n}: {p.order}" for n, p in phases.items())})')
    phases = dict(sorted(phases.items(), key=lambda item: item[1].order))
    batch, seq = self.batch_size, self.data.max_seq_length
    for name, p in phases.items():  # lengths in tokens -> steps, at each phase's batch size and length
      batch, seq = p.batch_size or batch, p.max_seq_length or seq
      if p.tokens and batch > 0 and seq > 0:  # (bad sizes are reported below)
        steps = _steps_for_tokens(f'phases.{name}', p, batch, seq)
        if p.steps and p.steps != steps:
          raise ConfigError(f'phases.{name}: its length is steps={p.steps} or tokens={p.tokens} ({steps} steps of '
                            f'{batch} x {seq}), not both: set phases.{name}.steps=0 to give it in tokens')
        phases[name] = dataclasses.replace(p, steps=steps)
    object.__setattr__(self, 'phases', phases)
    if phases and self.num_train_steps == 0 and self.num_train_epochs == 0:
      object.__setattr__(self, 'num_train_steps', sum(p.steps for p in phases.values()))  # checked below
    # Before the shared checks: keep_best's own need (eval_every > 0) is beside the point with phases.
    if phases and self.keep_best:
      raise ConfigError('keep_best ranks checkpoints by one held-out metric, but each phase evaluates on its own '
                        'records and masking rate: drop keep_best, or compare steps with experiments/evaluate.py')
    super().__post_init__()
    if phases:
      self.phase_list()  # every phase's config is checked when the run's is built
    if self.num_train_epochs and (self.data.train_weights or any(p.train_weights for p in phases.values())):
      raise ConfigError('an epoch of a mixture (data.train_weights) is no corpus\'s epoch: give num_train_steps '
                        '(or the phases\' steps or tokens)')
    if self.branch_from and self.init_checkpoint:
      raise ConfigError('branch_from continues another run with its whole state; init_checkpoint starts a new one '
                        'from weights: give one of them')

  def phase_list(self) -> list[Phase]:
    """The run's phases, resolved (one phase named 'train' without `phases`).

    Raises:
      ConfigError: a phase's length, learning-rate segment or resulting config is invalid.
    """
    if not self.phases:
      return [Phase('train', 1, 1, 0, self.num_train_steps, self, schedule_steps=self.num_train_steps)]
    total = sum(p.steps for p in self.phases.values())
    if self.num_train_epochs or self.num_train_steps != total:
      raise ConfigError(f'with phases the run\'s length is the sum of their steps ({total}); set num_train_steps=0 '
                        f'(or {total}) and num_train_epochs=0, got {self.num_train_steps} and {self.num_train_epochs}')
    decay = [name for name, p in self.phases.items() if p.lr == 'decay']
    out, start, examples, cfg = [], 0, 0, dataclasses.replace(self, phases={})
    for i, (name, p) in enumerate(self.phases.items()):
      where = f'phases.{name}'
      if p.lr not in ('', 'decay'):
        raise ConfigError(f"{where}.lr must be '' or 'decay', got {p.lr!r}")
      if decay and i > list(self.phases).index(decay[0]) and p.lr != 'decay':
        raise ConfigError(f"{where}.lr: the phases after the first decay phase ({decay[0]}) decay too: set lr='decay'")
      if p.lr == 'decay' and self.optim.schedule != 'wsd':
        raise ConfigError(f"{where}.lr='decay' needs optim.schedule='wsd' (got {self.optim.schedule!r})")
      data = cfg.data
      prob = p.masked_lm_prob if p.masked_lm_prob >= 0 else (data.masked_lm_prob if i == 0 else data.eval_masked_lm_prob)
      end = p.masked_lm_prob_end if p.masked_lm_prob_end >= 0 else (data.masked_lm_prob_end if i == 0 else 0.0)
      changes = dict(max_seq_length=p.max_seq_length or data.max_seq_length, masked_lm_prob=prob,
                     masked_lm_prob_end=end, train_files=p.train_files or data.train_files,
                     train_weights=p.train_weights or ('' if p.train_files else data.train_weights))
      if any(changes[k] != getattr(data, k) for k in changes):
        changes['max_predictions_per_seq'] = 0  # derived again from the phase's length and rates
        try:
          data = dataclasses.replace(data, **changes)
        except ConfigError as e:
          raise ConfigError(f'{where}: {e}') from None
      if p.learning_rate < 0:
        raise ConfigError(f'{where}.learning_rate must be > 0 (0: the phase before\'s), got {p.learning_rate}')
      try:
        model = dataclasses.replace(cfg.model, rope_theta=p.rope_theta or cfg.model.rope_theta,
                                    local_rope_theta=p.local_rope_theta or cfg.model.local_rope_theta)
        optim = dataclasses.replace(cfg.optim, learning_rate=p.learning_rate or cfg.optim.learning_rate)
        cfg = dataclasses.replace(cfg, data=data, model=model, optim=optim, batch_size=p.batch_size or cfg.batch_size,
                                  num_train_steps=p.steps)
      except ConfigError as e:
        raise ConfigError(f'{where}: {e}') from None
      parts = [(s, cfg.batch_size) for s in [p.steps]]
      if p.ramp_batch_size or p.ramp_tokens:
        parts = _ramp(where, p, cfg.batch_size, data.max_seq_length)
      at = start
      for steps, batch in parts:
        try:
          part = dataclasses.replace(cfg, batch_size=batch)
        except ConfigError as e:
          raise ConfigError(f'{where} (its ramp at batch {batch}): {e}') from None
        out.append(Phase(name, i + 1, len(self.phases), at, at + steps, part, examples, start, p.steps,
                         ramp=batch != cfg.batch_size))
        at, examples = at + steps, examples + steps * batch
      start += p.steps
    return out

  def phase_plan(self) -> str:
    """One line per phase: its steps, batch size (and ramp), sequence length and row tokens."""
    lines = []
    for p in self.phase_list():
      lines.append(f'{p.label}: steps {p.start}-{p.end}, {p.cfg.batch_size} x {p.cfg.data.max_seq_length} tokens, '
                   f'{p.tokens:,} row tokens')
    return '\n'.join(lines)

  def learning_rate_levels(self) -> list[tuple[int, float]] | None:
    """(first step, peak / optim.learning_rate) per phase when a phase sets its own learning_rate, else None."""
    if not any(p.learning_rate for p in self.phases.values()):
      return None
    return [(p.start, p.cfg.optim.learning_rate / self.optim.learning_rate) for p in self.phase_list()]

  def decay_start(self) -> int | None:
    """The step the WSD decay starts at: the first phase with lr='decay' (None: the schedule's default)."""
    return next((p.start for p in self.phase_list() if self.phases and self.phases[p.name].lr == 'decay'), None)

  def phase_at(self, step: int) -> Phase:
    """The phase that trains step `step` + 1 (the last phase from its end on)."""
    phases = self.phase_list()
    return next((p for p in phases if p.start <= step < p.end), phases[-1])

  def phase_before(self, step: int) -> Phase:
    """The phase whose training produced the state at `step` (the first phase at step 0)."""
    return self.phase_at(max(step - 1, 0))


def _finetuning_optim() -> OptimConfig:
  # Hugging Face Trainer's defaults: Adam epsilon 1e-8, a warmup of 10% of the steps.
  return OptimConfig(learning_rate=5e-5, warmup_steps=0, warmup_ratio=0.1, eps=1e-8)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(TrainingConfig):
  """A fine-tuning run: the shared training block, the task and its data.

  The model's architecture is its init_checkpoint's (required); `model` sets how it is computed
  (dtype, attention kernel, rematerialisation) and, when given, its dropout rates.
  """

  optim: OptimConfig = _f(factory=_finetuning_optim)
  # Each seed trains in its own seed_<n>/: seed and num_seeds may change when a workdir is run again.
  seed: int = _f(0, free=True, evaluation=True)
  num_seeds: int = _f(1, free=True, evaluation=True)  # seeds seed .. seed + num_seeds - 1, and their mean +- std
  num_train_steps: int = 0
  num_train_epochs: float = 3.0
  log_every: int = _f(25, free=True, evaluation=True)
  eval_every: int = _f(0, free=True)
  checkpoint_every: int = _f(0, free=True)
  keep_checkpoints: int = _f(1, free=True)
  model: ModelConfig = _f(factory=ModelConfig)
  task: str = 'sst2'  # a GLUE task name, 'conll2003', 'squad' or 'squad_v2'
  data_dir: str = _f('', path=True)
  train_file: str = _f('', path=True)  # overrides the task's file in data_dir
  eval_file: str = _f('', free=True, path=True, evaluation=True)
  max_seq_length: int = 128
  max_train_samples: int = 0  # > 0: the first N training examples in file order
  shuffle: bool = True  # reshuffle the training set every epoch
  # Packs several examples into each row (per-example attention, restarted positions);
  # the same function as padding each one, with no compute spent on padding.
  pack: bool = True
  # SQuAD
  doc_stride: int = 128  # overlap in tokens between consecutive windows (HF run_qa convention)
  max_query_length: int = 64
  n_best_size: int = _f(20, free=True, evaluation=True)
  max_answer_length: int = _f(30, free=True, evaluation=True)
  null_score_diff_threshold: float = _f(0.0, free=True, evaluation=True)  # SQuAD 2.0: no answer above this
  tune_null_threshold: bool = _f(True, free=True, evaluation=True)  # SQuAD 2.0: also report the best threshold
  train_articles: int = 40  # without a train file: the first N articles of dev-v1.1.json train
  eval_articles: int = _f(8, free=True, evaluation=True)  # ... and the last N evaluate

  def __post_init__(self):
    super().__post_init__()
    if self.max_seq_length < 8:
      raise ConfigError(f'max_seq_length={self.max_seq_length} must be at least 8')
    if self.num_seeds <= 0:
      raise ConfigError(f'num_seeds must be positive, got {self.num_seeds}')


# Fine-tuning fields of earlier versions (one flat block): where they went, and the two that became a tool.
RENAMED = {'learning_rate': 'optim.learning_rate', 'adam_eps': 'optim.eps', 'weight_decay': 'optim.weight_decay',
           'clip_norm': 'optim.clip_norm', 'warmup_ratio': 'optim.warmup_ratio', 'max_steps': 'num_train_steps',
           'dtype': 'model.dtype'}
REMOVED = {'eval_only': 'evaluate a workdir again with experiments/evaluate.py --workdir=DIR',
           'eval_step': 'evaluate one checkpoint with experiments/evaluate.py --workdir=DIR --step=N'}


def upgrade_saved(config: dict[str, Any]) -> dict[str, Any]:
  """A saved config (config.json, a checkpoint's meta) in today's field names; a new dict when it changes.

  Pretraining: data.nsp became data.objective and data.whole_word_masking data.masking. Fine-tuning
  (config.json's 'finetune' block, or a checkpoint's config): the flat fields of RENAMED moved into
  the shared blocks, eval_only/eval_step went to experiments/evaluate.py, and config.json's
  top-level 'model' (the starting checkpoint's architecture) became the config's own `model`.
  """
  if isinstance(config.get('resume_allow'), str):  # the fields it names, renamed too
    renamed = _rename_list(config['resume_allow'], {**RENAMED, **_PRETRAINING_RENAMED})
    config = config if renamed == config['resume_allow'] else {**config, 'resume_allow': renamed}
  if 'finetune' in config:
    finetune = _upgrade_finetune(config['finetune'])
    if 'model' in config:  # the starting checkpoint's architecture, with the run's dtype (a flat field then)
      finetune = {**finetune, 'model': {**config['model'], **finetune.get('model', {})}}
    elif finetune is config['finetune']:
      return config
    return {k: v for k, v in {**config, 'finetune': finetune}.items() if k != 'model'}
  if 'task' in config and 'data' not in config:  # a fine-tuning checkpoint's config
    return _upgrade_finetune(config)
  data = config.get('data')
  if not isinstance(data, dict) or not {'nsp', 'whole_word_masking'} & set(data):
    return config
  data = dict(data)
  if 'nsp' in data:
    data.setdefault('objective', 'nsp' if data.pop('nsp') else 'none')
  if 'whole_word_masking' in data:
    data.setdefault('masking', 'whole_word' if data.pop('whole_word_masking') else 'token')
  return {**config, 'data': data}


def _weight_problems(weights: str, files: str) -> list[str]:
  """What is wrong with data.train_weights for data.train_files (one weight per comma-separated entry)."""
  try:
    values = [float(w) for w in weights.split(',')]
  except ValueError:
    return [f'data.train_weights={weights!r} must be comma-separated numbers, one per data.train_files entry']
  entries = [f for f in files.split(',') if f.strip()]
  if len(values) != len(entries):
    return [f'data.train_weights gives {len(values)} weight(s) for {len(entries)} data.train_files entries '
            f'({files!r}): one per entry']
  if not all(math.isfinite(v) and v > 0 for v in values):
    return [f'data.train_weights={weights!r}: each weight must be a positive number']
  return []


def _ramp_parts(where: str, p: PhaseConfig, batch_size: int, seq: int) -> list[tuple[int, int]]:
  """(steps, batch size) of a batch-size ramp: doubling sizes from p.ramp_batch_size, each an equal share of
  p.ramp_tokens ([] without a ramp)."""
  if not (p.ramp_batch_size or p.ramp_tokens):
    return []
  if not 0 < p.ramp_batch_size < batch_size or p.ramp_tokens <= 0:
    raise ConfigError(f'{where}: a batch-size ramp needs 0 < ramp_batch_size ({p.ramp_batch_size}) < batch_size '
                      f'({batch_size}) and ramp_tokens > 0 ({p.ramp_tokens})')
  sizes = [p.ramp_batch_size]
  while sizes[-1] * 2 < batch_size:
    sizes.append(sizes[-1] * 2)
  share = p.ramp_tokens / len(sizes)
  return [(math.ceil(share / (b * seq)), b) for b in sizes]


def _steps_for_tokens(where: str, p: PhaseConfig, batch_size: int, seq: int) -> int:
  """The fewest steps whose rows (its ramp's, then `batch_size` x `seq`) hold at least p.tokens tokens."""
  ramp = _ramp_parts(where, p, batch_size, seq)
  left = p.tokens - sum(n * b * seq for n, b in ramp)
  if ramp and left <= 0:
    raise ConfigError(f'{where}: its batch-size ramp alone trains {sum(n * b * seq for n, b in ramp):,} of its '
                      f'{p.tokens:,} tokens; lower ramp_tokens or give the phase more tokens')
  return sum(n for n, _ in ramp) + math.ceil(left / (batch_size * seq))


def _ramp(where: str, p: PhaseConfig, batch_size: int, seq: int) -> list[tuple[int, int]]:
  """(steps, batch size) of a phase with a batch-size ramp: `_ramp_parts`, then the rest of the phase at
  `batch_size`."""
  parts = _ramp_parts(where, p, batch_size, seq)
  left = p.steps - sum(n for n, _ in parts)
  if left <= 0:
    raise ConfigError(f'{where}: its batch-size ramp takes {sum(n for n, _ in parts)} steps of its {p.steps}; '
                      'lower ramp_tokens or give the phase more steps')
  return parts + [(left, batch_size)]


_PRETRAINING_RENAMED = {'data.nsp': 'data.objective', 'data.whole_word_masking': 'data.masking'}


def _rename_list(names: str, renamed: dict[str, str]) -> str:
  """A comma-separated list of field names with the renamed ones in today's names."""
  return ','.join(renamed.get(n.strip(), n.strip()) for n in names.split(',') if n.strip())


def _upgrade_finetune(flat: dict[str, Any]) -> dict[str, Any]:
  if isinstance(flat.get('resume_allow'), str) and _rename_list(flat['resume_allow'], RENAMED) != flat['resume_allow']:
    flat = {**flat, 'resume_allow': _rename_list(flat['resume_allow'], RENAMED)}
  if not (set(RENAMED) | set(REMOVED)) & set(flat):
    return flat
  out = {k: v for k, v in flat.items() if k not in RENAMED and k not in REMOVED}
  for old, new in RENAMED.items():
    if old in flat:
      section, name = new.split('.') if '.' in new else ('', new)
      if section:
        out[section] = {**out.get(section, {}), name: flat[old]}
      else:
        out[name] = flat[old]
  if 'optim' in out:  # the warmup was a ratio then: no fixed number of steps
    out['optim'] = {'warmup_steps': 0, **out['optim']}
  return out


def _from_dict(cls, d: dict[str, Any], prefix: str):
  fields = {f.name: f for f in dataclasses.fields(cls)}
  old = sorted(set(d) - set(fields)) if not prefix else []  # the old flat names were top-level fields
  moved = [f'{k} is now {RENAMED[k]}' for k in old if k in RENAMED]
  gone = [f'{k} is gone: {REMOVED[k]}' for k in old if k in REMOVED]
  if moved or gone:
    raise ConfigError('; '.join(moved + gone))
  unknown = sorted(set(d) - set(fields))
  if unknown:
    raise ConfigError(f'unknown config key(s): {", ".join(prefix + k for k in unknown)}; '
                      f'valid keys under {prefix or "the top level"}: {", ".join(fields)}')
  kwargs = {}
  for name, value in d.items():
    sub = _block(fields[name])
    kwargs[name] = _from_dict(sub, dict(value), prefix + name + '.') if sub and isinstance(value, dict) else value
  try:
    return cls(**kwargs)
  except TypeError as e:
    raise ConfigError(f'bad config under {prefix or "the top level"}: {e}') from None


def _block(f: dataclasses.Field) -> type | None:
  """The config block (a dataclass) a field holds, or None for a plain value."""
  default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
  return type(default) if dataclasses.is_dataclass(default) else None


def from_checkpoint(how: str) -> tuple[str, ...]:
  """The ModelConfig fields a starting checkpoint sets: 'fixed' (it shapes the parameters or the function
  they compute) or 'default' (its value unless given)."""
  return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata['checkpoint'] == how)


def architecture_diffs(saved: dict[str, Any], current: ModelConfig) -> list[str]:
  """'field: saved (checkpoint) vs current (config)' for each field fixed by a checkpoint that differs."""
  return [f'{name}: {saved[name]} (checkpoint) vs {getattr(current, name)} (config)'
          for name in from_checkpoint('fixed') if name in saved and saved[name] != getattr(current, name)]


def _same_paths(a: Any, b: Any) -> bool:
  """Whether two path values (comma-separated lists of local paths, globs or URLs) name the same paths."""
  if not (isinstance(a, str) and isinstance(b, str)):
    return a == b
  norm = lambda v: [p.strip() if '://' in p else os.path.realpath(p.strip())  # pylint: disable=unnecessary-lambda-assignment
                    for p in v.split(',') if p.strip()]
  return norm(a) == norm(b)


def config_diffs(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...], prefix: str = '') -> list[str]:
  """'name: old -> new' for every leaf that differs, skipping names (or sections) in `free` and
  fields the old config lacks (added since it was written). Paths (fields with the `path` fact)
  compare resolved: 'data/x', './data/x' and its absolute form are the same."""
  out = []
  for key in sorted(set(old) | set(new)):
    name = prefix + key
    if name in free or key not in old or old[key] is None:
      continue
    a, b = old[key], new.get(key)
    if isinstance(a, dict) and isinstance(b, dict) and (a or not b):  # {} -> {...} (phases added) differs
      out += config_diffs(a, b, free, name + '.')
    elif a != b and not (name in _PATHS and _same_paths(a, b)):
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


_PATHS = frozenset(facts(PretrainConfig, 'path') + facts(FinetuneConfig, 'path'))
