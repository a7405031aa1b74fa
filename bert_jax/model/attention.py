"""Self-attention and the choice of its kernel per call: cuDNN flash, XLA, or explicit einsums.

`choose_attention` is a pure function of the config, the platform (`hardware.resolve`, decided when the module is
built) and whether dropout is active; `describe_attention` states the choice in one line (logged when a model is
built for training).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import hardware
from bert_jax.config import ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import Dense, compute_dtype, einsum_f32, rotate


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
    platform: 'cpu', 'gpu', 'rocm' or 'tpu' (`hardware.resolve`).
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
  """One line saying which attention kernel inference and training use on `platform` (`hardware.resolve`'s; None:
  jax's default devices'), for the build log."""
  platform = hardware.resolve(platform)
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


def band_mask(window: int, length: int, key_valid_bs=None, segment_ids_bt=None) -> jax.Array:
  """A local layer's mask in blocks, [B, 1, nb, w/2, 3 w/2]: query block i against key blocks i-1, i, i+1.

  Query t of block i is position i * w/2 + u; key v of its band is position (i - 1) * w/2 + v. Allowed: the key
  exists (0 <= position < `length`), is at most w/2 positions from the query, and is a real token
  (`key_valid_bs` [B, S]: padding) of the query's segment (`segment_ids_bt` [B, T], 0 = padding: packed rows).
  Built from O(T x w) elements, never T x T.
  """
  r = window // 2
  nb = -(-length // r)
  q_pos = np.arange(nb)[:, None] * r + np.arange(r)[None, :]  # [nb, r]: static positions
  k_pos = (np.arange(nb)[:, None] - 1) * r + np.arange(3 * r)[None, :]  # [nb, 3r]
  in_range = (k_pos >= 0) & (k_pos < length)
  allowed = (np.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= r) & in_range[:, None, :]  # [nb, r, 3r]
  mask = jnp.asarray(allowed)[None]
  k_safe = np.clip(k_pos, 0, length - 1)
  if key_valid_bs is not None:
    mask = mask & jnp.asarray(key_valid_bs).astype(bool)[:, k_safe][:, :, None, :]
  if segment_ids_bt is not None:
    segment_ids_bt = jnp.asarray(segment_ids_bt)
    q_seg = jnp.pad(segment_ids_bt, ((0, 0), (0, nb * r - length)))[:, q_pos]  # [B, nb, r]
    k_seg = segment_ids_bt[:, k_safe]  # [B, nb, 3r]
    mask = mask & (q_seg[:, :, :, None] == k_seg[:, :, None, :]) & (k_seg > 0)[:, :, None, :]
  return mask[:, None]


def _blocks(x_btnh: jax.Array, r: int, nb: int, pad_blocks: int) -> jax.Array:
  """[B, T, N, H] -> [B, nb + 2 * pad_blocks, r, N, H]: zero padding, then blocks of r positions."""
  b, t = x_btnh.shape[:2]
  x = jnp.pad(x_btnh, ((0, 0), (pad_blocks * r, (nb + pad_blocks) * r - t), (0, 0), (0, 0)))
  return x.reshape(b, nb + 2 * pad_blocks, r, *x_btnh.shape[2:])


def _key_windows(x_bsnh: jax.Array, r: int, nb: int) -> jax.Array:
  """[B, S, N, H] -> [B, nb, 3 r, N, H]: for query block i, the key (or value) blocks i-1, i, i+1."""
  x = _blocks(x_bsnh, r, nb, 1)
  return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def blockwise_local_attention(q_btnh, k_bsnh, v_bsnh, band_b1xqk, dropout, *, deterministic: bool,
                              backward: str = 'compute') -> jax.Array:
  """Local attention at linear cost: each block of w/2 queries against its three neighbouring key blocks.

  The same function as the masked full path under `window_mask_b1ts` (the softmax over the keys of the window;
  keys outside it get exactly zero weight there), in O(T x 1.5 w) work and memory instead of O(T^2).
  `band_b1xqk` is `band_mask(...)`; `dropout` drops probabilities as the full path does; `backward`: the scores'
  (`layers.einsum_f32`).
  """
  nb, r = band_b1xqk.shape[2], band_b1xqk.shape[3]
  t = q_btnh.shape[1]
  q_bxqnh = _blocks(q_btnh, r, nb, 0)
  k_bxknh, v_bxknh = _key_windows(k_bsnh, r, nb), _key_windows(v_bsnh, r, nb)
  scale = q_btnh.shape[-1] ** -0.5
  logits = einsum_f32('bxqnh,bxknh->bnxqk', q_bxqnh, k_bxknh, backward=backward) * scale
  logits = jnp.where(band_b1xqk, logits, jnp.finfo(jnp.float32).min)
  probs = dropout(jax.nn.softmax(logits, axis=-1), deterministic=deterministic)
  ctx_bxqnh = jnp.einsum('bnxqk,bxknh->bxqnh', probs.astype(v_bsnh.dtype), v_bxknh)
  return ctx_bxqnh.reshape(q_btnh.shape[0], nb * r, *q_btnh.shape[2:])[:, :t]


def blockwise_local_attention_fused(q_btnh, k_bsnh, v_bsnh, band_b1xqk, *, implementation: str) -> jax.Array:
  """`blockwise_local_attention` through `jax.nn.dot_product_attention` (`implementation` 'cudnn' or 'xla'):
  each block of w/2 queries is one row of a batch of B x nb short attentions against its 3 w/2 keys.

  cuDNN's own window argument is causal only (jax raises for a right window without a causal mask), so an
  encoder's symmetric window reaches the fused kernel this way: flash attention over [B nb, w/2, N, H] queries
  with the band as its mask. No attention dropout (the function has none).
  """
  b, t, n, h = q_btnh.shape
  nb, r = band_b1xqk.shape[2], band_b1xqk.shape[3]
  q_xqnh = _blocks(q_btnh, r, nb, 0).reshape(b * nb, r, n, h)
  window = lambda x: _key_windows(x, r, nb).reshape(b * nb, 3 * r, n, h)  # pylint: disable=unnecessary-lambda-assignment
  mask_x1qk = jnp.broadcast_to(band_b1xqk, (b, 1, nb, r, 3 * r)).reshape(b * nb, 1, r, 3 * r)
  # A query that sees no key (padding far from any real token) attends to its own position instead: a row of
  # the fused softmax with no key is 0 / 0, NaN in every gradient. Such outputs are unused either way.
  blind = ~mask_x1qk.any(-1, keepdims=True)
  mask_x1qk = mask_x1qk | (blind & jnp.eye(r, 3 * r, k=r, dtype=bool))
  ctx_xqnh = jax.nn.dot_product_attention(q_xqnh, window(k_bsnh), window(v_bsnh), mask=mask_x1qk,
                                          implementation=implementation)
  return ctx_xqnh.reshape(b, nb * r, n, h)[:, :t]


class SelfAttention(nnx.Module):
  """Multi-head self-attention under a boolean mask ([B, 1, 1, S] padding or [B, 1, T, S] segments).

  Each call picks its kernel with `choose_attention`: cuDNN flash or XLA through
  `jax.nn.dot_product_attention`, or, while training with BERT's attention_probs_dropout
  (which that function lacks), explicit einsums with dropout on the probabilities. All three
  take the softmax in float32. A query row with no visible key (a padding token of a packed
  row) attends uniformly to every key: finite, and ignored downstream. Rotary positions
  (`rope`: RoPE's cos/sin tables) rotate the queries and keys first. A local attention window
  arrives as part of the mask: a full mask (short rows, attention maps), or `band_mask`'s blocks, which
  select the blockwise paths (linear in the row length): cuDNN flash over the blocks where the kernel choice is
  'cudnn', else `blockwise_local_attention`'s einsums. `platform`: the one it is built for (`hardware.resolve`;
  None: jax's default devices'), kept for the kernel choice and its Dense layers.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
    d, n, h, std = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.initializer_range
    self.platform = hardware.resolve(platform)
    dense = dict(std=std, dtype=compute_dtype(cfg), rngs=rngs, use_bias=cfg.use_bias, platform=self.platform)
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
    if mask_b11s.ndim == 5:  # a local layer's band (`band_mask`): blocks of w/2 queries against 3 w/2 keys
      impl = choose_attention(self.cfg, self.platform, training=not deterministic, seq_len=mask_b11s.shape[3])
      if impl == 'cudnn':
        ctx_btnh = blockwise_local_attention_fused(q_btnh, k_bsnh, v_bsnh, mask_b11s, implementation='cudnn')
      else:
        ctx_btnh = blockwise_local_attention(q_btnh, k_bsnh, v_bsnh, mask_b11s, self.probs_dropout,
                                             deterministic=deterministic, backward=self.cfg.logits_backward)
      return self.output(ctx_btnh)
    b, t, s = q_btnh.shape[0], q_btnh.shape[1], k_bsnh.shape[1]
    impl = 'einsum' if return_probs else choose_attention(
        self.cfg, self.platform, training=not deterministic, seq_len=t)
    probs_bnts = None
    if impl == 'cudnn' and mask_b11s.shape[2] == 1 and self.cfg.fused_mask == 'lengths':
      # A key-padding mask of right-padded rows is each row's length: cuDNN's padding mask, no bias tensor in
      # either pass. (A row of padding alone keeps one key, as the dense path keeps its softmax finite.)
      kv_lengths_b = jnp.maximum(jnp.sum(mask_b11s[:, 0, 0, :], axis=-1, dtype=jnp.int32), 1)
      ctx_btnh = jax.nn.dot_product_attention(q_btnh, k_bsnh, v_bsnh, key_value_seq_lengths=kv_lengths_b,
                                              implementation='cudnn')
    elif impl == 'cudnn':
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
      logits_bnts = einsum_f32('bnth,bnsh->bnts', q_bnth, k_bnsh, backward=self.cfg.logits_backward) * scale
      logits_bnts = jnp.where(mask_b11s, logits_bnts, jnp.finfo(jnp.float32).min)
      probs_bnts = jax.nn.softmax(logits_bnts, axis=-1)
      dropped = self.probs_dropout(probs_bnts, deterministic=deterministic)
      ctx_btnh = jnp.einsum('bnts,bnsh->bnth', dropped.astype(v_bnsh.dtype), v_bnsh).transpose(0, 2, 1, 3)
    out_btd = self.output(ctx_btnh)
    return (out_btd, probs_bnts) if return_probs else out_btd
