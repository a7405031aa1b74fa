"""BERT building blocks (flax.nnx): Dense, LayerNorm, Embed, Embeddings and rotary position tables.

Every parameter carries Flax's partitioning metadata (`nnx.with_partitioning`) with logical axis
names ('vocab', 'embed', 'heads', 'kv', 'mlp'); activations are pinned with names of their own
('activation_*'); `sharding.LOGICAL_AXIS_RULES` maps both to mesh axes in one table. Parameters are
float32; matmuls run in the configured compute dtype; LayerNorm, softmax statistics and
logits run in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import hardware
from bert_jax.config import ModelConfig
from bert_jax.model.dropout import Dropout
from bert_jax.sharding import constrain


def einsum_f32(spec: str, a: jax.Array, b: jax.Array, *, backward: str = 'compute') -> jax.Array:
  """`jnp.einsum(spec, a, b)` with a float32 result (attention scores) from inputs in the compute dtype.

  backward='compute': the backward matmuls take the float32 cotangent cast to the inputs' dtype, as every other
  matmul's backward does (under bfloat16, bfloat16 products accumulated in float32); 'float32': jax's own
  transpose, which runs both backward matmuls in float32 (a float32 cotangent against an upcast input; XLA's HLO
  shows them as f32 dots). Float32 inputs take jax's own path either way (`ModelConfig.logits_backward`).
  """
  if backward == 'float32' or a.dtype == jnp.float32:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  return _f32_compute_backward(functools.partial(jnp.einsum, spec), a, b)


def dot_general_f32(a: jax.Array, b: jax.Array, dims, *, backward: str = 'compute') -> jax.Array:
  """`jax.lax.dot_general(a, b, dims)` with a float32 result (the MLM logits); `backward` as in `einsum_f32`."""
  if backward == 'float32' or a.dtype == jnp.float32:
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
  return _f32_compute_backward(functools.partial(jax.lax.dot_general, dimension_numbers=dims), a, b)


def _f32_compute_backward(product, a, b):
  """`product(a, b)` in float32, its backward matmuls in a's dtype (`product`: a bilinear function of a and b)."""

  @jax.custom_vjp
  def f(a, b):
    return product(a, b, preferred_element_type=jnp.float32)

  def fwd(a, b):
    return f(a, b), (a, b)

  def bwd(residuals, g):
    a, b = residuals
    # The transpose of a compute-dtype product (accumulated in float32 on accelerators) takes a cotangent of its
    # dtype.
    _, vjp = jax.vjp(product, a, b)
    return vjp(g.astype(a.dtype))

  f.defvjp(fwd, bwd)
  return f(a, b)


def add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
  """y + bias (a float32 parameter) in y's dtype, the bias gradient summed from y's cotangent in float32.

  jax's own transpose sums a bfloat16 cotangent in bfloat16; XLA:CPU upcasts that reduction and rewrites it into
  a tree of windowed sums (reduce-window), many times slower than one float32 sum of the same values (the figures:
  docs/results.md). Float32 activations take `y + bias` as is.
  The others are reverse mode only (a custom VJP): nothing here takes forward-mode derivatives of a bfloat16 model.
  """
  return y + bias if y.dtype == jnp.float32 else _add_bias_f32_grad(y, bias)


@jax.custom_vjp
def _add_bias_f32_grad(y, bias):
  return y + bias.astype(y.dtype)


def _add_bias_fwd(y, bias):
  return _add_bias_f32_grad(y, bias), bias.ndim


def _add_bias_bwd(bias_ndim, g):
  return g, jnp.sum(g.astype(jnp.float32), axis=tuple(range(g.ndim - bias_ndim)))


_add_bias_f32_grad.defvjp(_add_bias_fwd, _add_bias_bwd)


def matmul(x: jax.Array, w: jax.Array, *, platform: str) -> jax.Array:
  """x @ w.astype(x.dtype) for a 2-D activation x [M, K] and float32 kernel w [K, N]; on `platform` 'cpu' (the one
  the model is built for: `bert_jax.hardware.resolve`) under bfloat16 its backward runs in the layouts XLA:CPU's
  fast (YNNPACK) kernels take.

  jax's own transpose asks for x^T · dy (contracting x's leading axis) and dy · w^T: XLA:CPU's bfloat16 dots
  accept neither layout, so it runs the weight gradient as a float32 Eigen dot on upcast copies (its result rounded
  to bfloat16) and the input gradient in a slower form. Here the backward multiplies row-major copies of x^T and
  w^T instead (`_row_major_transpose`: a copy of each operand, cheap beside the product), which the fast kernels
  run at several times the rate, with the weight gradient accumulated and returned in float32 (no bfloat16
  rounding of it; the figures: docs/results.md). Elsewhere (float32, or an accelerator, whose matmuls take
  transposed operands as they are) this is jax's own product. Reverse mode only, as `add_bias`.
  """
  if x.dtype != jnp.bfloat16 or platform != 'cpu':
    return jnp.dot(x, w.astype(x.dtype))
  return _matmul_row_major_grads(x, w)


