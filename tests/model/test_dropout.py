"""Hashed dropout masks: the keep rate, independence across keys and elements, determinism,
layout invariance, and the nnx.Dropout interface (deterministic, reseeding, threefry fallback)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.model.dropout import Dropout, keep_mask

SHAPE = (4, 8, 64, 64)  # 131,072 elements


def _mask(key, rate=0.1, shape=SHAPE):
  return np.asarray(jax.jit(keep_mask, static_argnums=(1, 2))(key, shape, rate))


@pytest.mark.parametrize('rate', [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_rate_within_5_sigma(rate):
  m = _mask(jax.random.key(3), rate)
  sigma = np.sqrt(rate * (1 - rate) / m.size)
  assert abs(m.mean() - (1 - rate)) < 5 * sigma


def test_masks_are_uncorrelated_across_keys_neighbours_and_axes():
  a = _mask(jax.random.key(0)).astype(float)
  b = _mask(jax.random.key(1)).astype(float)
  bound = 5 / np.sqrt(a.size)  # 5 sigma of a correlation estimate between independent masks
  assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < bound
  assert abs(np.corrcoef(a.ravel()[:-1], a.ravel()[1:])[0, 1]) < bound  # neighbouring elements
  assert abs(np.corrcoef(a[:, :, :-1].ravel(), a[:, :, 1:].ravel())[0, 1]) < bound  # neighbouring rows
  # the fraction kept in both equals the product of the rates, as for independent masks
  assert abs((a * b).mean() - a.mean() * b.mean()) < 5 * np.sqrt(0.81 * 0.19 / a.size)


def test_same_key_same_mask_and_consecutive_keys_differ():
  key = jax.random.key(7)
  np.testing.assert_array_equal(_mask(key), _mask(key))
  folded = [_mask(jax.random.fold_in(key, step)) for step in range(3)]
  assert (folded[0] != folded[1]).mean() > 0.15 and (folded[1] != folded[2]).mean() > 0.15


def test_sharded_inputs_draw_the_same_mask_as_one_device():
  mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(('data', 'fsdp'), 'tensor'))
  x = jax.device_put(jnp.ones(SHAPE), spec)
  key = jax.random.key(5)
  y = jax.jit(lambda x: jnp.where(keep_mask(key, x.shape, 0.1), x, 0.0), out_shardings=spec)(x)
  np.testing.assert_array_equal(np.asarray(y) > 0, _mask(key))


def test_module_scales_kept_values_and_follows_the_nnx_interface():
  layer = Dropout(0.25, rngs=nnx.Rngs(dropout=0))
  x = jnp.ones((32, 256))
  np.testing.assert_array_equal(layer(x, deterministic=True), x)
  y = np.asarray(layer(x, deterministic=False))
  np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.75], rtol=1e-6)
  assert np.asarray(layer(x, deterministic=False)).tolist() != y.tolist()  # the stream advances
  nnx.reseed(layer, dropout=11)
  first = np.asarray(layer(x, deterministic=False))
  nnx.reseed(layer, dropout=11)
  np.testing.assert_array_equal(layer(x, deterministic=False), first)  # reseeding replays
  threefry = Dropout(0.25, impl='threefry', rngs=nnx.Rngs(dropout=0))
  reference = nnx.Dropout(0.25, rngs=nnx.Rngs(dropout=0))
  np.testing.assert_array_equal(threefry(x, deterministic=False), reference(x, deterministic=False))
  with pytest.raises(ValueError, match='dropout impl'):
    Dropout(0.1, impl='philox', rngs=nnx.Rngs(0))
