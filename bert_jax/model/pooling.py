"""One vector per text from the encoder's token outputs: mean or [CLS] pooling, then L2 normalisation.

The same functions serve inference (`bert_jax.inference.embed`) and contrastive training, so a trained model is
evaluated and exported with exactly the pooling it was trained with. Mean pooling follows sentence-transformers:
the mean over every real token of the row ([CLS] and [SEP] included), padding excluded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

POOLINGS = ('mean', 'cls')
# torch.nn.functional.normalize's eps, as in sentence-transformers' Normalize module.
NORM_EPS = 1e-12


def pool(seq_btd: jax.Array, attention_mask_bt: jax.Array, pooling: str) -> jax.Array:
  """float32 [B, D]: the mean of `seq_btd` over the tokens where `attention_mask_bt` is 1, or the [CLS] row.

  Args:
    seq_btd: the encoder's sequence output [B, T, D] (any float dtype).
    attention_mask_bt: [B, T] 1 at real tokens, 0 at padding.
    pooling: 'mean' or 'cls'.

  Raises:
    ValueError: an unknown pooling.
  """
  if pooling not in POOLINGS:
    raise ValueError(f'pooling must be one of {", ".join(POOLINGS)}, got {pooling!r}')
  seq_btd = seq_btd.astype(jnp.float32)
  if pooling == 'cls':
    return seq_btd[:, 0]
  mask_bt1 = attention_mask_bt[..., None].astype(jnp.float32)
  return (seq_btd * mask_bt1).sum(1) / jnp.maximum(mask_bt1.sum(1), 1.0)


def pool_segments(seq_rtd: jax.Array, segment_ids_rt: jax.Array, position_ids_rt: jax.Array, num_segments: int,
                  pooling: str) -> jax.Array:
  """float32 [R, S, D]: `pool` of every segment of packed rows, segment s + 1 of row r at [r, s].

  Packed rows hold several texts each (`segment_ids` 1, 2, ... per text, 0 at padding; positions restarting at 0 in
  each): a text's vector is the mean of its own tokens, or its first token (position 0) for 'cls', the same as
  `pool` of the text padded alone. One einsum against the one-hot of the segments: no gather of per-text token
  windows. A slot with no segment (s + 1 past the row's last) is zero.

  Args:
    seq_rtd: the encoder's sequence output [R, T, D] of the packed rows.
    segment_ids_rt, position_ids_rt: int [R, T].
    num_segments: S, at least the most segments a row holds.
    pooling: 'mean' or 'cls'.
  """
  if pooling not in POOLINGS:
    raise ValueError(f'pooling must be one of {", ".join(POOLINGS)}, got {pooling!r}')
  onehot_rts = segment_ids_rt[..., None] == jnp.arange(1, num_segments + 1)
  if pooling == 'cls':
    onehot_rts = onehot_rts & (position_ids_rt == 0)[..., None]
  weights_rts = onehot_rts.astype(jnp.float32)
  # HIGHEST: float32 products on every backend (not TF32 or bfloat16 passes), as `pool`'s elementwise sum.
  sums_rsd = jnp.einsum('rtd,rts->rsd', seq_rtd.astype(jnp.float32), weights_rts,
                        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return sums_rsd / jnp.maximum(weights_rts.sum(1), 1.0)[..., None]


def l2_normalize(x_bd: jax.Array, eps: float = NORM_EPS) -> jax.Array:
  """x / max(||x||, eps) along the last axis, in float32.

  Written with rsqrt of the clamped squared norm so that the gradient is finite at x = 0 too
  (jnp.linalg.norm's is NaN there).
  """
  x_bd = x_bd.astype(jnp.float32)
  return x_bd * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(x_bd), axis=-1, keepdims=True), eps * eps))


def truncate(x_bd: jax.Array, dim: int) -> jax.Array:
  """The first `dim` components of each vector, normalised again (a Matryoshka embedding of size `dim`)."""
  return l2_normalize(x_bd[..., :dim])


def sentence_embedding(encoder, input_ids_bt, token_type_ids_bt, attention_mask_bt, *, pooling: str,
                       normalize: bool = True, deterministic: bool = True) -> jax.Array:
  """float32 [B, D]: a `BertEncoder` over a padded batch, pooled (and normalised).

  Args:
    encoder: a `bert_jax.model.encoder.BertEncoder` (or anything with its call signature).
    input_ids_bt, token_type_ids_bt, attention_mask_bt: int [B, T], right-padded.
    pooling: 'mean' or 'cls'.
    normalize: L2-normalise the result.
    deterministic: disables dropout (False in training: the encoder draws from its dropout streams).
  """
  seq_btd, _ = encoder(input_ids_bt, token_type_ids_bt, attention_mask_bt, deterministic=deterministic)
  emb_bd = pool(seq_btd, attention_mask_bt, pooling)
  return l2_normalize(emb_bd) if normalize else emb_bd
