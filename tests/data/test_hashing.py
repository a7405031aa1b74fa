"""Tests for bert_jax.data.hashing: counter-based randomness and the keyed permutation."""

import numpy as np
import pytest

from bert_jax.data import hashing

_MASK64 = (1 << 64) - 1


def _splitmix64_reference(seed, count):
  """The published splitmix64 generator, in Python ints."""
  out, state = [], seed
  for _ in range(count):
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    out.append(z ^ (z >> 31))
  return out


def test_mix64_is_splitmix64_finaliser():
  states = np.array([(0x9E3779B97F4A7C15 * (i + 1)) & _MASK64 for i in range(5)], np.uint64)
  assert [int(v) for v in hashing.mix64(states)] == _splitmix64_reference(0, 5)
  assert int(_splitmix64_reference(0, 1)[0]) == 0xE220A8397B1DCDAF  # the reference's first output
  x = np.arange(200_000, dtype=np.uint64)
  assert np.unique(hashing.mix64(x)).size == x.size  # bijective: no collisions
  assert hashing.mix64(x).dtype == np.uint64 and hashing.mix64(np.uint64(7)).shape == ()


def test_uniform_is_a_splitmix64_stream_of_the_key():
  """Element j of (key, stream) is output j of splitmix64 seeded with a mix of key and stream."""
  k = hashing.key(42)
  bits = hashing.bits(k, (6,), 3)
  base = int(hashing._stream_base(k, 3))  # pylint: disable=protected-access
  assert [int(v) for v in bits] == _splitmix64_reference(base, 6)
  u = hashing.uniform(k, (6,), 3)
  np.testing.assert_array_equal(u, (bits >> np.uint64(11)).astype(np.float64) / 2.0**53)


def test_key_combines_parts_in_order_and_broadcasts():
  a = hashing.key(1, 2)
  assert a.dtype == np.uint64 and a.shape == ()
  assert int(a) == int(hashing.key(1, 2)) != int(hashing.key(2, 1))
  assert int(hashing.key(1)) != int(hashing.key(1, 0)) != int(hashing.key(1, 0, 0))
  positions = np.arange(100_000)
  keys = hashing.key(7, 1, positions)
  assert keys.shape == (100_000,) and keys.dtype == np.uint64
  assert np.unique(keys).size == keys.size
  assert int(keys[123]) == int(hashing.key(7, 1, 123)) == int(hashing.key(7, 1, np.uint64(123)))
  np.testing.assert_array_equal(hashing.key(np.arange(3)[:, None], np.arange(4)),
                                [[int(hashing.key(i, j)) for j in range(4)] for i in range(3)])
  assert int(hashing.key(-1)) == int(hashing.key(_MASK64))  # ints wrap modulo 2**64
  assert int(hashing.key(7, 1, -5)) == int(hashing.key(7, 1, np.array([-5]))[0])
  with pytest.raises(TypeError):
    hashing.key(np.array([0.5]))


def test_uniform_depends_only_on_key_stream_and_index():
  keys = hashing.key(3, np.arange(8))
  u = hashing.uniform(keys, (4, 5), stream=2)
  assert u.shape == (8, 4, 5) and u.dtype == np.float64
  np.testing.assert_array_equal(u, hashing.uniform(keys, (4, 5), 2))
  # A key's numbers do not depend on the other keys of the call, their order, or their shape.
  np.testing.assert_array_equal(u[5], hashing.uniform(keys[5], (4, 5), 2))
  np.testing.assert_array_equal(u[::-1], hashing.uniform(keys[::-1], (4, 5), 2))
  np.testing.assert_array_equal(u.reshape(2, 4, 4, 5), hashing.uniform(keys.reshape(2, 4), (4, 5), 2))
  # Element [.., j] is the flat index j of the tail: a longer tail extends a shorter one.
  np.testing.assert_array_equal(u.reshape(8, 20), hashing.uniform(keys, (20,), 2))
  np.testing.assert_array_equal(u.reshape(8, 20), hashing.uniform(keys, (30,), 2)[:, :20])
  assert not np.array_equal(u, hashing.uniform(keys, (4, 5), 3))


def test_bits_at_reads_the_same_streams():
  keys = hashing.key(4, np.arange(6))
  full = hashing.bits(keys, (50,), 7)
  rows = np.array([0, 0, 5, 2, 5])
  index = np.array([0, 49, 3, 3, 17])
  np.testing.assert_array_equal(hashing.bits_at(keys[rows], index, 7), full[rows, index])
  np.testing.assert_array_equal(hashing.bits_at(keys, index, 7, rows=rows), full[rows, index])
  np.testing.assert_array_equal(hashing.bits_at(keys[:, None], np.arange(50), 7), full)  # broadcasts


