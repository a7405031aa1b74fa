"""Loading any BERT checkpoint for inference: a Hugging Face directory or a bert_jax workdir.

`load_pretrained(path)` returns the model config, the parameters (our pure-dict layout of
`BertForPreTraining`; the 'mlm' / 'nsp' subtrees are absent when the checkpoint has no such
head) and the tokenizer that goes with them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax import sharding as shd, workdir as workdir_lib
from bert_jax.checkpointing import CONFIG_FILE, read_config, state_problem
from bert_jax.config import MeshConfig, ModelConfig
from bert_jax.errors import CheckpointError
from bert_jax.model import BertEncoder, BertForPreTraining
from bert_jax.data.tokenization import SentencePieceTokenizer, WordPieceTokenizer, load_tokenizer

# A pretraining workdir's tokenizer: SentencePiece, or WordPiece when its data used a Hugging Face one.
TOKENIZER_FILES = ('tokenizer.model', 'tokenizer.json')


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
  """`cls(cfg)` holding `params`, built abstractly (no random init, no per-shape compiles).

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


def load_pretrained(path: str, step: int | None = None) -> PretrainedBert:
  """Loads an HF directory (config.json + model.safetensors) or a bert_jax pretraining workdir.

  Args:
    path: the directory.
    step: for a bert_jax workdir, the checkpoint step (default: latest).

  Raises:
    CheckpointError: the directory is neither, or is incomplete.
  """
  if not os.path.isdir(path):
    raise CheckpointError(f'checkpoint directory {path} does not exist')
  if workdir_lib.kind_of(path) == 'finetuning':
    raise CheckpointError(f'{path} is a fine-tuning workdir (task heads, no masked-LM head); give a pretraining '
                          'workdir or a Hugging Face directory, or evaluate it with its finetune_*.py and '
                          '--config.eval_only=True')
  if os.path.isdir(os.path.join(path, 'checkpoints')):
    return _load_workdir(path, step)
  if os.path.exists(os.path.join(path, CONFIG_FILE)):
    from bert_jax import hf  # pylint: disable=g-import-not-at-top
    cfg, params, _, _ = hf.load_hf_checkpoint(path)
    problem = state_problem(params)  # a bert_jax workdir's restore checks its own
    if problem:
      raise CheckpointError(f'checkpoint {path} is unusable: {problem}')
    return PretrainedBert(cfg, params, hf.load_hf_tokenizer(path), 'hf', path)
  raise CheckpointError(f'{path} is neither a Hugging Face checkpoint (config.json + model.safetensors) '
                        'nor a bert_jax workdir (config.json + checkpoints/)')


def _load_workdir(path: str, step: int | None) -> PretrainedBert:
  if read_config(path) is not None and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
    raise CheckpointError(f'{path} has no tokenizer ({" or ".join(TOKENIZER_FILES)}); it was written by an older '
                          'bert_jax — copy the tokenizer from its data cache into the workdir')
  from bert_jax import train_lib  # pylint: disable=g-import-not-at-top
  mesh = shd.make_mesh(MeshConfig(), jax.devices()[:1])  # inference: one device
  cfg, _, state, meta = train_lib.restore_workdir(path, step, mesh)
  return PretrainedBert(cfg.model, jax.device_get(state['params']), load_tokenizer(path),
                        'bert_jax', path, step=int(meta['step']))


@dataclasses.dataclass(frozen=True)
class InitSource:
  """A checkpoint to continue pretraining from, described without reading its weights."""

  kind: str  # 'hf', 'pretraining' or 'finetuning' (a bert_jax workdir)
  path: str
  config: ModelConfig
  tokenizer_path: str  # what data.tokenizer accepts: the checkpoint's own tokenizer


def describe_source(path: str) -> InitSource:
  """The architecture and tokenizer of a Hugging Face directory or a bert_jax workdir.

  A fine-tuning workdir keeps no tokenizer: its own starting checkpoint's is used.
  """
  if not os.path.isdir(path):
    raise CheckpointError(f'init_checkpoint {path} is not a directory (give a Hugging Face checkpoint '
                          'directory or a bert_jax workdir)')
  kind = workdir_lib.kind_of(path)
  is_workdir = kind in ('pretraining', 'finetuning') or os.path.isdir(os.path.join(path, 'checkpoints'))
  saved = read_config(path) if is_workdir else None  # an HF directory's config.json is not ours
  if kind == 'finetuning' and saved is not None and 'finetune' in saved:
    cfg = ModelConfig.from_saved(saved['model'])
    parent = saved['finetune'].get('init_checkpoint', '')
    if not parent or not os.path.isdir(parent):
      raise CheckpointError(f'{path} is a fine-tuning workdir whose starting checkpoint {parent!r} (for its '
                            'tokenizer) is gone')
    return InitSource('finetuning', path, cfg, describe_source(parent).tokenizer_path)
  if saved is not None:
    from bert_jax.config import PretrainConfig  # pylint: disable=g-import-not-at-top
    tok = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))]
    if not tok:
      raise CheckpointError(f'{path} has no tokenizer ({" or ".join(TOKENIZER_FILES)}); it was written by an '
                            'older bert_jax — copy the tokenizer from its data cache into the workdir')
    return InitSource('pretraining', path, PretrainConfig.from_dict(saved).model, os.path.join(path, tok[0]))
  if os.path.exists(os.path.join(path, CONFIG_FILE)):
    from bert_jax import hf  # pylint: disable=g-import-not-at-top
    spiece = os.path.join(path, hf.SPIECE_FILE)  # a bert_jax export of a SentencePiece model
    return InitSource('hf', path, hf.read_hf_config(path), spiece if os.path.isfile(spiece) else path)
  raise CheckpointError(f'init_checkpoint {path} is neither a Hugging Face checkpoint (config.json + '
                        'model.safetensors) nor a bert_jax workdir (config.json + checkpoints/)')


def load_init_params(source: InitSource, step: int | None = None) -> tuple[dict[str, Any], int | None]:
  """The parameters a run continues from: {'bert': encoder + pooler} plus 'mlm' / 'nsp' when the
  checkpoint has those heads (a fine-tuning workdir: the encoder of its first seed's checkpoint).

  Returns:
    (params as host arrays, the bert_jax checkpoint step or None for a Hugging Face directory).
  """
  if source.kind != 'finetuning':
    loaded = load_pretrained(source.path, step)
    return loaded.params, loaded.step
  from bert_jax import finetune_lib  # pylint: disable=g-import-not-at-top
  return finetune_lib.restore_encoder(source.path, step)
