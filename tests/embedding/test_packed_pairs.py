"""Packed batches of pairs: every text in its own segment of a shared row, found again by (row, slot); the pooled
vectors and every loss equal the padded batch's, in the one train step with GradCache and on 8 devices."""

from flax import nnx
import jax
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import packed_pairs, pairs
from bert_jax.embedding.contrastive import Contrastive
from bert_jax.embedding.distillation import Distillation
from bert_jax.model.biencoder import BiEncoder, ContrastiveSpec
from bert_jax.train.step import StepModel

from harness.numerics import tolerance



class CharTokenizer:
  """[CLS]=1 + one id per character + [SEP]=2, cut at max_length; [PAD]=0 (test_pairs.py's)."""

  pad_id = 0

  def encode_inputs(self, text, text_b, max_length):
    del text_b
    ids = [1] + [3 + ord(c) % 50 for c in text][:max_length - 2] + [2]
    return ids, [0] * len(ids), len(text) > max_length - 2

WORDS = ('paris', 'is the capital of france', 'berlin', 'rome has seven hills and a river', 'the', 'what is',
         'who wrote the book about the sea', 'x', 'a long passage about rivers, hills and the sea in the south')


def _pairs(n=12, negatives=1, scores=False, seed=0):
  rng = np.random.default_rng(seed)
  pick = lambda: str(rng.choice(WORDS))  # pylint: disable=unnecessary-lambda-assignment
  return [pairs.Pair(pick(), pick(), tuple(pick() for _ in range(negatives)), i,
                     tuple(rng.normal(size=1 + negatives).round(3)) if scores else ()) for i in range(n)]


def _texts_at(batch, side, rows_of_micro=None):
  """Token ids of each text of `side`, cut from the packed rows by its (row, slot)."""
  out = []
  for r, s in zip(batch[f'{side}_row'].reshape(-1), batch[f'{side}_segment'].reshape(-1)):
    if rows_of_micro is not None:
      r = rows_of_micro(r)
    ids, segments, positions = batch['input_ids'][r], batch['segment_ids'][r], batch['position_ids'][r]
    mine = segments == s + 1
    np.testing.assert_array_equal(positions[mine], np.arange(mine.sum()))  # positions restart per text
    out.append(ids[mine].tolist())
  return out


def test_every_text_is_one_segment_of_a_row_found_by_its_row_and_slot():
  train = _pairs(n=10, negatives=2)
  tok = CharTokenizer()
  batch = packed_pairs.make_packed_batch(tok, train, pairs.passage_ids(train), list(range(7)), max_query_length=8,
                                         max_passage_length=24, batch_size=8, rows_multiple=4)
  padded = pairs.make_batch(tok, train, pairs.passage_ids(train), list(range(7)), max_query_length=8,
                            max_passage_length=24, batch_size=8)
  r, t = batch['input_ids'].shape
  assert t == 24 and r % 4 == 0 and batch['segment_lengths'].shape == (r, 3)  # 24 // 8 slots a row
  encode = lambda text, n: tok.encode_inputs(text, None, n)[0]  # pylint: disable=unnecessary-lambda-assignment
  assert _texts_at(batch, 'query')[:7] == [encode(p.query, 8) for p in train[:7]]
  assert _texts_at(batch, 'passage')[:7] == [encode(p.positive, 24) for p in train[:7]]
  assert _texts_at(batch, 'negative')[:14] == [encode(n, 24) for p in train[:7] for n in p.negatives]
  for name in ('passage_ids', 'negative_ids', 'weights'):  # the pairs' own arrays are the padded batch's
    np.testing.assert_array_equal(batch[name], padded[name])
  real = sum(len(x) for x in _texts_at(batch, 'query')[:7] + _texts_at(batch, 'passage')[:7] +
             _texts_at(batch, 'negative')[:14])
  assert packed_pairs.real_tokens(batch) == real
  padded_tokens = sum(v.size for k, v in padded.items() if k.endswith('_input_ids'))
  assert batch['input_ids'].size < padded_tokens


def test_micro_batches_are_packed_apart_and_interleaved():
  train = _pairs(n=8)
  tok = CharTokenizer()
  batch = packed_pairs.make_packed_batch(tok, train, pairs.passage_ids(train), list(range(8)), max_query_length=8,
                                         max_passage_length=16, batch_size=8, micro_batches=2, rows_multiple=2)
  r = batch['input_ids'].shape[0]
  assert r % 4 == 0
  for j in range(2):  # the train step's micro-batch j: every 2nd row and every 2nd pair, from j
    micro = {k: v[j::2] for k, v in batch.items()}
    assert micro['query_row'].max() < r // 2  # rows of its own micro-batch
    queries = _texts_at(micro, 'query')
    assert queries == [tok.encode_inputs(p.query, None, 8)[0] for p in train[j::2]]
  want = [len(tok.encode_inputs(p.positive, None, 16)[0]) for p in train]
  np.testing.assert_array_equal(packed_pairs.lengths(batch, 'passage', micro_batches=2), want)


