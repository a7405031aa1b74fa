"""Hugging Face BERT (BertModel, BertForPreTraining, BertForMaskedLM, BertForNextSentencePrediction and the
fine-tuning classes): the family of bert_jax's default architecture.

A BERT-shaped ModelConfig (`bert_layout.BERT_SHAPE`) with token types, without ELECTRA's embedding_size and
RoBERTa's position_offset, exports as BERT (`exports`).

One table, `_name_table`, pairs each of our parameter paths with its Hugging Face tensor
name and the rule that converts between the two layouts; import and export both read it, so they
cannot drift apart.

The heads are BertForPreTraining's (MLM, NSP) and the fine-tuning ones (`classifier` of
BertForSequenceClassification / BertForTokenClassification, `qa_outputs` of
BertForQuestionAnswering): a fine-tuned model exports as that transformers class, with its
task's label names as `id2label`.

Only safetensors are read: a `pytorch_model.bin` is a pickle, and unpickling runs code.
"""

from __future__ import annotations

import json
import os
from typing import Any

from flax import nnx, traverse_util
import jax
import numpy as np
from safetensors import numpy as st_numpy

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax.errors import BertJaxError, CheckpointError
from bert_jax.interop.hf import bert_layout, model_dir, name_tables, task_classes
from bert_jax.interop.hf.model_dir import CONFIG_FILE, WEIGHTS_FILE
from bert_jax.interop.hf.name_tables import SAME, bert_encoder_table, dense, norm
from bert_jax.model.heads import SEQUENCE_KINDS
from bert_jax.runs import reporting


_Entry, _hf_shape = name_tables.Entry, name_tables.hf_shape


def exports(cfg: ModelConfig) -> bool:
  """Whether `cfg` exports as BERT: BERT-shaped, with token types, no embedding_size and no position_offset."""
  return (bert_layout.bert_shaped(cfg) and bool(cfg.type_vocab_size) and not cfg.embedding_size
          and not cfg.position_offset)


PRETRAINING_HEADS, TASK_HEADS = ('mlm', 'nsp'), task_classes.TASK_HEADS
# Our head kind (heads.HEAD_KINDS) <-> the transformers class.
TASK_ARCHITECTURES = {kind: 'Bert' + suffix for kind, suffix in task_classes.CLASS_SUFFIXES.items()}


def _name_table(num_layers: int) -> list[_Entry]:
  """Every parameter of BertForPreTraining and of the task heads with its Hugging Face name and conversion rule."""
  table = bert_encoder_table(num_layers)
  table += dense(('bert', 'pooler'), 'pooler.dense', group='pooler')
  table += dense(('mlm', 'transform'), 'cls.predictions.transform.dense', group='mlm')
  table += norm(('mlm', 'layer_norm'), 'cls.predictions.transform.LayerNorm', group='mlm')
  table.append(_Entry(('mlm', 'bias'), 'cls.predictions.bias', SAME, 'mlm'))
  table += dense(('nsp',), 'cls.seq_relationship', group='nsp')
  # Task heads: BertFor{Sequence,Token}Classification's `classifier`, BertForQuestionAnswering's `qa_outputs`.
  table += dense(('classifier',), 'classifier', group='classifier')
  table += dense(('qa_outputs',), 'qa_outputs', group='qa_outputs')
  return table


def _hf_name(entry: _Entry, prefix: str) -> str:
  return prefix + entry.hf_name if entry.group in ('bert', 'pooler') else entry.hf_name


# Tensors a checkpoint may carry that hold nothing we need: int buffers transformers
# recreates itself.
# The MLM decoder is tied to the word embeddings (and its bias to cls.predictions.bias);
# older checkpoints store the tied copies anyway.
_DECODER_WEIGHT, _DECODER_BIAS = 'cls.predictions.decoder.weight', 'cls.predictions.decoder.bias'

# HF BertConfig defaults, used for keys a config.json leaves out (as transformers does).
_HF_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, hidden_act='gelu', hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                    initializer_range=0.02, layer_norm_eps=1e-12, position_embedding_type='absolute',
                    pad_token_id=0)
# ModelConfig field <- HF config key.
_CONFIG_KEYS = dict(vocab_size='vocab_size', hidden_size='hidden_size', num_layers='num_hidden_layers',
                    num_heads='num_attention_heads', intermediate_size='intermediate_size',
                    max_position_embeddings='max_position_embeddings',
                    type_vocab_size='type_vocab_size', hidden_dropout='hidden_dropout_prob',
                    attention_dropout='attention_probs_dropout_prob',
                    initializer_range='initializer_range', layer_norm_eps='layer_norm_eps',
                    pad_token_id='pad_token_id')


