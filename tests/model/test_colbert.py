"""The multi-vector encoder: MaxSim by hand, the projection against the model, normalised token vectors."""

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config
from bert_jax.errors import ConfigError
from bert_jax.model.colbert import MultiVectorEncoder, MultiVectorSpec, maxsim, paired_maxsim


def test_maxsim_by_hand():
  # One query of 3 tokens (the last not scored) against two documents of 3 tokens (unscored ones marked).
  q = jnp.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
  q_mask = jnp.array([[1, 1, 0]])
  d = jnp.array([[[0.5, 0.1], [0.2, 0.9], [9.0, 9.0]],   # its third token is unscored: 9 never wins
                 [[-1.0, 0.0], [0.0, -2.0], [0.3, 0.4]]])
  d_mask = jnp.array([[1, 1, 0], [1, 1, 1]])
  # Doc 0: token (1, 0) -> max(0.5, 0.2) = 0.5; token (0, 1) -> max(0.1, 0.9) = 0.9; sum 1.4.
  # Doc 1: token (1, 0) -> max(-1, 0, 0.3) = 0.3; token (0, 1) -> max(0, -2, 0.4) = 0.4; sum 0.7.
  np.testing.assert_allclose(maxsim(q, q_mask, d, d_mask), [[1.4, 0.7]], rtol=1e-6)
  # Every query token scored: + max over doc 0's scored tokens of 1 + 1 -> 1.1, doc 1's -> 0.7.
  np.testing.assert_allclose(maxsim(q, jnp.ones((1, 3)), d, d_mask), [[2.5, 1.4]], rtol=1e-6)
  # A document with no scored token scores 0, not -inf.
  np.testing.assert_allclose(maxsim(q, q_mask, d, jnp.zeros((2, 3))), [[0.0, 0.0]])
  # Each query against its own candidates: the diagonal blocks of the full product.
  np.testing.assert_allclose(paired_maxsim(q, q_mask, d[None], d_mask[None]), [[1.4, 0.7]], rtol=1e-6)


def _tiny(hidden=32):
  return config.preset('tiny', vocab_size=64, hidden_size=hidden, num_heads=2, intermediate_size=64, num_layers=1)


def test_a_projection_wider_than_the_model_is_refused():
  with pytest.raises(ConfigError, match=r'projection_dim=64 must be between 1 and the model\'s hidden size 32'):
    MultiVectorEncoder(_tiny(), MultiVectorSpec(projection_dim=64), rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='temperature'):
    MultiVectorSpec(projection_dim=8, temperature=0.0).check(32)


def test_token_vectors_are_projected_and_normalised():
  model = MultiVectorEncoder(_tiny(), MultiVectorSpec(projection_dim=8), rngs=nnx.Rngs(0))
  ids = jnp.array([[2, 5, 7, 3, 0]])
  out = nnx.jit(lambda m, i, a: m.token_vectors(i, a))(model, ids, jnp.array([[1, 1, 1, 1, 0]]))
  assert out.shape == (1, 5, 8) and out.dtype == jnp.float32
  np.testing.assert_allclose(jnp.linalg.norm(out, axis=-1), 1.0, rtol=1e-5)
  assert model.projection.kernel[...].shape == (32, 8) and model.projection.bias is None
