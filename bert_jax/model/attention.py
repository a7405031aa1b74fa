"""Self-attention and the choice of its kernel per call: cuDNN flash, XLA, or explicit einsums.

`choose_attention` is a pure function of the config, the platform and whether dropout is active;
`describe_attention` states the choice in one line (logged when a model is built for training).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import Dense, compute_dtype, rotate


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


class SelfAttention(nnx.Module):
  """Multi-head self-attention under a boolean mask ([B, 1, 1, S] padding or [B, 1, T, S] segments).

  Each call picks its kernel with `choose_attention`: cuDNN flash or XLA through
  `jax.nn.dot_product_attention`, or, while training with BERT's attention_probs_dropout
  (which that function lacks), explicit einsums with dropout on the probabilities. All three
  take the softmax in float32. A query row with no visible key (a padding token of a packed
  row) attends uniformly to every key: finite, and ignored downstream. Rotary positions
  (`rope`: RoPE's cos/sin tables) rotate the queries and keys first; a local attention window
  arrives as part of the mask.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, h, std = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.initializer_range
    dense = dict(std=std, dtype=compute_dtype(cfg), rngs=rngs, use_bias=cfg.use_bias)
    self.query = Dense((d,), (n, h), ('embed', 'heads', 'kv'), **dense)
    self.key = Dense((d,), (n, h), ('embed', 'heads', 'kv'), **dense)
    self.value = Dense((d,), (n, h), ('embed', 'heads', 'kv'), **dense)
    self.output = Dense((n, h), (d,), ('heads', 'kv', 'embed'), **dense)
    self.probs_dropout = Dropout(cfg.attention_dropout, impl=cfg.dropout_impl, rngs=rngs)
    self.cfg = cfg

  def queries_keys(self, x_btd, rope=None) -> tuple[jax.Array, jax.Array]:
    """The queries and keys [B, T, N, H] that meet in the attention scores (rotated when `rope` is given)."""
    q_btnh, k_btnh = self.query(x_btd), self.key(x_btd)
    if rope is not None:
      q_btnh, k_btnh = rotate(q_btnh, *rope), rotate(k_btnh, *rope)
    return q_btnh, k_btnh

  def __call__(self, x_btd, mask_b11s, rope=None, *, deterministic: bool, return_probs: bool = False):
    """Attends under `mask_b11s` (boolean, [B, 1, 1 or T, S]); `rope`: (cos, sin) [B, T, H / 2] or None."""
    q_btnh, k_bsnh = self.queries_keys(x_btd, rope)
    v_bsnh = self.value(x_btd)
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
      # layout changes in either pass (einsums on [B, T, N, H] transpose in both).
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