def test_uniform_distribution():
  u = hashing.uniform(hashing.key(0, np.arange(1000)), (1000,), 0).ravel()  # 1e6 draws
  assert u.min() >= 0.0 and u.max() < 1.0
  assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))  # 53-bit grid
  assert u.mean() == pytest.approx(0.5, abs=0.002)  # sd of the mean: 0.0003
  assert u.var() == pytest.approx(1 / 12, abs=0.001)
  counts = np.bincount((u * 1000).astype(np.int64), minlength=1000)
  chi2 = np.sum((counts - 1000.0) ** 2 / 1000.0)
  assert chi2 < 1200  # df = 999: mean 999, sd 45
  # Low bits are as random as high ones.
  low = (u * 2.0**53).astype(np.int64) & 255
  counts = np.bincount(low, minlength=256)
  assert np.sum((counts - u.size / 256) ** 2 / (u.size / 256)) < 350  # df = 255


def _corr(x, y):
  return float(np.corrcoef(x.ravel(), y.ravel())[0, 1])


def test_streams_keys_and_indices_are_independent():
  keys = hashing.key(5, np.arange(1000))
  a = hashing.uniform(keys, (1000,), 0)
  b = hashing.uniform(keys, (1000,), 1)
  tol = 0.006  # about 6 standard errors at 1e6 pairs
  assert abs(_corr(a, b)) < tol  # streams of one key
  assert abs(_corr(a[:-1], a[1:])) < tol  # adjacent keys (consecutive positions)
  assert abs(_corr(a[:, :-1], a[:, 1:])) < tol  # adjacent indices of one stream
  assert abs(_corr(a, hashing.uniform(keys + np.uint64(1), (1000,), 0))) < tol  # keys one apart
  # Joint distribution of the two streams: a 10x10 contingency table is flat.
  table = np.bincount((a * 10).astype(int).ravel() * 10 + (b * 10).astype(int).ravel(), minlength=100)
  assert np.sum((table - 1e4) ** 2 / 1e4) < 180  # df = 99


def test_randint_range_and_uniformity():
  keys = hashing.key(9, np.arange(1000))
  r = hashing.randint(keys, (1000,), 4, -3, 14)
  assert r.dtype == np.int64 and r.shape == (1000, 1000)
  assert r.min() == -3 and r.max() == 13
  counts = np.bincount(r.ravel() + 3)
  expected = r.size / 17
  assert np.sum((counts - expected) ** 2 / expected) < 60  # df = 16
  np.testing.assert_array_equal(r, hashing.randint(keys, (1000,), 4, -3, 14))
  np.testing.assert_array_equal(hashing.randint(keys, (5,), 0, 0, 1), 0)
  big = hashing.randint(keys, (100,), 0, 0, 1 << 53)
  assert big.min() >= 0 and big.max() < 1 << 53
  with pytest.raises(ValueError):
    hashing.randint(keys, (1,), 0, 5, 5)


@pytest.mark.parametrize('n', [1, 2, 3, 7, 16, 17, 1000, 10**6])
def test_permute_is_a_bijection(n):
  p = hashing.permute(np.arange(n), n, seed_key=11)
  assert p.dtype == np.int64 and p.shape == (n,)
  np.testing.assert_array_equal(np.sort(p), np.arange(n))
  np.testing.assert_array_equal(p, hashing.permute(np.arange(n), n, 11))  # deterministic
  if n >= 1000:
    # Adjacent indices land far apart: |p(i+1) - p(i)| averages n/3 for a random permutation.
    assert np.abs(np.diff(p)).mean() / n == pytest.approx(1 / 3, abs=0.02)
    assert np.mean(p == np.arange(n)) < 0.01
    assert not np.array_equal(p, hashing.permute(np.arange(n), n, 12))  # seed dependence
    assert abs(_corr(np.arange(n), p)) < 0.1


def test_permute_elementwise_and_seeded():
  n = 12345
  full = hashing.permute(np.arange(n), n, 3)
  some = np.array([[5, 0], [n - 1, 77]])
  np.testing.assert_array_equal(hashing.permute(some, n, 3), full[some])  # pure per index
  np.testing.assert_array_equal(hashing.permute(np.int32(5), n, 3), full[5])
  seeds = [tuple(hashing.permute(np.arange(3), 3, s)) for s in range(300)]
  assert len(set(seeds)) == 6  # every permutation of 3 is reachable
  assert len({tuple(hashing.permute(np.arange(2), 2, s)) for s in range(50)}) == 2
  with pytest.raises(ValueError):
    hashing.permute(np.array([n]), n, 3)
  with pytest.raises(ValueError):
    hashing.permute(np.array([-1]), n, 3)
