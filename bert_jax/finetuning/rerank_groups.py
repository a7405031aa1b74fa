"""The reranker's groups: a query with its positive and its negatives (`experiments/mine.py --layout=negatives`),
read from a table, scored together by the listwise loss, and ranked in evaluation.

A group's passages are the positive first, then the negatives; every group of a file has as many (the listwise loss
batches whole groups, so shapes stay static). With teacher scores (mine.py --scores: 'scores', the positive's then
each negative's) a group carries one score per passage.

The listwise loss (`listwise_losses`): each example of a packed batch carries its group's index in the batch
('group_ids') and its target probability ('labels': 1 for the positive and 0 for a negative, or the teacher's
softmax over the group); a group's loss is the KL divergence from the targets to the softmax of its logits, which
for a one-hot target is the softmax cross-entropy with the positive as the class (sentence-transformers'
cross-encoder CrossEntropyLoss; with teacher scores ListNet's, less the teacher's entropy). The per-group
log-sum-exp is a segment reduction over the batch's example slots.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import tables
from bert_jax.errors import DataError

MRR_DEPTH = 10  # eval_mrr_at_10: the positive's reciprocal rank when within the top 10, else 0


@dataclasses.dataclass(frozen=True)
class RerankGroup:
  query: str
  passages: tuple[str, ...]  # the positive first, then the negatives
  scores: tuple[float, ...] | None = None  # the teacher's, one per passage
  line: int = 0


def columns(cfg) -> tuple[str, ...]:
  """The columns a groups file needs (`cfg`: a RerankConfig)."""
  return (cfg.query_column, cfg.positive_column, cfg.negatives_column) + ((cfg.score_column,) if cfg.uses_scores()
                                                                          else ())


def flags(cfg) -> str:
  return ('--config.query_column, --config.positive_column, --config.negatives_column'
          + (', --config.score_column' if cfg.uses_scores() else ''))


def is_groups(cfg, names: Sequence[str]) -> bool:
  """Whether a file of columns `names` holds groups: it has negatives_column and no passage_column."""
  return cfg.negatives_column in names and cfg.passage_column not in names


def _negatives(path: str, line: int, value: Any, cfg) -> list[str]:
  if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v.strip() for v in value):
    raise DataError(f'{path}:{line}: {cfg.negatives_column!r} must be a non-empty list of non-empty texts, got '
                    f'{str(value)[:80]}')
  return list(value)


def _scores(path: str, line: int, value: Any, size: int, cfg) -> tuple[float, ...]:
  ok = isinstance(value, (list, tuple)) and len(value) == size
  out = []
  for v in value if ok else ():
    try:
      out.append(float(v))
    except (TypeError, ValueError):
      out.append(math.nan)
    ok = ok and not isinstance(v, bool) and math.isfinite(out[-1])
  if not ok:
    raise DataError(f'{path}:{line}: {cfg.score_column!r} must be a list of {size} finite numbers (the teacher\'s '
                    f'scores: the positive\'s, then each negative\'s), got {str(value)[:80]}')
  return tuple(out)


def read_groups(path: str, records: Sequence[tuple[int, dict[str, Any]]], cfg) -> list[RerankGroup]:
  """The groups of a table's `records`; DataError naming the file and line of a row with a missing or empty text,
  negatives that are not a list of texts, a negative that is the positive itself, teacher scores missing, not
  finite or not one per passage, or another number of negatives than the first row's."""
  groups: list[RerankGroup] = []
  for line, r in records:
    query = tables.text_at(path, line, r, cfg.query_column)
    positive = tables.text_at(path, line, r, cfg.positive_column)
    negatives = _negatives(path, line, tables.value_at(path, line, r, cfg.negatives_column), cfg)
    if groups and len(negatives) != len(groups[0].passages) - 1:
      raise DataError(f'{path}:{line}: {len(negatives)} negatives, but the first group (line {groups[0].line}) has '
                      f'{len(groups[0].passages) - 1}: every group must have as many (mine them with one '
                      '--num_negatives)')
    if positive in negatives:
      raise DataError(f'{path}:{line}: negative {negatives.index(positive) + 1} is the positive itself')
    passages = (positive, *negatives)
    scores = (_scores(path, line, tables.value_at(path, line, r, cfg.score_column), len(passages), cfg)
              if cfg.uses_scores() else None)
    groups.append(RerankGroup(query, passages, scores, line))
  return groups


def targets(group: RerankGroup, loss: str, temperature: float) -> np.ndarray:
  """Each passage's training target: listwise, its probability (one-hot on the positive, or the teacher's softmax
  over score / temperature); bce, 1 for the positive and 0 for a negative; mse, the teacher's score."""
  n = len(group.passages)
  if loss == 'mse':
    return np.asarray(group.scores, np.float64)
  if loss == 'listwise' and group.scores is not None:
    z = np.asarray(group.scores, np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()
  return np.eye(1, n)[0]


# --- the listwise loss ---------------------------------------------------------------------------------------------

def listwise_losses(logits_e: jax.Array, target_e: jax.Array, group_e: jax.Array, weight_e: jax.Array) -> jax.Array:
  """Each example's share of its group's loss [E]: target * (log target - log softmax over its group's logits),
  summed over a group its KL divergence (cross-entropy for a one-hot target); zero for padding (weight 0).

  Args:
    logits_e: [E] the examples' logits (float32).
    target_e: [E] target probabilities, summing to 1 over each group.
    group_e: [E] int, each example's group index in the batch, in [0, E).
    weight_e: [E] 1 for real examples, 0 for padding.
  """
  e = logits_e.shape[0]
  real = weight_e > 0
  masked = jnp.where(real, logits_e, -jnp.inf)
  top = jax.ops.segment_max(masked, group_e, num_segments=e)
  top = jnp.where(jnp.isfinite(top), top, 0.0)  # an all-padding group
  total = jax.ops.segment_sum(jnp.where(real, jnp.exp(logits_e - top[group_e]), 0.0), group_e, num_segments=e)
  lse_e = (top + jnp.log(jnp.maximum(total, 1e-30)))[group_e]
  entropy_term = jnp.where(target_e > 0, target_e * jnp.log(jnp.where(target_e > 0, target_e, 1.0)), 0.0)
  return jnp.where(real, entropy_term - target_e * (logits_e - lse_e), 0.0)


def group_losses(logits_gn: np.ndarray, target_gn: np.ndarray) -> np.ndarray:
  """The listwise loss of each group [G] from its logits and targets [G, n] (numpy: evaluation)."""
  z = logits_gn - logits_gn.max(1, keepdims=True)
  log_q = z - np.log(np.exp(z).sum(1, keepdims=True))
  plogp = np.where(target_gn > 0, target_gn * np.log(np.where(target_gn > 0, target_gn, 1.0)), 0.0)
  return np.sum(plogp - target_gn * log_q, axis=1)


def ranking_metrics(logits_gn: np.ndarray) -> dict[str, float]:
  """MRR@10 and top-1 accuracy of the positive (column 0) among its group's passages; a tie ranks it below."""
  rank = 1 + np.sum(logits_gn[:, 1:] >= logits_gn[:, :1], axis=1)
  return {'mrr_at_10': float(np.mean(np.where(rank <= MRR_DEPTH, 1.0 / rank, 0.0))),
          'top1_accuracy': float(np.mean(rank == 1))}
