"""BERT building blocks (flax.nnx): Dense, LayerNorm, Embeddings, SelfAttention, EncoderLayer.

Every parameter carries `logical_axes` metadata ('vocab', 'embed', 'heads', 'kv', 'mlp', ...);
`sharding.LOGICAL_AXIS_RULES` maps those names to mesh axes in one table. Parameters are
float32; matmuls run in the configured compute dtype; LayerNorm, softmax statistics and
logits run in float32.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax import metrics
from bert_jax.config import ModelConfig
from bert_jax.dropout import Dropout
from bert_jax.errors import ConfigError
from bert_jax.sharding import constrain


def _truncated_normal(std: float):
  # Same as BERT's tf.truncated_normal_initializer: cut at 2 std of the untruncated normal.
  return jax.nn.initializers.truncated_normal(stddev=std)


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


def current_platform() -> str:
  """The default backend: 'gpu' (NVIDIA), 'rocm', 'tpu' or 'cpu'."""
  backend = jax.default_backend()
  if backend == 'gpu' and 'rocm' in str(getattr(jax.devices()[0].client, 'platform_version', '')).lower():
    return 'rocm'
  return backend


def _cudnn_unsupported(cfg: ModelConfig, platform: str, training: bool, seq_len: int | None) -> str | None:
  """Why cuDNN flash attention (via jax.nn.dot_product_attention) cannot run here, or None.

  jax's cudnn path needs bf16/fp16 inputs and a head dim that is a multiple of 8 and at most 128
  (256 from Hopper on; 128 is the portable bound); it turns our boolean mask into an additive
  bias, and with a bias the backward pass needs even sequence lengths.
  """
  if platform != 'gpu':
    return f'it needs an NVIDIA GPU (platform: {platform})'
  if cfg.dtype != 'bfloat16':
    return f'it needs model.dtype=bfloat16 (got {cfg.dtype})'
  if cfg.head_dim > 128 or cfg.head_dim % 8:
    return f'it needs a head dim <= 128 and a multiple of 8 (got {cfg.head_dim})'
  if training and seq_len is not None and seq_len % 2:
    return f'training with a mask needs an even sequence length (got {seq_len})'
  return None


def choose_attention(cfg: ModelConfig, platform: str, *, training: bool, seq_len: int | None = None) -> str:
  """The attention kernel of one call: 'cudnn', 'xla' or 'einsum' (deterministic in its arguments).

  'einsum' (explicit softmax with dropout on the probabilities) whenever training with
  attention_dropout > 0: jax.nn.dot_product_attention has no attention dropout. Otherwise a
  forced `cfg.attention_impl`, or automatically 'cudnn' (flash) where it runs, else 'xla'.

  Args:
    cfg: the model config (attention_impl, attention_dropout, dtype, head_dim).
    platform: `current_platform()`.
    training: dropout is active (deterministic=False).
    seq_len: the sequence length when known (odd lengths rule cuDNN out while training).

  Raises:
    ConfigError: `attention_impl='cudnn'` is forced where cuDNN cannot run.
  """
  if cfg.attention_impl == 'einsum' or (training and cfg.attention_dropout > 0):
    return 'einsum'
  reason = _cudnn_unsupported(cfg, platform, training, seq_len)
  if cfg.attention_impl == 'cudnn' and reason:
    raise ConfigError(f"model.attention_impl='cudnn' cannot run: {reason}; use '' (automatic) or 'xla'")
  if cfg.attention_impl:
    return cfg.attention_impl
  return 'xla' if reason else 'cudnn'


_ATTENTION_NAMES = {'cudnn': 'cudnn (flash)', 'xla': 'xla (jax.nn.dot_product_attention)',
                    'einsum': 'einsum (explicit softmax, attention dropout)'}


def describe_attention(cfg: ModelConfig, platform: str | None = None) -> str:
  """One line saying which attention kernel inference and training use, for the build log."""
  platform = platform or current_platform()
  infer = choose_attention(cfg, platform, training=False)
  train = choose_attention(cfg, platform, training=True)
  forced = f' [model.attention_impl={cfg.attention_impl}]' if cfg.attention_impl else ''
  if infer == train:
    line = f'attention: {_ATTENTION_NAMES[infer]} for inference and training{forced}'
  else:
    line = (f'attention: {_ATTENTION_NAMES[infer]} for inference; {_ATTENTION_NAMES[train]} while training '
            f'(attention_dropout={cfg.attention_dropout}){forced}')
  if train == 'cudnn':
    line += '; odd sequence lengths train with xla'
  return line


def log_attention(cfg: ModelConfig) -> None:
  """Prints `describe_attention` on process 0 (called once per model build)."""
  metrics.log(describe_attention(cfg))


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
    # One 2-D matmul over flattened views (free reshapes of contiguous axes). Contracting
    # several axes at once, or keeping batch axes, makes XLA canonicalise the dot with
    # physical transposes of the kernel (dx) and of the activations (dW) in the backward pass;
    # the 2-D form needs none (BERT-base CPU train step: 424 -> 184 copy/transpose fusions,
    # ~5% faster with the attention change below).
    kernel = self.kernel[...].astype(self.dtype)
    in_shape, out_shape = kernel.shape[:self.num_in], kernel.shape[self.num_in:]
    lead = x.shape[:x.ndim - self.num_in]
    k = math.prod(in_shape)
    y = jnp.dot(x.astype(self.dtype).reshape(-1, k), kernel.reshape(k, -1)).reshape(lead + out_shape)
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
    # FSDP: gather the table's feature shards before the lookup (the rows stay split over
    # 'vocab'), so the result can be batch-sharded without a full rematerialisation.
    table = constrain(self.embedding[...], (self.embedding.logical_axes[0], None))
    return jnp.take(table, ids, axis=0)

  def attend(self, x: jax.Array) -> jax.Array:
    table = self.embedding[...].astype(x.dtype)
    logits = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)  # 2-D, as in Dense
    return logits.reshape(x.shape[:-1] + table.shape[:1])


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
    self.dropout = Dropout(cfg.hidden_dropout, impl=cfg.dropout_impl, rngs=rngs)

  def __call__(self, input_ids_bt, token_type_ids_bt, position_ids_bt, *, deterministic: bool):
    x_btd = (self.word_embeddings(input_ids_bt) + self.position_embeddings(position_ids_bt)
             + self.token_type_embeddings(token_type_ids_bt))
    x_btd = constrain(x_btd, ('batch', 'length', None))
    return self.dropout(self.layer_norm(x_btd), deterministic=deterministic)


class SelfAttention(nnx.Module):
  """Multi-head self-attention under a boolean mask ([B, 1, 1, S] padding or [B, 1, T, S] segments).

  Each call picks its kernel with `choose_attention`: cuDNN flash or XLA through
  `jax.nn.dot_product_attention`, or, while training with BERT's attention_probs_dropout
  (which that function lacks), explicit einsums with dropout on the probabilities. All three
  take the softmax in float32. A query row with no visible key (a padding token of a packed
  row) attends uniformly to every key: finite, and ignored downstream.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, h, std = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.initializer_range
    dtype = compute_dtype(cfg)
    self.query = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.key = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.value = Dense((d,), (n, h), ('embed', 'heads', 'kv'), std=std, dtype=dtype, rngs=rngs)
    self.output = Dense((n, h), (d,), ('heads', 'kv', 'embed'), std=std, dtype=dtype, rngs=rngs)
    self.probs_dropout = Dropout(cfg.attention_dropout, impl=cfg.dropout_impl, rngs=rngs)
    self.cfg = cfg

  def __call__(self, x_btd, mask_b11s, *, deterministic: bool, return_probs: bool = False):
    q_btnh, k_bsnh, v_bsnh = self.query(x_btd), self.key(x_btd), self.value(x_btd)
    b, t, s = q_btnh.shape[0], q_btnh.shape[1], k_bsnh.shape[1]
    impl = 'einsum' if return_probs else choose_attention(
        self.cfg, current_platform(), training=not deterministic, seq_len=t)
    probs_bnts = None
    if impl == 'cudnn':
      # jax turns a boolean mask into cuDNN's additive bias, which must be [B, N or 1, T, S]
      # (a [B, 1, 1, S] mask fails its shape check: jax issue #28974).
      mask_b1ts = jnp.broadcast_to(mask_b11s, (b, 1, t, s))
      ctx_btnh = jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, mask=mask_b1ts, implementation='cudnn')
    elif impl == 'xla':
      ctx_btnh = jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, mask=mask_b11s, implementation='xla')
    else:
      # Heads-major copies first: batched matmuls over leading (b, n) axes need no further
      # layout changes in either pass (~15% faster than einsums on [B, T, N, H] on CPU).
      q_bnth, k_bnsh, v_bnsh = (a.transpose(0, 2, 1, 3) for a in (q_btnh, k_bsnh, v_bsnh))
      scale = q_btnh.shape[-1] ** -0.5
      logits_bnts = jnp.einsum('bnth,bnsh->bnts', q_bnth, k_bnsh,
                               preferred_element_type=jnp.float32) * scale
      logits_bnts = jnp.where(mask_b11s, logits_bnts, jnp.finfo(jnp.float32).min)
      probs_bnts = jax.nn.softmax(logits_bnts, axis=-1)
      dropped = self.probs_dropout(probs_bnts, deterministic=deterministic)
      ctx_btnh = jnp.einsum('bnts,bnsh->bnth', dropped.astype(v_bnsh.dtype), v_bnsh).transpose(0, 2, 1, 3)
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
    self.dropout = Dropout(cfg.hidden_dropout, impl=cfg.dropout_impl, rngs=rngs)

  def __call__(self, x_btd, mask_b11s, *, deterministic: bool, return_probs: bool = False):
    """Returns y [B, T, D], or (y, attention probabilities [B, N, T, S]) when `return_probs`."""
    a_btd = self.attention(x_btd, mask_b11s, deterministic=deterministic, return_probs=return_probs)
    if return_probs:
      a_btd, probs_bnts = a_btd
    a_btd = self.dropout(a_btd, deterministic=deterministic)
    x_btd = self.attention_norm(x_btd + a_btd)
    h_bti = jax.nn.gelu(constrain(self.intermediate(x_btd), ('batch', 'length', 'mlp')), approximate=False)
    h_btd = self.dropout(self.output(h_bti), deterministic=deterministic)
    y_btd = constrain(self.output_norm(x_btd + h_btd), ('batch', 'length', None))
    return (y_btd, probs_bnts) if return_probs else y_btd
