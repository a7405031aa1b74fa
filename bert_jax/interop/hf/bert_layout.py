"""BERT's layout (`BERT_SHAPE`: the architecture switches of BERT and of every family here), and the import and
export of the BERT-layout families other than BERT itself (`families.distilbert`, `electra`, `roberta`), from one
description each (`Family`): their name table (`name_tables` entries), the prefix their models with heads add, the
tied MLM decoder they may store, and the transformers classes by heads.

DistilBERT and ELECTRA have no pooler, RoBERTa's has one in RobertaModel only: an import without one gets a pooler
of zeros (with a warning, as a BertForMaskedLM import's), and an export leaves it out unless its class has one
(`Family.pooled`); an NSP head is never exported. Their heads beside the MLM head (ELECTRA's discriminator) are
imported under their own group and exported back; bert_jax trains none of them (`pretrained.Source.params`
keeps only the encoder and our pretraining heads).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from flax import nnx, traverse_util
import jax
import numpy as np
from safetensors import numpy as st_numpy

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.errors import CheckpointError
from bert_jax.interop.hf import model_dir, task_classes
from bert_jax.interop.hf.name_tables import Entry, dense, hf_shape
from bert_jax.model.heads import SEQUENCE_KINDS
from bert_jax.runs import reporting


# The architecture switches of BERT's layout, which every family here and BERT itself have.
BERT_SHAPE = dict(norm_position='post', position_embedding='learned', mlp='gelu', use_bias=True, attention_window=0)


def bert_shaped(cfg: ModelConfig) -> bool:
  """Whether `cfg` has BERT's layout (`BERT_SHAPE`): the families that export it tell by the other fields."""
  return all(getattr(cfg, k) == v for k, v in BERT_SHAPE.items())


@dataclasses.dataclass(frozen=True)
class Family:
  """A Hugging Face family whose encoder is BERT's function under other names."""

  name: str  # 'DistilBERT'
  prefix: str  # what models with heads put before the encoder's names: 'distilbert.'
  table: Callable[[ModelConfig], list[Entry]]  # every tensor: groups 'bert' and the heads
  decoder: str  # the tied MLM decoder's name, which checkpoints may store (equal to the word embeddings)
  words: str  # the word embeddings' name (without the prefix)
  classes: dict[frozenset, str]  # the heads exported -> the transformers class
  extra_shapes: Callable[[ModelConfig], dict] = lambda cfg: {}  # shapes of head parameters outside our modules
  token_types: bool = True  # its tokenizer gives token_type_ids
  pooled: frozenset = frozenset()  # the head sets (keys of `classes`) whose class has a pooler (group 'pooler')
  decoder_bias: tuple[str, str] | None = None  # (the tied decoder bias checkpoints may store, the bias it equals)
  # Fine-tuned exports: the class names' stem ('DistilBert' + 'ForSequenceClassification', ...), the names of
  # <stem>ForSequenceClassification's two dense layers on [CLS] (our pooler, our classifier) and the activation
  # between them (model.pooler_activation must be it).
  stem: str = ''
  sequence_head: tuple[str, str] = ('', '')
  pooler_activation: str = 'tanh'

  def hf_name(self, entry: Entry, prefix: str) -> str:
    return prefix + entry.hf_name if entry.group in ('bert', 'pooler') else entry.hf_name

  def shapes(self, cfg: ModelConfig, num_labels: int = 2) -> dict:
    return {**model_dir.param_shapes(cfg, num_labels), **self.extra_shapes(cfg)}

  def task_table(self, kind: str) -> list[Entry]:
    """The task head's tensors of a fine-tuned `kind` (`task_classes.CLASS_SUFFIXES`): a sequence classifier's
    two dense layers, or the token classifier / QA outputs, which every family names as BERT does."""
    if kind in SEQUENCE_KINDS:
      return dense(('bert', 'pooler'), self.sequence_head[0], group='task') + dense(
          ('classifier',), self.sequence_head[1], group='task')
    head = task_classes.TASK_HEAD[kind]
    return dense((head,), head, group='task')

  def describe(self) -> str:
    return ' and '.join(sorted(self.classes.values()))


