"""bert_jax.interop.families.modernbert: ModernBERT-shaped models import from and export to transformers' ModernBERT.

The reference (tests/fixtures/hf_modernbert) is a random ModernBertForMaskedLM with transformers'
logits on a padded batch (data/make_hf_modernbert_reference.py), checked where transformers is
absent; the tests that load our exports in transformers run only where it is installed.
"""

import dataclasses
import functools
import json
import os
import shutil

from flax import nnx, traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from bert_jax import config
from bert_jax.data import tokenization as tk
from bert_jax.errors import CheckpointError
from bert_jax.interop import families
from bert_jax.interop.families import modernbert
from bert_jax.interop.hf import model_dir
from bert_jax.model import heads

from harness.inputs import FIXTURES
from harness.numerics import model_tolerance

FIXTURE = os.path.join(FIXTURES, 'hf_modernbert')
MODERN = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', type_vocab_size=0)


def _modern_cfg(**overrides):
  fields = dict(vocab_size=64, num_layers=3, max_position_embeddings=40, attention_window=6, global_attention_every=2,
                rope_theta=160000.0, use_bias=False, layer_norm_eps=1e-5, **MODERN)
  fields.update(overrides)
  return config.preset('tiny', **fields)


def _random_params(cfg, seed=0, nsp=False):
  """Pure params of a BertForPreTraining, all random: LayerNorm scales 1 + N(0, 0.1), the rest N(0, 0.1)."""
  rng = np.random.default_rng(seed)
  flat = {path: (path[-1] == 'scale') + rng.normal(0, 0.1, shape).astype(np.float32)
          for path, shape in model_dir.param_shapes(cfg).items() if path[0] in ('bert', 'mlm') or nsp and path[0] == 'nsp'}
  return traverse_util.unflatten_dict(flat)


def _model(cfg, params):
  graphdef, state, rest = nnx.split(
      nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0), nsp_head='nsp' in params)),
      nnx.Param, ...)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  return nnx.merge(graphdef, state, rest)


@functools.partial(jax.jit, static_argnums=0)
def _encode(cfg, params, ids, mask):
  """Our (MLM logits [B, T, V] at every position, last hidden state [B, T, D])."""
  model = _model(cfg, params)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  mlm, _ = model(ids, None, mask, positions)
  return mlm, model.bert(ids, None, mask)[0]


def _all_logits(cfg, params, ids, mask):
  return np.asarray(_encode(cfg, params, ids, mask)[0])


def _padded_batch(lengths=(30, 17, 9, 24), seq=32, vocab=64, seed=0):
  rng = np.random.default_rng(seed)
  ids, mask = np.zeros((len(lengths), seq), np.int32), np.zeros((len(lengths), seq), np.int32)
  for b, n in enumerate(lengths):
    ids[b, :n], mask[b, :n] = rng.integers(5, vocab, n), 1
    ids[b, 0], ids[b, n - 1] = tk.CLS_ID, tk.SEP_ID
  return ids, mask


def _assert_trees_identical(a, b):
  flat_a, flat_b = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
  assert flat_a.keys() == flat_b.keys()
  for path in flat_a:
    assert np.array_equal(np.asarray(flat_a[path]), np.asarray(flat_b[path])), path


def _one_line(excinfo):
  assert '\n' not in str(excinfo.value)
  return str(excinfo.value)


@pytest.mark.parametrize('use_bias', [False, True])
def test_name_table_covers_every_parameter_but_the_pooler_once(use_bias):
  cfg = _modern_cfg(use_bias=use_bias)
  table = modernbert._name_table(cfg)  # pylint: disable=protected-access
  shapes = model_dir.param_shapes(cfg)
  paths = [p for e in table for p in e.paths]
  assert sorted(map(str, paths)) == sorted(str(p) for p in shapes if p[:2] != ('bert', 'pooler') and p[0] in ('bert', 'mlm'))
  names = [e.hf_name for e in table]
  assert len(set(names)) == len(names)
  biases = [p for p in paths if p[-1] == 'bias']
  if use_bias:
    assert ('bert', 'layers', 0, 'attention', 'query', 'bias') in biases and len(biases) > 1
  else:  # the MLM decoder keeps its per-token bias, as ModernBERT's decoder_bias
    assert biases == [('mlm', 'bias')]


