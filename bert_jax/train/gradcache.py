"""Cached in-batch negatives (GradCache, Gao et al. 2021): the exact gradient of a contrastive loss over a global
batch whose activations do not fit, computed micro-batch by micro-batch.

A contrastive loss couples every row of the batch (each query scores every passage), so plain gradient
accumulation, which sums independent micro-batch losses, changes the loss: its negatives are the micro-batch's
only. GradCache keeps the loss of the whole batch and splits the work:

  1. embed every micro-batch without keeping activations (`jax.lax.map`: one micro-batch's graph alive at a time);
  2. the loss of the whole batch of embeddings, and its gradient w.r.t. the embeddings (and w.r.t. the parameters
     the loss itself reads, e.g. a learned temperature);
  3. again per micro-batch (`jax.lax.scan`), the encoder's vector-Jacobian product (`jax.vjp`) of that micro-batch's
     embedding cotangents, summed into the parameter gradients.

Peak memory is one micro-batch's activations plus the embeddings of the whole batch; the cost is a second forward
pass. By the chain rule the gradient is exactly that of the loss of the whole batch, provided pass 3 recomputes the
very embeddings of pass 1. With dropout it only does if both passes draw the same dropout masks: a second pass with
fresh masks gives a gradient that is silently wrong (for the embeddings that pass 2's masks would give, at a loss
computed from pass 1's). Here the masks are a pure function of a key: micro-batch j is embedded with
`fold_in(rng, j)` in both passes (`micro_batch_keys`), and `embed_fn` must draw its dropout from the key it is given
and from nothing else (no RNG state carried between calls). `value_and_grad_uncached` is the same computation (same
micro-batches, same keys) through one graph: the reference the tests hold GradCache to, and the plain step to measure
it against.

Micro-batches take every k-th row (row r * k + j is row r of micro-batch j), as the train step's gradient
accumulation does: on a mesh the batch is split over the data/fsdp axes by contiguous rows, so strided micro-batches
stay spread over all devices instead of each landing on a few.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bert_jax.errors import ConfigError
from bert_jax.sharding import constrain

# embed_fn(params, micro_batch, key) -> embeddings (a pytree of [micro, ...] arrays)
EmbedFn = Callable[[Any, Any, jax.Array], Any]
# loss_fn(params, embeddings of the whole batch) -> (scalar loss, aux)
LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]


def _batch_size(batch) -> int:
  sizes = {x.shape[0] for x in jax.tree.leaves(batch)}
  if len(sizes) != 1:
    raise ConfigError(f'the batch\'s arrays disagree on the number of rows: {sorted(sizes)}')
  return sizes.pop()


def num_micro_batches(batch, micro_batch_size: int) -> int:
  """How many micro-batches of `micro_batch_size` rows the batch holds; ConfigError unless it divides the batch."""
  b = _batch_size(batch)
  if micro_batch_size < 1 or b % micro_batch_size:
    raise ConfigError(f'the micro-batch size {micro_batch_size} does not divide the global batch of {b} rows')
  return b // micro_batch_size


def _count(batch, micro_batch_size: int | None, micro_batches: int | None) -> int:
  """k, from `micro_batch_size` (a batch whose arrays share their rows) or given as `micro_batches` (each array's
  rows split in k: a packed batch's token rows and its pairs differ in number)."""
  if (micro_batch_size is None) == (micro_batches is None):
    raise ConfigError('give one of micro_batch_size and micro_batches')
  if micro_batches is None:
    return num_micro_batches(batch, micro_batch_size)
  for x in jax.tree.leaves(batch):
    if micro_batches < 1 or x.shape[0] % micro_batches:
      raise ConfigError(f'{micro_batches} micro-batches do not divide an array of {x.shape[0]} rows')
  return micro_batches


def split_micro_batches(batch, k: int):
  """[B, ...] -> [k, B / k, ...] with micro-batch j = rows j, j + k, j + 2k, ... (each stays split over the mesh)."""
  def split(x):
    x = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
    return constrain(x, (None, 'activation_batch') + (None,) * (x.ndim - 2))
  return jax.tree.map(split, batch)


def join_micro_batches(chunks):
  """The inverse of `split_micro_batches`: [k, B / k, ...] -> [B, ...] in the original row order."""
  def join(x):
    x = jnp.swapaxes(x, 0, 1)
    return constrain(x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), ('activation_batch',) + (None,) * (x.ndim - 2))
  return jax.tree.map(join, chunks)


