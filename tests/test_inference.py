"""Inference: embeddings (order, padding, pooling), fill-mask, attention maps, input files, MiniLM parity."""

import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config, inference
from bert_jax.data import tokenization
from bert_jax.embedding import encoding
from bert_jax.errors import CheckpointError, ConfigError, DataError
from bert_jax.interop.pretrained import PretrainedBert
from bert_jax.model import heads

from harness.inputs import REPO, WIKITEXT, minilm_dir_or_skip
from harness.numerics import tolerance

TEXTS = [
    ('The game began development in 2010 .', None),
    ('It was', 'a pair of texts .'),
    ('Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ playing video game developed by '
     'Sega and Media.Vision for the PlayStation Portable .', None),
    ('', None),
    ('Short .', 'The second segment of this pair is a little longer than the first one .'),
    ('Yes', None),
]


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """A random tiny BertForPreTraining with a SentencePiece tokenizer trained on WikiText lines."""
  root = tmp_path_factory.mktemp('tiny')
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = [l for l in f.readlines()[:600] if l.strip()]
  tokenizer = tokenization.train_sentencepiece(lines, str(root / 'tokenizer.model'), vocab_size=300,
                                               lower_case=True)
  # A large init scale makes attention peaked, so any leak through padding would show.
  cfg = config.preset('tiny', vocab_size=tokenizer.vocab_size, max_position_embeddings=128,
                      initializer_range=0.2)
  params = nnx.to_pure_dict(nnx.state(heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param))
  return PretrainedBert(cfg, jax.device_get(params), tokenizer, 'bert_jax', str(root))


@nnx.jit  # one compilation per length instead of one per op and length
def _encoder_call(encoder, ids, types):
  return encoder(ids, types, jnp.ones_like(ids))


def _unpadded(tiny, text_a, text_b=None, max_length=128):
  """Reference: the encoder on one text at its exact length, no padding, no batching."""
  ids, types, _ = tiny.tokenizer.encode_inputs(text_a, text_b, max_length=max_length)
  seq, pooled = _encoder_call(tiny.encoder(), np.array([ids]), np.array([types]))
  return ids, types, np.asarray(seq[0]), np.asarray(pooled[0])


@pytest.mark.slow
def test_embed_rows_in_input_order_equal_unbatched_unpadded_runs(tiny):
  out = inference.embed(tiny, TEXTS, batch_size=4)
  lengths = out['attention_mask'].sum(1)
  assert out['input_ids'].shape[1] == lengths.max() == out['last_hidden_state'].shape[1]
  for i, (a, b) in enumerate(TEXTS):
    ids, types, seq, pooled = _unpadded(tiny, a, b)
    n = len(ids)
    assert lengths[i] == n and out['input_ids'][i, :n].tolist() == ids
    assert out['token_type_ids'][i, :n].tolist() == types
    np.testing.assert_allclose(out['last_hidden_state'][i, :n], seq, atol=2e-5)
    assert np.all(out['last_hidden_state'][i, n:] == 0) and np.all(out['input_ids'][i, n:] == 0)
    np.testing.assert_allclose(out['pooler_output'][i], pooled, atol=2e-5)


def test_mean_pooling_and_l2_normalisation(tiny):
  raw = inference.embed(tiny, TEXTS, normalize=False)
  mask = raw['attention_mask'][..., None]
  mean = (raw['last_hidden_state'] * mask).sum(1) / mask.sum(1)
  # Means over up to 48 tokens of hidden values up to about 3; the norms sum over 64 dimensions.
  np.testing.assert_allclose(raw['sentence_embedding'], mean, atol=tolerance(np.float32, 48, magnitude=3))
  unit = inference.embed(tiny, TEXTS)['sentence_embedding']
  np.testing.assert_allclose(unit, mean / np.linalg.norm(mean, axis=1, keepdims=True),
                             atol=tolerance(np.float32, 64, depth=2))
  np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=tolerance(np.float32, 64))