def test_architecture_decides_the_export():
  assert not modernbert.exports(config.preset('tiny'))
  # BERT-shaped: without token types DistilBERT, with an embedding size ELECTRA.
  assert [families.hf_model_type(config.preset('tiny', **o))
          for o in ({}, dict(type_vocab_size=0), dict(embedding_size=32))] == ['bert', 'distilbert', 'electra']
  assert families.hf_model_type(_modern_cfg()) == 'modernbert'
  assert modernbert.exports(_modern_cfg())
  assert families.hf_model_type(_modern_cfg(use_bias=True, attention_window=0, global_attention_every=0)) == (
      'modernbert')


@pytest.mark.parametrize('explicit_mask', [True, False])
def test_modernbert_matches_transformers(explicit_mask, record_property):
  """MLM logits of a random ModernBertForMaskedLM (3 layers, global / local window 8 / global, RoPE bases
  160000 and 10000, no biases) equal transformers' at the real positions of a padded batch longer than the
  window. Without a mask, the default from [PAD] gives the same logits."""
  cfg, params, has_mlm, has_nsp = families.load_hf_checkpoint(FIXTURE)
  assert has_mlm and not has_nsp and set(params) == {'bert', 'mlm'}
  assert (cfg.norm_position, cfg.position_embedding, cfg.mlp, cfg.type_vocab_size, cfg.use_bias) == (
      'pre', 'rotary', 'geglu', 0, False)
  assert cfg.layer_windows == (0, 8, 0) and (cfg.rope_theta, cfg.local_rope_theta) == (160000.0, 10000.0)
  # No pooler: the MLM head's dense and LayerNorm, where transformers starts a sequence classifier's head
  assert (cfg.pooler_activation, cfg.pooler_norm) == ('gelu', True)
  assert np.array_equal(params['bert']['pooler']['kernel'], params['mlm']['transform']['kernel'])
  assert np.array_equal(params['bert']['pooler_norm']['scale'], params['mlm']['layer_norm']['scale'])
  with np.load(os.path.join(FIXTURE, 'reference.npz')) as f:
    ref = dict(f)
  mask = ref['attention_mask']
  assert mask.shape[1] > 8 and mask.sum(1).min() < mask.shape[1]  # longer than the window, and padded
  logits = _all_logits(cfg, params, ref['input_ids'], mask if explicit_mask else None)
  diff = float(np.abs(logits[mask == 1] - ref['mlm_logits']).max())
  record_property('max_abs_diff_mlm_logits', diff)
  print(f'ModernBertForMaskedLM (transformers {ref["transformers_version"]}) vs bert_jax: {diff:.2e}')
  assert diff <= model_tolerance(cfg, np.abs(ref['mlm_logits']).max())


