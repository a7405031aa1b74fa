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

`Contrastive` is the `train.step.Objective` of InfoNCE over the global batch, for a `model.biencoder.BiEncoder`. Its
forward pass has two halves, `embed` (per row: the encoder) and `head` (the loss's inputs from the embeddings of the
whole batch), because its rows are coupled: with `optim.grad_accum_steps = k > 1` the train step does not sum k
independent micro-batch losses (each with only its micro-batch's negatives: another loss) but runs GradCache
(`train.gradcache`) over k micro-batches: the exact gradient of the loss of the whole batch, at one micro-batch's
activation memory. Its batch: query_*, passage_*, negative_* (optional) token ids and attention masks, or the
packed rows and each text's (row, slot) (see `model.biencoder`); weights [B] (1 for real pairs); passage_ids [B],
negative_ids [B, K], query_ids [B] (optional).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from bert_jax.errors import ConfigError
from bert_jax.model.biencoder import ContrastiveSpec, check_matryoshka_dims, check_temperature
from bert_jax.model.pooling import truncate
from bert_jax.sharding import constrain

_ROWS = ('activation_batch', None)  # queries: split over the batch axes
_GATHERED = (None, None)  # candidates: every device sees the whole global batch


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
  return softmax_rows(logits_bc, mask_bc)


def softmax_rows(logits_bc, mask_bc):
  """(per-row loss [B], per-row top-1 hit [B]) of logits [B, C] whose row i's positive is candidate i; masked
  (True) candidates are dropped. Any score's logits: cosines here, MaxSim in `embedding.late_interaction`."""
  logits_bc = constrain(jnp.where(mask_bc, -jnp.inf, logits_bc), _ROWS)
  b = logits_bc.shape[0]
  positive_b = jnp.take_along_axis(logits_bc, jnp.arange(b)[:, None], axis=1)[:, 0]
  loss_b = jax.nn.logsumexp(logits_bc, axis=1) - positive_b
  # A hit: no candidate scores strictly above the positive (a tie counts for the positive).
  hit_b = jnp.max(logits_bc, axis=1) <= positive_b
  return loss_b, hit_b


def candidate_masks(passage_ids_b, negative_ids_bk, query_ids_b, valid_b, b: int, k: int):
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
             dims: Sequence[int] | None = None, dim_weights: Sequence[float] | None = None,
             normalize: bool = True) -> dict[str, jax.Array]:
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
    normalize: score by cosine (vectors normalised, after any truncation); False: by the plain dot product of the
      vectors as given (sparse term weights), with no Matryoshka dims.

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
  if not normalize and dims is not None:
    raise ConfigError('Matryoshka dims truncate normalised embeddings; normalize=False scores the vectors as given')
  dims = check_matryoshka_dims(dims, d) if dims is not None else (d,)
  weights = _check_weights(dim_weights, dims)
  cut = truncate if normalize else (lambda x, _: x)

  q2c_mask_bc, p2q_mask_bb = candidate_masks(passage_ids_b, negative_ids_bk, query_ids_b, valid_b, b, k)
  out, total_b = {}, jnp.zeros((b,), jnp.float32)
  for i, (dim, weight) in enumerate(zip(dims, weights)):
    q_bd, p_bd = cut(query_bd, dim), cut(passage_bd, dim)
    # Each part gathered before they are joined (gathering the joined array makes XLA replicate and re-split it).
    candidates_cd = constrain(p_bd, _GATHERED)
    if k:
      negatives_cd = constrain(cut(negative_bkd, dim).reshape(b * k, dim), _GATHERED)
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


@dataclasses.dataclass(frozen=True)
class Contrastive:
  """The `Objective` of a `BiEncoder` (or any module with `embed(batch, deterministic)` and `temperature_value()`)
  trained with `spec` (the module's own)."""

  spec: ContrastiveSpec = ContrastiveSpec()
  terms: tuple[str, ...] = ('contrastive',)
  couples_rows: bool = True  # the train step accumulates by GradCache, not by summing micro-batch losses

  def embed(self, module, batch, *, deterministic: bool) -> dict[str, jax.Array]:
    """The per-row half of the forward pass: embeddings of `batch`'s rows."""
    return module.embed(batch, deterministic=deterministic)

  def head(self, module, embeddings) -> dict[str, Any]:
    """The whole-batch half: what `sums` reads, from the embeddings of the whole batch."""
    return {'embeddings': embeddings, 'temperature': module.temperature_value()}

  def forward(self, module, batch, *, deterministic: bool):
    return self.head(module, self.embed(module, batch, deterministic=deterministic))

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    e, spec = outputs['embeddings'], self.spec
    weights_b = batch['weights'].astype(jnp.float32)
    out = info_nce(
        e['query'], e['passage'], e.get('negative'), temperature=outputs['temperature'],
        passage_ids_b=batch.get('passage_ids'), negative_ids_bk=batch.get('negative_ids'),
        query_ids_b=batch.get('query_ids'), valid_b=weights_b, symmetric=spec.symmetric,
        dims=spec.matryoshka_dims or None, dim_weights=spec.matryoshka_weights or None)
    count = jnp.sum(weights_b)
    sums = {'contrastive_loss_sum': jnp.sum(out['loss']), 'contrastive_count': count,
            'correct_sum': jnp.sum(out['correct'] * weights_b),
            'temperature_sum': outputs['temperature'] * count}
    if spec.matryoshka_dims:
      sums.update({f'loss_{d}_sum': jnp.sum(out[f'loss_{d}']) for d in spec.matryoshka_dims})
    return sums

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'contrastive': jnp.sum(batch['weights'].astype(jnp.float32))}

  def summarize(self, sums) -> dict[str, Any]:
    count = jnp.maximum(sums['contrastive_count'], 1.0)
    out = {'loss': sums['contrastive_loss_sum'] / count, 'accuracy': sums['correct_sum'] / count,
           'temperature': sums['temperature_sum'] / count}
    for name in sums:
      if name.startswith('loss_') and name.endswith('_sum'):
        out[name[:-len('_sum')]] = sums[name] / count
    return out

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)