def test_cls_pooling(tiny):
  out = inference.embed(tiny, TEXTS, pooling='cls', normalize=False)
  np.testing.assert_array_equal(out['sentence_embedding'], out['last_hidden_state'][:, 0])
  unit = inference.embed(tiny, TEXTS, pooling='cls')['sentence_embedding']
  cls = out['last_hidden_state'][:, 0]
  np.testing.assert_allclose(unit, cls / np.linalg.norm(cls, axis=1, keepdims=True), atol=tolerance(np.float32, 64))


def test_pairs_get_token_type_one_after_the_first_sep(tiny):
  out = inference.embed(tiny, TEXTS)
  tok = tiny.tokenizer
  for i, (_, b) in enumerate(TEXTS):
    ids, types = out['input_ids'][i], out['token_type_ids'][i]
    seps = np.flatnonzero(ids == tok.sep_id)
    assert ids[0] == tok.cls_id
    assert len(seps) == (2 if b is not None else 1)
    assert np.all(types[:seps[0] + 1] == 0)
    if b is not None:
      assert np.all(types[seps[0] + 1:seps[1] + 1] == 1) and np.all(types[seps[1] + 1:] == 0)
    else:
      assert not types.any()


def test_long_texts_are_truncated_with_one_warning(tiny, capsys):
  capsys.readouterr()
  out = inference.embed(tiny, TEXTS, max_length=8)
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith('warning:')]
  assert out['input_ids'].shape[1] == 8
  truncated = sum(tiny.tokenizer.encode_inputs(a, b, max_length=8)[2] for a, b in TEXTS)
  assert 2 <= truncated < len(TEXTS)
  assert len(warnings) == 1 and 'max_length=8' in warnings[0], warnings
  assert f'{truncated} of {len(TEXTS)} texts' in warnings[0], warnings


@pytest.mark.slow
def test_one_compilation_per_length_bucket(tiny):
  texts = [(' '.join(['word'] * n), None) for n in range(1, 40)]
  inference.embed(tiny, texts, batch_size=4)
  compiled = encoding._encode._cache_size()  # pylint: disable=protected-access
  # Other lengths in the same buckets, another order, a smaller last batch: nothing new to compile.
  inference.embed(tiny, texts[::-1][:-3] + [('The game began .', 'Yes .')], batch_size=4)
  assert encoding._encode._cache_size() == compiled  # pylint: disable=protected-access


def test_progress_lines_with_eta(tiny, capsys):
  inference.embed(tiny, TEXTS * 3, batch_size=2, progress=True)
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith('embed: batch')]
  assert lines and lines[-1].startswith('embed: batch 9/9') and 'ETA' in lines[-1]
  inference.embed(tiny, TEXTS, batch_size=2)  # short input: quiet by default
  assert 'embed: batch' not in capsys.readouterr().out


@pytest.mark.parametrize('kwargs,error,pattern', [
    (dict(max_length=129), ConfigError, "exceeds the model's max_position_embeddings=128"),
    (dict(pooling='max'), ConfigError, 'pooling must be one of'),
    (dict(batch_size=0), ConfigError, 'batch_size must be positive'),
])
def test_embed_bad_arguments(tiny, kwargs, error, pattern):
  with pytest.raises(error, match=pattern):
    inference.embed(tiny, TEXTS, **kwargs)


def test_embed_no_texts(tiny):
  with pytest.raises(DataError, match='no texts'):
    inference.embed(tiny, [])


