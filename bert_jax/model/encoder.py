"""The encoder layer (post- or pre-LN) and BertEncoder (+ pooler), with remat and scan over the layers."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax import hardware
from bert_jax.config import ModelConfig
from bert_jax.model.attention import SelfAttention, band_mask
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import Dense, Embeddings, LayerNorm, compute_dtype, rotary_tables
from bert_jax.sharding import constrain


def attention_mask_b11s(attention_mask_bs: jax.Array) -> jax.Array:
  """Key-padding mask [B, 1, 1, S] (True = attend) from a [B, S] 0/1 mask."""
  return attention_mask_bs.astype(bool)[:, None, None, :]


def segment_mask_b1ts(segment_ids_bt: jax.Array) -> jax.Array:
  """Block-diagonal mask [B, 1, T, S] for packed rows: attend within the same segment id > 0."""
  same_bts = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
  return (same_bts & (segment_ids_bt[:, None, :] > 0))[:, None]


def window_mask_b1ts(mask_b11s: jax.Array, window: int) -> jax.Array:
  """`mask_b11s` restricted to keys at most window / 2 positions from the query (a local layer's mask).

  Distances count positions in the row: in a packed row an example's tokens are contiguous, so its
  window is the one it has alone.
  """
  t = mask_b11s.shape[-1]
  offset_ts = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]
  return mask_b11s & (jnp.abs(offset_ts) <= window // 2)[None, None]


# model.remat_policy -> what jax.checkpoint saves for the backward pass (None: no remat).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_saveable,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _runs(graphdefs) -> list[tuple[int, int]]:
  """[start, stop) of each run of consecutive equal graphdefs."""
  runs = []
  for i, g in enumerate(graphdefs):
    if runs and graphdefs[runs[-1][0]] == g:
      runs[-1] = (runs[-1][0], i + 1)
    else:
      runs.append((i, i + 1))
  return runs


def run_layers(layers, x_btd, contexts, kinds, *, deterministic: bool, remat_policy: str = 'none',
               scan: bool = False) -> jax.Array:
  """Applies `layers` in order as pure functions of their split state, under jax.checkpoint and/or lax.scan.

  Each layer is split into (graphdef, params, rest); `rest` holds its dropout RNG streams, one
  key per Dropout (`nnx.reseed` gives every stream its own), so rematerialised and scanned
  layers draw exactly the dropout masks of the plain loop: the same function, not merely the
  same distribution. With `scan`, each run of structurally identical layers (all of them, or all
  but a pre-LN encoder's first) is one lax.scan over its states stacked along a new leading axis
  inside the computation only (a copy under jit); the modules and the parameter tree keep one
  entry per layer, so checkpoints, HF import/export and sharding rules are unchanged. Global and
  local layers run apart (their masks differ in shape: a local layer's is a band), so a
  ModernBERT-style alternation scans each run of one kind. Updated RNG counters are written back,
  as the plain loop's calls would leave them.

  Args:
    layers: modules called as `layer(x, *context, deterministic=...)`.
    x_btd: [B, T, D] input of the first layer.
    contexts: per layer kind, the arguments after x: (mask, rope tables or None).
    kinds: per layer, the index of its context (python ints).
    deterministic: disables dropout.
    remat_policy: a key of REMAT_POLICIES.
    scan: run each run of identical layers of one kind as one jax.lax.scan (compile once, not once per layer).

  Returns:
    The last layer's output [B, T, D].
  """
  splits = [nnx.split(layer, nnx.Param, ...) for layer in layers]
  policy = REMAT_POLICIES[remat_policy]
  # A run is one kind of layer too: global and local layers take masks of different shapes.
  keys = [(g, kind) for (g, _, _), kind in zip(splits, kinds)]

  def make_apply(graphdef):
    def apply(params, rest, x_btd, context):
      layer = nnx.merge(graphdef, params, rest)
      y_btd = layer(x_btd, *context, deterministic=deterministic)
      return y_btd, nnx.split(layer, nnx.Param, ...)[2]
    if remat_policy != 'none':
      # Inside scan the loop already keeps XLA from merging the recomputation with the forward pass.
      apply = jax.checkpoint(apply, policy=policy, prevent_cse=not scan)
    return apply

  new_rests = []
  for start, stop in _runs(keys):
    apply, group = make_apply(splits[start][0]), splits[start:stop]
    if scan and stop - start > 1:
      params_l = jax.tree.map(lambda *xs: jnp.stack(xs), *[p for _, p, _ in group])
      rest_l = jax.tree.map(lambda *xs: jnp.stack(xs), *[r for _, _, r in group])
      context = contexts[kinds[start]]

      def body(x_btd, state, context=context, apply=apply):
        params, rest = state
        return apply(params, rest, x_btd, context)

      x_btd, new_rest_l = jax.lax.scan(body, x_btd, (params_l, rest_l))
      new_rests += [jax.tree.map(lambda a, i=i: a[i], new_rest_l) for i in range(stop - start)]
    else:
      for (_, params, rest), kind in zip(group, kinds[start:stop]):
        x_btd, new_rest = apply(params, rest, x_btd, contexts[kind])
        new_rests.append(new_rest)
  if not deterministic:  # dropout advanced the RNG counters
    for layer, new_rest in zip(layers, new_rests):
      nnx.update(layer, new_rest)
  return x_btd


_ACTIVATIONS_BTD = ('activation_batch', 'activation_length', 'activation_embed')
_ACTIVATIONS_BTI = ('activation_batch', 'activation_length', 'activation_mlp')


class EncoderLayer(nnx.Module):
  """A transformer layer: self-attention and an MLP, each in a residual branch with LayerNorm and dropout.

  Post-LN (BERT): x = LN(x + Attn(x)); x = LN(x + MLP(x)). Pre-LN: x = x + Attn(LN(x)); x = x + MLP(LN(x)),
  where the first layer (`first`) has no LayerNorm before its attention: its input is the embeddings'
  LayerNorm output (ModernBERT). MLP: dense, exact GELU, dense; or GeGLU: GELU(x W) * (x V), dense.
  `platform`: the one it is built for (`hardware.resolve`; None: jax's default devices').
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, first: bool = False, platform: str | None = None):
    d, i, std = cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range
    dtype = compute_dtype(cfg)
    platform = hardware.resolve(platform)
    norm = dict(eps=cfg.layer_norm_eps, dtype=dtype, use_bias=cfg.use_bias)
    dense = dict(std=std, dtype=dtype, rngs=rngs, use_bias=cfg.use_bias, platform=platform)
    self.pre_norm = cfg.norm_position == 'pre'
    self.attention = SelfAttention(cfg, rngs=rngs, platform=platform)
    if self.pre_norm:
      self.attention_norm = None if first else LayerNorm(d, **norm)
      self.mlp_norm = LayerNorm(d, **norm)
    else:
      self.attention_norm = LayerNorm(d, **norm)
    self.geglu = cfg.mlp == 'geglu'
    if self.geglu:  # [D, 2, I]: [:, 0] goes through GELU, [:, 1] gates it
      self.intermediate = Dense((d,), (2, i), ('embed', None, 'mlp'), **dense)
    else:
      self.intermediate = Dense((d,), (i,), ('embed', 'mlp'), **dense)
    self.output = Dense((i,), (d,), ('mlp', 'embed'), **dense)
    if not self.pre_norm:
      self.output_norm = LayerNorm(d, **norm)
    self.dropout = Dropout(cfg.hidden_dropout, impl=cfg.dropout_impl, rngs=rngs)

  def attention_input(self, x_btd):
    """What the attention sees of the layer input: the input itself (post-LN, first pre-LN layer) or its LN."""
    return self.attention_norm(x_btd) if self.pre_norm and self.attention_norm is not None else x_btd

  def mlp(self, x_btd, *, deterministic: bool):
    h = self.intermediate(x_btd)
    if self.geglu:
      h_bt2i = constrain(h, ('activation_batch', 'activation_length', None, 'activation_mlp'))
      h_bti = jax.nn.gelu(h_bt2i[..., 0, :], approximate=False) * h_bt2i[..., 1, :]
    else:
      h_bti = jax.nn.gelu(constrain(h, _ACTIVATIONS_BTI), approximate=False)
    return self.dropout(self.output(h_bti), deterministic=deterministic)

  def __call__(self, x_btd, mask_b11s, rope=None, *, deterministic: bool, return_probs: bool = False):
    """Returns y [B, T, D], or (y, attention probabilities [B, N, T, S]) when `return_probs`.

    `rope`: rotary (cos, sin) tables [B, T, H / 2] (position_embedding='rotary'), else None.
    """
    a_btd = self.attention(self.attention_input(x_btd), mask_b11s, rope, deterministic=deterministic,
                           return_probs=return_probs)
    if return_probs:
      a_btd, probs_bnts = a_btd
    a_btd = self.dropout(a_btd, deterministic=deterministic)
    if self.pre_norm:
      x_btd = x_btd + a_btd
      y_btd = x_btd + self.mlp(self.mlp_norm(x_btd), deterministic=deterministic)
    else:
      x_btd = self.attention_norm(x_btd + a_btd)
      y_btd = self.output_norm(x_btd + self.mlp(x_btd, deterministic=deterministic))
    y_btd = constrain(y_btd, _ACTIVATIONS_BTD)
    return (y_btd, probs_bnts) if return_probs else y_btd


class BertEncoder(nnx.Module):
  """Embeddings, `num_layers` encoder layers (post- or pre-LN, then a final LayerNorm) and the [CLS] pooler
  (dense + tanh, or model.pooler_activation; + LayerNorm with model.pooler_norm).

  `platform`: the one the model is built for ('cpu', 'gpu', 'rocm', 'tpu': `hardware.resolve`, e.g. of the run's
  mesh), kept by every layer: it picks the attention kernel and Dense's backward. None: jax's default devices',
  resolved here, once.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
    self.cfg = cfg
    platform = hardware.resolve(platform)
    self.embeddings = Embeddings(cfg, rngs=rngs, platform=platform)
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs, first=i == 0, platform=platform)
                            for i in range(cfg.num_layers)])
    if cfg.norm_position == 'pre':  # the residual stream is never normalised inside the layers
      self.final_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=compute_dtype(cfg),
                                  use_bias=cfg.use_bias)
    self.pooler = Dense((cfg.hidden_size,), (cfg.hidden_size,), ('embed', 'mlp'), std=cfg.initializer_range,
                        dtype=compute_dtype(cfg), rngs=rngs, use_bias=cfg.use_bias, platform=platform)
    if cfg.pooler_norm:  # ModernBERT's classification head: dense, GELU, LayerNorm
      self.pooler_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=compute_dtype(cfg),
                                   use_bias=cfg.use_bias)

  def pool(self, cls_xd: jax.Array) -> jax.Array:
    """The pooler on [CLS] vectors [..., D]: model.pooler_activation(dense(x)), then LayerNorm with
    model.pooler_norm."""
    y_xd = self.pooler(cls_xd)
    activation = self.cfg.pooler_activation
    if activation == 'relu':
      y_xd = jax.nn.relu(y_xd)
    elif activation == 'gelu':
      y_xd = jax.nn.gelu(y_xd, approximate=False)
    else:
      y_xd = jnp.tanh(y_xd)
    return self.pooler_norm(y_xd) if self.cfg.pooler_norm else y_xd

  def layer_contexts(self, mask_b11s, position_ids_bt, attention_mask_bt=None, segment_ids_bt=None,
                     full_masks: bool = False) -> tuple[list[tuple], tuple[int, ...]]:
    """(contexts, kinds): what each layer is called with after its input, per kind (0 global, 1 local),
    and each layer's kind. A context is (mask, rotary tables or None); a local layer's mask is a band of
    blocks (`attention.band_mask`: linear cost) when the row is longer than the window, unless `full_masks`."""
    cfg = self.cfg
    rotary = cfg.position_embedding == 'rotary'
    windows = cfg.layer_windows

    def rope(theta):
      return rotary_tables(position_ids_bt, cfg.head_dim, theta) if rotary else None

    contexts = [(mask_b11s, rope(cfg.rope_theta))]
    if any(windows):
      t = position_ids_bt.shape[1]
      if t > cfg.attention_window and not full_masks:
        local = band_mask(cfg.attention_window, t, None if segment_ids_bt is not None else attention_mask_bt,
                          segment_ids_bt)
      else:
        local = window_mask_b1ts(mask_b11s, cfg.attention_window)
      contexts.append((local, rope(cfg.local_rope_theta)))
    return contexts, tuple(int(w > 0) for w in windows)

  def __call__(self, input_ids_bt, token_type_ids_bt=None, attention_mask_bt=None, position_ids_bt=None,
               *, segment_ids_bt=None, deterministic: bool = True, return_attention: bool = False):
    """Encodes a batch.

    Args:
      input_ids_bt: int [B, T] token ids.
      token_type_ids_bt: int [B, T] segment ids (0 for A, 1 for B); zeros when None; unused without a
        token type table (type_vocab_size=0).
      attention_mask_bt: int [B, T], 1 at real tokens, right-padded (a prefix of ones per row: cuDNN takes
        each row's length, `cfg.fused_mask`); when None, every token that is not [PAD]
        (`cfg.pad_token_id`): a padded batch never attends to its padding.
      position_ids_bt: int [B, T]; 0..T-1 when None (learned or rotary positions).
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
    contexts, kinds = self.layer_contexts(mask_b11s, position_ids_bt, attention_mask_bt, segment_ids_bt,
                                          full_masks=return_attention)
    probs = []
    if not return_attention and (self.cfg.scan_layers or self.cfg.remat_policy != 'none'):
      x_btd = run_layers(self.layers, x_btd, contexts, kinds, deterministic=deterministic,
                         remat_policy=self.cfg.remat_policy, scan=self.cfg.scan_layers)
    else:
      for layer, kind in zip(self.layers, kinds):
        x_btd = layer(x_btd, *contexts[kind], deterministic=deterministic, return_probs=return_attention)
        if return_attention:
          x_btd, probs_bnts = x_btd
          probs.append(probs_bnts)
    if self.cfg.norm_position == 'pre':
      x_btd = self.final_norm(x_btd)
    pooled_bd = self.pool(x_btd[:, 0])
    if return_attention:
      return x_btd, pooled_bd, jnp.stack(probs)
    return x_btd, pooled_bd


def count_params(params) -> int:
  """Number of scalars in a parameter pytree."""
  return sum(x.size for x in jax.tree.leaves(params))