def _row_major_transpose(a: jax.Array) -> jax.Array:
  """a.T (2-D) materialised in row-major order. XLA folds a plain transpose into the consuming dot's dimension
  numbers (the layout its CPU kernels reject); splitting the leading axis first makes the final reshape a
  bitcast only of a row-major copy, so the copy happens (tests/model/test_layers.py checks the compiled dots)."""
  m, k = a.shape
  split = next((d for d in (8, 4, 2, *range(3, 64)) if m % d == 0 and m > d), None)
  if split is None:
    return a.T
  return a.reshape(m // split, split, k).transpose(2, 0, 1).reshape(k, m)


@jax.custom_vjp
def _matmul_row_major_grads(x, w):
  return jnp.dot(x, w.astype(x.dtype))


def _matmul_fwd(x, w):
  w_c = w.astype(x.dtype)
  # Saves the kernel in the compute dtype, as jax's own transpose does (not a float32 copy per scanned layer), and
  # its dtype as an empty array.
  return jnp.dot(x, w_c), (x, w_c, jnp.zeros((0,), w.dtype))


def _matmul_bwd(residuals, dy):
  x, w_c, w_dtype = residuals
  dx = jnp.dot(dy, _row_major_transpose(w_c), preferred_element_type=jnp.float32).astype(x.dtype)
  dw = jnp.dot(_row_major_transpose(x), dy, preferred_element_type=jnp.float32)
  return dx, dw.astype(w_dtype.dtype)


_matmul_row_major_grads.defvjp(_matmul_fwd, _matmul_bwd)


def _truncated_normal(std: float):
  # Same as BERT's tf.truncated_normal_initializer: cut at 2 std of the untruncated normal.
  return jax.nn.initializers.truncated_normal(stddev=std)


def param(init, key, shape: Sequence[int], axes: Sequence[str | None]) -> nnx.Param:
  """A float32 parameter from `init`, annotated with logical axis names (`nnx.with_partitioning`).

  The names become shardings only through the rules table (`sharding.state_shardings`), never at
  creation: modules are also built without a mesh (inference, tests), so eager sharding is off.
  """
  return nnx.Param(nnx.with_partitioning(init, tuple(axes), eager_sharding=False)(key, tuple(shape), jnp.float32))


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


class Dense(nnx.Module):
  """y = x · W + b contracting the trailing `len(in_shape)` axes of x.

  The kernel has shape in_shape + out_shape, so attention projections keep an explicit
  heads axis that tensor parallelism can split. `platform`: the one it is built for (`hardware.resolve`; None:
  jax's default devices'), which picks its product's backward (`matmul`).
  """

  def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], axes: Sequence[str | None],
               *, std: float, dtype, rngs: nnx.Rngs, use_bias: bool = True, platform: str | None = None):
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    assert len(axes) == len(in_shape) + len(out_shape), (axes, in_shape, out_shape)
    self.kernel = param(_truncated_normal(std), rngs.params(), in_shape + out_shape, axes)
    self.bias = param(jax.nn.initializers.zeros, None, out_shape, axes[len(in_shape):]) if use_bias else None
    self.num_in = len(in_shape)
    self.dtype = dtype
    self.platform = hardware.resolve(platform)

  def __call__(self, x: jax.Array) -> jax.Array:
    # One 2-D matmul over flattened views (free reshapes of contiguous axes). Contracting
    # several axes at once, or keeping batch axes, makes XLA canonicalise the dot with
    # physical transposes of the kernel (dx) and of the activations (dW) in the backward pass;
    # the 2-D form needs none on accelerators (its effect on the BERT-base step: docs/results.md).
    # XLA:CPU's bfloat16 kernels do want them: `matmul` makes them there.
    kernel = self.kernel[...]  # float32; `matmul` casts it to the compute dtype
    in_shape, out_shape = kernel.shape[:self.num_in], kernel.shape[self.num_in:]
    lead = x.shape[:x.ndim - self.num_in]
    k = math.prod(in_shape)
    y = matmul(x.astype(self.dtype).reshape(-1, k), kernel.reshape(k, -1), platform=self.platform)
    y = y.reshape(lead + out_shape)
    if self.bias is not None:
      y = add_bias(y, self.bias[...])
    return y


class LayerNorm(nnx.Module):
  """LayerNorm computed in float32 (BERT: eps 1e-12), output cast to the compute dtype; no bias
  (`use_bias=False`) as in ModernBERT."""

  def __init__(self, features: int, *, eps: float, dtype, use_bias: bool = True):
    self.scale = param(jax.nn.initializers.ones, None, (features,), ('embed',))
    self.bias = param(jax.nn.initializers.zeros, None, (features,), ('embed',)) if use_bias else None
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...]
    if self.bias is not None:
      y = y + self.bias[...]
    return y.astype(self.dtype)