@pytest.mark.slow
def test_fill_mask_equals_softmax_of_mlm_logits(tiny):
  text = 'The game [MASK] development in 2010 , and [MASK] was released .'
  predictions = inference.fill_mask(tiny, text, top_k=4)
  ids, types, _ = tiny.tokenizer.encode_inputs(text, max_length=128)
  positions = np.flatnonzero(np.array(ids) == tiny.tokenizer.mask_id)
  assert len(predictions) == len(positions) == 2
  logits, _ = tiny.pretraining_model()(np.array([ids]), np.array([types]), np.ones((1, len(ids)), np.int32),
                                       positions[None])
  probs = np.asarray(jax.nn.softmax(logits[0], axis=-1))
  for top, p in zip(predictions, probs):
    assert len(top) == 4
    expected = np.argsort(-p)[:4]
    assert [t for t, _ in top] == [tiny.tokenizer.id_to_token(i) for i in expected]
    np.testing.assert_allclose([q for _, q in top], p[expected], rtol=tolerance(np.float32, 300, depth=2))  # vocab 300
    assert all(a[1] >= b[1] for a, b in zip(top, top[1:]))


@pytest.mark.slow
def test_fill_masks_batched_equal_one_at_a_time(tiny):
  texts = ['The game [MASK] development in 2010 , and [MASK] was released .', 'It [MASK] .',
           'A much longer sentence about the [MASK] of the game , which was released in Japan in 2010 .']
  batched = inference.fill_masks(tiny, texts, top_k=3, batch_size=2)  # two batches, padded rows
  for text, got in zip(texts, batched):
    alone = inference.fill_mask(tiny, text, top_k=3)
    assert [[t for t, _ in m] for m in got] == [[t for t, _ in m] for m in alone]
    np.testing.assert_allclose([[p for _, p in m] for m in got], [[p for _, p in m] for m in alone],
                               rtol=tolerance(np.float32, 300, depth=2))
  with pytest.raises(DataError, match='text 2 has no \\[MASK\\]'):
    inference.fill_masks(tiny, ['The [MASK] .', 'no mask here .'])


def test_fill_mask_errors(tiny):
  with pytest.raises(DataError, match='no \\[MASK\\]'):
    inference.fill_mask(tiny, 'A text without a mask .')
  encoder_only = PretrainedBert(tiny.config, {'bert': tiny.params['bert']}, tiny.tokenizer, 'hf', tiny.path)
  with pytest.raises(CheckpointError, match='no masked-LM head'):
    inference.fill_mask(encoder_only, 'The [MASK] .')


def test_attention_maps_rows_sum_to_one_and_equal_self_attention(tiny):
  tokens, probs = inference.attention_maps(tiny, 'The game began development in 2010 .', 'It was released .')
  ids, types, _ = tiny.tokenizer.encode_inputs('The game began development in 2010 .', 'It was released .',
                                               max_length=128)
  cfg = tiny.config
  assert tokens == [tiny.tokenizer.id_to_token(i) for i in ids] and tokens[0] == '[CLS]'
  assert probs.shape == (cfg.num_layers, cfg.num_heads, len(ids), len(ids)) and probs.dtype == np.float32
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=tolerance(np.float32, len(ids)))
  # Layer 0 straight from SelfAttention on the embeddings.
  enc = tiny.encoder()
  ids_1t, types_1t = np.array([ids]), np.array([types])
  x = enc.embeddings(ids_1t, types_1t, np.arange(len(ids))[None], deterministic=True)
  _, ref = enc.layers[0].attention(x, np.ones((1, 1, 1, len(ids)), bool), deterministic=True,
                                   return_probs=True)
  np.testing.assert_allclose(probs[0], np.asarray(ref[0]), atol=tolerance(np.float32, cfg.hidden_size))