def test_export_import_round_trip_is_bit_exact(tmp_path):
  """The fixture imports, exports to the very tensors transformers saved, and imports back bit-exactly."""
  cfg, params, _, _ = families.load_hf_checkpoint(FIXTURE)
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params)
  theirs, ours = (st_numpy.load_file(os.path.join(d, model_dir.WEIGHTS_FILE)) for d in (FIXTURE, out))
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    assert np.array_equal(ours[name], theirs[name]), name
  with open(os.path.join(out, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    exported = json.load(f)
  assert exported['architectures'] == ['ModernBertForMaskedLM'] and exported['model_type'] == 'modernbert'
  cfg2, params2, has_mlm, _ = families.load_hf_checkpoint(out)
  assert cfg2 == cfg and has_mlm
  _assert_trees_identical(params, params2)


@pytest.mark.parametrize('use_bias', [False, True])
def test_random_model_round_trip_with_a_tokenizer(tmp_path, use_bias):
  cfg = _modern_cfg(use_bias=use_bias, global_attention_every=0)  # every layer local
  params = _random_params(cfg, nsp=True)
  directory = tmp_path / 'vocab'
  directory.mkdir()
  (directory / 'vocab.txt').write_text('\n'.join(tk.SPECIAL_TOKENS + ('the', 'cat', '##s')) + '\n')
  tokenizer = tk.WordPieceTokenizer.from_directory(str(directory))
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, tokenizer)  # the NSP head and the pooler are left out, with a warning
  cfg2, params2, has_mlm, has_nsp = families.load_hf_checkpoint(out)
  # the import's pooler is ModernBERT's classification head, started from the MLM head (ours is not exported)
  assert cfg2 == dataclasses.replace(cfg, pooler_activation='gelu', pooler_norm=True) and has_mlm and not has_nsp
  params.pop('nsp')
  params['bert']['pooler'] = params['mlm']['transform']
  params['bert']['pooler_norm'] = params['mlm']['layer_norm']
  _assert_trees_identical(params, params2)
  assert model_dir.load_hf_tokenizer(out).encode('the cats') == tokenizer.encode('the cats')
  # An encoder alone exports as ModernBertModel and imports without the head: the pooler drawn (seed 0)
  families.save_hf_checkpoint(str(tmp_path / 'encoder'), cfg, {'bert': params['bert']})
  _, encoder, has_mlm, _ = families.load_hf_checkpoint(str(tmp_path / 'encoder'))
  assert not has_mlm and set(encoder) == {'bert'}
  drawn = {k: encoder['bert'].pop(k) for k in ('pooler', 'pooler_norm')}
  assert np.std(drawn['pooler']['kernel']) == pytest.approx(cfg.initializer_range, rel=0.1)
  assert (drawn['pooler_norm']['scale'] == 1).all()
  _assert_trees_identical({'bert': {k: v for k, v in params['bert'].items() if k not in drawn}}, encoder)


@pytest.mark.parametrize('overrides', [
    dict(norm_position='pre'),  # pre-LN with biases and learned positions
    dict(position_embedding='rotary'),
    dict(mlp='geglu'),
    dict(use_bias=False),
    dict(attention_window=4),
    dict(MODERN, embedding_size=16),  # ELECTRA's embedding width belongs to BERT-shaped models only
    dict(MODERN, position_embedding='learned'),
    dict(MODERN, type_vocab_size=2),
])
def test_other_architectures_export_as_bert_jax_only(tmp_path, overrides):
  cfg = config.preset('tiny', vocab_size=64, **overrides)
  params = _random_params(cfg)  # the refusal comes first, whatever the parameters
  with pytest.raises(CheckpointError, match='this architecture exports as bert_jax only') as e:
    families.save_hf_checkpoint(str(tmp_path / 'out'), cfg, params)
  message = _one_line(e)
  assert 'Hugging Face has BERT' in message and 'ModernBERT' in message
  assert not os.path.exists(tmp_path / 'out')  # refused before writing anything


@pytest.mark.parametrize('types,local,expected', [
    (['full_attention'] * 3, 128, (0, 0)),
    (['full_attention', 'sliding_attention', 'sliding_attention'] * 2, 128, (128, 3)),
    (['full_attention', 'sliding_attention', 'sliding_attention'], 128, (128, 3)),
    (['full_attention', 'sliding_attention'] * 2, 9, (8, 2)),  # odd: transformers' radius is 9 // 2
    (['sliding_attention'] * 2, 16, (16, 0)),
])
def test_layer_types_map_to_a_window_pattern(types, local, expected):
  assert modernbert._window_pattern('c', types, local) == expected  # pylint: disable=protected-access
  window, every = expected
  cfg = config.preset('tiny', num_layers=len(types), attention_window=window, global_attention_every=every)
  assert [('sliding_attention' if w else 'full_attention') for w in cfg.layer_windows] == types


def _variant(tmp_path, name, config_changes=None, edit=None):
  d = str(tmp_path / name)
  shutil.copytree(FIXTURE, d)
  if config_changes:
    path = os.path.join(d, model_dir.CONFIG_FILE)
    with open(path, encoding='utf-8') as f:
      cfg = json.load(f)
    cfg.update(config_changes)
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(cfg, f)
  if edit:
    path = os.path.join(d, model_dir.WEIGHTS_FILE)
    tensors = st_numpy.load_file(path)
    edit(tensors)
    st_numpy.save_file(tensors, path, metadata={'format': 'pt'})
  return d


@pytest.mark.parametrize('changes,pattern', [
    (dict(hidden_activation='gelu_pytorch_tanh'), "hidden_activation='gelu_pytorch_tanh', but bert_jax implements"),
    (dict(attention_bias=True), 'attention_bias=True, mlp_bias=False.*one switch for every bias'),
    (dict(layer_types=['sliding_attention', 'full_attention', 'sliding_attention']),
     r'global layers \[1\] of 3; bert_jax places them at 0, N, 2N'),
    (dict(layer_types=['full_attention', 'sliding_attention', 'chunked']), "layer_types has \\['chunked'\\]"),
    (dict(rope_parameters={'full_attention': {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 1e4}}),
     "rope_type='linear'"),
    (dict(tie_word_embeddings=False), 'tie_word_embeddings=false'),
    (dict(num_attention_heads=5), 'not divisible'),
])
def test_bad_modernbert_configs_are_one_line(tmp_path, changes, pattern):
  with pytest.raises(CheckpointError, match=pattern) as e:
    families.load_hf_checkpoint(_variant(tmp_path, 'bad', changes))
  _one_line(e)


def test_bad_modernbert_weights_are_one_line(tmp_path):
  missing = _variant(tmp_path, 'missing', edit=lambda t: t.pop('model.layers.1.attn_norm.weight'))
  with pytest.raises(CheckpointError, match='lacks 1 tensor.*3-layer ModernBERT needs: model.layers.1.attn_norm'):
    families.load_hf_checkpoint(missing)
  extra = _variant(tmp_path, 'extra', edit=lambda t: t.update({'model.layers.0.attn_norm.weight': np.ones(64, 'f4')}))
  with pytest.raises(CheckpointError, match='lacks: model.layers.0.attn_norm.weight; bert_jax imports ModernBertModel'):
    families.load_hf_checkpoint(extra)
  biased = _variant(tmp_path, 'biased', dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True))
  with pytest.raises(CheckpointError, match=r'\(biases on\) needs: model.embeddings.norm.bias'):
    families.load_hf_checkpoint(biased)
  untied = _variant(tmp_path, 'untied', edit=lambda t: t.update({'decoder.weight': np.zeros((96, 64), 'f4')}))
  with pytest.raises(CheckpointError, match='decoder.weight differs from model.embeddings.tok_embeddings.weight'):
    families.load_hf_checkpoint(untied)
  shape = _variant(tmp_path, 'shape', edit=lambda t: t.update({'model.layers.2.mlp.Wi.weight': np.zeros((64, 64), 'f4')}))
  with pytest.raises(CheckpointError, match=r'model.layers.2.mlp.Wi.weight has shape \(64, 64\) but config.json '
                     r'implies \(128, 64\)') as e:
    families.load_hf_checkpoint(shape)
  _one_line(e)
  # decoder_bias=false: the same function with a zero bias.
  no_bias = _variant(tmp_path, 'no_decoder_bias', dict(decoder_bias=False), edit=lambda t: t.pop('decoder.bias'))
  _, params, _, _ = families.load_hf_checkpoint(no_bias)
  assert not np.any(params['mlm']['bias'])