def load(directory: str, cfg: ModelConfig, family: Family) -> tuple[ModelConfig, dict, bool, bool]:
  """Reads a checkpoint of `family` whose config.json gave `cfg`; returns as `families.load_hf_checkpoint`:
  (config, params, has_mlm_head, False), params with 'bert' (its pooler drawn where the checkpoint has none) and
  the heads it holds; a <stem>ForSequenceClassification's two dense layers are our pooler and 'classifier'."""
  tensors = model_dir.read_tensors(directory)
  prefix = family.prefix if any(n.startswith(family.prefix) for n in tensors) else ''
  table, shapes = family.table(cfg), family.shapes(cfg)
  if family.stem and all(f'{name}.weight' in tensors for name in family.sequence_head):  # a sequence classifier
    table = table + family.task_table('classification')
    shapes = family.shapes(cfg, int(tensors[f'{family.sequence_head[1]}.weight'].shape[0]))
  words, decoder = tensors.get(prefix + family.words), tensors.get(family.decoder)
  if decoder is not None and (words is None or decoder.shape != words.shape or not np.array_equal(decoder, words)):
    raise CheckpointError(f'{directory}: {family.decoder} differs from {prefix}{family.words}; bert_jax ties the MLM '
                          'decoder to them, so an untied decoder cannot be imported')
  if family.decoder_bias is not None and family.decoder_bias[0] in tensors:
    stored, bias = tensors[family.decoder_bias[0]], tensors.get(family.decoder_bias[1])
    if bias is None or stored.shape != bias.shape or not np.array_equal(stored, bias):
      raise CheckpointError(f'{directory}: {family.decoder_bias[0]} differs from {family.decoder_bias[1]}; bert_jax '
                            'ties the MLM decoder bias to it, so an untied one cannot be imported')
  heads = {e.group for e in table if e.group != 'bert' and family.hf_name(e, prefix) in tensors}
  wanted = [e for e in table if e.group == 'bert' or e.group in heads]
  where = f'{directory}/{model_dir.WEIGHTS_FILE}'
  missing = [family.hf_name(e, prefix) for e in wanted if family.hf_name(e, prefix) not in tensors]
  if missing:
    raise CheckpointError(f'{where} lacks {len(missing)} tensor(s) a {cfg.num_layers}-layer {family.name} needs: '
                          f'{model_dir.some(missing)}')
  known = {family.hf_name(e, prefix) for e in table} | {family.decoder} | set(family.decoder_bias or ())
  unknown = sorted(n for n in tensors if n not in known and n.removeprefix(prefix) not in model_dir.BUFFERS)
  if unknown:
    raise CheckpointError(f'{where} has tensor(s) that a {cfg.num_layers}-layer {family.name} lacks: '
                          f'{model_dir.some(unknown)}; bert_jax imports {family.describe()} checkpoints')
  flat = {}
  for e in wanted:
    theirs, expected = tensors[family.hf_name(e, prefix)], hf_shape(e, shapes[e.path])
    if theirs.shape != expected:
      raise CheckpointError(f'{directory}: tensor {family.hf_name(e, prefix)} has shape {theirs.shape} but '
                            f'config.json implies {expected}')
    flat[e.path] = np.ascontiguousarray(e.rule.from_hf(theirs, shapes[e.path]))
  if 'pooler' not in heads and 'task' not in heads:
    # Drawn as transformers draws the fresh dense layer of its classification heads (normal, std
    # initializer_range; bias 0), from a fixed seed: zeros would never train under DistilBERT's ReLU.
    reporting.log(f'warning: {directory} holds a {family.name} checkpoint without a pooler: its pooler is drawn at '
                  'random (pooler_output is meaningless until fine-tuning trains it)')
    rng = np.random.default_rng(0)
    for path, shape in sorted(shapes.items()):
      if path[:2] == ('bert', 'pooler'):
        flat[path] = (rng.normal(0.0, cfg.initializer_range, shape).astype(np.float32) if path[-1] == 'kernel'
                      else np.zeros(shape, np.float32))
  return cfg, traverse_util.unflatten_dict(flat), 'mlm' in heads, False