def load_checkpoint(directory: str, cfg: ModelConfig) -> tuple[ModelConfig, dict, bool, bool]:
  """Reads a Hugging Face BERT checkpoint directory whose config.json gave `cfg`.

  BertModel checkpoints (names without a 'bert.' prefix) and BertForPreTraining /
  BertForMaskedLM / BertForNextSentencePrediction / BertForSequenceClassification /
  BertForTokenClassification / BertForQuestionAnswering ones (with it) are accepted. A
  checkpoint without a pooler (BertForMaskedLM, and transformers' token classification and
  question answering models) gets a pooler of zeros, with a warning.

  Args:
    directory: holds config.json and model.safetensors (or a sharded safetensors index).
    cfg: its ModelConfig (`model_config`).

  Returns:
    (config, params, has_mlm_head, has_nsp_head): `params` is a pure dict of float32 numpy
    arrays in our layout (`nnx.to_pure_dict(nnx.state(BertForPreTraining(config), nnx.Param))`
    and the task heads'), with 'bert' always, 'mlm' / 'nsp' when the checkpoint has those heads,
    and 'classifier' or 'qa_outputs' when it has a task head (`read_hf_task` names the task).
  """
  tensors = model_dir.read_tensors(directory)
  names = {_modern_name(n): n for n in tensors}
  if len(names) != len(tensors):
    raise CheckpointError(f'{directory}: the checkpoint holds both LayerNorm gamma/beta and '
                          'weight/bias names for one tensor; re-save it with transformers')
  prefix = 'bert.' if any(n.startswith('bert.') for n in names) else ''
  table = _name_table(cfg.num_layers)

  def get(hf_name):
    return tensors[names[hf_name]] if hf_name in names else None

  word_embeddings = get(prefix + 'embeddings.word_embeddings.weight')
  if _DECODER_BIAS in names and 'cls.predictions.bias' not in names:
    names['cls.predictions.bias'] = names.pop(_DECODER_BIAS)
  _check_tied(directory, get(_DECODER_WEIGHT), word_embeddings, _DECODER_WEIGHT,
              prefix + 'embeddings.word_embeddings.weight')
  _check_tied(directory, get(_DECODER_BIAS), get('cls.predictions.bias'), _DECODER_BIAS,
              'cls.predictions.bias')

  present = {e.group for e in table if _hf_name(e, prefix) in names}
  has_mlm, has_nsp = 'mlm' in present, 'nsp' in present
  task_heads = sorted(present & set(TASK_HEADS))
  if task_heads and (has_mlm or has_nsp or len(task_heads) > 1):
    held = ', '.join(sorted(present - {'bert', 'pooler'}))
    raise CheckpointError(f'{directory}/{WEIGHTS_FILE} holds the heads {held} '
                          'together; a transformers BERT has pretraining heads or one task head')
  num_labels = _task_head_labels(directory, get('classifier.weight'), cfg) if 'classifier' in present else 2
  shapes = model_dir.param_shapes(cfg, num_labels)
  fill_pooler = 'pooler' not in present and (has_mlm or bool(task_heads))
  if fill_pooler:
    reporting.log(f'warning: {directory} has no pooler (a {model_dir.hf_class(directory)} checkpoint); its pooler is '
                  'set to zeros, so pooler_output is meaningless')
  wanted = [e for e in table if e.group in ('bert', 'pooler') or e.group in present]
  missing = [_hf_name(e, prefix) for e in wanted if _hf_name(e, prefix) not in names
             and not (fill_pooler and e.group == 'pooler')]
  if missing:
    raise CheckpointError(f'{directory}/{WEIGHTS_FILE} lacks {len(missing)} tensor(s) a BERT with '
                          f'{cfg.num_layers} layers needs: {model_dir.some(missing)}')
  known = {_hf_name(e, prefix) for e in table} | {_DECODER_WEIGHT, _DECODER_BIAS}
  unknown = [names[n] for n in names if n not in known and n.removeprefix(prefix) not in model_dir.BUFFERS]
  if unknown:
    raise CheckpointError(f'{directory}/{WEIGHTS_FILE} has tensor(s) that a {cfg.num_layers}-layer '
                          f'BERT with pretraining or task heads lacks: {model_dir.some(unknown)}; bert_jax imports '
                          'BertModel, BertForPreTraining, BertForMaskedLM and BertFor{Sequence,Token}'
                          'Classification / BertForQuestionAnswering checkpoints')

  flat = {}
  for e in wanted:
    shape = shapes[e.path]
    theirs = get(_hf_name(e, prefix))
    if theirs is None:  # the absent pooler of a BertForMaskedLM checkpoint
      flat[e.path] = np.zeros(shape, np.float32)
      continue
    expected = _hf_shape(e, shape)
    if theirs.shape != expected:
      raise CheckpointError(f'{directory}: tensor {names[_hf_name(e, prefix)]} has shape '
                            f'{theirs.shape} but config.json implies {expected}')
    flat[e.path] = np.ascontiguousarray(e.rule.from_hf(theirs, shape))
  return cfg, traverse_util.unflatten_dict(flat), has_mlm, has_nsp


