"""Continuing pretraining from existing weights (`init_checkpoint`): a Hugging Face directory or a
bert_jax workdir (pretraining, or fine-tuning: its first seed's encoder).

The checkpoint sets the architecture (and, unless given, the dropout rates: `Source.model_config`)
and the tokenizer; its encoder and the MLM/NSP heads it has replace the fresh ones, while the
optimizer, step and data position start fresh. The checkpoint is only ever read, parameters only.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Collection

from bert_jax.config import PretrainConfig
from bert_jax.data import tokenization
from bert_jax.errors import ConfigError
from bert_jax.interop.pretrained import Source, describe
from bert_jax.runs import reporting

_PART_NAMES = {'bert': 'encoder', 'mlm': 'MLM head (decoder tied to the word embeddings)', 'nsp': 'NSP head'}


def resolve_init_checkpoint(cfg: PretrainConfig, explicit_model_fields: Collection[str] = ()
                            ) -> tuple[PretrainConfig, Source | None]:
  """`cfg` with cfg.init_checkpoint's architecture and tokenizer (as data.tokenizer).

  Args:
    cfg: the run's config.
    explicit_model_fields: model fields the user set explicitly (e.g. on the command line); an
      architecture field that disagrees with the checkpoint is refused rather than silently replaced.

  Returns:
    (the config, the source description; None without an init_checkpoint).
  """
  if not cfg.init_checkpoint:
    return cfg, None
  source = describe(cfg.init_checkpoint, 'init_checkpoint')
  model = source.model_config(cfg.model, explicit_model_fields)
  own = source.tokenizer()  # CheckpointError when its tokenizer has more tokens than its model has embeddings
  source.check_weights()  # and when its weights cannot be read: before the data is prepared and the workdir made
  tokenizer = cfg.data.tokenizer or source.tokenizer_path
  if cfg.data.tokenizer and os.path.abspath(cfg.data.tokenizer) != os.path.abspath(source.tokenizer_path):
    _check_same_vocabulary(cfg.data.tokenizer, own, source.path)
  return dataclasses.replace(cfg, model=model, data=dataclasses.replace(cfg.data, tokenizer=tokenizer)), source


def _check_same_vocabulary(path: str, own, source_path: str) -> None:
  """ConfigError when the tokenizer at `path` is not `own`, that of the init_checkpoint at `source_path`."""
  given = tokenization.load_tokenizer(path)
  pieces = lambda t: [t.id_to_token(i) for i in range(t.vocab_size)]  # pylint: disable=unnecessary-lambda-assignment
  if type(given) is not type(own) or pieces(given) != pieces(own):
    raise ConfigError(f'data.tokenizer {path} ({type(given).__name__}, {given.vocab_size} tokens) is not '
                      f'the tokenizer of init_checkpoint {source_path} ({type(own).__name__}, {own.vocab_size} '
                      'tokens): its embeddings belong to that one; leave data.tokenizer empty')


def initial_params(cfg: PretrainConfig, source: Source) -> dict[str, Any]:
  """The loaded parts of a continued run's first state ('bert', and the heads the checkpoint has), logged."""
  params, step = source.params(None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
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
