"""Import and export of Hugging Face ModernBERT checkpoints (ModernBertModel, ModernBertForMaskedLM,
ModernBertForSequenceClassification).

A ModelConfig is ModernBERT-shaped when its architecture switches are ModernBERT's: pre-LN,
rotary positions, a GeGLU MLP and no token type embeddings, with biases or without, and any
pattern of global and local-window layers that bert_jax expresses (global at 0, N, 2N, ...).
Such a model exports as transformers' ModernBertForMaskedLM (ModernBertModel without an MLM
head) and imports back bit-exactly; transformers computes the same function (parity tests in
tests/interop/families/test_modernbert.py, fixture from data/make_hf_modernbert_reference.py). A BERT-shaped
config (the defaults) exports as BertForPreTraining & co (`families.bert`); every other combination
of switches has no Hugging Face architecture and exports as bert_jax only: `families.hf_model_type`
says so in one line.

ModernBERT's sequence classifier reads [CLS] after the final norm through its `head` (dense, GELU, LayerNorm) and
`classifier`: our pooler with model.pooler_activation='gelu' and model.pooler_norm (which the import sets), and our
classifier. A fine-tuned sequence classifier (classification, regression: a reranker) exports as
ModernBertForSequenceClassification with classifier_pooling='cls' and imports back; one fine-tuned from a
ModernBERT-shaped model without that pooler, and token or span heads, export as bert_jax only (one line).
ModernBertForSequenceClassification.from_pretrained(a ModernBertForMaskedLM) starts its `head` from the MLM head (the
names are shared); the import of a masked-LM checkpoint sets our pooler likewise, and draws it for a ModernBertModel.

Correspondence with transformers' ModernBERT (modeling_modernbert.py):
  embeddings.tok_embeddings, embeddings.norm   word_embeddings, the embeddings' layer_norm
  layers.i.attn_norm (none in layer 0)         layers/i/attention_norm (none in layer 0)
  layers.i.attn.Wqkv [3 x N*H, D]              query, key, value kernels [D, N, H], packed in that order
  layers.i.attn.Wo, mlp_norm, mlp.Wo           attention/output, mlp_norm, output
  layers.i.mlp.Wi [2 x I, D]                   intermediate [D, 2, I]: [:, 0] through GELU, [:, 1] the gate
  final_norm, head.dense, head.norm            final_norm, mlm/transform, mlm/layer_norm
                                               (a sequence classifier: bert/pooler, bert/pooler_norm)
  classifier                                   classifier
  decoder (weight tied), decoder.bias          the tied word embeddings, mlm/bias
  local_attention, layer_types                 attention_window, global_attention_every
  rope_parameters (full / sliding)             rope_theta / local_rope_theta
ModernBERT has no pooler and no NSP head: an import's pooler is zeros (as a BertForMaskedLM
import's), and an export leaves both out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

from flax import nnx, traverse_util
import jax
import numpy as np
from safetensors import numpy as st_numpy

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax.errors import BertJaxError, CheckpointError
from bert_jax.interop.hf import model_dir, task_classes
from bert_jax.model.heads import SEQUENCE_KINDS
from bert_jax.runs import reporting

# The switches that make a config ModernBERT-shaped.
MODERNBERT_SHAPE = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', type_vocab_size=0)

# ModernBertConfig's defaults (transformers 5.x), for keys a config.json leaves out.
_HF_DEFAULTS = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                    num_attention_heads=12, hidden_activation='gelu', max_position_embeddings=8192,
                    initializer_range=0.02, norm_eps=1e-5, norm_bias=False, pad_token_id=50283,
                    attention_bias=False, attention_dropout=0.0, local_attention=128, embedding_dropout=0.0,
                    mlp_bias=False, mlp_dropout=0.0, decoder_bias=True, classifier_bias=False,
                    classifier_activation='gelu', global_attn_every_n_layers=3, global_rope_theta=160000.0,
                    local_rope_theta=10000.0, tie_word_embeddings=True)
_BIAS_KEYS = ('attention_bias', 'mlp_bias', 'norm_bias', 'classifier_bias')
_FULL, _SLIDING = 'full_attention', 'sliding_attention'

ParamPath = tuple


def exports(cfg: ModelConfig) -> bool:
  """Whether `cfg` exports as ModernBERT: ModernBERT-shaped (`MODERNBERT_SHAPE`, any biases and attention windows)
  without ELECTRA's embedding_size."""
  return all(getattr(cfg, k) == v for k, v in MODERNBERT_SHAPE.items()) and not cfg.embedding_size