def save(directory: str, cfg: ModelConfig, params, tokenizer, family: Family,
         hf_config: Callable[[ModelConfig, str, Any], dict], *, overwrite: bool = False,
         task: dict[str, Any] | None = None) -> None:
  """Writes `params` as a Hugging Face directory of `family`, the class its heads give (`Family.classes`),
  with `hf_config(cfg, class, tokenizer)` as config.json; arguments and errors as `families.save_hf_checkpoint`.
  The pooler (unless the class has one) and an NSP head are left out (a warning for the NSP head). A fine-tuned
  model (`task`) is written as `<stem>For<Task>`, a sequence classifier's pooler and classifier as the family's
  classification head."""
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  flat = traverse_util.flatten_dict(dict(params))
  if any(p[0] == 'nsp' for p in flat):
    reporting.log(f'warning: {family.name} has no next-sentence head: the NSP head and the pooler are not exported')
  heads = frozenset(p[0] for p in flat) - {'bert', 'nsp'}
  num_labels = task_classes.check_task(task, set(heads))
  if task is not None:
    if task['kind'] in SEQUENCE_KINDS and cfg.pooler_norm:
      raise CheckpointError(f'model.pooler_norm=True, but {family.name}\'s classification head has no LayerNorm after '
                            'its activation; nothing written')
    if task['kind'] in SEQUENCE_KINDS and cfg.pooler_activation != family.pooler_activation:
      raise CheckpointError(f'model.pooler_activation={cfg.pooler_activation}, but {family.name}\'s classification '
                            f'head applies {family.pooler_activation}: fine-tune from the {family.name} import (which '
                            'sets it) to export this classifier; nothing written')
    pooled = task['kind'] in SEQUENCE_KINDS
    table = [e for e in family.table(cfg) if e.group == 'bert'] + family.task_table(task['kind'])
    architecture = family.stem + task_classes.CLASS_SUFFIXES[task['kind']]
  elif heads not in family.classes:
    raise CheckpointError(f'params hold the heads {", ".join(sorted(heads))}: no {family.name} class of transformers '
                          f'has them together ({family.describe()}); nothing written')
  else:
    pooled = heads in family.pooled
    groups = heads | {'bert'} | ({'pooler'} if pooled else set())
    table = [e for e in family.table(cfg) if e.group in groups]
    architecture = family.classes[heads]
  flat = {p: x for p, x in flat.items() if p[0] != 'nsp' and (pooled or p[:2] != ('bert', 'pooler'))}
  shapes = family.shapes(cfg, num_labels)
  model_dir.check_params(flat, {e.path for e in table}, shapes,
                          f'a {cfg.num_layers}-layer {family.name} ({family.describe()})')
  tokenizer_files = model_dir.TokenizerExport.check(tokenizer, cfg)

  model_dir.prepare_directory(directory, overwrite)
  prefix = family.prefix if heads else ''
  tensors = {family.hf_name(e, prefix): np.ascontiguousarray(
      e.rule.to_hf(np.asarray(jax.device_get(flat[e.path]), np.float32))) for e in table}
  st_numpy.save_file(tensors, os.path.join(directory, model_dir.WEIGHTS_FILE), metadata={'format': 'pt'})
  if tokenizer_files is not None:
    tokenizer_files.write(directory, cfg.max_position_embeddings, token_types=family.token_types)
    if not family.token_types:
      _without_token_types(directory)
  with files.open(os.path.join(directory, model_dir.CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump({**hf_config(cfg, architecture, tokenizer), **(task_classes.task_config(task) if task else {})}, f,
              indent=2, sort_keys=True)


def _without_token_types(directory: str) -> None:
  """tokenizer_config.json without token_type_ids among the model inputs (a model without token types, as
  DistilBertTokenizer has it), so transformers' tokenizer does not pass them."""
  path = os.path.join(directory, 'tokenizer_config.json')
  if not files.isfile(path):
    return
  with files.open(path, encoding='utf-8') as f:
    config = json.load(f)
  config['model_input_names'] = ['input_ids', 'attention_mask']
  with files.open(path, 'w', encoding='utf-8') as f:
    json.dump(config, f, indent=2, sort_keys=True)
