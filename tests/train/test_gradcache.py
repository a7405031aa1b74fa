"""GradCache: its gradients equal the uncached computation's, with dropout on, on one device and on 8."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import contrastive
from bert_jax.model import biencoder
from bert_jax.train import gradcache
from bert_jax.errors import ConfigError
from bert_jax.model.dropout import keep_mask
from bert_jax.model.encoder import BertEncoder

from harness.numerics import tolerance

FEATURES, WIDTH, RATE = 6, 16, 0.2


def linear_embed(params, batch, key):
  """A linear encoder with the project's (hashed) dropout on its input and output, masks drawn from `key` alone.

  The encoder is not the point here and this one compiles in a fraction of BERT's time; the BERT test (slow tier)
  runs the same checks through `biencoder.embed_fn`."""
  out = {}
  for i, side in enumerate(('query', 'passage', 'negative')):
    if side not in batch:
      continue
    k_in, k_out = jax.random.split(jax.random.fold_in(key, i))
    x = batch[side] * keep_mask(k_in, batch[side].shape, RATE) / (1 - RATE)
    h = jnp.tanh(x @ params['encoder']['w'] + params['encoder']['b'])
    out[side] = h * keep_mask(k_out, h.shape, RATE) / (1 - RATE)
  return out



def _case(b=64, negatives=1, seed=0):
  rng = np.random.default_rng(seed)
  batch = {'query': rng.normal(size=(b, FEATURES)), 'passage': rng.normal(size=(b, FEATURES))}
  if negatives:
    batch['negative'] = rng.normal(size=(b, negatives, FEATURES))
  params = {'encoder': {'w': rng.normal(size=(FEATURES, WIDTH)), 'b': rng.normal(size=(WIDTH,))}}
  params = jax.tree.map(lambda x: x.astype(np.float32), params)
  params['temperature'] = biencoder.temperature_parameter(0.05)
  return params, {k: v.astype(np.float32) for k, v in batch.items()}


def loss_fn(params, e):
  """InfoNCE with a learned temperature (the loss reads it from the parameters itself), and symmetric."""
  out = contrastive.info_nce(e['query'], e['passage'], e.get('negative'), symmetric=True,
                             temperature=biencoder.bounded_temperature(params['temperature']))
  return contrastive.mean_loss(out['loss']), out['correct'].mean()


def _assert_trees_close(a, b, rel=1e-5):
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=rel * scale, rtol=0)


def _max_difference(a, b) -> float:
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(b))
  return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in
             zip(jax.tree.leaves(a), jax.tree.leaves(b))) / scale


def _run(fn, params, batch, rng, micro, embed=linear_embed, loss=loss_fn):
  return jax.jit(lambda p, b, k: fn(embed, loss, p, b, k, micro_batch_size=micro))(params, batch, rng)


# GradCache's and the uncached computation's results, one program shared by the tests that run them on one device:
# compiled together in 2.3 s, apart in 1.9 + 1.4 s (the fast tier's 5 s bound).
_cached_and_uncached_8 = jax.jit(lambda p, b, k: (
    gradcache.grad_cache(linear_embed, loss_fn, p, b, k, micro_batch_size=8),
    gradcache.value_and_grad_uncached(linear_embed, loss_fn, p, b, k, micro_batch_size=8)))


def test_gradients_equal_the_uncached_computation_with_dropout_on():
  # 64 pairs (+ a hard negative each) in micro-batches of 8, dropout 0.2, a learned temperature, symmetric.
  params, batch = _case()
  rng = jax.random.key(7)
  ((loss, acc), grads), ((ref_loss, ref_acc), ref_grads) = _cached_and_uncached_8(params, batch, rng)
  np.testing.assert_allclose(loss, ref_loss, rtol=tolerance(np.float32, 128))  # 128 candidates a query
  np.testing.assert_allclose(acc, ref_acc)
  _assert_trees_close(grads, ref_grads)
  assert float(np.abs(grads['temperature'])) > 0  # the loss's own parameter gets its gradient too


def test_a_second_pass_with_other_dropout_masks_would_be_caught():
  # What the equality above rules out: GradCache's silent bug, a second pass whose dropout masks differ from the
  # first's. Built from the same two passes, pass 3 drawing from another key: its gradient is off by far more than
  # the tolerance above, so the test fails for an implementation whose passes disagree.
  params, batch = _case()
  rng = jax.random.key(7)
  _, (_, ref_grads) = _cached_and_uncached_8(params, batch, rng)

  def mismatched(p, b):
    k = gradcache.num_micro_batches(b, 8)
    chunks = gradcache.split_micro_batches(b, k)
    first, second = gradcache.micro_batch_keys(rng, k), gradcache.micro_batch_keys(jax.random.key(8), k)
    e = gradcache.join_micro_batches(gradcache.embed_micro_batches(linear_embed, p, chunks, first))
    (_, _), (g_loss, g_emb) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(p, e)
    g_enc = gradcache.backprop_micro_batches(linear_embed, p, chunks, second,
                                             gradcache.split_micro_batches(g_emb, k))
    return jax.tree.map(jnp.add, g_loss, g_enc)

  assert _max_difference(jax.jit(mismatched)(params, batch), ref_grads) > 1e-2


def test_without_dropout_it_equals_one_pass_over_the_whole_batch():
  params, batch = _case(b=32, negatives=0)
  rng = jax.random.key(0)

  def embed(p, b, key):  # dropout off
    del key
    return {side: jnp.tanh(x @ p['encoder']['w'] + p['encoder']['b']) for side, x in b.items()}

  (loss, _), grads = _run(gradcache.grad_cache, params, batch, rng, 4, embed=embed)
  (ref_loss, _), ref_grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, embed(p, batch, rng)), has_aux=True))(
      params)
  np.testing.assert_allclose(loss, ref_loss, rtol=tolerance(np.float32, 32))
  _assert_trees_close(grads, ref_grads)


def test_micro_batches_take_every_kth_row_and_join_back():
  x = np.arange(12 * 2).reshape(12, 2)
  chunks = gradcache.split_micro_batches({'x': x}, 3)['x']
  assert chunks.shape == (3, 4, 2)
  np.testing.assert_array_equal(chunks[1, :, 0], [2, 8, 14, 20])  # rows 1, 4, 7, 10
  np.testing.assert_array_equal(gradcache.join_micro_batches({'x': chunks})['x'], x)


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused():
  params, batch = _case(b=12, negatives=0)
  with pytest.raises(ConfigError, match='micro-batch size 5 does not divide the global batch of 12 rows'):
    gradcache.grad_cache(linear_embed, loss_fn, params, batch, jax.random.key(0), micro_batch_size=5)


def test_micro_batches_split_arrays_of_different_row_counts():
  # A packed batch: its token rows and its pairs differ in number; each array's rows are split in k (its micro-batch
  # j: every k-th row from j, of each array). The whole step over such a batch: tests/embedding/test_packed_pairs.py.
  params, batch = _case(b=16, negatives=0)
  rows = {**batch, 'rows': np.arange(8 * 3).reshape(8, 3)}
  chunks = gradcache.split_micro_batches(rows, 4)
  assert chunks['query'].shape == (4, 4, FEATURES) and chunks['rows'].shape == (4, 2, 3)
  np.testing.assert_array_equal(chunks['rows'][1], rows['rows'][1::4])
  with pytest.raises(ConfigError, match='3 micro-batches do not divide an array of 16 rows'):
    gradcache.grad_cache(linear_embed, loss_fn, params, rows, jax.random.key(0), micro_batches=3)
  with pytest.raises(ConfigError, match='give one of micro_batch_size and micro_batches'):
    gradcache.grad_cache(linear_embed, loss_fn, params, rows, jax.random.key(0), micro_batches=4, micro_batch_size=4)
  with pytest.raises(ConfigError, match='disagree on the number of rows'):  # a batch size names one row count
    gradcache.grad_cache(linear_embed, loss_fn, params, rows, jax.random.key(0), micro_batch_size=4)


def test_on_8_devices_it_equals_one_device():
  params, batch = _case(b=64)
  rng = jax.random.key(3)
  one, _ = _cached_and_uncached_8(params, batch, rng)
  mesh = sharding.make_mesh(config.MeshConfig(data=4, fsdp=2))
  step = jax.jit(sharding.under_mesh(
      mesh, lambda p, b, k: gradcache.grad_cache(linear_embed, loss_fn, p, b, k, micro_batch_size=8)))
  many = step(jax.device_put(params, sharding.replicated(mesh)), jax.device_put(batch, sharding.batch_sharding(mesh)),
              rng)
  np.testing.assert_allclose(many[0][0], one[0][0], rtol=tolerance(np.float32, 128))
  _assert_trees_close(many[1], one[1])


@pytest.mark.slow
def test_tiny_bert_gradients_equal_the_uncached_computation_with_dropout_on():
  cfg = config.preset('tiny', vocab_size=64, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
                      hidden_dropout=0.1, attention_dropout=0.1)
  graphdef, params, rest = nnx.split(BertEncoder(cfg, rngs=nnx.Rngs(params=0, dropout=1)), nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  embed = biencoder.embed_fn(graphdef, rest, pooling='mean')
  rng = np.random.default_rng(0)
  batch = {}
  for side in ('query', 'passage'):
    batch[f'{side}_input_ids'] = rng.integers(1, 64, (64, 8)).astype(np.int32)
    batch[f'{side}_attention_mask'] = (np.arange(8) < rng.integers(3, 9, (64, 1))).astype(np.int32)

  def loss(p, e):
    return contrastive.mean_loss(contrastive.info_nce(e['query'], e['passage'], temperature=0.05)['loss']), ()

  cached = jax.jit(lambda p, b, k: gradcache.grad_cache(embed, loss, p, b, k, micro_batch_size=8))
  uncached = jax.jit(lambda p, b, k: gradcache.value_and_grad_uncached(embed, loss, p, b, k, micro_batch_size=8))
  (value, _), grads = cached(params, batch, jax.random.key(1))
  (ref_value, _), ref_grads = uncached(params, batch, jax.random.key(1))
  np.testing.assert_allclose(value, ref_value, rtol=tolerance(np.float32, 64, depth=2))
  _assert_trees_close(grads, ref_grads)
  # Dropout matters at this size: another key gives another gradient.
  assert _max_difference(uncached(params, batch, jax.random.key(2))[1], ref_grads) > 1e-2


def test_peak_memory_is_one_micro_batch_of_activations_not_the_whole_batch():
  # Compiled only (abstract inputs): XLA's own account of the scratch memory of each step. A 4-layer tanh tower
  # over 16 tokens keeps 4 x 16 x 32 floats per text for its backward pass; 512 pairs in micro-batches of 32.
  def tower(p, b, key):
    del key
    out = {}
    for side, h in b.items():
      for _ in range(4):
        h = jnp.tanh(h @ p['w'])
      out[side] = h.mean(1)
    return out

  def loss(p, e):
    del p
    return contrastive.mean_loss(contrastive.info_nce(e['query'], e['passage'], temperature=0.05)['loss']), ()

  batch = {side: jax.ShapeDtypeStruct((512, 16, 32), jnp.float32) for side in ('query', 'passage')}
  params = {'w': jax.ShapeDtypeStruct((32, 32), jnp.float32)}
  temp = {}
  for fn in (gradcache.grad_cache, gradcache.value_and_grad_uncached):
    step = jax.jit(lambda p, b, k, fn=fn: fn(tower, loss, p, b, k, micro_batch_size=32))
    temp[fn.__name__] = step.lower(params, batch, jax.random.key(0)).compile().memory_analysis().temp_size_in_bytes
  activations = 512 * 2 * 4 * 16 * 32 * 4  # pairs x sides x layers x tokens x width x float32: 16 MiB
  assert temp['value_and_grad_uncached'] > activations
  assert temp['grad_cache'] < temp['value_and_grad_uncached'] / 3
