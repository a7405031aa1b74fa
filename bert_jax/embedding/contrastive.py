"""InfoNCE for embedding models: in-batch negatives over the global batch, hard negatives, masked false negatives,
a fixed or learned (bounded) temperature, and Matryoshka dimensions.

Query i's positive is passage i; its negatives are every other passage and every hard negative of the batch (that
is sentence-transformers' MultipleNegativesRankingLoss, and with `symmetric` its symmetric variant: passage i also
picks query i among all queries). Similarities are cosines (vectors are normalised here, after any Matryoshka
truncation), divided by the temperature, in float32.

The global batch: the functions take global arrays. Inside `jax.jit` with the batch split over the data and fsdp
mesh axes, the queries stay split (each device scores its own rows) and the candidates (passages and hard
negatives) are pinned replicated (`sharding.constrain`), so XLA all-gathers them: every query is scored against every
passage of the global batch, not only those on its device, and the gradient of that all-gather (a reduce-scatter)
returns each candidate's gradient to the device that holds it. The loss is therefore the one-device loss of the same
global batch, whatever the mesh (tests/embedding/test_contrastive.py checks it on 8 devices).

False negatives: a candidate that is the same passage as the query's positive (equal `passage_ids`: ids or content
hashes) is not a negative: it is masked out of the softmax, as is, with `query_ids`, the positive of another row of the
same query (a query with several positives). In the passage -> query direction, query j is masked for passage i when
it is the same query or its positive is the same passage. Only negatives are masked, never a row's own positive.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.embedding.pooling import truncate
from bert_jax.errors import ConfigError
from bert_jax.sharding import constrain

# A learned temperature lives in [TEMPERATURE_MIN, TEMPERATURE_MAX] (CLIP caps its logit scale at 100, i.e. 0.01).
TEMPERATURE_MIN = 0.01
TEMPERATURE_MAX = 1.0
DEFAULT_TEMPERATURE = 0.05  # sentence-transformers' MultipleNegativesRankingLoss: scale 20

_ROWS = ('activation_batch', None)  # queries: split over the batch axes
_GATHERED = (None, None)  # candidates: every device sees the whole global batch


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


def _check_weights(weights: Sequence[float] | None, dims: tuple[int, ...]) -> tuple[float, ...]:
  if weights is None:
    return (1.0,) * len(dims)
  weights = tuple(float(w) for w in weights)
  if len(weights) != len(dims):
    raise ConfigError(f'{len(weights)} matryoshka weights for {len(dims)} dims')
  if any(not math.isfinite(w) or w < 0 for w in weights) or not sum(weights) > 0:
    raise ConfigError(f'matryoshka weights must be finite, >= 0 and not all 0, got {weights}')
  return weights


def _direction(anchors_bd, candidates_cd, mask_bc, temperature):
  """(per-row loss [B], per-row top-1 hit [B]): row i's positive is candidate i; masked candidates are dropped."""
  anchors_bd = constrain(anchors_bd, _ROWS)
  candidates_cd = constrain(candidates_cd, _GATHERED)
  logits_bc = jnp.einsum('bd,cd->bc', anchors_bd, candidates_cd, preferred_element_type=jnp.float32) / temperature
  logits_bc = constrain(jnp.where(mask_bc, -jnp.inf, logits_bc), _ROWS)
  b = logits_bc.shape[0]
  positive_b = jnp.take_along_axis(logits_bc, jnp.arange(b)[:, None], axis=1)[:, 0]
  loss_b = jax.nn.logsumexp(logits_bc, axis=1) - positive_b
  # A hit: no candidate scores strictly above the positive (a tie counts for the positive).
  hit_b = jnp.max(logits_bc, axis=1) <= positive_b
  return loss_b, hit_b


def _masks(passage_ids_b, negative_ids_bk, query_ids_b, valid_b, b: int, k: int):
  """Masks [B, B(1+K)] of the query -> candidate logits and [B, B] of the passage -> query ones (True: dropped)."""
  c = b * (1 + k)
  not_self_bc = jnp.arange(c)[None, :] != jnp.arange(b)[:, None]
  q2c_bc = jnp.zeros((b, c), bool)
  p2q_bb = jnp.zeros((b, b), bool)
  if passage_ids_b is not None:
    candidate_ids_c = passage_ids_b if not k else jnp.concatenate([passage_ids_b, negative_ids_bk.reshape(-1)])
    q2c_bc = q2c_bc | (candidate_ids_c[None, :] == passage_ids_b[:, None])
    p2q_bb = p2q_bb | (passage_ids_b[None, :] == passage_ids_b[:, None])
  if query_ids_b is not None:
    same_query_bb = query_ids_b[None, :] == query_ids_b[:, None]
    q2c_bc = q2c_bc | jnp.pad(same_query_bb, ((0, 0), (0, c - b)))
    p2q_bb = p2q_bb | same_query_bb
  if valid_b is not None:  # padding rows are nobody's negative (their own row keeps its positive: no NaN)
    valid_b = valid_b.astype(bool)
    valid_c = valid_b if not k else jnp.concatenate([valid_b, jnp.repeat(valid_b, k)])
    q2c_bc = q2c_bc | ~valid_c[None, :]
    p2q_bb = p2q_bb | ~valid_b[None, :]
  return q2c_bc & not_self_bc, p2q_bb & not_self_bc[:, :b]