# --- against transformers itself (where it is installed) ------------------------------------------


def _transformers():
  return pytest.importorskip('torch'), pytest.importorskip('transformers')


@pytest.mark.slow
@pytest.mark.parametrize('overrides', [
    dict(),  # global, local, global
    dict(use_bias=True, global_attention_every=0),  # every layer local, biases on
    dict(attention_window=0, global_attention_every=0, rope_theta=10000.0),  # every layer global
])
def test_transformers_loads_the_export(tmp_path, overrides):
  """bert_jax -> ModernBertForMaskedLM / ModernBertModel: nothing missing or unexpected, and transformers
  computes our logits and hidden states at the real positions."""
  torch, transformers = _transformers()
  cfg = _modern_cfg(**overrides)
  params = _random_params(cfg)
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params)
  ids, mask = _padded_batch()
  inputs = dict(input_ids=torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)))
  real = mask == 1
  mlm, info = transformers.ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info
  with torch.no_grad():
    theirs = mlm.eval()(**inputs).logits.numpy()
  ours = _all_logits(cfg, params, ids, mask)
  assert np.abs(theirs[real] - ours[real]).max() <= model_tolerance(cfg, np.abs(theirs[real]).max())
  families.save_hf_checkpoint(str(tmp_path / 'encoder'), cfg, {'bert': params['bert']})
  encoder = transformers.ModernBertModel.from_pretrained(str(tmp_path / 'encoder')).eval()
  with torch.no_grad():
    theirs = encoder(**inputs).last_hidden_state.numpy()
  hidden = np.asarray(_encode(cfg, params, ids, mask)[1])
  assert np.abs(theirs[real] - hidden[real]).max() <= model_tolerance(cfg, np.abs(theirs[real]).max())