def _task_head_labels(directory: str, weight, cfg: ModelConfig) -> int:
  """The classifier's number of labels, checked against config.json's id2label / num_labels."""
  task = read_hf_task(directory)
  if weight.ndim != 2 or weight.shape[1] != cfg.hidden_size:
    raise CheckpointError(f'{directory}: tensor classifier.weight has shape {weight.shape} but config.json '
                          f'implies (num_labels, {cfg.hidden_size})')
  if task is not None and task['num_labels'] != weight.shape[0]:
    raise CheckpointError(f'{directory}: classifier.weight has {weight.shape[0]} rows but config.json has '
                          f'{task["num_labels"]} labels (id2label)')
  return int(weight.shape[0])


def read_hf_task(directory: str) -> dict[str, Any] | None:
  """The task of a fine-tuned Hugging Face BERT directory, from its config.json; None for other classes.

  Returns:
    {'name' (config.json's finetuning_task, or ''), 'kind' ('classification', 'regression', 'token' or
    'span'), 'num_labels', 'label_names' (id2label in id order)}, the form `load_finetuned` gives.
  """
  hf_config = model_dir.read_json_config(directory)
  arch = (hf_config.get('architectures') or [''])[0]
  if arch not in TASK_ARCHITECTURES.values():
    return None
  id2label = hf_config.get('id2label') or {}
  try:
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
  except (ValueError, TypeError):
    raise CheckpointError(f'{os.path.join(directory, CONFIG_FILE)}: id2label keys are not label ids') from None
  num_labels = int(hf_config.get('num_labels') or len(labels) or 2)
  if arch == 'BertForQuestionAnswering':
    kind = 'span'
  elif arch == 'BertForTokenClassification':
    kind = 'token'
  else:
    kinds = {problem: kind for kind, problem in task_classes.PROBLEM_TYPES.items()}
    kind = kinds.get(hf_config.get('problem_type'), 'classification')
  return {'name': hf_config.get('finetuning_task') or '', 'kind': kind, 'num_labels': num_labels,
          'label_names': labels if kind in ('classification', 'multilabel', 'token') else []}


