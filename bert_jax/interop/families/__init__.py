"""Hugging Face model families: `FAMILIES` maps config.json's model_type to the module that reads and writes it, and
the functions here go through it (`read_hf_config`, `load_hf_checkpoint`, `hf_model_type`, `save_hf_checkpoint`).

Every family module has the same four functions (tests/interop/test_families.py holds them to it):
  exports(cfg) -> bool                  whether a ModelConfig is this family's function, so exports as it
  model_config(path, hf) -> ModelConfig its parsed config.json's (`path` names it in errors)
  load_checkpoint(directory, cfg)       (config, params, has_mlm_head, has_nsp_head), as `load_hf_checkpoint`
  save_checkpoint(directory, cfg, params, tokenizer=None, *, overwrite=False, task=None), as `save_hf_checkpoint`
A new family is one such module and one row here. A module may have several rows (RoBERTa and XLM-R differ in
their tokenizer only): a config that it exports is named by its first row, and its save_checkpoint writes the
model_type it picks.
"""

from __future__ import annotations

import os
from typing import Any

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.errors import CheckpointError
from bert_jax.interop.families import bert, distilbert, electra, modernbert, roberta
from bert_jax.interop.hf import bert_layout, model_dir

FAMILIES = {'bert': bert, 'distilbert': distilbert, 'electra': electra, 'modernbert': modernbert,
            'roberta': roberta, 'xlm-roberta': roberta}


def read_hf_config(directory: str) -> ModelConfig:
  """The ModelConfig of a Hugging Face directory of any family (its config.json; the weights are not read)."""
  if not files.isdir(directory):
    raise CheckpointError(f'checkpoint directory {directory} does not exist; pass a Hugging Face '
                          f'BERT directory with {model_dir.CONFIG_FILE} and {model_dir.WEIGHTS_FILE}')
  path = os.path.join(directory, model_dir.CONFIG_FILE)
  hf = model_dir.read_json_config(directory)
  model_type = hf.get('model_type', 'bert')
  if model_type not in FAMILIES:
    raise CheckpointError(f'{path}: model_type={model_type!r}; bert_jax imports the model types '
                          f'{", ".join(FAMILIES)}')
  return FAMILIES[model_type].model_config(path, hf)


def load_hf_checkpoint(directory: str) -> tuple[ModelConfig, dict, bool, bool]:
  """Reads a Hugging Face checkpoint directory of any family (`bert.load_checkpoint` says what BERT's may hold).

  Args:
    directory: holds config.json and model.safetensors (or a sharded safetensors index).

  Returns:
    (config, params, has_mlm_head, has_nsp_head): `params` is a pure dict of float32 numpy
    arrays in our layout (`nnx.to_pure_dict(nnx.state(BertForPreTraining(config), nnx.Param))`
    and the task heads'), with 'bert' always, 'mlm' / 'nsp' when the checkpoint has those heads,
    and 'classifier' or 'qa_outputs' when it has a task head (`bert.read_hf_task` names the task).
  """
  cfg = read_hf_config(directory)
  family = FAMILIES[model_dir.read_json_config(directory).get('model_type', 'bert')]
  return family.load_checkpoint(directory, cfg)


def read_hf_task(directory: str) -> dict[str, Any] | None:
  """The task of a fine-tuned Hugging Face directory whose family names it (`bert.read_hf_task`,
  `modernbert.read_hf_task`); None for other classes and families."""
  family = FAMILIES.get(model_dir.read_json_config(directory).get('model_type', 'bert'))
  read = getattr(family, 'read_hf_task', None)
  return read(directory) if read else None


def hf_model_type(cfg: ModelConfig) -> str:
  """The Hugging Face model_type `cfg` exports as: a BERT-shaped config is 'bert', 'distilbert' without token
  types, 'electra' with an embedding_size, 'roberta' with a position_offset (`roberta.save_checkpoint` writes
  'xlm-roberta' for a Unigram tokenizer); a ModernBERT-shaped one 'modernbert'.

  Raises:
    CheckpointError: none of them (one line naming the switches that differ).
  """
  found = {}
  for model_type, family in FAMILIES.items():
    if family.exports(cfg):
      found.setdefault(family, model_type)
  if len(found) > 1:
    raise AssertionError(f'the families {", ".join(found.values())} all export one config: exports must exclude')
  if found:
    return next(iter(found.values()))
  if bert_layout.bert_shaped(cfg):  # both ELECTRA's embedding_size and RoBERTa's position_offset
    raise CheckpointError(f'model.embedding_size={cfg.embedding_size} with model.position_offset='
                          f'{cfg.position_offset}: no Hugging Face family has both (ELECTRA; RoBERTa); this '
                          'architecture exports as bert_jax only')

  def differs(shape):
    return [f'{k}={getattr(cfg, k)!r}' for k, v in shape.items() if getattr(cfg, k) != v]

  def describe(shape):
    return ', '.join(f'{k}={v!r}' for k, v in shape.items())

  bert_shape, modern_shape = bert_layout.BERT_SHAPE, modernbert.MODERNBERT_SHAPE
  modern = differs(modern_shape) + ([f'embedding_size={cfg.embedding_size}'] if cfg.embedding_size else [])
  raise CheckpointError(
      f'this architecture exports as bert_jax only: Hugging Face has BERT, DistilBERT and ELECTRA '
      f'({describe(bert_shape)}; this model has {", ".join(differs(bert_shape))}) and ModernBERT '
      f'({describe(modern_shape)}; this model has {", ".join(modern)}); keep the bert_jax workdir, or '
      'train one of those shapes')


def save_hf_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *,
                       overwrite: bool = False, task: dict[str, Any] | None = None) -> None:
  """Writes `params` as a Hugging Face directory of the family `cfg` exports as (`hf_model_type`), which
  transformers loads and which reloads bit-exactly (`bert.save_checkpoint` says what a BERT export holds).

  Args:
    directory: output directory; must be empty or absent unless `overwrite`.
    cfg: the model's configuration.
    params: pure dict (or nnx.State) of BertForPreTraining parameters ('bert', and optionally
      'mlm' and 'nsp'; a bare BertEncoder's parameters go under 'bert'), or of a fine-tuned head
      model ('bert' and 'classifier' or 'qa_outputs').
    tokenizer: a WordPieceTokenizer or SentencePieceTokenizer to ship alongside, or None.
    overwrite: replace this function's files in a non-empty directory.
    task: for a fine-tuned model, {'kind', 'num_labels', 'label_names', 'name'} as `load_finetuned` gives it.

  Raises:
    CheckpointError: an architecture no family has (one line), parameters that do not fit the config or the task;
      DataError: a tokenizer that cannot be exported exactly. Nothing is written then.
  """
  family = FAMILIES[hf_model_type(cfg)]
  family.save_checkpoint(directory, cfg, params, tokenizer, overwrite=overwrite, task=task)
