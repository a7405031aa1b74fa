"""Layers: attention paths agree with a naive reference, LayerNorm and GELU match BERT; Dense's CPU tricks under
bfloat16 (`xla_default`: tests/test_hardware.py runs them again under XLA's default compiler configuration)."""

import functools
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config
from bert_jax.model import attention, encoder, layers

from harness.numerics import tolerance


def _attention(dropout=0.0):
  cfg = config.preset('tiny', vocab_size=50, attention_dropout=dropout)
  return cfg, attention.SelfAttention(cfg, rngs=nnx.Rngs(0))


def test_fused_and_explicit_attention_match_naive_reference():
  cfg, attn = _attention()
  x = jax.random.normal(jax.random.key(1), (2, 7, cfg.hidden_size))
  mask = jnp.array([[1] * 7, [1] * 4 + [0] * 3], bool)[:, None, None, :]
  fused = attn(x, mask, deterministic=True)
  explicit, probs = attn(x, mask, deterministic=True, return_probs=True)
  # Naive softmax(QK^T / sqrt(h)) V with the padding mask.
  q, k, v = attn.query(x), attn.key(x), attn.value(x)
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(cfg.head_dim)
  logits = np.where(np.asarray(mask), logits, -1e30)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  ref = attn.output(jnp.asarray(np.einsum('bnts,bsnh->btnh', p, v)))
  # Sums over the head size (scores), then the keys and the hidden size (outputs of size |ref|, 0.02 at this init).
  close = tolerance(np.float32, cfg.hidden_size, magnitude=np.abs(ref).max(), depth=2)
  np.testing.assert_allclose(fused, ref, atol=close)
  np.testing.assert_allclose(explicit, ref, atol=close)
  np.testing.assert_allclose(probs, p, atol=tolerance(np.float32, cfg.head_dim))
  assert np.all(np.asarray(probs)[1, :, :, 4:] == 0)  # padded keys get no attention


def test_attention_dropout_only_when_training():
  cfg, attn = _attention(dropout=0.5)
  x = jax.random.normal(jax.random.key(1), (2, 5, cfg.hidden_size))
  mask = jnp.ones((2, 1, 1, 5), bool)
  a = attn(x, mask, deterministic=True)
  b = attn(x, mask, deterministic=True)
  c = attn(x, mask, deterministic=False)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_layer_norm_matches_bert_definition():
  ln = layers.LayerNorm(8, eps=1e-12, dtype=jnp.float32)
  x = jax.random.normal(jax.random.key(0), (3, 8)) * 5 + 2
  ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
  np.testing.assert_allclose(ln(x), ref, atol=tolerance(np.float32, 8, magnitude=np.abs(ref).max(), depth=2))


def test_bfloat16_compute_keeps_float32_params_and_layernorm():
  cfg = config.preset('tiny', vocab_size=50, dtype='bfloat16')
  layer = encoder.EncoderLayer(cfg, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.hidden_size)).astype(jnp.bfloat16)
  y = layer(x, jnp.ones((2, 1, 1, 5), bool), deterministic=True)
  assert y.dtype == jnp.bfloat16
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(layer, nnx.Param)))


def test_truncated_normal_init_std():
  cfg = config.preset('tiny', vocab_size=5000)
  emb = layers.Embed(5000, 64, ('vocab', 'embed'), std=0.02, rngs=nnx.Rngs(0))
  w = np.asarray(emb.embedding[...])
  assert np.abs(w).max() <= 0.04 + 1e-6  # cut at 2 std
  assert 0.015 < w.std() < 0.02  # truncation shrinks the std below 0.02
  assert cfg.initializer_range == 0.02


def _dense_grads(dtype):
  dense = layers.Dense((16,), (24,), ('embed', 'mlp'), std=0.02, dtype=dtype, rngs=nnx.Rngs(0))
  dense.bias[...] = jax.random.normal(jax.random.key(2), (24,))
  x = jax.random.normal(jax.random.key(0), (4, 37, 16))
  g = jax.random.normal(jax.random.key(1), (4, 37, 24))
  def loss(d, x):
    return jnp.sum(d(x).astype(jnp.float32) * g)
  return dense, x, g, nnx.grad(loss, argnums=(0, 1))(dense, x)


@pytest.mark.xla_default
def test_a_bfloat16_dense_sums_its_bias_and_kernel_gradients_in_float32():
  # The forward is x @ W + bias in bfloat16 as before. The bias gradient is the float32 sum of the cotangent (jax's
  # own transpose sums it in bfloat16: a rounding per partial sum); on CPU the kernel gradient is the float32 product
  # x^T . dy (jax's own rounds it to bfloat16: relative errors ~2e-3), and the input gradient is jax's own.
  dense, x, g, (grads, dx) = _dense_grads(jnp.bfloat16)
  kernel = dense.kernel[...].astype(jnp.bfloat16)
  plain = lambda k, b, x: jnp.sum(((x.astype(jnp.bfloat16) @ k) + b.astype(jnp.bfloat16)).astype(jnp.float32) * g)
  dk_jax, _, dx_ref = jax.grad(plain, argnums=(0, 1, 2))(kernel, dense.bias[...], x)
  np.testing.assert_array_equal(dense(x), x.astype(jnp.bfloat16) @ kernel + dense.bias[...].astype(jnp.bfloat16))
  g16 = np.asarray(g.astype(jnp.bfloat16).astype(jnp.float32), np.float64)  # the bfloat16 cotangent, summed exactly
  x16 = np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  # float32 sums over the 4 x 37 rows against exact ones.
  bias_exact = g16.sum((0, 1))
  np.testing.assert_allclose(grads.bias[...], bias_exact,
                             atol=tolerance(np.float32, 4 * 37, magnitude=np.abs(bias_exact).max()))
  assert grads.bias[...].dtype == grads.kernel[...].dtype == jnp.float32
  dk_exact = x16.reshape(-1, 16).T @ g16.reshape(-1, 24)
  np.testing.assert_allclose(grads.kernel[...], dk_exact,
                             atol=tolerance(np.float32, 4 * 37, magnitude=np.abs(dk_exact).max()))
  assert np.max(np.abs(np.asarray(dk_jax, np.float64) - dk_exact)) > 10 * np.max(
      np.abs(np.asarray(grads.kernel[...], np.float64) - dk_exact))  # closer than jax's own bfloat16 result
  np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx_ref, np.float32), rtol=1e-2, atol=1e-2)


