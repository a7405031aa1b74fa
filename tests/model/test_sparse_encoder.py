"""SPLADE pooling by hand, and the sparse encoder's fresh masked-LM head: tied to the word embeddings, bias 0."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config
from bert_jax.model.sparse_encoder import SparseEncoder, splade_pool

from harness.numerics import tolerance


def test_pooling_by_hand():
  logits = np.array([[[1.0, -2.0, 0.5], [3.0, 0.0, -1.0], [9.0, 9.0, 9.0]]], np.float32)  # token 2 is padding
  mask = np.array([[1, 1, 0]], np.int32)
  want = [[np.log(1 + 3.0), 0.0, np.log(1 + 0.5)]]  # per term: max over the real tokens of log(1 + relu)
  np.testing.assert_allclose(np.asarray(splade_pool(jnp.asarray(logits), jnp.asarray(mask))), want, rtol=1e-6)
  # No real token: all 0 (not the padding's 9s).
  assert not np.asarray(splade_pool(jnp.asarray(logits), jnp.zeros((1, 3), jnp.int32))).any()


def test_a_fresh_head_decodes_with_the_word_embeddings_and_a_zero_bias():
  cfg = config.preset('tiny', vocab_size=50, hidden_size=16, num_heads=2, intermediate_size=32, num_layers=1)
  model = SparseEncoder(cfg, rngs=nnx.Rngs(0))
  assert not np.asarray(model.mlm.bias[...]).any()
  ids = jnp.asarray([[2, 7, 9, 0]], jnp.int32)
  mask = jnp.asarray([[1, 1, 1, 0]], jnp.int32)

  @nnx.jit
  def both(model, ids, mask):  # one program: the head by hand (decoder = word embeddings, no bias), and the model
    seq, _ = model.bert(ids, jnp.zeros_like(ids), mask)
    h = model.mlm.layer_norm(jax.nn.gelu(model.mlm.transform(seq), approximate=False))
    return h @ model.bert.embeddings.word_embeddings.embedding[...].T, model.weights(ids, mask)

  logits, got = map(np.asarray, both(model, ids, mask))
  want = np.max(np.where(np.asarray(mask)[..., None] > 0, np.log1p(np.maximum(logits, 0)), 0), axis=1)
  assert got.shape == (1, 50) and (got >= 0).all() and (got > 0).any()
  np.testing.assert_allclose(got, want, atol=tolerance(np.float32, 16, magnitude=float(np.abs(logits).max())))