class Embed(nnx.Module):
  """A lookup table; `attend` multiplies by its transpose (the tied MLM decoder)."""

  def __init__(self, num: int, features: int, axes: tuple[str | None, str | None], *, std: float,
               rngs: nnx.Rngs):
    self.embedding = param(_truncated_normal(std), rngs.params(), (num, features), axes)
    self.rows_axis = axes[0]

  def __call__(self, ids: jax.Array) -> jax.Array:
    # FSDP: gather the table's feature shards before the lookup (the rows stay split over
    # 'vocab'), so the result can be batch-sharded without a full rematerialisation.
    table = constrain(self.embedding[...], (self.rows_axis, None))
    return jnp.take(table, ids, axis=0)

  def attend(self, x: jax.Array, *, backward: str = 'compute') -> jax.Array:
    """float32 logits x E^T; `backward`: `dot_general_f32`'s."""
    table = self.embedding[...].astype(x.dtype)
    logits = dot_general_f32(x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())),
                             backward=backward)  # 2-D, as in Dense
    return logits.reshape(x.shape[:-1] + table.shape[:1])


class Embeddings(nnx.Module):
  """word + learned position + token type, then LayerNorm and dropout; then, when the tables are narrower or
  wider than the encoder (`embedding_size`, ELECTRA), a dense projection to hidden_size (`project`).

  Without a position table (`position_embedding='rotary'`: positions act inside attention) or a
  token type table (`type_vocab_size=0`), those terms are absent and their ids unused. `platform`: Dense's.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
    std, e = cfg.initializer_range, cfg.embed_dim
    self.word_embeddings = Embed(cfg.vocab_size, e, ('vocab', 'embed'), std=std, rngs=rngs)
    self.position_embeddings = Embed(cfg.max_position_embeddings + cfg.position_offset, e, (None, 'embed'),
                                     std=std, rngs=rngs) if cfg.position_embedding == 'learned' else None
    self.position_offset = cfg.position_offset  # RoBERTa's rows before position 0
    self.token_type_embeddings = Embed(cfg.type_vocab_size, e, (None, 'embed'), std=std,
                                       rngs=rngs) if cfg.type_vocab_size else None
    self.layer_norm = LayerNorm(e, eps=cfg.layer_norm_eps, dtype=compute_dtype(cfg), use_bias=cfg.use_bias)
    self.dropout = Dropout(cfg.hidden_dropout, impl=cfg.dropout_impl, rngs=rngs)
    # ELECTRA's embeddings_project (after the dropout, as there); none when the widths agree.
    self.project = Dense((e,), (cfg.hidden_size,), (None, 'embed'), std=std, dtype=compute_dtype(cfg), rngs=rngs,
                         use_bias=cfg.use_bias, platform=platform) if e != cfg.hidden_size else None

  def __call__(self, input_ids_bt, token_type_ids_bt, position_ids_bt, *, deterministic: bool):
    x_bte = self.word_embeddings(input_ids_bt)
    if self.position_embeddings is not None:
      if self.position_offset:
        position_ids_bt = position_ids_bt + self.position_offset
      x_bte = x_bte + self.position_embeddings(position_ids_bt)
    if self.token_type_embeddings is not None and self.token_type_embeddings.embedding.shape[0] == 1:
      # One token type (RoBERTa, XLM-R): every id is 0, whatever a BERT-style template (B = 1) says.
      x_bte = x_bte + self.token_type_embeddings.embedding[...][0].astype(x_bte.dtype)
    elif self.token_type_embeddings is not None:
      x_bte = x_bte + self.token_type_embeddings(token_type_ids_bt)
    x_bte = constrain(x_bte, ('activation_batch', 'activation_length', 'activation_embed'))
    x_bte = self.dropout(self.layer_norm(x_bte), deterministic=deterministic)
    if self.project is None:
      return x_bte
    return constrain(self.project(x_bte), ('activation_batch', 'activation_length', 'activation_embed'))


def rotary_tables(position_ids_bt: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """RoPE's (cos, sin) [B, T, head_dim / 2], float32, for `rotate`.

  Frequency k is theta^(-2k / head_dim), computed in float32 as transformers does (RoFormer, Llama,
  ModernBERT), so imported models rotate by the same angles.
  """
  exponent_k = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  inv_freq_k = np.float32(1.0) / np.power(np.float32(theta), exponent_k)
  angle_btk = position_ids_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq_k)
  return jnp.cos(angle_btk), jnp.sin(angle_btk)


def rotate(x_btnh: jax.Array, cos_btk: jax.Array, sin_btk: jax.Array) -> jax.Array:
  """Rotates each (x[k], x[k + head_dim/2]) pair of every head by its position's angle (rotate-half layout).

  Computed in float32, cast back to x's dtype: transformers' `apply_rotary_pos_emb` term for term.
  """
  h = x_btnh.shape[-1] // 2
  x32_btnh = x_btnh.astype(jnp.float32)
  x1, x2 = x32_btnh[..., :h], x32_btnh[..., h:]
  cos, sin = cos_btk[:, :, None], sin_btk[:, :, None]  # broadcast over heads
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_btnh.dtype)
