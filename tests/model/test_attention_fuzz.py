"""Every attention path against one plain masked softmax, on random seeded cases: padded and packed rows,
global and local windows (full masks and `band_mask`'s blocks), float32 and bfloat16, forward and backward.

Fused attention is where encoders go wrong silently (MaxText, 2026: cuDNN flash ignored packed-segment
boundaries), so the masks here come from the library's own builders (`attention_mask_b11s`, `segment_mask_b1ts`,
`window_mask_b1ts`, `band_mask`) and the reference's from the case's description alone (lengths, segment ids,
window), in float64 numpy with its backward written out. Padding keys and values are large, so a key that leaks
through a mask moves the result far beyond the tolerance.

A query that sees no key (a packed row's padding, a padding token whose window holds no real token, a row with no
real token) is defined this way: its output is finite and unspecified (callers ignore it: losses weight padding
by 0), its gradients are finite whatever the cotangent there, and it changes nothing for the other queries.
Every other query ("sighted", padding tokens of a padded row included) must match the reference.

Fast tier: a few small cases on CPU ('xla', 'einsum', the blockwise einsum path, the fused blockwise path with
implementation='xla'). `-m gpu` on an NVIDIA GPU: more and longer cases, cuDNN global and blockwise included.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import hardware
from bert_jax.config import preset
from bert_jax.model import attention, encoder
from bert_jax.model.dropout import Dropout

_TOL = {'float32': 2e-5, 'bfloat16': 3e-2}  # of the reference's largest magnitude (at least 1)
_PAD_SCALE = 30.0  # padding keys and values: a leak shows


@dataclasses.dataclass(frozen=True)
class Case:
  """One random batch: [B, T] key validity, segment ids (0 = padding; None for padded rows), window (0 = global)."""
  b: int
  t: int
  n: int
  h: int
  valid_bt: np.ndarray
  segments_bt: np.ndarray | None
  window: int

  def reference_mask(self) -> np.ndarray:
    """[B, T, S] from the description alone, not from the library's builders."""
    if self.segments_bt is None:
      mask = np.broadcast_to(self.valid_bt[:, None, :], (self.b, self.t, self.t))
    else:
      seg = self.segments_bt
      mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    if self.window:
      pos = np.arange(self.t)
      mask = mask & (np.abs(pos[:, None] - pos[None, :]) <= self.window // 2)[None]
    return np.asarray(mask, bool)

  def rows_bt(self) -> np.ndarray:
    """What the encoder gets: the 0/1 attention mask of padded rows, the segment ids of packed ones."""
    return self.valid_bt.astype(np.int32) if self.segments_bt is None else self.segments_bt

  def library_mask(self, kind: str, rows_bt: jax.Array) -> jax.Array:
    """The encoder's mask of `rows_bt` (traceable): 'full': [B, 1, 1 or T, S], windowed by `window_mask_b1ts`
    when local; 'band': `band_mask`'s blocks."""
    packed = self.segments_bt is not None
    if kind == 'band':
      return attention.band_mask(self.window, self.t, None if packed else rows_bt, rows_bt if packed else None)
    mask = encoder.segment_mask_b1ts(rows_bt) if packed else encoder.attention_mask_b11s(rows_bt)
    return encoder.window_mask_b1ts(mask, self.window) if self.window else mask


def _random_case(rng: np.random.Generator, rows: str, *, max_t: int, local: bool, even_t: bool = False,
                 window_multiple: int = 2, head_dims=(8, 16)) -> Case:
  """Random shapes; padded rows of random lengths (one full, one with no real token: every query blind) or packed
  rows of 1-4 segments with random boundaries (the last row ending in padding: blind queries); a random even window
  from 2 to beyond the row."""
  b, t = int(rng.integers(2, 5)), int(rng.integers(max(6, max_t // 3), max_t + 1))
  t += t % 2 if even_t else 0
  n, h = int(rng.integers(1, 5)), int(rng.choice(head_dims))
  if rows == 'padded':
    lengths = rng.integers(1, t + 1, b)
    lengths[0], lengths[-1] = t, 0
    valid, segments = np.arange(t)[None] < lengths[:, None], None
  else:
    segments = np.zeros((b, t), np.int32)
    for row in range(b):
      used = int(rng.integers(t // 2, t if row == b - 1 else t + 1))  # the rest is padding (segment 0)
      cuts = np.sort(rng.choice(np.arange(1, used), size=min(int(rng.integers(0, 4)), used - 1), replace=False))
      for seg, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, used]), start=1):
        segments[row, lo:hi] = seg
    valid = segments > 0
  window = 0
  if local:  # windows of a few tokens and ones wider than the row
    half = int(rng.choice([1, 2, 3, 4, t // 2, t, t + 3]))
    window = -(-2 * max(half, 1) // window_multiple) * window_multiple
  return Case(b, t, n, h, valid, segments, window)


def _inputs(rng: np.random.Generator, case: Case, dtype: str):
  """q, k, v [B, T, N, H] in `dtype` (padding positions' keys and values large) and a cotangent."""
  shape = (case.b, case.t, case.n, case.h)
  scale = np.where(case.valid_bt, 1.0, _PAD_SCALE)[:, :, None, None]
  q = rng.normal(size=shape) * 1.5
  k, v = rng.normal(size=shape) * scale, rng.normal(size=shape) * scale
  cot = rng.normal(size=shape)
  return [jnp.asarray(a, dtype) for a in (q, k, v)], cot


def _reference(q, k, v, mask_bts, cot):
  """Masked softmax attention in float64 and its vjp written out; a query with no key gives 0 (and no gradient).

  Returns (out, (dq, dk, dv)), [B, T, N, H] each.
  """
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scale = q.shape[-1] ** -0.5
  mask = mask_bts[:, None]  # [B, 1, T, S]
  logits = np.einsum('btnh,bsnh->bnts', q, k, optimize=True) * scale
  logits = np.where(mask, logits, -np.inf)
  top = np.max(logits, -1, keepdims=True)
  e = np.where(mask, np.exp(logits - np.where(np.isfinite(top), top, 0)), 0.0)
  p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
  out = np.einsum('bnts,bsnh->btnh', p, v, optimize=True)
  d_p = np.einsum('btnh,bsnh->bnts', cot, v, optimize=True)
  d_logits = p * (d_p - np.sum(d_p * p, -1, keepdims=True)) * scale
  dq = np.einsum('bnts,bsnh->btnh', d_logits, k, optimize=True)
  dk = np.einsum('bnts,btnh->bsnh', d_logits, q, optimize=True)
  dv = np.einsum('bnts,btnh->bsnh', p, cot, optimize=True)
  return out, (dq, dk, dv)


class _Kernels(attention.SelfAttention):
  """SelfAttention without its projections: its kernel choice and masking, on given q, k and v."""

  def __init__(self, cfg):  # pylint: disable=super-init-not-called
    self.probs_dropout = Dropout(0.0, impl=cfg.dropout_impl, rngs=nnx.Rngs(0))
    self.cfg = cfg
    self.platform = hardware.resolve()

  def queries_keys(self, x_btd, rope=None):
    del rope
    return x_btd[0], x_btd[1]

  def value(self, x_btd):  # pylint: disable=method-hidden
    return x_btd[2]

  def output(self, ctx_btnh):  # pylint: disable=method-hidden
    return ctx_btnh


def _path(name: str, case: Case, dtype: str):
  """(mask kind, f(q, k, v, mask) -> [B, T, N, H]) of one attention path.

  'xla', 'einsum', 'cudnn': `SelfAttention` with that forced kernel ('full' masks, windowed or not).
  'band-einsum', 'band-cudnn': `SelfAttention` on `band_mask`'s blocks (its blockwise einsums; cuDNN flash
  over the blocks). 'band-fused-xla': `blockwise_local_attention_fused(implementation='xla')`.
  """
  if name == 'band-fused-xla':
    return 'band', lambda q, k, v, m: attention.blockwise_local_attention_fused(q, k, v, m, implementation='xla')
  impl = {'band-einsum': 'xla', 'band-cudnn': 'cudnn'}.get(name, name)
  cfg = preset('tiny', vocab_size=8, num_heads=case.n, hidden_size=case.n * case.h, dtype=dtype,
               attention_impl=impl, attention_dropout=0.0, hidden_dropout=0.0)
  layer = _Kernels(cfg)
  # Training mode (the path that takes gradients): cuDNN then insists on even lengths, as in the trainer.
  return ('band' if name.startswith('band') else 'full'), lambda q, k, v, m: layer((q, k, v), m,
                                                                                  deterministic=False)


def _run(name, case, dtype, q, k, v, cots, compiler_options=None):
  """A path's output and its (dq, dk, dv) for each cotangent in `cots`, in float64 numpy; the masks are built
  by the library inside the compiled function, from what the encoder gets."""
  kind, fn = _path(name, case, dtype)

  def forward_backward(q, k, v, rows_bt, cots):
    mask = case.library_mask(kind, rows_bt)
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
    return out, [vjp(cot.astype(out.dtype)) for cot in cots]

  args = q, k, v, jnp.asarray(case.rows_bt()), [jnp.asarray(c, q.dtype) for c in cots]
  with jax.default_matmul_precision('highest'):  # float32 on GPU: no TF32
    compiled = jax.jit(forward_backward).lower(*args).compile(compiler_options)
    out, grads = compiled(*args)
  as_np = lambda x: np.asarray(x, np.float64)  # pylint: disable=unnecessary-lambda-assignment
  return as_np(out), [tuple(map(as_np, g)) for g in grads]


def _check_close(got, want, tol, what):
  err = np.max(np.abs(got - want), initial=0.0)
  bound = tol * max(1.0, np.max(np.abs(want), initial=0.0))
  assert err <= bound, f'{what}: max |error| {err:.3g} > {bound:.3g}'


def _check_case(case: Case, dtype: str, paths, rng: np.random.Generator, compiler_options=None):
  """Each path: outputs at sighted queries, and q/k/v gradients of a cotangent there, equal the reference;
  with a cotangent on every query (blind ones too), outputs and gradients are finite."""
  (q, k, v), cot = _inputs(rng, case, dtype)
  mask_bts = case.reference_mask()
  sighted_bt = mask_bts.any(-1)
  assert not sighted_bt.all(), 'every case holds queries that see no key'
  cot_sighted = cot * sighted_bt[:, :, None, None]
  want_out, want_grads = _reference(q, k, v, mask_bts, cot_sighted)
  tol = _TOL[dtype]
  rows = 'packed' if case.segments_bt is not None else 'padded'
  for name in paths:
    what = f'{name} {dtype} {rows} b={case.b} t={case.t} n={case.n} h={case.h} window={case.window}'
    out, (grads, grads_all) = _run(name, case, dtype, q, k, v, [cot_sighted, cot], compiler_options)
    _check_close(out[sighted_bt], want_out[sighted_bt], tol, f'{what}: output')
    for axis, got, want in zip('qkv', grads, want_grads):
      _check_close(got, want, tol, f'{what}: d{axis}')
    assert np.isfinite(out).all(), f'{what}: a query with no key gives a non-finite output'
    assert all(np.isfinite(g).all() for g in grads_all), f'{what}: a query with no key gives a non-finite gradient'


# The fast tier's time is XLA:CPU compiling a few dozen small functions; LLVM's optimisations (the backend's,
# after every HLO pass has run) change nothing these tests check, and take half of it.
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}
_CPU_GLOBAL = ('xla', 'einsum')
_CPU_BAND = ('band-einsum', 'band-fused-xla')


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('rows', ['padded', 'packed'])
def test_global_attention_matches_the_reference(rows, dtype):
  rng = np.random.default_rng([rows == 'packed', dtype == 'bfloat16'])
  _check_case(_random_case(rng, rows, max_t=48, local=False), dtype, _CPU_GLOBAL, rng, _FAST_COMPILE)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('rows', ['padded', 'packed'])
def test_local_attention_matches_the_reference(rows, dtype):
  """A window mask on the full path (one of the two kernels, the other in the other dtype) and `band_mask`'s
  blocks on the blockwise ones: the same function."""
  rng = np.random.default_rng([rows == 'packed', dtype == 'bfloat16', 7])
  full = _CPU_GLOBAL[(rows == 'packed') != (dtype == 'bfloat16')]
  _check_case(_random_case(rng, rows, max_t=64, local=True), dtype, (full,) + _CPU_BAND, rng, _FAST_COMPILE)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs an NVIDIA GPU: JAX_PLATFORMS=cuda pytest -m gpu')
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('rows', ['padded', 'packed'])
@pytest.mark.parametrize('local', [False, True], ids=['global', 'local'])
def test_every_path_matches_the_reference_on_gpu(local, rows, dtype):
  """Longer rows (up to 256) and wider heads; cuDNN (bfloat16 only) global and over `band_mask`'s blocks. Even
  row lengths and windows a multiple of 4 (blocks of an even length): cuDNN's backward with a mask needs them (the
  trainer picks 'xla' otherwise). About 2 minutes on an H200."""
  paths = _CPU_GLOBAL + (_CPU_BAND if local else ())
  if dtype == 'bfloat16' and hardware.resolve() == 'gpu':
    paths += ('cudnn', 'band-cudnn') if local else ('cudnn',)
  for seed in range(2 if dtype == 'bfloat16' else 1):  # float32: the kernels CPU runs, checked there too
    rng = np.random.default_rng([seed, rows == 'packed', dtype == 'bfloat16', local, 11])
    _check_case(_random_case(rng, rows, max_t=256, local=local, even_t=True, window_multiple=4,
                             head_dims=(16, 64)), dtype, paths, rng)