def test_row_counts_come_from_a_few_sizes():
  assert [packed_pairs.row_count(n) for n in (1, 7, 16, 17, 18, 33, 100)] == [1, 7, 16, 18, 18, 36, 104]
  assert [packed_pairs.row_count(n, 8) for n in (1, 9, 24, 130, 200)] == [8, 16, 24, 144, 208]
  sizes = {packed_pairs.row_count(n, 2) for n in range(40, 80)}
  assert len(sizes) <= 16 and all(s % 2 == 0 for s in sizes)


# ------------------------------------------------------------------------------------ against the padded batch

_MODEL = config.preset('tiny', vocab_size=64, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
                       max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)


def _both(train, rows, **kw):
  tok, ids = CharTokenizer(), pairs.passage_ids(train)
  size = dict(max_query_length=8, max_passage_length=24, batch_size=8)
  padded = pairs.make_batch(tok, train, ids, rows, **size)
  return padded, packed_pairs.make_packed_batch(tok, train, ids, rows, **size, **kw)


def _close(a, b, err_msg='', depth=_MODEL.num_layers):
  # The same float32 model on other row layouts: sums of other lengths and orders (the widest 64), per layer.
  tol = tolerance(np.float32, 64, depth=depth)
  np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=err_msg)


@pytest.mark.parametrize('pooling,negatives', [('mean', 2), ('mean', 0), ('cls', 2)])
def test_pooled_vectors_and_losses_equal_the_padded_batch(pooling, negatives):
  spec = ContrastiveSpec(pooling=pooling)
  model = BiEncoder(_MODEL, spec, rngs=nnx.Rngs(0))
  embed = jax.jit(lambda b: model.embed(b, deterministic=True))
  train = _pairs(n=10, negatives=negatives, scores=bool(negatives))
  padded, packed = _both(train, list(range(7)))  # 7 pairs and a padding pair
  want, got = embed(padded), embed(packed)
  assert set(want) == set(got) == {'query', 'passage'} | ({'negative'} if negatives else set())
  for side in want:
    _close(got[side][:7], want[side][:7], side)
  objectives = [Contrastive(spec)] + ([Distillation(spec, loss='margin_mse'), Distillation(spec, loss='kl')]
                                      if negatives else [])
  outputs = lambda e: {'embeddings': e, 'temperature': model.temperature_value()}  # pylint: disable=unnecessary-lambda-assignment
  # Every objective's sums from each batch's own ids, weights and teacher scores (one program for both batches).
  sums = jax.jit(lambda e, b: [o.sums(outputs(e), b) for o in objectives])
  labels = lambda b: {k: v for k, v in b.items() if k in ('passage_ids', 'negative_ids', 'weights', 'teacher_scores')}  # pylint: disable=unnecessary-lambda-assignment
  for objective, ref, new in zip(objectives, sums(want, labels(padded)), sums(got, labels(packed))):
    for name in ref:
      _close(new[name], ref[name], f'{objective.terms[0]} {name}')
  # Not vacuous: texts pooled over their whole rows (attention and mean across the texts packed together) differ.
  leaky = {**packed, 'segment_ids': (packed['segment_ids'] > 0).astype(np.int32),
           'query_segment': np.zeros_like(packed['query_segment'])}
  leak = np.abs(np.asarray(embed(leaky)['query'][:7]) - np.asarray(want['query'][:7])).max()
  assert leak > 100 * tolerance(np.float32, 64, depth=_MODEL.num_layers)


def _step(batch, mesh, k, objective):
  model = StepModel(lambda rngs: BiEncoder(_MODEL, objective.spec, rngs=rngs), objective, optax.sgd(0.5), mesh,
                    grad_accum_steps=k)
  state, metrics = model.train_step(model.init_state(seed=0), model.global_batch(batch), model.rest)
  return jax.device_get(metrics), jax.device_get(state['params'])


@pytest.mark.slow
def test_the_train_step_with_gradcache_on_8_devices_equals_the_padded_one_and_one_device():
  spec = ContrastiveSpec(learn_temperature=True)
  objective = Contrastive(spec)
  train = _pairs(n=16, negatives=1)
  eight, one = sharding.make_mesh(config.MeshConfig(data=8)), sharding.make_mesh(
      config.MeshConfig(data=1), jax.devices()[:1])
  rows = list(range(16))
  padded = pairs.make_batch(CharTokenizer(), train, pairs.passage_ids(train), rows, max_query_length=8,
                            max_passage_length=24, batch_size=16)
  packed = packed_pairs.make_packed_batch(CharTokenizer(), train, pairs.passage_ids(train), rows,
                                          max_query_length=8, max_passage_length=24, batch_size=16,
                                          micro_batches=2, rows_multiple=8)
  assert packed['input_ids'].shape[0] % 16 == 0  # 2 micro-batches x 8 devices
  ref, ref_params = _step(padded, eight, 2, objective)  # GradCache over the padded sides
  got, got_params = _step(packed, eight, 2, objective)  # GradCache over the packed rows
  single, _ = _step(packed_pairs.make_packed_batch(CharTokenizer(), train, pairs.passage_ids(train), rows,
                                                   max_query_length=8, max_passage_length=24, batch_size=16),
                    one, 1, objective)
  for name in ('loss', 'accuracy', 'temperature', 'grad_norm'):  # forward and backward: depth 3, as test_objective
    _close(got[name], ref[name], name, depth=3)
    _close(single[name], ref[name], name, depth=3)
  for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(ref_params)):
    _close(a, b, depth=3)
