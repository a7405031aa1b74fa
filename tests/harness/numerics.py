"""Numbers compared: how far apart two float computations of one value may be (`tolerance`, `model_tolerance`,
`largest` for a tree's scale), and a module's call compiled as one program (`jitted`).

Production behaviour changed: none (`jitted` compiles a module's call with nnx.jit, as the library's inference tools
run it).
"""

import functools

import numpy as np


# `tolerance`'s multiple of eps * sqrt(n) * M (see there).
_ROUNDING_SPREAD = 4


def tolerance(dtype=np.float32, reduction_size: int = 1, magnitude: float = 1.0, *, depth: int = 1,
              worst_case: bool = False) -> float:
  """How far apart two float computations of the same value may be when they sum in different orders.

  For an `atol`, `magnitude` is the size of the values compared; for an `rtol`, leave it 1. For comparisons whose
  two sides may sum in different orders: jax against numpy, torch or transformers, sharded against one device,
  blockwise against dense, XLA's kernels on another CPU (with or without AVX-512: other vector widths, blockings and
  thread splits). Where the same program runs twice, or a resume must be bitwise, compare exactly instead.

  Derivation: rounding a result to `dtype` moves it by at most u = eps / 2 of its size (eps = np.finfo(dtype).eps:
  1.19e-7 for float32, 7.8e-3 for bfloat16). A sum of n = `reduction_size` terms whose partial sums stay below M
  (`magnitude`) rounds n - 1 times, each time by at most u * M. Two orders of one sum are each that far from the
  exact sum, so they differ by at most 2 (n - 1) u M < eps * n * M: the bound `worst_case=True` gives. Rounding
  errors of independent signs add like a random walk instead, the usual case (Higham, Accuracy and Stability of
  Numerical Algorithms, 2nd ed., sections 2.8 and 4.2): the two sums then differ by about sqrt(2 n / 3) u M =
  0.4 eps sqrt(n) M (one standard deviation). The default allows _ROUNDING_SPREAD (4) times eps sqrt(n) M, about
  ten of them: the largest of thousands of compared differences is about four, and the rest covers magnitudes a
  caller estimates rather than knows and errors that are not independent (the same weights in every row). A value
  that passes through `depth` such reductions one after another (e.g. a model's layers) carries each one's error
  into the next; through well-conditioned steps (LayerNorm, a softmax of O(1) scores, GELU) they add: times `depth`.

  Float32, n = 64, M = 1, depth = 2: 7.6e-6, where a wrong mask, a missing 1/sqrt(d) scale or a dropped term moves
  such values by 1e-2 or more.
  """
  if worst_case:
    return float(np.finfo(dtype).eps * reduction_size * magnitude * depth)
  return float(_ROUNDING_SPREAD * np.finfo(dtype).eps * np.sqrt(reduction_size) * magnitude * depth)


def largest(tree) -> float:
  """The largest absolute value in a tree of arrays: the `magnitude` for comparing gradients leaf by leaf. A leaf's
  own largest value is no measure of its terms where they cancel (a key bias's gradient under softmax is zero up to
  rounding: 1e-13 from terms of 1e-2)."""
  import jax  # pylint: disable=g-import-not-at-top
  return max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(tree))


def model_tolerance(cfg, magnitude: float = 1.0) -> float:
  """`tolerance` for a model's float32 outputs of size `magnitude` against PyTorch's (torch's kernels, and the CPU
  that made a stored reference, sum in other orders): the widest sum of a layer, once per layer. `cfg`: bert_jax's
  model config or a Hugging Face one."""
  width = max(getattr(cfg, name, 0) or 0 for name in ('intermediate_size', 'hidden_size', 'hidden_dim'))
  layers = next(getattr(cfg, name) for name in ('num_layers', 'num_hidden_layers', 'n_layers') if hasattr(cfg, name))
  return tolerance(np.float32, width, magnitude=float(magnitude), depth=layers)


@functools.cache
def _jitted_call():
  from flax import nnx  # pylint: disable=g-import-not-at-top
  return nnx.jit(lambda m, *args: m(*args))


def jitted(module):
  """`module(*args)` compiled as one program per shape (`nnx.jit`), as the library's inference tools run it. A first
  eager call compiles each operation on its own: MiniLM's encoder took 1.9 s so on 8 fake devices, 0.6 s jitted."""
  return lambda *args: _jitted_call()(module, *args)
