"""The bi-encoder: one encoder for queries and passages, pooled and normalised, and its (fixed or learned) temperature.

`BiEncoder` is the encoder (`bert`, so a checkpoint's encoder loads as for every head model) and, when the
temperature is learned, its one unconstrained parameter (`bounded_temperature`); `ContrastiveSpec` says how it is
pooled and trained. `embed_batch` runs a contrastive batch through an encoder; `embed_fn` makes that a pure function
for GradCache (`train.gradcache`).

The batch holds padded token ids per side (token types are all 0: each text is encoded alone):

  query_input_ids, query_attention_mask        int [B, T_q]
  passage_input_ids, passage_attention_mask    int [B, T_p]
  negative_input_ids, negative_attention_mask  int [B, K, T_p]  (optional: K hard negatives per query)

or, packed (`embedding.packed_pairs`), every text of the batch in rows of T tokens, several per row:

  input_ids, segment_ids, position_ids         int [R, T]  (segment ids 1, 2, ... per text, 0 at padding;
                                                            positions restart at 0 in each text)
  segment_lengths                              int [R, S]  (each slot's tokens; S: the most texts a row holds)
  query_row, query_segment                     int [B]     (the row and slot of each query)
  passage_row, passage_segment                 int [B]
  negative_row, negative_segment               int [B, K]  (optional)

The encoder then runs once over the rows (attention inside each text, `BertEncoder`'s segment_ids), each text is
pooled from its own tokens (`pooling.pool_segments`) and picked out by its (row, slot): the same vectors as the
padded batch's.

`embed_fn` turns a module into the pure (params, micro_batch, key) -> embeddings function that `gradcache` (and the
uncached step) differentiate: the dropout streams are reseeded from `key` inside it, so the masks are a function of
the key alone and a recomputation with the same key draws the same ones.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.config import ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.pooling import POOLINGS, l2_normalize, pool_segments, sentence_embedding

# A learned temperature lives in [TEMPERATURE_MIN, TEMPERATURE_MAX] (CLIP caps its logit scale at 100, i.e. 0.01).
TEMPERATURE_MIN = 0.01
TEMPERATURE_MAX = 1.0
DEFAULT_TEMPERATURE = 0.05  # sentence-transformers' MultipleNegativesRankingLoss: scale 20

def check_temperature(temperature: float) -> float:
  """`temperature` as a float; ConfigError unless it is a finite number > 0."""
  try:
    value = float(temperature)
  except (TypeError, ValueError):
    raise ConfigError(f'temperature must be a number > 0, got {temperature!r}') from None
  if not math.isfinite(value) or value <= 0:
    raise ConfigError(f'temperature must be a finite number > 0, got {temperature!r}')
  return value


def check_temperature_bounds(lo: float, hi: float, init: float) -> None:
  """ConfigError unless 0 < lo < hi and lo <= init <= hi."""
  lo, hi, init = check_temperature(lo), check_temperature(hi), check_temperature(init)
  if not lo < hi:
    raise ConfigError(f'the learned temperature\'s bounds must satisfy min < max, got min={lo} max={hi}')
  if not lo <= init <= hi:
    raise ConfigError(f'the initial temperature {init} lies outside its bounds [{lo}, {hi}]')


def bounded_temperature(raw: jax.Array, lo: float = TEMPERATURE_MIN, hi: float = TEMPERATURE_MAX) -> jax.Array:
  """A learned temperature from its unconstrained parameter `raw`: log t = log lo + (log hi - log lo) sigmoid(raw).

  The bound is smooth rather than a clip: a clipped log-temperature that overshoots its bound gets zero gradient and
  can stay there; here the gradient only shrinks near the bounds, and t never leaves [lo, hi].
  """
  log_lo, log_hi = math.log(lo), math.log(hi)
  return jnp.exp(log_lo + (log_hi - log_lo) * jax.nn.sigmoid(jnp.asarray(raw, jnp.float32)))


def temperature_parameter(init: float = DEFAULT_TEMPERATURE, lo: float = TEMPERATURE_MIN,
                          hi: float = TEMPERATURE_MAX) -> np.float32:
  """The `raw` value for which `bounded_temperature(raw, lo, hi)` is `init` (ConfigError for bad bounds)."""
  check_temperature_bounds(lo, hi, init)
  u = (math.log(init) - math.log(lo)) / (math.log(hi) - math.log(lo))
  u = min(max(u, 1e-6), 1 - 1e-6)  # init at a bound: as close as float32 allows
  return np.float32(math.log(u / (1 - u)))


def check_matryoshka_dims(dims: Sequence[int], hidden_size: int) -> tuple[int, ...]:
  """`dims` as a tuple; ConfigError unless they are positive integers, strictly decreasing, at most `hidden_size`.

  E.g. (384, 256, 128, 64) for a 384-wide model: the loss is taken at each leading size.
  """
  dims = tuple(dims)
  if not dims:
    raise ConfigError('matryoshka dims must name at least one size')
  if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
    raise ConfigError(f'matryoshka dims must be positive integers, got {dims}')
  if max(dims) > hidden_size:
    raise ConfigError(f'matryoshka dim {max(dims)} exceeds the model\'s hidden size {hidden_size}')
  if any(a <= b for a, b in zip(dims, dims[1:])):
    raise ConfigError(f'matryoshka dims must be strictly decreasing (largest first), got {dims}')
  return tuple(int(d) for d in dims)


SIDES = ('query', 'passage', 'negative')


def embed_batch(encoder, batch: dict[str, jax.Array], *, pooling: str, normalize: bool = True,
                deterministic: bool = True) -> dict[str, jax.Array]:
  """{'query': [B, D], 'passage': [B, D], and with negatives 'negative': [B, K, D]}, float32.

  The encoder runs once per side (query, passage, negatives flattened to [B * K, T]); with dropout each call draws
  its own masks (the module's dropout stream advances between calls).
  """
  if 'segment_ids' in batch:
    return _embed_packed(encoder, batch, pooling=pooling, normalize=normalize, deterministic=deterministic)
  out = {}
  for side in SIDES:
    if f'{side}_input_ids' not in batch:
      continue
    ids, mask = batch[f'{side}_input_ids'], batch[f'{side}_attention_mask']
    lead = ids.shape[:-1]
    ids, mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
    emb = sentence_embedding(encoder, ids, jax.numpy.zeros_like(ids), mask, pooling=pooling, normalize=normalize,
                             deterministic=deterministic)
    out[side] = emb.reshape(*lead, emb.shape[-1])
  return out


def _embed_packed(encoder, batch: dict[str, jax.Array], *, pooling: str, normalize: bool,
                  deterministic: bool) -> dict[str, jax.Array]:
  """`embed_batch` of a packed batch: one encoder call over the rows, each text pooled from its own segment."""
  ids, segments, positions = batch['input_ids'], batch['segment_ids'], batch['position_ids']
  seq_rtd, _ = encoder(ids, jnp.zeros_like(ids), None, positions, segment_ids_bt=segments,
                       deterministic=deterministic)
  pooled_rsd = pool_segments(seq_rtd, segments, positions, batch['segment_lengths'].shape[1], pooling)
  out = {}
  for side in SIDES:
    if f'{side}_row' in batch:
      emb = pooled_rsd[batch[f'{side}_row'], batch[f'{side}_segment']]  # [B, D] or [B, K, D]
      out[side] = l2_normalize(emb) if normalize else emb
  return out


def embed_fn(graphdef: nnx.GraphDef, rest: Any, *, pooling: str, normalize: bool = True, train: bool = True):
  """The pure embedding function of an encoder split as `nnx.split(encoder, nnx.Param, ...)`.

  Args:
    graphdef, rest: the encoder's graph and non-parameter state (its dropout RNG streams), e.g. as pure dicts.
    pooling: 'mean' or 'cls'.
    train: dropout on (masks drawn from the key), else deterministic.

  Returns:
    (params, batch, key) -> `embed_batch` of the merged encoder, its dropout streams reseeded from `key`.
  """
  def fn(params, batch, key):
    encoder = nnx.merge(graphdef, params, rest)
    if train:
      nnx.reseed(encoder, dropout=key)
    return embed_batch(encoder, batch, pooling=pooling, normalize=normalize, deterministic=not train)
  return fn


@dataclasses.dataclass(frozen=True)
class ContrastiveSpec:
  """How a bi-encoder is trained: pooling, temperature, directions and Matryoshka sizes."""

  pooling: str = 'mean'
  temperature: float = DEFAULT_TEMPERATURE  # fixed, or the learned one's initial value
  learn_temperature: bool = False
  temperature_min: float = TEMPERATURE_MIN
  temperature_max: float = TEMPERATURE_MAX
  symmetric: bool = False
  matryoshka_dims: tuple[int, ...] = ()  # () : the full size only
  matryoshka_weights: tuple[float, ...] = ()  # () : equal

  @classmethod
  def of(cls, cfg) -> ContrastiveSpec:
    """The spec of a retrieval `FinetuneConfig` (what its run trains, and what its checkpoints hold)."""
    return cls(pooling=cfg.pooling, temperature=cfg.temperature, learn_temperature=cfg.learn_temperature,
               temperature_min=cfg.temperature_min, temperature_max=cfg.temperature_max, symmetric=cfg.symmetric,
               matryoshka_dims=cfg.retrieval_dims(), matryoshka_weights=cfg.retrieval_weights())

  def check(self, hidden_size: int) -> None:
    """ConfigError for a bad pooling, temperature, bounds or Matryoshka sizes for a model of `hidden_size`."""
    if self.pooling not in POOLINGS:
      raise ConfigError(f'pooling must be one of {", ".join(POOLINGS)}, got {self.pooling!r}')
    check_temperature(self.temperature)
    if self.learn_temperature:
      check_temperature_bounds(self.temperature_min, self.temperature_max, self.temperature)
    if self.matryoshka_dims:
      dims = check_matryoshka_dims(self.matryoshka_dims, hidden_size)
      if self.matryoshka_weights and len(self.matryoshka_weights) != len(dims):
        raise ConfigError(f'{len(self.matryoshka_weights)} matryoshka weights for {len(dims)} dims')
    elif self.matryoshka_weights:
      raise ConfigError('matryoshka weights without matryoshka dims')


class BiEncoder(nnx.Module):
  """One encoder for queries and passages (shared weights), pooled and normalised, and the temperature; `platform`:
  `BertEncoder`'s."""

  def __init__(self, cfg: ModelConfig, spec: ContrastiveSpec, *, rngs: nnx.Rngs, platform: str | None = None):
    spec.check(cfg.hidden_size)
    self.spec = spec
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    # The learned temperature's unconstrained parameter (`bounded_temperature`), or None when fixed.
    self.temperature = nnx.Param(jnp.asarray(temperature_parameter(
        spec.temperature, spec.temperature_min, spec.temperature_max))) if spec.learn_temperature else None

  def embed(self, batch: dict[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
    return embed_batch(self.bert, batch, pooling=self.spec.pooling, deterministic=deterministic)

  def temperature_value(self) -> jax.Array:
    if self.temperature is None:
      return jnp.float32(self.spec.temperature)
    return bounded_temperature(self.temperature[...], self.spec.temperature_min,
                                           self.spec.temperature_max)
