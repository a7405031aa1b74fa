"""Continuing pretraining from existing weights (`init_checkpoint`): a Hugging Face directory or a
bert_jax workdir (pretraining, or fine-tuning: its first seed's encoder).

The checkpoint's architecture (INIT_FIELDS) and tokenizer replace the config's; its encoder and
the MLM/NSP heads it has replace the fresh ones, while the optimizer, step and data position
start fresh. The checkpoint is only ever read, parameters only.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Collection

from bert_jax.config import ModelConfig, PretrainConfig
from bert_jax.data import tokenization
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.interop import hf, pretrained
from bert_jax.train import reporting, workdir as workdir_lib
from bert_jax.train.checkpoints import CONFIG_FILE, read_config

# What a continued run takes from its init_checkpoint: everything that shapes the parameters or the
# function they compute. Dropout rates, dtype and the speed switches stay the config's.
INIT_FIELDS = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
               'max_position_embeddings', 'type_vocab_size', 'initializer_range', 'layer_norm_eps',
               'pad_token_id', 'norm_position', 'position_embedding', 'rope_theta', 'local_rope_theta', 'mlp',
               'use_bias', 'attention_window', 'global_attention_every')
_PART_NAMES = {'bert': 'encoder', 'mlm': 'MLM head (decoder tied to the word embeddings)', 'nsp': 'NSP head'}


@dataclasses.dataclass(frozen=True)
class InitSource:
  """A checkpoint to continue pretraining from, described without reading its weights."""

  kind: str  # 'hf', 'pretraining' or 'finetuning' (a bert_jax workdir)
  path: str
  config: ModelConfig
  tokenizer_path: str  # what data.tokenizer accepts: the checkpoint's own tokenizer


def describe_source(path: str) -> InitSource:
  """The architecture and tokenizer of a Hugging Face directory or a bert_jax workdir.

  A fine-tuning workdir's tokenizer is its own copy of its starting checkpoint's (older workdirs:
  the starting checkpoint's, with a warning).
  """
  if not os.path.isdir(path):
    raise CheckpointError(f'init_checkpoint {path} is not a directory (give a Hugging Face checkpoint '
                          'directory or a bert_jax workdir)')
  kind = workdir_lib.kind_of(path)
  is_workdir = kind in ('pretraining', 'finetuning') or os.path.isdir(os.path.join(path, 'checkpoints'))
  saved = read_config(path) if is_workdir else None  # an HF directory's config.json is not ours
  if kind == 'finetuning' and saved is not None and 'finetune' in saved:
    cfg = ModelConfig.from_saved(saved['model'])
    return InitSource('finetuning', path, cfg, pretrained.finetuning_tokenizer_path(path, saved))
  if saved is not None:
    tok = pretrained.own_tokenizer_file(path)
    if not tok:
      raise CheckpointError(f'{path} has no tokenizer ({" or ".join(pretrained.TOKENIZER_FILES)}); it was written '
                            'by an older bert_jax — copy the tokenizer from its data cache into the workdir')
    return InitSource('pretraining', path, PretrainConfig.from_dict(saved).model, tok)
  if os.path.exists(os.path.join(path, CONFIG_FILE)):
    spiece = os.path.join(path, hf.SPIECE_FILE)  # a bert_jax export of a SentencePiece model
    return InitSource('hf', path, hf.read_hf_config(path), spiece if os.path.isfile(spiece) else path)
  raise CheckpointError(f'init_checkpoint {path} is neither a Hugging Face checkpoint (config.json + '
                        'model.safetensors) nor a bert_jax workdir (config.json + checkpoints/)')


def resolve_init_checkpoint(cfg: PretrainConfig, explicit_model_fields: Collection[str] = ()
                            ) -> tuple[PretrainConfig, InitSource | None]:
  """`cfg` with cfg.init_checkpoint's architecture (INIT_FIELDS) and tokenizer (as data.tokenizer).

  Args:
    cfg: the run's config.
    explicit_model_fields: model fields the user set explicitly (e.g. on the command line); one
      that disagrees with the checkpoint is refused rather than silently replaced.

  Returns:
    (the config, the source description; None without an init_checkpoint).
  """
  if not cfg.init_checkpoint:
    return cfg, None
  source = describe_source(cfg.init_checkpoint)
  theirs = {f: getattr(source.config, f) for f in INIT_FIELDS}
  clashes = [f'model.{f}={getattr(cfg.model, f)} (the checkpoint has {theirs[f]})'
             for f in INIT_FIELDS if f in explicit_model_fields and getattr(cfg.model, f) != theirs[f]]
  if clashes:
    raise ConfigError(f'init_checkpoint {cfg.init_checkpoint} fixes the architecture, but '
                      + '; '.join(clashes) + ' was given: drop those flags')
  changed = [f'{f} {getattr(cfg.model, f)} -> {theirs[f]}' for f in INIT_FIELDS if getattr(cfg.model, f) != theirs[f]]
  tokenizer = cfg.data.tokenizer or source.tokenizer_path
  if cfg.data.tokenizer and os.path.abspath(cfg.data.tokenizer) != os.path.abspath(source.tokenizer_path):
    _check_same_vocabulary(cfg.data.tokenizer, source)
  if changed:
    reporting.log(f'init_checkpoint {cfg.init_checkpoint}: its architecture replaces the config\'s ('
                  + ', '.join(changed) + ')')
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **theirs),
                            data=dataclasses.replace(cfg.data, tokenizer=tokenizer))
  return cfg, source


def _check_same_vocabulary(path: str, source: InitSource) -> None:
  given, own = tokenization.load_tokenizer(path), tokenization.load_tokenizer(source.tokenizer_path)
  pieces = lambda t: [t.id_to_token(i) for i in range(t.vocab_size)]  # pylint: disable=unnecessary-lambda-assignment
  if type(given) is not type(own) or pieces(given) != pieces(own):
    raise ConfigError(f'data.tokenizer {path} ({type(given).__name__}, {given.vocab_size} tokens) is not '
                      f'the tokenizer of init_checkpoint {source.path} ({type(own).__name__}, {own.vocab_size} '
                      'tokens): its embeddings belong to that one; leave data.tokenizer empty')


def load_init_params(source: InitSource, step: int | None = None) -> tuple[dict[str, Any], int | None]:
  """The parameters a run continues from: {'bert': encoder + pooler} plus 'mlm' / 'nsp' when the
  checkpoint has those heads (a fine-tuning workdir: the encoder of its first seed's checkpoint).

  Returns:
    (params as host arrays, the bert_jax checkpoint step or None for a Hugging Face directory).
  """
  if source.kind == 'finetuning':
    _, params, at = pretrained.finetuned_encoder(source.path, step)
    return params, at
  loaded = pretrained.load_pretrained(source.path, step)
  return loaded.params, loaded.step


def initial_params(cfg: PretrainConfig, source: InitSource) -> dict[str, Any]:
  """The loaded parts of a continued run's first state ('bert', and the heads the checkpoint has), logged."""
  params, step = load_init_params(source, None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
  if not cfg.data.sentence_pairs:
    params = {k: v for k, v in params.items() if k != 'nsp'}
  loaded = sorted(params)
  fresh = [k for k in ('mlm', 'nsp') if k not in params and (k == 'mlm' or cfg.data.sentence_pairs)]
  at = f' step {step}' if step is not None else ''
  reporting.log(f'initialised from {source.kind} checkpoint {source.path}{at}: loaded '
                + ', '.join(_PART_NAMES[k] for k in loaded)
                + (f'; fresh {", ".join(_PART_NAMES[k] for k in fresh)}' if fresh else '')
                + '; optimizer, step and data position start fresh')
  return params