def micro_batch_keys(rng: jax.Array, k: int) -> jax.Array:
  """The dropout key of each micro-batch, [k]: fold_in(rng, j). Both passes use these, so their masks agree."""
  return jax.vmap(lambda j: jax.random.fold_in(rng, j))(jnp.arange(k))


def embed_micro_batches(embed_fn: EmbedFn, params, chunks, keys):
  """Pass 1: embeddings [k, B / k, ...] of every micro-batch, one micro-batch's activations alive at a time and
  none kept for a backward pass."""
  params = jax.lax.stop_gradient(params)
  return jax.lax.map(lambda xs: embed_fn(params, xs[0], xs[1]), (chunks, keys))


def backprop_micro_batches(embed_fn: EmbedFn, params, chunks, keys, cotangents):
  """Pass 3: sum over micro-batches j of the vjp of `embed_fn(., chunk_j, key_j)` at `params` with the embedding
  cotangents [k, B / k, ...] of chunk j; the micro-batches are recomputed one at a time."""
  def body(grads, xs):
    chunk, key, cotangent = xs
    _, vjp = jax.vjp(lambda p: embed_fn(p, chunk, key), params)
    (g,) = vjp(cotangent)
    return jax.tree.map(jnp.add, grads, g), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, _ = jax.lax.scan(body, zeros, (chunks, keys, cotangents))
  return grads


def grad_cache(embed_fn: EmbedFn, loss_fn: LossFn, params, batch, rng: jax.Array, *,
               micro_batch_size: int | None = None, micro_batches: int | None = None):
  """((loss, aux), grads) of `loss_fn(params, embed(params, batch))` over the whole batch, by GradCache.

  Jittable (call it inside the jitted train step). Equal, up to float rounding, to `value_and_grad_uncached` with
  the same arguments.

  Args:
    embed_fn: (params, micro_batch, key) -> a pytree of embeddings with the micro-batch's rows leading; a pure
      function whose dropout masks come from `key` only.
    loss_fn: (params, embeddings of the whole batch in row order) -> (scalar loss, aux); `params` is there for
      parameters the loss reads itself (a learned temperature).
    params: the differentiated parameters (a pytree).
    batch: a pytree of [B, ...] arrays (the global batch).
    rng: the step's dropout key; micro-batch j uses `fold_in(rng, j)`.
    micro_batch_size: rows per micro-batch; must divide B.
    micro_batches: instead, the number k of micro-batches: every array's rows are split in k (their leading sizes
      may differ, e.g. a packed batch's token rows and its pairs).

  Raises:
    ConfigError: the micro-batch size does not divide the batch.
  """
  k = _count(batch, micro_batch_size, micro_batches)
  chunks, keys = split_micro_batches(batch, k), micro_batch_keys(rng, k)
  embeddings = join_micro_batches(embed_micro_batches(embed_fn, params, chunks, keys))
  (loss, aux), (loss_param_grads, embedding_grads) = jax.value_and_grad(
      loss_fn, argnums=(0, 1), has_aux=True)(params, embeddings)
  encoder_grads = backprop_micro_batches(embed_fn, params, chunks, keys, split_micro_batches(embedding_grads, k))
  return (loss, aux), jax.tree.map(jnp.add, loss_param_grads, encoder_grads)


def value_and_grad_uncached(embed_fn: EmbedFn, loss_fn: LossFn, params, batch, rng: jax.Array, *,
                            micro_batch_size: int | None = None, micro_batches: int | None = None):
  """The same ((loss, aux), grads) as `grad_cache`, differentiated through one graph of the whole batch (every
  micro-batch's activations kept): the reference, and the plain step whose memory GradCache saves."""
  k = _count(batch, micro_batch_size, micro_batches)
  chunks, keys = split_micro_batches(batch, k), micro_batch_keys(rng, k)

  def total(params):
    # lax.map, as pass 1, so each micro-batch goes through the very same function; differentiating it keeps every
    # micro-batch's activations (what GradCache avoids).
    embeddings = join_micro_batches(jax.lax.map(lambda xs: embed_fn(params, xs[0], xs[1]), (chunks, keys)))
    return loss_fn(params, embeddings)

  return jax.value_and_grad(total, has_aux=True)(params)
