"""Counter-based randomness: numbers that are pure functions of (key, stream, index).

The data pipeline builds rows of a global batch in several processes; each row's masks and
shuffles must not depend on which other rows share its batch or process. So instead of a
stateful generator, every random number here is a hash of a 64-bit key (e.g.
`key(seed, epoch, position)`), a small stream number (what the number is for) and a counter
(the element index), in the manner of splitmix64: `mix64` is its bijective finaliser, and
element j of a stream is `mix64(base + (j + 1) * GAMMA)` with `base` a mix of key and stream.

numpy only (no jax): these run in spawned data-worker processes. All uint64 arithmetic wraps
modulo 2**64 by design.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GAMMA = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, splitmix64's increment
_STREAM_SALT = np.uint64(0xD1B54A32D192ED03)
_U64 = (1 << 64) - 1
_KEY_START = 0x6A09E667F3BCC908  # sqrt(2)'s bits: any fixed start for `key`
_FEISTEL_ROUNDS = 8
_MIN_FEISTEL_BITS = 4  # tiny domains (n = 2, 3, ...) still get a keyed, non-trivial permutation
_BLOCK_ELEMENTS = 8192  # uint64s per block of work in `bits` (64 KiB)


def _u64(x) -> np.ndarray:
  """ints (any sign, wrapped mod 2**64) or integer arrays -> uint64 array."""
  if isinstance(x, (int, np.integer)):
    return np.asarray(int(x) & _U64, dtype=np.uint64)
  x = np.asarray(x)
  if x.dtype == np.uint64:
    return x
  if not (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
    raise TypeError(f'hash inputs must be integers, got {x.dtype}')
  return x.astype(np.uint64)  # negative int64 wraps (two's complement)


def _mix_inplace(z: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser on a writable uint64 array, in place (fewer temporaries)."""
  z ^= z >> np.uint64(30)
  z *= _M1
  z ^= z >> np.uint64(27)
  z *= _M2
  z ^= z >> np.uint64(31)
  return z


def mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijection of uint64 with good avalanche, elementwise.

  Returns a new uint64 array of x's shape (0-d for a scalar).
  """
  with np.errstate(over='ignore'):
    return _mix_inplace(np.array(_u64(x), dtype=np.uint64, copy=True))


def key(*parts: int | np.ndarray) -> np.ndarray:
  """Combines ints and integer arrays (broadcast together) into uint64 keys by chained mixing.

  key(a, b, c) = mix64(mix64(mix64(s0 ^ m(a)) ^ m(b)) ^ m(c)) with m(p) = mix64(p + GAMMA):
  order matters, and each part goes through a bijection, so distinct part tuples collide
  only by chance (about 2**-64 per pair). Example: key(seed, 1, positions_b) -> uint64[B].
  """
  h = _KEY_START
  i = 0
  while i < len(parts) and isinstance(parts[i], (int, np.integer)):  # leading ints: in Python, faster
    h = _mix_int(h ^ _mix_int(int(parts[i]) + int(GAMMA)))
    i += 1
  h = np.asarray(h, dtype=np.uint64)
  with np.errstate(over='ignore'):
    for p in parts[i:]:
      h = _mix_inplace(np.asarray(h ^ _mix_inplace(np.asarray(_u64(p) + GAMMA))))
  return h


def _mix_int(x: int) -> int:
  """mix64 of one Python int (no numpy call overhead)."""
  x &= _U64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
  return x ^ (x >> 31)


@functools.lru_cache(maxsize=256)
def _stream_salt(stream: int) -> np.uint64:
  return np.uint64(_mix_int(int(stream) * int(_STREAM_SALT) + int(GAMMA)))


@functools.lru_cache(maxsize=64)
def _counters(count: int) -> np.ndarray:
  """(j + 1) * GAMMA for j < count (read-only, shared)."""
  with np.errstate(over='ignore'):
    ctr = np.arange(1, count + 1, dtype=np.uint64) * GAMMA
  ctr.flags.writeable = False
  return ctr


def _stream_base(keys: np.ndarray, stream: int) -> np.ndarray:
  with np.errstate(over='ignore'):
    return _mix_inplace(np.asarray(_u64(keys) ^ _stream_salt(int(stream))))


def bits(keys: np.ndarray, shape_tail: tuple[int, ...], stream: int) -> np.ndarray:
  """Raw random uint64 of shape keys.shape + shape_tail; element [..., j] depends only on
  (that key, stream, flat index j within shape_tail) -- a splitmix64 sequence per (key, stream)."""
  shape_tail = tuple(int(s) for s in shape_tail)
  base = _stream_base(keys, stream)
  count = math.prod(shape_tail)
  ctr = _counters(count)
  flat_base = base.reshape(-1)
  out = np.empty((flat_base.size, count), np.uint64)
  # Blocks of keys small enough for the cache: the mix makes several passes over its data
  # (and big temporaries can cost page faults).
  step = max(1, _BLOCK_ELEMENTS // max(count, 1))
  with np.errstate(over='ignore'):
    for i in range(0, flat_base.size, step):
      z = out[i:i + step]
      np.add(flat_base[i:i + step, None], ctr, out=z)
      _mix_inplace(z)
  return out.reshape(base.shape + shape_tail)


def bits_at(keys: np.ndarray, index: np.ndarray, stream: int, rows: np.ndarray | None = None) -> np.ndarray:
  """Elementwise `bits`: element i is bits(key_i, (index[i] + 1,), stream)[index[i]], reading a
  stream at scattered indices without the rest. key_i is keys[i] (keys and index broadcast
  together) or, when `rows` is given, keys[rows[i]] (each key then mixed only once)."""
  base = _stream_base(keys, stream)
  if rows is not None:
    base = base[rows]
  index = np.asarray(index)
  if not np.issubdtype(index.dtype, np.integer):
    raise TypeError(f'bits_at needs integer indices, got {index.dtype}')
  with np.errstate(over='ignore'):
    z = index.astype(np.uint64)
    z += np.uint64(1)
    z *= GAMMA
    z = z + base
    return _mix_inplace(np.asarray(z))


def uniform(keys: np.ndarray, shape_tail: tuple[int, ...], stream: int) -> np.ndarray:
  """float64 in [0, 1) of shape keys.shape + shape_tail with 53 random bits each.

  Element [..., j] is a function of (key, stream, flat index j) only: the same key gives the
  same numbers whatever other keys share the call. Different streams (or keys) are
  independent for all practical purposes.
  """
  z = bits(keys, shape_tail, stream)
  z >>= np.uint64(11)
  return z.astype(np.float64) * (1.0 / (1 << 53))


def randint(keys: np.ndarray, shape_tail: tuple[int, ...], stream: int, low: int, high: int) -> np.ndarray:
  """int64 in [low, high), shape keys.shape + shape_tail, a function of (key, stream, index).

  floor(u * (high - low)) with u = `uniform(...)` (53 bits): the bias of any value is below
  (high - low) / 2**53 (under 4e-12 for a 30k vocabulary), i.e. none worth a rejection loop.
  """
  span = int(high) - int(low)
  if span <= 0:
    raise ValueError(f'randint needs low < high, got [{low}, {high})')
  if span > (1 << 53):
    raise ValueError(f'randint range {span} exceeds 2**53')
  r = (uniform(keys, shape_tail, stream) * span).astype(np.int64)
  np.minimum(r, span - 1, out=r)  # u * span < span exactly in float64, kept as a guard
  return r + int(low)


def permute(indices: np.ndarray, n: int, seed_key: int) -> np.ndarray:
  """A keyed bijection of [0, n) applied elementwise to `indices`: int64 of indices' shape.

  A Feistel network over b bits, b = max(ceil(log2 n), 4) (the next power of two >= n), with
  8 rounds whose round function is mix64 of the half-block and a per-round key; b odd splits
  unevenly and the two halves trade places every round. Values that land in [n, 2**b) are
  encrypted again (cycle walking) until they fall in [0, n), which keeps it a bijection of
  [0, n). O(1) memory beyond the arrays themselves (no permutation table), and element i's
  image depends only on (seed_key, n, indices[i]).
  """
  n = int(n)
  idx = np.asarray(indices)
  if not np.issubdtype(idx.dtype, np.integer):
    raise TypeError(f'permute needs integer indices, got {idx.dtype}')
  if n <= 0:
    raise ValueError(f'permute needs n >= 1, got {n}')
  out = idx.astype(np.int64, copy=True)
  if out.size and (out.min() < 0 or out.max() >= n):
    raise ValueError(f'permute indices must lie in [0, {n})')
  if n == 1:
    return out
  b = max((n - 1).bit_length(), _MIN_FEISTEL_BITS)
  round_keys = [key(seed_key, n, r) for r in range(_FEISTEL_ROUNDS)]
  flat = out.reshape(-1)
  todo = np.arange(flat.size)
  x = flat.astype(np.uint64)
  rounds = _feistel_rounds(b, tuple(int(k) for k in round_keys))
  bound = np.uint64(n)
  with np.errstate(over='ignore'):
    while todo.size:
      x = _feistel(x, rounds)
      back = x < bound
      flat[todo[back]] = x[back].astype(np.int64)
      todo, x = todo[~back], x[~back]
  return out


def _feistel_rounds(b: int, round_keys: tuple[int, ...]) -> list[tuple]:
  """Per round: (round key, low part's bits, its mask, high part's bits, its mask) as uint64."""
  hi_bits, lo_bits = b // 2, b - b // 2
  rounds = []
  for rk in round_keys:
    rounds.append((np.uint64(rk), np.uint64(lo_bits), np.uint64((1 << lo_bits) - 1), np.uint64(hi_bits),
                   np.uint64((1 << hi_bits) - 1)))
    hi_bits, lo_bits = lo_bits, hi_bits
  return rounds


def _feistel(x: np.ndarray, rounds: list[tuple]) -> np.ndarray:
  """One encryption of b-bit values: each round XORs a keyed hash (mix64) of the low part into
  the high part, then rotates so the parts swap; an even number of rounds restores the layout.
  Call under np.errstate(over='ignore')."""
  for rk, lo_bits, lo_mask, hi_bits, hi_mask in rounds:
    hi = x >> lo_bits
    lo = x & lo_mask
    f = _mix_inplace(lo ^ rk)
    f &= hi_mask
    hi ^= f
    lo <<= hi_bits
    lo |= hi
    x = lo
  return x