# --- the name table --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Rule:
  """Converts one of our tensors: `to_hf(ours)` and `from_hf(theirs, our_shape)`; both exact."""
  to_hf: Callable[[Any], Any]
  from_hf: Callable[[Any, tuple], Any]


_SAME = _Rule(lambda x: x, lambda x, shape: x)
_VECTOR = _Rule(lambda x: x.reshape(-1), lambda x, shape: x.reshape(shape))


def _kernel(num_in: int) -> _Rule:
  """A Dense kernel (its `num_in` input axes first) <-> nn.Linear's flat (out, in) weight."""
  return _Rule(lambda x: x.reshape(math.prod(x.shape[:num_in]), -1).T, lambda x, shape: x.T.reshape(shape))


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One Hugging Face tensor: our parameter(s), several when it packs them along its first axis (Wqkv)."""
  paths: tuple[ParamPath, ...]
  hf_name: str  # encoder names without the 'model.' prefix that ModernBertForMaskedLM adds
  rule: _Rule  # per packed part
  group: str  # 'bert' or 'mlm'

  def to_hf(self, ours: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([self.rule.to_hf(x) for x in ours], axis=0)

  def from_hf(self, theirs: np.ndarray, shapes: list[tuple]) -> list[np.ndarray]:
    return [self.rule.from_hf(part, shape) for part, shape in zip(np.split(theirs, len(shapes)), shapes)]


def _name_table(cfg: ModelConfig) -> list[_Entry]:
  """Every parameter of a ModernBERT-shaped BertForPreTraining but the pooler and NSP head, with its HF name."""
  def norm(path, hf, group='bert'):
    out = [_Entry((path + ('scale',),), hf + '.weight', _VECTOR, group)]
    return out + ([_Entry((path + ('bias',),), hf + '.bias', _VECTOR, group)] if cfg.use_bias else [])

  def dense(paths, hf, num_in=1, group='bert'):
    out = [_Entry(tuple(p + ('kernel',) for p in paths), hf + '.weight', _kernel(num_in), group)]
    return out + ([_Entry(tuple(p + ('bias',) for p in paths), hf + '.bias', _VECTOR, group)] if cfg.use_bias else [])

  emb = ('bert', 'embeddings')
  table = [_Entry((emb + ('word_embeddings', 'embedding'),), 'embeddings.tok_embeddings.weight', _SAME, 'bert')]
  table += norm(emb + ('layer_norm',), 'embeddings.norm')
  for i in range(cfg.num_layers):
    ours, theirs = ('bert', 'layers', i), f'layers.{i}'
    if i:  # the first layer's attention reads the embeddings' LayerNorm output directly
      table += norm(ours + ('attention_norm',), f'{theirs}.attn_norm')
    table += dense([ours + ('attention', name) for name in ('query', 'key', 'value')], f'{theirs}.attn.Wqkv')
    table += dense([ours + ('attention', 'output')], f'{theirs}.attn.Wo', num_in=2)
    table += norm(ours + ('mlp_norm',), f'{theirs}.mlp_norm')
    table += dense([ours + ('intermediate',)], f'{theirs}.mlp.Wi')
    table += dense([ours + ('output',)], f'{theirs}.mlp.Wo')
  table += norm(('bert', 'final_norm'), 'final_norm')
  table += dense([('mlm', 'transform')], 'head.dense', group='mlm')
  table += norm(('mlm', 'layer_norm'), 'head.norm', group='mlm')
  table.append(_Entry((('mlm', 'bias'),), 'decoder.bias', _VECTOR, 'mlm'))
  return table


def _task_table(cfg: ModelConfig) -> list[_Entry]:
  """ModernBertForSequenceClassification's head: our pooler (dense, GELU, LayerNorm) and classifier (which has a
  bias whatever classifier_bias says)."""
  table = [_Entry((('bert', 'pooler', 'kernel'),), 'head.dense.weight', _kernel(1), 'task')]
  table += [_Entry((('bert', 'pooler', 'bias'),), 'head.dense.bias', _VECTOR, 'task')] if cfg.use_bias else []
  table += [_Entry((('bert', 'pooler_norm', 'scale'),), 'head.norm.weight', _VECTOR, 'task')]
  table += [_Entry((('bert', 'pooler_norm', 'bias'),), 'head.norm.bias', _VECTOR, 'task')] if cfg.use_bias else []
  return table + [_Entry((('classifier', 'kernel'),), 'classifier.weight', _kernel(1), 'task'),
                  _Entry((('classifier', 'bias'),), 'classifier.bias', _VECTOR, 'task')]


def _hf_name(entry: _Entry, prefix: str) -> str:
  return prefix + entry.hf_name if entry.group == 'bert' else entry.hf_name


_DECODER_WEIGHT = 'decoder.weight'  # tied to the word embeddings; save_pretrained leaves it out
_SEQUENCE_CLASS = 'ModernBertForSequenceClassification'
_POOLER = (('bert', 'pooler'), ('bert', 'pooler_norm'))  # exported only as a sequence classifier's head


# --- config ----------------------------------------------------------------------------------


def model_config(path: str, hf: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of a ModernBERT config.json (`hf`, already parsed; `path` names it in errors)."""
  hf = {**_HF_DEFAULTS, **hf}
  for key in ('hidden_activation', 'classifier_activation'):
    if hf[key] != 'gelu':
      raise CheckpointError(f"{path}: {key}={hf[key]!r}, but bert_jax implements only the exact (erf) GELU, "
                            "'gelu'; this model's outputs would not match")
  biases = {k: bool(hf[k]) for k in _BIAS_KEYS}
  if len(set(biases.values())) > 1:
    raise CheckpointError(f'{path}: {", ".join(f"{k}={v}" for k, v in biases.items())}; bert_jax has one '
                          'switch for every bias (model.use_bias)')
  if not hf['tie_word_embeddings']:
    raise CheckpointError(f'{path}: tie_word_embeddings=false; bert_jax ties the MLM decoder to the word '
                          'embeddings, so an untied decoder cannot be imported')
  if _SEQUENCE_CLASS in (hf.get('architectures') or ()) and hf.get('classifier_pooling', 'cls') != 'cls':
    raise CheckpointError(f"{path}: classifier_pooling={hf['classifier_pooling']!r}; bert_jax's sequence "
                          "classifier reads [CLS] ('cls'), so this classifier's scores would differ")
  layer_types = hf.get('layer_types') or [
      _SLIDING if i % hf['global_attn_every_n_layers'] else _FULL for i in range(hf['num_hidden_layers'])]
  window, every = _window_pattern(path, layer_types, hf['local_attention'])
  global_theta, local_theta = _rope_thetas(path, hf)
  fields = dict(vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'], num_layers=hf['num_hidden_layers'],
                num_heads=hf['num_attention_heads'], intermediate_size=hf['intermediate_size'],
                max_position_embeddings=hf['max_position_embeddings'], hidden_dropout=hf['mlp_dropout'],
                attention_dropout=hf['attention_dropout'], initializer_range=hf['initializer_range'],
                layer_norm_eps=hf['norm_eps'], pad_token_id=hf['pad_token_id'], use_bias=biases['norm_bias'],
                attention_window=window, global_attention_every=every, rope_theta=float(global_theta),
                local_rope_theta=float(local_theta), pooler_activation='gelu', pooler_norm=True,
                **MODERNBERT_SHAPE)
  try:
    return ModelConfig(**fields)
  except (BertJaxError, TypeError) as e:
    raise CheckpointError(f'{path}: {e}') from None