@pytest.mark.slow
def test_transformers_modernbert_with_biases_imports(tmp_path):
  """A random transformers ModernBERT with every bias on (and old-style config keys) imports and computes its logits."""
  torch, transformers = _transformers()
  torch.manual_seed(1)
  hf_config = transformers.ModernBertConfig(
      vocab_size=64, hidden_size=64, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
      max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=10, attention_bias=True,
      mlp_bias=True, norm_bias=True, classifier_bias=True, global_rope_theta=5000.0, local_rope_theta=700.0,
      pad_token_id=0)
  model = transformers.ModernBertForMaskedLM(hf_config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('bias') or 'norm' in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(str(tmp_path / 'hf'))
  cfg, params, _, _ = families.load_hf_checkpoint(str(tmp_path / 'hf'))
  assert cfg.use_bias and cfg.layer_windows == (0, 10, 10, 0) and (cfg.rope_theta, cfg.local_rope_theta) == (
      5000.0, 700.0)
  ids, mask = _padded_batch()
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                   attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
  real = mask == 1
  assert np.abs(theirs[real] - _all_logits(cfg, params, ids, mask)[real]).max() <= model_tolerance(
      cfg, np.abs(theirs[real]).max())


def _classifier_logits(cfg, params, ids):
  """Our sequence classifier's logits [B, num_labels] of padded rows (the mask from [PAD])."""
  model = heads.BertForSequenceClassification(cfg, params['classifier']['kernel'].shape[1], rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(model, state)
  return np.asarray(model(jnp.asarray(ids)))


@pytest.mark.slow
@pytest.mark.parametrize('use_bias', [False, True])
def test_a_sequence_classifier_is_transformers_and_round_trips(tmp_path, use_bias):
  """ModernBertForSequenceClassification (num_labels 1, classifier_pooling 'cls'; its head dense, GELU, LayerNorm on
  [CLS] after the final norm) is our sequence classifier with the ModernBERT import's pooler: a random one imports
  with transformers' logits, exports back to the same tensors (config: the class, 'cls', one label) and reimports
  bit-exactly; one started from a masked-LM checkpoint starts from its MLM head in both. 'mean' pooling and
  a classifier exported from a model without that pooler are one line each."""
  torch, transformers = _transformers()
  torch.manual_seed(2)
  hf_config = transformers.ModernBertConfig(
      vocab_size=64, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
      max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, num_labels=1,
      attention_bias=use_bias, mlp_bias=use_bias, norm_bias=use_bias, classifier_bias=use_bias)
  mlm = transformers.ModernBertForMaskedLM(hf_config).eval()
  with torch.no_grad():
    for name, p in mlm.named_parameters():
      if 'norm' in name or name.endswith('bias'):
        p.add_(0.1 * torch.randn_like(p))
  mlm.save_pretrained(str(tmp_path / 'mlm'))
  model = transformers.ModernBertForSequenceClassification.from_pretrained(str(tmp_path / 'mlm')).eval()
  assert torch.equal(model.head.dense.weight, mlm.head.dense.weight)  # the MLM head, by its shared names
  model.save_pretrained(str(tmp_path / 'hf'))
  ids, mask = _padded_batch(lengths=(30, 17, 9, 24), seq=32)
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                   attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
  cfg, params, has_mlm, _ = families.load_hf_checkpoint(str(tmp_path / 'hf'))
  assert set(params) == {'bert', 'classifier'} and not has_mlm and cfg.pooler_norm
  assert modernbert.read_hf_task(str(tmp_path / 'hf'))['kind'] == 'regression'
  atol = model_tolerance(cfg, np.abs(theirs).max())
  np.testing.assert_allclose(_classifier_logits(cfg, params, ids), theirs, rtol=0, atol=atol)
  # the masked-LM import: our pooler is its head, transformers' classifier's start (the classifier: theirs)
  _, from_mlm, _, _ = families.load_hf_checkpoint(str(tmp_path / 'mlm'))
  from_mlm = {'bert': from_mlm['bert'], 'classifier': params['classifier']}
  np.testing.assert_allclose(_classifier_logits(cfg, from_mlm, ids), theirs, rtol=0, atol=atol)

  task = dict(name='rerank', kind='regression', num_labels=1, label_names=[])
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, task=task)
  original, exported = (st_numpy.load_file(os.path.join(d, model_dir.WEIGHTS_FILE)) for d in (tmp_path / 'hf', out))
  assert sorted(exported) == sorted(original)
  for name in original:
    assert np.array_equal(exported[name], original[name]), name
  with open(os.path.join(out, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  assert (written['architectures'], written['classifier_pooling'], len(written['id2label'])) == (
      ['ModernBertForSequenceClassification'], 'cls', 1)
  cfg2, params2, _, _ = families.load_hf_checkpoint(out)
  assert cfg2 == cfg
  _assert_trees_identical(params, params2)

  mean = str(tmp_path / 'mean')
  shutil.copytree(out, mean)
  with open(os.path.join(mean, model_dir.CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump({**written, 'classifier_pooling': 'mean'}, f)
  with pytest.raises(CheckpointError, match="classifier_pooling='mean'; bert_jax's sequence classifier reads"):
    families.load_hf_checkpoint(mean)
  with pytest.raises(CheckpointError, match=r'model.pooler_activation=tanh, model.pooler_norm=False, but '
                                            "ModernBERT's classification head is dense, GELU, LayerNorm"):
    plain = dataclasses.replace(cfg, pooler_activation='tanh', pooler_norm=False)
    bert = {k: v for k, v in params['bert'].items() if k != 'pooler_norm'}
    families.save_hf_checkpoint(str(tmp_path / 'x'), plain, {'bert': bert, 'classifier': params['classifier']},
                                task=task)
  with pytest.raises(CheckpointError, match='a fine-tuned modernbert token model exports as bert_jax only'):
    families.save_hf_checkpoint(str(tmp_path / 'y'), cfg, {'bert': params['bert'], 'classifier': params['classifier']},
                                task=dict(task, kind='token'))
  assert not os.path.exists(tmp_path / 'x') and not os.path.exists(tmp_path / 'y')