def test_attention_details_are_the_encoders_attention_and_explain_it(tiny):
  text_a, text_b = 'The game began development in 2010 .', 'It was released .'
  d = inference.attention_details(tiny, text_a, text_b)
  ids, types, _ = tiny.tokenizer.encode_inputs(text_a, text_b, max_length=128)
  cfg, t = tiny.config, len(ids)
  assert d.tokens == [tiny.tokenizer.id_to_token(i) for i in ids] and list(d.segment_ids) == types
  assert list(np.flatnonzero(d.special)) == [0, types.index(1) - 1, t - 1]  # [CLS] and both [SEP]s
  assert d.query.shape == d.key.shape == (cfg.num_layers, cfg.num_heads, t, cfg.head_dim)
  # The encoder's own return_attention pass (compiled apart, so equal up to float32 rounding: sums over the hidden
  # size in each of the layers).
  _, _, probs_ref = jax.jit(lambda i, y: tiny.encoder()(i, y, return_attention=True))(np.array([ids]),
                                                                                         np.array([types]))
  np.testing.assert_allclose(d.probs, np.asarray(probs_ref)[:, 0], rtol=0,
                             atol=tolerance(np.float32, cfg.hidden_size, depth=cfg.num_layers))
  np.testing.assert_array_equal(d.probs, inference.attention_maps(tiny, text_a, text_b)[1])
  # The explainers' walk-through: scores = q·k/√d, and their softmax is the attention row.
  np.testing.assert_allclose(d.scores, np.einsum('lnth,lnsh->lnts', d.query, d.key) / np.sqrt(cfg.head_dim),
                             atol=tolerance(np.float32, cfg.head_dim, magnitude=np.abs(d.scores).max()))
  np.testing.assert_allclose(jax.nn.softmax(d.scores, axis=-1), d.probs, atol=tolerance(np.float32, t, depth=2))
  enc = tiny.encoder()
  x = enc.embeddings(np.array([ids]), np.array([types]), np.arange(t)[None], deterministic=True)
  np.testing.assert_allclose(d.query[0], np.asarray(enc.layers[0].attention.query(x))[0].transpose(1, 0, 2),
                             atol=tolerance(np.float32, cfg.hidden_size, magnitude=np.abs(d.query[0]).max()))


def test_attention_details_with_pre_ln_rotary_and_a_local_window(tiny):
  """The explorer's queries and keys are the ones attention uses (after the pre-LN norm, rotated); scores
  explain the probabilities in global layers, and local layers put no weight outside their window."""
  cfg = config.preset('tiny', vocab_size=tiny.config.vocab_size, max_position_embeddings=128, initializer_range=0.2,
                      norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False, type_vocab_size=0,
                      attention_window=4, global_attention_every=2)
  params = nnx.to_pure_dict(nnx.state(heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param))
  modern = PretrainedBert(cfg, jax.device_get(params), tiny.tokenizer, 'bert_jax', tiny.path)
  d = inference.attention_details(modern, 'The game began development in 2010 .', 'It was released .')
  t = len(d.tokens)
  _, _, probs_ref = jax.jit(lambda i: modern.encoder()(i, return_attention=True))(
      np.array([modern.tokenizer.encode_inputs('The game began development in 2010 .', 'It was released .',
                                               max_length=128)[0]]))
  # Compiled apart: equal up to float32 rounding of sums over the hidden size, in each layer.
  np.testing.assert_allclose(d.probs, np.asarray(probs_ref)[:, 0],
                             atol=tolerance(np.float32, cfg.hidden_size, depth=cfg.num_layers))
  np.testing.assert_allclose(jax.nn.softmax(d.scores[0], axis=-1), d.probs[0],  # layer 0: global
                             atol=tolerance(np.float32, t, depth=2))
  offset = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
  assert np.all(d.probs[1][:, offset > 2] == 0) and np.all(d.probs[0][:, offset > 2] > 0)  # layer 1: local
  window_scores = np.where(offset <= 2, d.scores[1], -np.inf)
  np.testing.assert_allclose(jax.nn.softmax(window_scores, axis=-1), d.probs[1], atol=tolerance(np.float32, t, depth=2))


