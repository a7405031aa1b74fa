"""Dropout whose masks come from a counter-based hash instead of threefry bits per element.

`jax.random.bernoulli` runs threefry for every element, which is costly on CPU, and BERT-base draws
~38M mask elements per 8 x 128 training step (attention probabilities and three hidden-state dropouts
per layer): a large part of a CPU step (the figures: docs/results.md). Here one
threefry call per dropout site gives two 32-bit seeds, and each element's keep bit comes from
hashing its global index with them (two rounds of MurmurHash3's 32-bit finaliser, a bijection
with full avalanche; a few integer operations per element). It is the same dropout (keep probability exact to
2^-32, masks independent across sites and steps, fixed by the key, so resumed runs replay
bit-exactly) computed with a cheaper generator; counter-based generators (Philox) are what
cuDNN and PyTorch's GPU dropout use for the same reason. Masks depend on global element
indices only, so every mesh layout draws the same mask. `impl='threefry'` gives flax's own
`nnx.Dropout` masks.
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import DROPOUT_IMPLS


def _fmix32(x: jax.Array) -> jax.Array:
  # MurmurHash3's finaliser: an invertible mix where every input bit flips each output bit
  # with probability ~1/2.
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def _linear_index(shape: tuple[int, ...]) -> jax.Array:
  # Built from per-axis iotas (not a reshaped 1-D iota) so sharded shapes partition without
  # moving data: each device computes the indices of its own block.
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    stride *= shape[axis]
  return index


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """Boolean mask, True with probability 1 - `rate` per element, a pure function of `key`."""
  if math.prod(shape) >= 2**32:
    raise ValueError(f'dropout over {math.prod(shape)} elements needs 64-bit indices')
  seeds = jax.random.bits(key, (2,), jnp.uint32)
  x = _fmix32(_linear_index(shape) * jnp.uint32(0x9E3779B9) + seeds[0])
  x = _fmix32(x ^ seeds[1])
  threshold = min(round(rate * 2**32), 2**32 - 1)
  return x >= jnp.uint32(threshold)


class Dropout(nnx.Dropout):
  """`nnx.Dropout` (same RNG stream, `deterministic` and reseeding) with hashed masks."""

  def __init__(self, rate: float, *, impl: str = 'hash', rngs: nnx.Rngs | None = None):
    if impl not in DROPOUT_IMPLS:
      raise ValueError(f'dropout impl must be one of {DROPOUT_IMPLS}, got {impl!r}')
    super().__init__(rate, rngs=rngs)
    self.impl = impl

  def __call__(self, inputs: jax.Array, *, deterministic: bool | None = None, rngs=None) -> jax.Array:
    deterministic = self.deterministic if deterministic is None else deterministic
    if self.impl == 'threefry' or deterministic or self.rate == 0.0 or self.rate == 1.0:
      return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
    if isinstance(rngs, jax.Array):
      key = rngs
    elif isinstance(rngs, nnx.Rngs):
      key = rngs[self.rng_collection]()
    else:
      key = (rngs or self.rngs)()
    keep = keep_mask(key, inputs.shape, self.rate)
    return jax.lax.select(keep, inputs / (1.0 - self.rate), jnp.zeros_like(inputs))
