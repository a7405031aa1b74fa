"""BERT building blocks (flax.nnx): Dense, LayerNorm, Embeddings, SelfAttention, EncoderLayer.

Every parameter carries `logical_axes` metadata ('vocab', 'embed', 'heads', 'kv', 'mlp', ...);
`sharding.LOGICAL_AXIS_RULES` maps those names to mesh axes in one table. Parameters are
float32; matmuls run in the configured compute dtype; LayerNorm, softmax statistics and
logits run in float32.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.config import ModelConfig


def _truncated_normal(std: float):
  # Same as BERT's tf.truncated_normal_initializer: cut at 2 std of the untruncated normal.
  return jax.nn.initializers.truncated_normal(stddev=std)


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


class Dense(nnx.Module):
  """y = x · W + b contracting the trailing `len(in_shape)` axes of x.

  The kernel has shape in_shape + out_shape, so attention projections keep an explicit
  heads axis that tensor parallelism can split.
  """

  def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], axes: Sequence[str | None],
               *, std: float, dtype, rngs: nnx.Rngs, use_bias: bool = True):
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    assert len(axes) == len(in_shape) + len(out_shape), (axes, in_shape, out_shape)
    self.kernel = nnx.Param(_truncated_normal(std)(rngs.params(), in_shape + out_shape, jnp.float32),
                            logical_axes=tuple(axes))
    self.bias = (nnx.Param(jnp.zeros(out_shape, jnp.float32), logical_axes=tuple(axes[len(in_shape):]))
                 if use_bias else None)
    self.num_in = len(in_shape)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...].astype(self.dtype)
    contract = (tuple(range(x.ndim - self.num_in, x.ndim)), tuple(range(self.num_in)))
    y = jax.lax.dot_general(x.astype(self.dtype), kernel, (contract, ((), ())))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class LayerNorm(nnx.Module):
  """LayerNorm computed in float32 (BERT: eps 1e-12), output cast to the compute dtype."""

  def __init__(self, features: int, *, eps: float, dtype):
    self.scale = nnx.Param(jnp.ones((features,), jnp.float32), logical_axes=('embed',))
    self.bias = nnx.Param(jnp.zeros((features,), jnp.float32), logical_axes=('embed',))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]
    return y.astype(self.dtype)


class Embed(nnx.Module):
  """A lookup table; `attend` multiplies by its transpose (the tied MLM decoder)."""

  def __init__(self, num: int, features: int, axes: tuple[str | None, str | None], *, std: float,
               rngs: nnx.Rngs):
    self.embedding = nnx.Param(_truncated_normal(std)(rngs.params(), (num, features), jnp.float32),
                               logical_axes=axes)

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], ids, axis=0)

  def attend(self, x: jax.Array) -> jax.Array:
    return jnp.einsum('...d,vd->...v', x, self.embedding[...].astype(x.dtype),
                      preferred_element_type=jnp.float32)


class Embeddings(nnx.Module):
  """word + learned position + token type, then LayerNorm and dropout."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    std = cfg.initializer_range
    self.word_embeddings = Embed(cfg.vocab_size, cfg.hidden_size, ('vocab', 'embed'), std=std, rngs=rngs)
    self.position_embeddings = Embed(cfg.max_position_embeddings, cfg.hidden_size, (None, 'embed'),
                                     std=std, rngs=rngs)
    self.token_type_embeddings = Embed(cfg.type_vocab_size, cfg.hidden_size, (None, 'embed'), std=std,
                                       rngs=rngs)
    self.layer_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=compute_dtype(cfg))
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, input_ids_bt, token_type_ids_bt, position_ids_bt, *, deterministic: bool):
    x_btd = (self.word_embeddings(input_ids_bt) + self.position_embeddings(position_ids_bt)
             + self.token_type_embeddings(token_type_ids_bt))
    return self.dropout(self.layer_norm(x_btd), deterministic=deterministic)


class SelfAttention(nnx.Module):
  """Multi-head self-attention with a key-padding mask.

  Without attention dropout (inference, evaluation, or attention_dropout=0) this calls
  `jax.nn.dot_product_attention`, which picks the fastest kernel (cuDNN flash on GPU for
  bf16). That function has no dropout on the probabilities, so while training with BERT's
  attention_probs_dropout the same math runs as explicit einsums (float32 softmax).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, h, std = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.initializer_range
    dtype = compute_dtype(cfg)
    self.query = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.key = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.value = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.output = Dense((n, h), (d,), ('heads', 'kv', 'embed'), std=std, dtype=dtype, rngs=rngs)
    self.probs_dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)
    self.attention_impl = cfg.attention_impl or None

  def __call__(self, x_btd, mask_b11s, *, deterministic: bool, return_probs: bool = False):
    q_btnh, k_bsnh, v_bsnh = self.query(x_btd), self.key(x_btd), self.value(x_btd)
    use_fused = not return_probs and (deterministic or self.probs_dropout.rate == 0.0)
    if use_fused:
      ctx_btnh = jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, mask=mask_b11s,
                                              implementation=self.attention_impl)
      probs_bnts = None
    else:
      scale = q_btnh.shape[-1] ** -0.5
      logits_bnts = jnp.einsum('btnh,bsnh->bnts', q_btnh, k_bsnh,
                               preferred_element_type=jnp.float32) * scale
      logits_bnts = jnp.where(mask_b11s, logits_bnts, jnp.finfo(jnp.float32).min)
      probs_bnts = jax.nn.softmax(logits_bnts, axis=-1)
      dropped = self.probs_dropout(probs_bnts, deterministic=deterministic)
      ctx_btnh = jnp.einsum('bnts,bsnh->btnh', dropped.astype(v_bsnh.dtype), v_bsnh)
    out_btd = self.output(ctx_btnh)
    return (out_btd, probs_bnts) if return_probs else out_btd


class EncoderLayer(nnx.Module):
  """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)), exact GELU."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, i, std = cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range
    dtype = compute_dtype(cfg)
    self.attention = SelfAttention(cfg, rngs=rngs)
    self.attention_norm = LayerNorm(d, eps=cfg.layer_norm_eps, dtype=dtype)
    self.intermediate = Dense((d,), (i,), ('embed', 'mlp'), std=std, dtype=dtype, rngs=rngs)
    self.output = Dense((i,), (d,), ('mlp', 'embed'), std=std, dtype=dtype, rngs=rngs)
    self.output_norm = LayerNorm(d, eps=cfg.layer_norm_eps, dtype=dtype)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x_btd, mask_b11s, *, deterministic: bool, return_probs: bool = False):
    """Returns y [B, T, D], or (y, attention probabilities [B, N, T, S]) when `return_probs`."""
    a_btd = self.attention(x_btd, mask_b11s, deterministic=deterministic, return_probs=return_probs)
    if return_probs:
      a_btd, probs_bnts = a_btd
    a_btd = self.dropout(a_btd, deterministic=deterministic)
    x_btd = self.attention_norm(x_btd + a_btd)
    h_bti = jax.nn.gelu(self.intermediate(x_btd), approximate=False)
    h_btd = self.dropout(self.output(h_bti), deterministic=deterministic)
    y_btd = self.output_norm(x_btd + h_btd)
    return (y_btd, probs_bnts) if return_probs else y_btd