def _dots(hlo: str) -> list[tuple[str, str, str, str]]:
  """(lhs dtype, rhs dtype, lhs contracting axis, rhs contracting axis) of each 2-D dot in compiled HLO text."""
  found = []
  for computation in hlo.split('\n\n'):
    dtypes = dict(re.findall(r'%([\w.\-]+) = (\w+)\[', computation))
    for lhs, rhs, lhs_axis, rhs_axis in re.findall(r'dot\(%([\w.\-]+), %([\w.\-]+)\), '
                                                 r'lhs_contracting_dims=\{(\d+)\}, rhs_contracting_dims=\{(\d+)\}',
                                                 computation):
      found.append((dtypes[lhs], dtypes[rhs], lhs_axis, rhs_axis))
  return found


@pytest.mark.xla_default
def test_a_bfloat16_matmul_backward_runs_its_dots_in_row_major_layouts_on_cpu():
  # XLA:CPU runs a bfloat16 dot fast only when the lhs contracts its last axis and the rhs its first (both
  # row-major); jax's own backward asks for x^T . dy and dy . w^T, which it runs as float32 dots on upcast copies
  # (3x slower). The compiled forward and backward of `layers.matmul` have three dots, all in that layout (the
  # materialised transposes held), with bfloat16 operands on jax 0.12+ (0.10.2 upcasts one of them in any layout).
  x, w, dy = jnp.ones((256, 48), jnp.bfloat16), jnp.ones((48, 96), jnp.float32), jnp.ones((256, 96), jnp.bfloat16)
  def fwd_bwd(x, w):
    y, vjp = jax.vjp(functools.partial(layers.matmul, platform='cpu'), x, w)
    return (y,) + vjp(dy)
  dots = _dots(jax.jit(fwd_bwd).lower(x, w).compile().as_text())
  assert len(dots) == 3 and all(d[2:] == ('1', '0') for d in dots), dots
  if tuple(map(int, jax.__version__.split('.')[:2])) >= (0, 12):
    assert all(d[:2] == ('bf16', 'bf16') for d in dots), dots
  _, dx, dw = fwd_bwd(x, w)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_array_equal(dx, jnp.full((256, 48), 96, jnp.bfloat16))
  np.testing.assert_array_equal(dw, jnp.full((48, 96), 256, jnp.float32))


@pytest.mark.xla_default
def test_a_bfloat16_bias_gradient_is_one_float32_sum_on_cpu():
  # jax's own transpose of a bfloat16 bias add sums the cotangent in bfloat16, which XLA:CPU upcasts and rewrites
  # into windowed sums (reduce-window); `add_bias` compiles to one plain float32 reduction instead.
  y, b, g = jnp.ones((256, 96), jnp.bfloat16), jnp.ones((96,), jnp.float32), jnp.ones((256, 96), jnp.bfloat16)
  def backward(add):
    return lambda y, b, g: jax.vjp(add, y, b)[1](g)
  plain = backward(lambda y, b: y + b.astype(y.dtype))
  assert 'reduce-window' in jax.jit(plain).lower(y, b, g).compile().as_text()  # what `add_bias` avoids
  hlo = jax.jit(backward(layers.add_bias)).lower(y, b, g).compile().as_text()
  assert 'reduce-window' not in hlo and re.search(r'f32\[96\]\S* reduce\(', hlo), hlo
  _, db = jax.jit(backward(layers.add_bias))(y, b, g)
  assert db.dtype == jnp.float32
  np.testing.assert_array_equal(db, jnp.full((96,), 256, jnp.float32))


def test_row_major_transpose_of_any_leading_size():
  for m in (1, 2, 7, 8, 9, 12, 49, 64):
    a = jnp.arange(m * 5, dtype=jnp.float32).reshape(m, 5)
    np.testing.assert_array_equal(jax.jit(layers._row_major_transpose)(a), a.T)  # pylint: disable=protected-access


def test_a_float32_dense_keeps_jaxs_own_bias_gradient():
  dense, x, g, (grads, _) = _dense_grads(jnp.float32)
  plain = lambda b: jnp.sum((x @ dense.kernel[...] + b) * g)
  np.testing.assert_array_equal(grads.bias[...], jax.grad(plain)(dense.bias[...]))