def save_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *, overwrite: bool = False,
                    task: dict[str, Any] | None = None) -> None:
  """Writes a Hugging Face BERT directory that transformers loads and that reloads bit-exactly.

  The architecture is BertModel without heads, BertForPreTraining with both pretraining heads,
  BertForMaskedLM with only the MLM head, and for a fine-tuned model (`task`) the transformers
  class of its head: BertForSequenceClassification (classification; regression with
  problem_type='regression'), BertForTokenClassification or BertForQuestionAnswering, with the
  task's label names as id2label / label2id. The last two have no pooler in transformers, so
  ours is left out.

  A WordPiece tokenizer is written as vocab.txt + tokenizer.json + tokenizer_config.json
  (transformers' BertTokenizer reads them). A SentencePiece tokenizer is written as tokenizer.json
  (its conversion, `tokenizer_json.sentencepiece_to_tokenizers`, checked against SentencePiece
  first: a model that would tokenize differently is refused) + tokenizer_config.json +
  special_tokens_map.json for transformers' fast tokenizer, and as spiece.model, which bert_jax
  reads back bit-exactly (`model_dir.load_hf_tokenizer`).

  Its arguments are `families.save_hf_checkpoint`'s. Raises CheckpointError for parameters that do not fit the
  config or the task, DataError for a tokenizer that cannot be exported exactly; nothing is written then.
  """
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  flat = traverse_util.flatten_dict(dict(params))
  heads = {p[0] for p in flat} - {'bert'}
  num_labels = task_classes.check_task(task, heads)
  groups = {'bert'} | heads | ({'pooler'} if task is None or task['kind'] in SEQUENCE_KINDS else set())
  if 'pooler' in groups and (cfg.pooler_activation != 'tanh' or cfg.pooler_norm):
    what = 'model.pooler_norm=True' if cfg.pooler_norm else f'model.pooler_activation={cfg.pooler_activation}'
    raise CheckpointError(f'{what}: BERT\'s pooler applies tanh (no LayerNorm), so its pooled output would differ '
                          'in transformers; nothing written')
  table = [e for e in _name_table(cfg.num_layers) if e.group in groups]
  shapes = model_dir.param_shapes(cfg, num_labels)
  exported = {e.path for e in table}
  unknown = sorted('/'.join(map(str, p)) for p in set(flat) - exported
                   if not (p[:2] == ('bert', 'pooler') and 'pooler' not in groups))
  if unknown:
    raise CheckpointError(f'parameters {model_dir.some(unknown)} are not part of a {cfg.num_layers}-layer '
                          "BERT with pretraining or task heads; pass {'bert': params['bert']} (plus 'mlm' "
                          "and 'nsp' if present) to export the encoder; nothing written")
  missing = ['/'.join(map(str, e.path)) for e in table if e.path not in flat]
  if missing:
    raise CheckpointError(f'params lack {model_dir.some(missing)}; nothing written')
  for e in table:
    if tuple(flat[e.path].shape) != shapes[e.path]:
      raise CheckpointError(f'parameter {"/".join(map(str, e.path))} has shape '
                            f'{tuple(flat[e.path].shape)} but the config implies {shapes[e.path]}')
  tokenizer_files = model_dir.TokenizerExport.check(tokenizer, cfg)

  model_dir.prepare_directory(directory, overwrite)
  prefix = 'bert.' if heads else ''
  tensors = {_hf_name(e, prefix): np.ascontiguousarray(
      e.rule.to_hf(np.asarray(jax.device_get(flat[e.path]), np.float32))) for e in table}
  st_numpy.save_file(tensors, os.path.join(directory, WEIGHTS_FILE), metadata={'format': 'pt'})
  config = _hf_config(cfg, heads, tokenizer, task)
  if tokenizer_files is not None:
    tokenizer_files.write(directory, cfg.max_position_embeddings)
  with files.open(os.path.join(directory, CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump(config, f, indent=2, sort_keys=True)


def model_config(path: str, hf: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of a BERT config.json (`hf`, already parsed; `path` names it in errors)."""
  hf = {**_HF_DEFAULTS, **hf}
  name_tables.check_bert_layers(path, hf)
  try:
    return ModelConfig(**{ours: hf[theirs] for ours, theirs in _CONFIG_KEYS.items()})
  except (BertJaxError, TypeError) as e:
    raise CheckpointError(f'{path}: {e}') from None


def _modern_name(name: str) -> str:
  # TF-era checkpoints call LayerNorm's weight/bias gamma/beta; transformers renames them too.
  if 'LayerNorm' in name:
    for old, new in (('.gamma', '.weight'), ('.beta', '.bias')):
      if name.endswith(old):
        return name[:-len(old)] + new
  return name


def _check_tied(directory, tied, source, tied_name, source_name):
  if tied is not None and (source is None or tied.shape != source.shape
                           or not np.array_equal(tied, source)):
    raise CheckpointError(f'{directory}: {tied_name} differs from {source_name}; bert_jax ties the '
                          'MLM decoder to them, so an untied decoder cannot be imported')


def _hf_config(cfg: ModelConfig, heads: set, tokenizer, task: dict[str, Any] | None = None) -> dict:
  arch = {frozenset(): 'BertModel', frozenset({'mlm', 'nsp'}): 'BertForPreTraining',
          frozenset({'mlm'}): 'BertForMaskedLM', frozenset({'nsp'}): 'BertForNextSentencePrediction'}
  config = {**_HF_DEFAULTS, 'model_type': 'bert',
            'pad_token_id': tokenizer.pad_id if tokenizer is not None else tokenization.PAD_ID,
            'tie_word_embeddings': True}
  config.update({theirs: getattr(cfg, ours) for ours, theirs in _CONFIG_KEYS.items()})
  if task is None:
    config['architectures'] = [arch[frozenset(heads)]]
    return config
  config['architectures'] = [TASK_ARCHITECTURES[task['kind']]]
  return {**config, **task_classes.task_config(task)}