def _window_pattern(path: str, layer_types: list[str], local_attention: int) -> tuple[int, int]:
  """(attention_window, global_attention_every) of ModernBERT's per-layer types."""
  unknown = sorted(set(layer_types) - {_FULL, _SLIDING})
  if unknown:
    raise CheckpointError(f'{path}: layer_types has {unknown}; ModernBERT layers are {_FULL!r} or {_SLIDING!r}')
  if _SLIDING not in layer_types:
    return 0, 0
  if local_attention < 2:
    raise CheckpointError(f'{path}: local_attention={local_attention}; bert_jax windows reach at least one '
                          'position to each side (attention_window >= 2)')
  # transformers' sliding layers see keys at most local_attention // 2 positions away.
  window = 2 * (local_attention // 2)
  full = [i for i, t in enumerate(layer_types) if t == _FULL]
  every = 0 if not full else (full[1] - full[0] if len(full) > 1 else len(layer_types))
  if full != [i for i in range(len(layer_types)) if every and i % every == 0]:
    raise CheckpointError(f'{path}: global layers {full} of {len(layer_types)}; bert_jax places them at 0, N, '
                          '2N, ... (model.global_attention_every=N) or nowhere')
  return window, every


def _rope_thetas(path: str, hf: dict[str, Any]) -> tuple[float, float]:
  """(global, local) RoPE bases from rope_parameters (transformers 5) or global/local_rope_theta (4.x)."""
  params = hf.get('rope_parameters') or {}
  if hf.get('rope_scaling'):
    params = {_FULL: hf['rope_scaling'], _SLIDING: hf['rope_scaling']}
  thetas = []
  for kind, fallback in ((_FULL, hf['global_rope_theta']), (_SLIDING, hf['local_rope_theta'])):
    p = params.get(kind) or {}
    if p.get('rope_type', 'default') != 'default':
      raise CheckpointError(f"{path}: rope_type={p['rope_type']!r} ({kind}); bert_jax implements only "
                            "'default' RoPE")
    thetas.append(p.get('rope_theta', fallback))
  if thetas[1] is None:  # transformers 4.x: no local base means the global one
    thetas[1] = thetas[0]
  return thetas[0], thetas[1]


def _hf_config(cfg: ModelConfig, with_mlm: bool, tokenizer) -> dict[str, Any]:
  windows = cfg.layer_windows
  layer_types = [_SLIDING if w else _FULL for w in windows]
  tok = tokenizer if tokenizer is not None else None
  cls_id = tok.cls_id if tok is not None else tokenization.CLS_ID
  sep_id = tok.sep_id if tok is not None else tokenization.SEP_ID
  config = {
      'architectures': ['ModernBertForMaskedLM' if with_mlm else 'ModernBertModel'], 'model_type': 'modernbert',
      'vocab_size': cfg.vocab_size, 'hidden_size': cfg.hidden_size, 'intermediate_size': cfg.intermediate_size,
      'num_hidden_layers': cfg.num_layers, 'num_attention_heads': cfg.num_heads,
      'max_position_embeddings': cfg.max_position_embeddings, 'initializer_range': cfg.initializer_range,
      'norm_eps': cfg.layer_norm_eps, 'hidden_activation': 'gelu', 'classifier_activation': 'gelu',
      **{k: cfg.use_bias for k in _BIAS_KEYS}, 'decoder_bias': True, 'tie_word_embeddings': True,
      'attention_dropout': cfg.attention_dropout, 'embedding_dropout': cfg.hidden_dropout,
      'mlp_dropout': cfg.hidden_dropout, 'layer_types': layer_types,
      # Without local layers the window is unused; 128 is ModernBertConfig's default.
      'local_attention': cfg.attention_window or 128,
      'rope_parameters': {_FULL: {'rope_type': 'default', 'rope_theta': cfg.rope_theta},
                          _SLIDING: {'rope_type': 'default', 'rope_theta': cfg.local_rope_theta}},
      # transformers 4.x reads these instead of layer_types / rope_parameters.
      'global_rope_theta': cfg.rope_theta, 'local_rope_theta': cfg.local_rope_theta,
      'pad_token_id': tok.pad_id if tok is not None else tokenization.PAD_ID,
      'cls_token_id': cls_id, 'bos_token_id': cls_id, 'sep_token_id': sep_id, 'eos_token_id': sep_id,
  }
  every = cfg.global_attention_every if cfg.attention_window else 1
  if every:  # all-local layers have no global_attn_every_n_layers (4.x makes layer 0 global)
    config['global_attn_every_n_layers'] = every
  return config


# --- import ----------------------------------------------------------------------------------


def load_checkpoint(directory: str, cfg: ModelConfig) -> tuple[ModelConfig, dict, bool, bool]:
  """Reads a ModernBertModel, ModernBertForMaskedLM or ModernBertForSequenceClassification directory whose
  config.json gave `cfg`.

  Returns:
    (config, params, has_mlm_head, False) as `families.load_hf_checkpoint`: `params` shaped like a
    ModernBERT-shaped BertForPreTraining's ('bert', and 'mlm' with a masked-LM head), or a sequence classifier's
    ('bert' with its head as the pooler, 'classifier'). Without a classifier the pooler is the MLM head's dense and
    LayerNorm (as transformers starts a classifier from a masked-LM checkpoint), or drawn for a ModernBertModel.
  """
  tensors = model_dir.read_tensors(directory)
  prefix = 'model.' if any(n.startswith('model.') for n in tensors) else ''
  has_task = 'classifier.weight' in tensors
  num_labels = _labels(directory, tensors['classifier.weight'], cfg) if has_task else 2
  table, shapes = _name_table(cfg) + _task_table(cfg), model_dir.param_shapes(cfg, num_labels)
  words = tensors.get(prefix + 'embeddings.tok_embeddings.weight')
  decoder = tensors.get(_DECODER_WEIGHT)
  if decoder is not None and (words is None or decoder.shape != words.shape or not np.array_equal(decoder, words)):
    raise CheckpointError(f'{directory}: {_DECODER_WEIGHT} differs from {prefix}embeddings.tok_embeddings.weight; '
                          'bert_jax ties the MLM decoder to them, so an untied decoder cannot be imported')
  has_mlm = not has_task and any(e.group == 'mlm' and e.hf_name in tensors for e in table)
  with files.open(os.path.join(directory, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    decoder_bias = json.load(f).get('decoder_bias', True)
  wanted = [e for e in table if e.group == 'bert' or (e.group == 'mlm' and has_mlm) or (e.group == 'task' and has_task)]
  zero_decoder_bias = has_mlm and not decoder_bias  # decoder_bias=false: the same function with zeros
  missing = [_hf_name(e, prefix) for e in wanted if _hf_name(e, prefix) not in tensors
             and not (zero_decoder_bias and e.hf_name == 'decoder.bias')]
  if missing:
    raise CheckpointError(f'{directory}/{model_dir.WEIGHTS_FILE} lacks {len(missing)} tensor(s) a '
                          f'{cfg.num_layers}-layer ModernBERT{" (biases on)" if cfg.use_bias else ""} needs: {model_dir.some(missing)}')
  known = {_hf_name(e, prefix) for e in wanted} | ({_DECODER_WEIGHT} if has_mlm or not has_task else set())
  unknown = sorted(n for n in tensors if n not in known)
  if unknown:
    raise CheckpointError(f'{directory}/{model_dir.WEIGHTS_FILE} has tensor(s) that a {cfg.num_layers}-layer '
                          f'ModernBERT{" sequence classifier" if has_task else " with a masked-LM head"} lacks: '
                          f'{model_dir.some(unknown)}; bert_jax imports ModernBertModel, ModernBertForMaskedLM and '
                          f'{_SEQUENCE_CLASS} checkpoints')
  flat = {}
  for e in wanted:
    our_shapes = [shapes[p] for p in e.paths]
    theirs = tensors.get(_hf_name(e, prefix))
    if theirs is None:  # decoder_bias=false
      flat[e.paths[0]] = np.zeros(our_shapes[0], np.float32)
      continue
    expected = e.to_hf([np.broadcast_to(np.float32(0), s) for s in our_shapes]).shape
    if theirs.shape != expected:
      raise CheckpointError(f'{directory}: tensor {_hf_name(e, prefix)} has shape {theirs.shape} but config.json '
                            f'implies {expected}')
    for path, x in zip(e.paths, e.from_hf(theirs, our_shapes)):
      flat[path] = np.ascontiguousarray(x)
  if not has_task:
    _fill_pooler(directory, flat, shapes, cfg, has_mlm)
  return cfg, traverse_util.unflatten_dict(flat), has_mlm, False


def _labels(directory: str, weight: np.ndarray, cfg: ModelConfig) -> int:
  """A sequence classifier's number of labels (its classifier's rows), checked against config.json."""
  hf = model_dir.read_json_config(directory)
  arch = (hf.get('architectures') or [''])[0]
  if arch != _SEQUENCE_CLASS:
    raise CheckpointError(f'{directory}: a {arch or "model"} with a classifier; bert_jax imports ModernBertModel, '
                          f'ModernBertForMaskedLM and {_SEQUENCE_CLASS} checkpoints')
  if weight.ndim != 2 or weight.shape[1] != cfg.hidden_size:
    raise CheckpointError(f'{directory}: tensor classifier.weight has shape {weight.shape} but config.json implies '
                          f'(num_labels, {cfg.hidden_size})')
  labels = len(hf.get('id2label') or {}) or int(hf.get('num_labels') or weight.shape[0])
  if labels != weight.shape[0]:
    raise CheckpointError(f'{directory}: classifier.weight has {weight.shape[0]} rows but config.json has {labels} '
                          'labels (id2label)')
  return int(weight.shape[0])


def read_hf_task(directory: str) -> dict[str, Any] | None:
  """The task of a ModernBertForSequenceClassification directory (as `bert.read_hf_task`); None for other
  classes."""
  hf = model_dir.read_json_config(directory)
  if (hf.get('architectures') or [''])[0] != _SEQUENCE_CLASS:
    return None
  id2label = hf.get('id2label') or {}
  labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
  kinds = {problem: kind for kind, problem in task_classes.PROBLEM_TYPES.items()}
  kind = kinds.get(hf.get('problem_type'), 'regression' if len(labels) == 1 else 'classification')
  return {'name': hf.get('finetuning_task') or '', 'kind': kind, 'num_labels': len(labels) or 2,
          'label_names': labels if kind != 'regression' else []}


def _fill_pooler(directory: str, flat: dict, shapes: dict, cfg: ModelConfig, has_mlm: bool) -> None:
  """The pooler of a checkpoint without a classifier: the MLM head's dense and LayerNorm (transformers' classifier
  shares their names), or drawn as transformers draws a fresh head (normal, std initializer_range, seed 0)."""
  if has_mlm:
    for ours, theirs in ((('bert', 'pooler'), ('mlm', 'transform')), (('bert', 'pooler_norm'), ('mlm', 'layer_norm'))):
      flat.update({ours + p[2:]: flat[p].copy() for p in list(flat) if p[:2] == theirs})
    return
  reporting.log(f'warning: {directory} is a ModernBertModel checkpoint: it has no classification head, so the '
                'pooler (its dense, GELU, LayerNorm) is drawn at random (pooler_output is meaningless until '
                'fine-tuning trains it)')
  rng = np.random.default_rng(0)
  for path, shape in sorted(shapes.items()):
    if path[:2] in _POOLER:
      flat[path] = (rng.normal(0.0, cfg.initializer_range, shape).astype(np.float32) if path[-1] == 'kernel'
                    else np.ones(shape, np.float32) if path[-1] == 'scale' else np.zeros(shape, np.float32))


# --- export ----------------------------------------------------------------------------------


def save_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *, overwrite: bool = False,
                    task=None) -> None:
  """Writes a ModernBERT-shaped model as a Hugging Face ModernBertForMaskedLM directory (ModernBertModel
  without an MLM head; ModernBertForSequenceClassification for a fine-tuned sequence classifier, `task`) that
  transformers loads and that reloads bit-exactly; arguments as `families.save_hf_checkpoint`. The pooler (but as
  a classifier's head) and an NSP head are left out (ModernBERT has neither)."""
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  flat = traverse_util.flatten_dict(dict(params))
  if task is not None:
    _check_task(cfg, task, {p[0] for p in flat} - {'bert'})
  if any(p[0] == 'nsp' for p in flat):
    reporting.log('warning: ModernBertForMaskedLM has no next-sentence head: the NSP head and the pooler are not '
                  'exported')
  flat = {p: x for p, x in flat.items() if p[0] != 'nsp' and (task is not None or p[:2] not in _POOLER)}
  with_mlm = any(p[0] == 'mlm' for p in flat)
  table = [e for e in _name_table(cfg) if e.group == 'bert' or with_mlm] + (_task_table(cfg) if task else [])
  num_labels = int(task['num_labels']) if task else 2
  model_dir.check_params(flat, {p for e in table for p in e.paths}, model_dir.param_shapes(cfg, num_labels),
                          f'a {cfg.num_layers}-layer ModernBERT sequence classifier' if task else
                          f"a {cfg.num_layers}-layer ModernBERT with a masked-LM head; pass {{'bert': params['bert']}} "
                          "(plus 'mlm') to export the encoder")
  tokenizer_files = model_dir.TokenizerExport.check(tokenizer, cfg)

  model_dir.prepare_directory(directory, overwrite)
  prefix = 'model.' if with_mlm or task else ''
  host = {p: np.asarray(jax.device_get(x), np.float32) for p, x in flat.items()}
  tensors = {_hf_name(e, prefix): np.ascontiguousarray(e.to_hf([host[p] for p in e.paths])) for e in table}
  st_numpy.save_file(tensors, os.path.join(directory, model_dir.WEIGHTS_FILE), metadata={'format': 'pt'})
  config = _hf_config(cfg, with_mlm, tokenizer)
  if task is not None:
    config.update(architectures=[_SEQUENCE_CLASS], classifier_pooling='cls', classifier_dropout=cfg.hidden_dropout,
                  **task_classes.task_config(task))
  if tokenizer_files is not None:
    tokenizer_files.write(directory, cfg.max_position_embeddings, token_types=False)
  with files.open(os.path.join(directory, model_dir.CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump(config, f, indent=2, sort_keys=True)


def _check_task(cfg: ModelConfig, task: dict[str, Any], heads: set) -> None:
  """CheckpointError (nothing written) unless a fine-tuned model is a sequence classifier whose pooler is
  ModernBERT's classification head."""
  task_classes.check_task(task, heads)
  if task['kind'] not in SEQUENCE_KINDS:
    raise CheckpointError(f"a fine-tuned modernbert {task['kind']} model exports as bert_jax only: ModernBERT's "
                          'token and question-answering classes put a dense, GELU and LayerNorm before their output '
                          'layer, which bert_jax\'s heads do not have; nothing written')
  if cfg.pooler_activation != 'gelu' or not cfg.pooler_norm:
    raise CheckpointError(f'model.pooler_activation={cfg.pooler_activation}, model.pooler_norm={cfg.pooler_norm}, '
                          "but ModernBERT's classification head is dense, GELU, LayerNorm (gelu, True): fine-tune from "
                          'a ModernBERT import (which sets them) to export this classifier; nothing written')
