"""The post-LN encoder layer and BertEncoder (+ pooler), with remat and scan over the layers."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import ModelConfig
from bert_jax.model.attention import SelfAttention
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import Dense, Embeddings, LayerNorm, compute_dtype
from bert_jax.sharding import constrain


def attention_mask_b11s(attention_mask_bs: jax.Array) -> jax.Array:
  """Key-padding mask [B, 1, 1, S] (True = attend) from a [B, S] 0/1 mask."""
  return attention_mask_bs.astype(bool)[:, None, None, :]


def segment_mask_b1ts(segment_ids_bt: jax.Array) -> jax.Array:
  """Block-diagonal mask [B, 1, T, S] for packed rows: attend within the same segment id > 0."""
  same_bts = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
  return (same_bts & (segment_ids_bt[:, None, :] > 0))[:, None]


# model.remat_policy -> what jax.checkpoint saves for the backward pass (None: no remat).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_saveable,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def run_layers(layers, x_btd, mask_b11s, *, deterministic: bool, remat_policy: str = 'none',
               scan: bool = False) -> jax.Array:
  """Applies `layers` in order as pure functions of their split state, under jax.checkpoint and/or lax.scan.

  Each layer is split into (graphdef, params, rest); `rest` holds its dropout RNG streams, one
  key per Dropout (`nnx.reseed` gives every stream its own), so rematerialised and scanned
  layers draw exactly the dropout masks of the plain loop: the same function, not merely the
  same distribution. With `scan`, the per-layer states are stacked along a new leading axis
  inside the computation only (a copy under jit); the modules and the parameter tree keep one
  entry per layer, so checkpoints, HF import/export and sharding rules are unchanged. Updated
  RNG counters are written back, as the plain loop's calls would leave them.

  Args:
    layers: a sequence of structurally identical modules called as `layer(x, mask, deterministic=...)`.
    x_btd: [B, T, D] input of the first layer.
    mask_b11s: boolean attention mask, passed to every layer.
    deterministic: disables dropout.
    remat_policy: a key of REMAT_POLICIES.
    scan: run the layers as one jax.lax.scan (compile once, not once per layer).

  Returns:
    The last layer's output [B, T, D].
  """
  splits = [nnx.split(layer, nnx.Param, ...) for layer in layers]
  graphdef = splits[0][0]
  if any(g != graphdef for g, _, _ in splits[1:]):
    raise ValueError('run_layers needs structurally identical layers')

  def apply(params, rest, x_btd, mask):
    layer = nnx.merge(graphdef, params, rest)
    y_btd = layer(x_btd, mask, deterministic=deterministic)
    return y_btd, nnx.split(layer, nnx.Param, ...)[2]

  policy = REMAT_POLICIES[remat_policy]
  if remat_policy != 'none':
    # Inside scan the loop already keeps XLA from merging the recomputation with the forward pass.
    apply = jax.checkpoint(apply, policy=policy, prevent_cse=not scan)
  if scan:
    params_l = jax.tree.map(lambda *xs: jnp.stack(xs), *[p for _, p, _ in splits])
    rest_l = jax.tree.map(lambda *xs: jnp.stack(xs), *[r for _, _, r in splits])

    def body(x_btd, state):
      return apply(*state, x_btd, mask_b11s)

    x_btd, new_rest_l = jax.lax.scan(body, x_btd, (params_l, rest_l))
    new_rests = [jax.tree.map(lambda a, i=i: a[i], new_rest_l) for i in range(len(splits))]
  else:
    new_rests = []
    for _, params, rest in splits:
      x_btd, new_rest = apply(params, rest, x_btd, mask_b11s)
      new_rests.append(new_rest)
  if not deterministic:  # dropout advanced the RNG counters
    for layer, new_rest in zip(layers, new_rests):
      nnx.update(layer, new_rest)
  return x_btd


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
    h_bti = jax.nn.gelu(constrain(self.intermediate(x_btd), ('activation_batch', 'activation_length', 'activation_mlp')),
                        approximate=False)
    h_btd = self.dropout(self.output(h_bti), deterministic=deterministic)
    y_btd = constrain(self.output_norm(x_btd + h_btd), ('activation_batch', 'activation_length', 'activation_embed'))
    return (y_btd, probs_bnts) if return_probs else y_btd


class BertEncoder(nnx.Module):
  """Embeddings, `num_layers` post-LN encoder layers and the [CLS] pooler (dense + tanh)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.pooler = Dense((cfg.hidden_size,), (cfg.hidden_size,), ('embed', 'mlp'),
                        std=cfg.initializer_range, dtype=compute_dtype(cfg), rngs=rngs)

  def __call__(self, input_ids_bt, token_type_ids_bt=None, attention_mask_bt=None, position_ids_bt=None,
               *, segment_ids_bt=None, deterministic: bool = True, return_attention: bool = False):
    """Encodes a batch.

    Args:
      input_ids_bt: int [B, T] token ids.
      token_type_ids_bt: int [B, T] segment ids (0 for A, 1 for B); zeros when None.
      attention_mask_bt: int [B, T], 1 at real tokens; when None, every token that is not
        [PAD] (`cfg.pad_token_id`): a padded batch never attends to its padding.
      position_ids_bt: int [B, T]; 0..T-1 when None.
      segment_ids_bt: int [B, T] for packed rows (several examples per row): tokens attend only
        to tokens of the same segment id, 0 = padding; replaces `attention_mask_bt` when given.
      deterministic: disables dropout.
      return_attention: also return every layer's attention probabilities, computed by the
        explicit (XLA einsum) attention path whatever kernel `attention_impl` selects, in a
        plain loop over the layers whatever `scan_layers` and `remat_policy` say.

    Returns:
      (sequence_output [B, T, D], pooled_output [B, D]) in the compute dtype; with
      `return_attention`, a third element: float32 probabilities [L, B, N, T, T] (zero at
      padded keys).
    """
    if token_type_ids_bt is None:
      token_type_ids_bt = jnp.zeros_like(input_ids_bt)
    if attention_mask_bt is None:
      attention_mask_bt = (input_ids_bt != self.cfg.pad_token_id).astype(jnp.int32)
    if position_ids_bt is None:
      position_ids_bt = jnp.broadcast_to(jnp.arange(input_ids_bt.shape[1]), input_ids_bt.shape)
    x_btd = self.embeddings(input_ids_bt, token_type_ids_bt, position_ids_bt, deterministic=deterministic)
    if segment_ids_bt is not None:
      mask_b11s = segment_mask_b1ts(segment_ids_bt)
    else:
      mask_b11s = attention_mask_b11s(attention_mask_bt)
    probs = []
    if not return_attention and (self.cfg.scan_layers or self.cfg.remat_policy != 'none'):
      x_btd = run_layers(self.layers, x_btd, mask_b11s, deterministic=deterministic,
                         remat_policy=self.cfg.remat_policy, scan=self.cfg.scan_layers)
    else:
      for layer in self.layers:
        x_btd = layer(x_btd, mask_b11s, deterministic=deterministic, return_probs=return_attention)
        if return_attention:
          x_btd, probs_bnts = x_btd
          probs.append(probs_bnts)
    pooled_bd = jnp.tanh(self.pooler(x_btd[:, 0]))
    if return_attention:
      return x_btd, pooled_bd, jnp.stack(probs)
    return x_btd, pooled_bd


def count_params(params) -> int:
  """Number of scalars in a parameter pytree."""
  return sum(x.size for x in jax.tree.leaves(params))