def info_nce(query_bd: jax.Array, passage_bd: jax.Array, negative_bkd: jax.Array | None = None, *,
             temperature, passage_ids_b: jax.Array | None = None, negative_ids_bk: jax.Array | None = None,
             query_ids_b: jax.Array | None = None, valid_b: jax.Array | None = None, symmetric: bool = False,
             dims: Sequence[int] | None = None, dim_weights: Sequence[float] | None = None) -> dict[str, jax.Array]:
  """Per-pair InfoNCE losses of a global batch of (query, positive passage, hard negatives).

  Args:
    query_bd: query embeddings [B, D] (normalised or not: cosine similarity is used).
    passage_bd: their positive passages [B, D].
    negative_bkd: K hard negatives per query [B, K, D], or None. Every query scores all B * (1 + K) candidates.
    temperature: > 0; a python float (checked) or a jax scalar (e.g. `bounded_temperature` of a parameter).
    passage_ids_b: int [B] ids (or content hashes) of the positives: a candidate with its row's positive's id is
      a false negative and is masked. None: nothing is masked for duplicates.
    negative_ids_bk: int [B, K] ids of the hard negatives; required with `passage_ids_b` when there are negatives.
    query_ids_b: int [B] ids of the queries, or None: rows of the same query are each other's positives.
    valid_b: [B] 1 for real pairs, 0 for padding (no loss, nobody's negative); None: all real.
    symmetric: also the passage -> query loss (over the B queries), averaged with query -> passage.
    dims: Matryoshka sizes, strictly decreasing, e.g. (384, 256, 128, 64): the loss at each leading size
      (truncated and normalised again); None: the full size only.
    dim_weights: one weight per dim (default equal): the loss is sum_d w_d L_d / sum_d w_d (sentence-transformers'
      MatryoshkaLoss sums instead: multiply by sum_d w_d to match its scale).

  Returns:
    float32 [B] arrays: 'loss' (the weighted Matryoshka mean, symmetric directions averaged; 0 at padding),
    'loss_<d>' per dim, and 'correct' (1 where the positive is the query's top candidate at dims[0]).

  Raises:
    ConfigError: bad temperature, dims or weights, or ids missing for the hard negatives.
  """
  b, d = query_bd.shape
  if passage_bd.shape != (b, d):
    raise ConfigError(f'passages {passage_bd.shape} do not match queries {query_bd.shape}')
  k = 0 if negative_bkd is None else negative_bkd.shape[1]
  if negative_bkd is not None and negative_bkd.shape != (b, k, d):
    raise ConfigError(f'hard negatives must be [B, K, D] = [{b}, K, {d}], got {negative_bkd.shape}')
  if k and passage_ids_b is not None and negative_ids_bk is None:
    raise ConfigError('negative_ids_bk is needed with passage_ids_b when there are hard negatives '
                      '(else a negative equal to a positive would count as a negative)')
  if isinstance(temperature, (int, float)):
    temperature = check_temperature(temperature)
  dims = check_matryoshka_dims(dims, d) if dims is not None else (d,)
  weights = _check_weights(dim_weights, dims)

  q2c_mask_bc, p2q_mask_bb = _masks(passage_ids_b, negative_ids_bk, query_ids_b, valid_b, b, k)
  out, total_b = {}, jnp.zeros((b,), jnp.float32)
  for i, (dim, weight) in enumerate(zip(dims, weights)):
    q_bd, p_bd = truncate(query_bd, dim), truncate(passage_bd, dim)
    # Each part gathered before they are joined (gathering the joined array makes XLA replicate and re-split it).
    candidates_cd = constrain(p_bd, _GATHERED)
    if k:
      negatives_cd = constrain(truncate(negative_bkd, dim).reshape(b * k, dim), _GATHERED)
      candidates_cd = jnp.concatenate([candidates_cd, negatives_cd])
    loss_b, hit_b = _direction(q_bd, candidates_cd, q2c_mask_bc, temperature)
    if symmetric:
      loss_b = (loss_b + _direction(p_bd, q_bd, p2q_mask_bb, temperature)[0]) / 2
    if valid_b is not None:
      loss_b = jnp.where(valid_b.astype(bool), loss_b, 0.0)
    out[f'loss_{dim}'] = loss_b
    total_b = total_b + weight * loss_b
    if i == 0:
      out['correct'] = hit_b.astype(jnp.float32)
  out['loss'] = total_b / sum(weights)
  return out


def mean_loss(losses_b: jax.Array, valid_b: jax.Array | None = None) -> jax.Array:
  """The mean of per-pair losses over the real pairs."""
  if valid_b is None:
    return jnp.mean(losses_b)
  valid_b = valid_b.astype(jnp.float32)
  return jnp.sum(losses_b * valid_b) / jnp.maximum(jnp.sum(valid_b), 1.0)
