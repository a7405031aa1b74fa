"""The contrastive batch through an nnx encoder: shapes per side, and dropout masks that are a function of the key."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import biencoder
from bert_jax.model.dropout import Dropout

from harness.numerics import tolerance


class ToyEncoder(nnx.Module):
  """BertEncoder's call signature over a token embedding, the project's Dropout and a dense layer (fast to compile;
  its dropout stream is reseeded as the real encoder's)."""

  def __init__(self, rate: float, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(32, 8, rngs=rngs)
    self.dropout = Dropout(rate, rngs=rngs)
    self.dense = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, input_ids_bt, token_type_ids_bt, attention_mask_bt, *, deterministic: bool):
    del token_type_ids_bt, attention_mask_bt
    return self.dense(self.dropout(self.embed(input_ids_bt), deterministic=deterministic)), None


def _batch(b=4, k=2, t=5):
  rng = np.random.default_rng(0)
  batch = {'query_input_ids': rng.integers(1, 32, (b, t)), 'passage_input_ids': rng.integers(1, 32, (b, t)),
           'negative_input_ids': rng.integers(1, 32, (b, k, t))}
  for side in ('query', 'passage', 'negative'):
    ids = batch[f'{side}_input_ids']
    batch[f'{side}_attention_mask'] = np.ones_like(ids)
    batch[f'{side}_attention_mask'][..., -1] = 0
  return {name: jnp.asarray(x, jnp.int32) for name, x in batch.items()}


def test_embed_fn_draws_its_dropout_masks_from_the_key_alone():
  graphdef, params, rest = nnx.split(ToyEncoder(0.5, rngs=nnx.Rngs(params=0, dropout=1)), nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  fn = jax.jit(biencoder.embed_fn(graphdef, rest, pooling='mean', normalize=False))
  batch = _batch()
  a, again, other = fn(params, batch, jax.random.key(0)), fn(params, batch, jax.random.key(0)), fn(
      params, batch, jax.random.key(1))
  assert a['query'].shape == (4, 8) and a['passage'].shape == (4, 8) and a['negative'].shape == (4, 2, 8)
  for side in a:
    np.testing.assert_array_equal(a[side], again[side])  # same key: same masks, same embeddings
    assert not np.allclose(a[side], other[side])
  # Queries and passages draw different masks from one key (the stream advances between the encoder's calls):
  # encoding the passages' tokens as queries would otherwise give the passages' embeddings.
  swapped = dict(batch, query_input_ids=batch['passage_input_ids'])
  assert not np.allclose(fn(params, swapped, jax.random.key(0))['query'], a['passage'])
  # Without dropout (train=False), embed_batch of the module: masked mean pooling, normalised.
  plain = jax.jit(biencoder.embed_fn(graphdef, rest, pooling='mean', train=False))(params, batch, jax.random.key(0))
  module = nnx.merge(graphdef, params, rest)
  seq = np.asarray(module(batch['query_input_ids'], None, None, deterministic=True)[0])
  mean = seq[:, :4].mean(1)  # the last token is padding
  np.testing.assert_allclose(plain['query'], mean / np.linalg.norm(mean, axis=1, keepdims=True),
                             atol=tolerance(np.float32, 8, depth=3))
