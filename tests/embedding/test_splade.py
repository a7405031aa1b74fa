"""The SPLADE objective: the FLOPS regulariser and its warm-up by hand, the ranking loss on dot products (not cosines),
padding left out, the loss and gradients of the global batch on 8 devices equal to one device's, and top terms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import contrastive, splade
from bert_jax.errors import ConfigError

from harness.numerics import tolerance


def test_flops_by_hand():
  w = np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 0.0]], np.float32)
  # means over the 2 rows: (0, 2, 1) -> 0 + 4 + 1
  assert float(splade.flops(jnp.asarray(w))) == pytest.approx(5.0)
  # A padding row (valid 0) is left out of the mean: only row 0 counts -> 0 + 1 + 4
  padded = np.concatenate([w[:1], np.full((1, 3), 9.0, np.float32)])
  assert float(splade.flops(jnp.asarray(padded), jnp.asarray([1, 0]))) == pytest.approx(5.0)


def test_the_warm_up_is_quadratic_then_flat():
  assert [splade.regularizer_factor(s, 4) for s in (0, 1, 2, 4, 9)] == [0.0, 1 / 16, 1 / 4, 1.0, 1.0]
  assert splade.regularizer_factor(0, 0) == 1.0  # no warm-up: the full weight from the first step


def _outputs(b=4, k=1, v=6, seed=0):
  rng = np.random.default_rng(seed)
  relu = lambda x: np.maximum(x, 0).astype(np.float32)
  e = {'query': relu(rng.normal(size=(b, v))), 'passage': relu(rng.normal(size=(b, v))),
       'negative': relu(rng.normal(size=(b, k, v)))}
  return e


def _numpy_loss(e, qw, dw, factor, temperature, valid):
  """The SpladeLoss by hand: cross-entropy over each query's dot products with all positives and negatives, plus the
  two FLOPS terms (documents: positives and negatives), padding rows out of every mean and of the candidates."""
  q, p, n = e['query'], e['passage'], e['negative']
  b, k, v = n.shape
  cand = np.concatenate([p, n.reshape(b * k, v)])
  cand_valid = np.concatenate([valid, np.repeat(valid, k)]).astype(bool)
  logits = q @ cand.T / temperature
  losses = []
  for i in range(b):
    if not valid[i]:
      continue
    keep = cand_valid.copy()
    keep[i] = True
    row = logits[i][keep]
    pos = logits[i, i]
    losses.append(np.log(np.exp(row - row.max()).sum()) + row.max() - pos)
  flops = lambda w, m: float(np.sum((w[m.astype(bool)].mean(0)) ** 2))
  return np.mean(losses) + factor * (qw * flops(q, valid) + dw * flops(cand, cand_valid.astype(np.float32)))


def test_the_objective_matches_the_loss_by_hand_and_ignores_padding():
  e = _outputs()
  valid = np.array([1, 1, 1, 0], np.float32)
  obj = splade.SparseRanking(temperature=0.5, query_weight=0.3, document_weight=0.2)
  batch = {'weights': jnp.asarray(valid), 'regularizer_factor': jnp.full((4,), 0.25, jnp.float32)}
  sums = jax.jit(obj.sums)({'embeddings': jax.tree.map(jnp.asarray, e)}, batch)
  counts = obj.counts(batch)
  loss = sum(float(sums[f'{t}_loss_sum']) / max(float(counts[t]), 1.0) for t in obj.terms)
  want = _numpy_loss(e, 0.3, 0.2, 0.25, 0.5, valid)
  assert loss == pytest.approx(want, rel=tolerance(np.float32, 12, depth=2))
  assert float(obj.summarize(sums)['loss']) == pytest.approx(want, rel=tolerance(np.float32, 12, depth=2))
  # Dot products, not cosines: scaling one query's weights changes its loss (a cosine would not move).
  scaled = dict(e, query=e['query'] * np.array([[3.0], [1], [1], [1]], np.float32))
  assert _numpy_loss(scaled, 0, 0, 0, 0.5, valid) != pytest.approx(_numpy_loss(e, 0, 0, 0, 0.5, valid))
  sums = jax.jit(obj.sums)({'embeddings': jax.tree.map(jnp.asarray, scaled)}, {**batch, 'regularizer_factor':
                                                                              jnp.zeros((4,), jnp.float32)})
  assert float(sums['ranking_loss_sum']) / 3 == pytest.approx(_numpy_loss(scaled, 0, 0, 0, 0.5, valid),
                                                              rel=tolerance(np.float32, 12))


def test_normalize_false_takes_no_matryoshka_dims():
  with pytest.raises(ConfigError, match='normalize=False'):
    contrastive.info_nce(jnp.ones((2, 4)), jnp.ones((2, 4)), temperature=1.0, dims=(4, 2), normalize=False)


def _model_loss(params, batch, obj):
  """A linear term-weight model (log1p of ReLU of x @ w: the encoder is not the point) under the objective."""
  def weights(x):
    return jnp.log1p(jax.nn.relu(x @ params['w']))
  e = {'query': weights(batch['q']), 'passage': weights(batch['p']), 'negative': weights(batch['n'])}
  sums = obj.sums({'embeddings': e}, batch)
  counts = obj.counts(batch)
  return sum(sums[f'{t}_loss_sum'] / jnp.maximum(counts[t], 1.0) for t in obj.terms)


def test_the_loss_on_8_devices_is_the_one_device_loss_of_the_global_batch():
  b, d, v = 32, 6, 40
  rng = np.random.default_rng(3)
  batch = {'q': rng.normal(size=(b, d)), 'p': rng.normal(size=(b, d)), 'n': rng.normal(size=(b, 1, d))}
  batch = {k: x.astype(np.float32) for k, x in batch.items()}
  batch.update(weights=np.ones(b, np.float32), regularizer_factor=np.full(b, 0.5, np.float32),
               passage_ids=rng.integers(0, b // 2, b).astype(np.int32),  # duplicates across devices
               negative_ids=rng.integers(b // 2, 2 * b, (b, 1)).astype(np.int32))
  params = {'w': rng.normal(size=(d, v)).astype(np.float32)}
  obj = splade.SparseRanking(temperature=1.0, query_weight=0.5, document_weight=0.3)
  loss = lambda p, x: _model_loss(p, x, obj)
  one = jax.jit(jax.value_and_grad(loss))(params, batch)
  mesh = sharding.make_mesh(config.MeshConfig(data=4, fsdp=2, tensor=1))
  many = jax.jit(sharding.under_mesh(mesh, jax.value_and_grad(loss)))(
      jax.device_put(params, sharding.replicated(mesh)), jax.device_put(batch, sharding.batch_sharding(mesh)))
  tol = tolerance(np.float32, 2 * b * v, magnitude=float(np.abs(one[1]['w']).max()), depth=2)
  np.testing.assert_allclose(many[0], one[0], rtol=tolerance(np.float32, 2 * b * v, depth=2))
  np.testing.assert_allclose(many[1]['w'], one[1]['w'], atol=tol)
  # Each device's 4 rows alone give another loss (their own candidates and FLOPS means): the equality is not vacuous.
  per_device = np.mean([float(jax.jit(loss)(params, jax.tree.map(lambda x, s=s: x[s:s + 4], batch)))
                        for s in range(0, b, 4)])
  assert abs(per_device - float(one[0])) > 0.1


def test_top_terms_are_the_largest_non_zero_weights_first():
  class Vocab:
    @staticmethod
    def id_to_token(i):
      return f't{i}'
  w = np.array([0.0, 0.5, 2.0, 0.0, 0.5], np.float32)
  assert splade.top_terms(w, Vocab, 3) == {'t2': 2.0, 't1': 0.5, 't4': 0.5}
  assert splade.top_terms(w, Vocab, 10) == {'t2': 2.0, 't1': 0.5, 't4': 0.5}  # zeros are not terms