@pytest.mark.slow
def test_encoder_attention_probs_ignore_padding(tiny):
  ids, types, _ = tiny.tokenizer.encode_inputs('The game began development .', max_length=128)
  n, pad = len(ids), 5
  enc = tiny.encoder()
  seq, pooled, probs = enc(np.array([ids + [0] * pad]), np.array([types + [0] * pad]),
                           np.array([[1] * n + [0] * pad]), return_attention=True)
  seq_ref, pooled_ref, probs_ref = enc(np.array([ids]), np.array([types]), return_attention=True)
  assert probs.shape == (tiny.config.num_layers, 1, tiny.config.num_heads, n + pad, n + pad)
  assert np.all(np.asarray(probs)[..., n:] == 0)  # padded keys get exactly zero
  np.testing.assert_allclose(probs[..., :n, :n], probs_ref,
                             atol=tolerance(np.float32, tiny.config.hidden_size, depth=tiny.config.num_layers))
  np.testing.assert_allclose(seq[:, :n], seq_ref, atol=2e-5)
  # The default call is unchanged: two outputs, equal to the return_attention ones up to float32
  # rounding (it attends through jax.nn.dot_product_attention, they through explicit einsums).
  seq2, pooled2 = enc(np.array([ids]), np.array([types]))
  close = tolerance(np.float32, tiny.config.intermediate_size, depth=tiny.config.num_layers)
  np.testing.assert_allclose(seq2, seq_ref, rtol=close, atol=close)
  np.testing.assert_allclose(pooled2, pooled_ref, rtol=close, atol=close)


def test_attention_maps_bad_max_length(tiny):
  with pytest.raises(ConfigError, match='max_position_embeddings=128'):
    inference.attention_maps(tiny, 'Hello .', max_length=512)


def test_read_texts(tmp_path):
  path = tmp_path / 'in.txt'
  path.write_bytes('first text\r\nsecond\tits pair\n\nform\x0cfeed \xff\n\n'.encode('utf-8') + b'bad \xff\n')
  assert inference.read_texts(str(path)) == [('first text', None), ('second', 'its pair'), ('', None),
                                             ('form\x0cfeed \xff', None), ('', None), ('bad \ufffd', None)]


@pytest.mark.parametrize('content,pattern', [
    (None, 'does not exist'),
    ('', 'has no text'),
    ('\n \n', 'has no text'),
    ('ok\na\tb\tc\n', 'line 2 has 3 tab-separated fields'),
])
def test_read_texts_bad_files(tmp_path, content, pattern):
  path = tmp_path / 'in.txt'
  if content is not None:
    path.write_text(content, encoding='utf-8')
  with pytest.raises(DataError, match=pattern):
    inference.read_texts(str(path))


# --- Real weights: all-MiniLM-L6-v2 against sentence-transformers' own embeddings. -----------------

MINILM_FIXTURE = os.path.join(REPO, 'tests', 'fixtures', 'minilm_reference.npz')


@pytest.fixture(scope='module')
def minilm():
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top
  return pretrained.load_pretrained(minilm_dir_or_skip())


def test_minilm_embeddings_match_sentence_transformers(minilm):
  if not os.path.exists(MINILM_FIXTURE):
    pytest.skip(f'{MINILM_FIXTURE} is missing (made by data/make_hf_reference.py)')
  ref = np.load(MINILM_FIXTURE)
  texts = [(str(t), None) for t in ref['st_texts']]
  # sentence-transformers truncates at its own max_seq_length (256 for this model).
  ours = inference.embed(minilm, texts, batch_size=4, max_length=int(ref['st_max_seq_length']))
  emb, st = ours['sentence_embedding'], ref['st_embeddings']
  cosine = (emb * st).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(st, axis=1))
  assert cosine.min() >= 0.99999, cosine
  # Both unit vectors, close element-wise too: float32 rounding of 6 layers' sums over 384 dimensions (ours and,
  # on another CPU, theirs).
  np.testing.assert_allclose(emb, st, atol=tolerance(np.float32, 384, depth=6, magnitude=np.abs(st).max()))


def test_minilm_has_no_mlm_head(minilm):
  with pytest.raises(CheckpointError, match='no masked-LM head'):
    inference.fill_mask(minilm, 'Paris is the [MASK] of France.')
