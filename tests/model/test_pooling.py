"""Pooling and normalisation against numpy; the gradient of the normalisation at zero."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import pooling

from harness.numerics import tolerance


def test_mean_over_real_tokens_and_cls():
  rng = np.random.default_rng(0)
  seq = rng.normal(size=(3, 5, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.int32)
  mean = np.stack([seq[i, :mask[i].sum()].mean(0) for i in range(3)])
  np.testing.assert_allclose(pooling.pool(seq, mask, 'mean'), mean, atol=tolerance(np.float32, 5, magnitude=3))
  np.testing.assert_allclose(pooling.pool(seq, mask, 'cls'), seq[:, 0])
  with pytest.raises(ValueError, match='pooling must be one of mean, cls'):
    pooling.pool(seq, mask, 'max')


def test_normalize_and_truncate():
  x = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0]], np.float32)
  np.testing.assert_allclose(pooling.l2_normalize(x), [[3 / 13, 4 / 13, 12 / 13], [0, 0, 0]],
                             rtol=tolerance(np.float32, 3))
  np.testing.assert_allclose(pooling.truncate(x, 2)[0], [0.6, 0.8], rtol=tolerance(np.float32, 2))
  grad = jax.grad(lambda v: pooling.l2_normalize(v).sum())(jnp.zeros((1, 3)))
  assert np.all(np.isfinite(grad))  # jnp.linalg.norm's would be NaN at zero
