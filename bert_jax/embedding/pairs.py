"""Training pairs and triplets from your files: (query, positive passage, zero or more hard negatives) by column
names, and the padded batches the `Contrastive` objective reads.

Files are CSV, TSV, JSONL or Parquet (`data.tables.records`: the same reader as the classify/regress tasks), each
of them compressed or not, local or remote. `PairColumns` names the query and positive columns and any negative
columns; in JSONL (or Parquet) a negative column may hold a list of texts. Every row must have the same number of
negatives (a batch is [B, K, T]).

Teacher scores (distillation): `PairColumns.scores` names the columns of each row's 1 + K scores, the positive's
first, then each negative's in order (a column may hold a list: `experiments/mine.py --scores` writes them all in
'scores'). Every score must be a finite number and every row must have exactly 1 + K of them; the batch holds them
as 'teacher_scores' [B, 1 + K] float32.

Passage ids: every distinct passage text (positives and negatives together) gets one int32 id, its index in
first-appearance order, so the same passage twice in a batch is recognised exactly (no hash collisions) and masked
as a false negative by the loss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from bert_jax.data import tables
from bert_jax.errors import DataError


@dataclasses.dataclass(frozen=True)
class PairColumns:
  """Which columns hold the query, its positive passage and its hard negatives (none by default)."""

  query: str = 'query'
  positive: str = 'positive'
  negatives: tuple[str, ...] = ()
  scores: tuple[str, ...] = ()  # teacher scores: none by default


@dataclasses.dataclass(frozen=True)
class Pair:
  """One training example, the line of the file it came from, and its teacher scores (positive's, then each
  negative's; () without)."""

  query: str
  positive: str
  negatives: tuple[str, ...]
  line: int
  scores: tuple[float, ...] = ()


def _texts(path: str, line: int, record: dict[str, Any], column: str) -> list[str]:
  value = tables.value_at(path, line, record, column)
  values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
  for v in values:
    if not isinstance(v, str) or not v.strip():
      raise DataError(f'{path}:{line}: {column!r} must hold non-empty texts, got {v!r}')
  return values


def _scores(path: str, line: int, record: dict[str, Any], columns: Sequence[str], k: int) -> tuple[float, ...]:
  """The row's teacher scores: finite numbers, 1 + k of them (DataError naming the file, line and column)."""
  out = []
  for column in columns:
    if column not in record or record[column] is None:
      raise DataError(f'{path}:{line}: no teacher scores in {column!r} (distillation needs a score for the positive '
                      'and each negative)')
    value = record[column]
    values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
    for v in values:  # numbers, or their text (CSV, TSV)
      try:
        score = math.nan if isinstance(v, bool) else float(v)
      except (TypeError, ValueError):
        score = math.nan
      if not math.isfinite(score):
        raise DataError(f'{path}:{line}: a teacher score in {column!r} must be a finite number, got {v!r}')
      out.append(score)
  if len(out) != 1 + k:
    raise DataError(f'{path}:{line}: {len(out)} teacher scores for 1 positive and {k} negatives: a row needs '
                    f"{1 + k}, the positive's first, then each negative's")
  return tuple(out)


def check_columns(path: str, names: Sequence[str], columns: PairColumns) -> None:
  """DataError naming the first of `columns` that the file's columns `names` lack, and those it has."""
  for column in (columns.query, columns.positive) + tuple(columns.negatives) + tuple(columns.scores):
    if column not in names:
      raise DataError(f'{path}:1: no column {column!r}; the file has {", ".join(map(repr, names)) or "none"} '
                      '(a header line naming the query, positive and negative columns is required: set '
                      '--config.query_column, --config.positive_column, --config.negative_columns or '
                      '--config.score_columns)')


def read_pairs(path: str, columns: PairColumns = PairColumns()) -> list[Pair]:
  """The (query, positive, negatives) rows of `path`.

  Raises:
    DataError: a missing, empty or headerless file, a column it lacks (naming those it has), an empty query or
      positive (a query with no positive), a ragged number of negatives, teacher scores that are missing, not
      finite numbers or not 1 + K: the file and line.
  """
  names, records = tables.records(path)
  check_columns(path, names, columns)
  pairs, first = [], None
  for line, record in records:
    query = tables.text_at(path, line, record, columns.query)
    try:
      positive = tables.text_at(path, line, record, columns.positive)
    except DataError:
      raise DataError(f'{path}:{line}: the query has no positive passage: {columns.positive!r} must be a '
                      f'non-empty text, got {record.get(columns.positive)!r}') from None
    negatives = tuple(t for c in columns.negatives for t in _texts(path, line, record, c))
    if first is None:
      first = (line, len(negatives))
    elif len(negatives) != first[1]:
      raise DataError(f'{path}:{line}: {len(negatives)} hard negatives, but line {first[0]} has {first[1]}: every '
                      'row needs the same number')
    scores = _scores(path, line, record, columns.scores, len(negatives)) if columns.scores else ()
    pairs.append(Pair(query, positive, negatives, line, scores))
  return pairs


def passage_ids(pairs: Sequence[Pair]) -> tuple[np.ndarray, np.ndarray]:
  """(int32 ids of the positives [N], of the negatives [N, K]): one id per distinct passage text."""
  index: dict[str, int] = {}
  positive_n = np.array([index.setdefault(p.positive, len(index)) for p in pairs], np.int32)
  k = len(pairs[0].negatives) if pairs else 0
  negative_nk = np.array([[index.setdefault(t, len(index)) for t in p.negatives] for p in pairs],
                         np.int32).reshape(len(pairs), k)
  return positive_n, negative_nk


def _pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  ids = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  return ids, mask


def bucket_width(longest: int, limit: int) -> int:
  """The width a side is padded to: its longest row rounded up to a multiple of 32 (of 64 past 128 tokens, of 128
  past 256), at most `limit`. A run compiles its step once per width it meets (a handful: 8 up to 512 tokens), not
  once per length, and pays for at most a step's worth of padding, not for `limit`: SQuAD's questions (about 16
  tokens) run at 32, not at a max_query_length of 128."""
  step = 32 if longest <= 128 else 64 if longest <= 256 else 128
  return max(1, min(limit, -(-longest // step) * step))


def make_batch(tokenizer, pairs: Sequence[Pair], ids: tuple[np.ndarray, np.ndarray], rows: Sequence[int], *,
               max_query_length: int, max_passage_length: int, batch_size: int | None = None,
               encode_side=None) -> dict[str, np.ndarray]:
  """The `Contrastive` (or `Distillation`) objective's batch of `pairs[rows]`, padded to the longest text per side
  (and to `batch_size` rows with weight 0); with the pairs' teacher scores when they have them.

  Args:
    tokenizer: has `encode_inputs(text, None, max_length=...) -> (ids, types, truncated)` and `pad_id`.
    ids: `passage_ids(pairs)`.
    rows: which pairs, in batch order.
    encode_side: (texts, side, limit) -> token id rows, side 'query' or 'passage' (negatives too); None: each text
      alone (`tokenizer.encode_inputs`). The multi-vector kind prepends its markers this way.
  """
  batch_size = batch_size or len(rows)
  chosen = [pairs[r] for r in rows]
  k = len(chosen[0].negatives) if chosen else 0

  def encode(texts, limit, side='passage'):
    if encode_side is not None:
      return encode_side(texts, side, limit)
    return [tokenizer.encode_inputs(t, None, max_length=limit)[0] for t in texts]

  pad = batch_size - len(chosen)
  query = encode([p.query for p in chosen], max_query_length, 'query') + [[tokenizer.pad_id]] * pad
  passage = encode([p.positive for p in chosen], max_passage_length) + [[tokenizer.pad_id]] * pad
  batch = {}
  batch['query_input_ids'], batch['query_attention_mask'] = _pad(query, max(map(len, query)), tokenizer.pad_id)
  batch['passage_input_ids'], batch['passage_attention_mask'] = _pad(passage, max(map(len, passage)),
                                                                     tokenizer.pad_id)
  if k:
    negatives = encode([t for p in chosen for t in p.negatives], max_passage_length)
    negatives += [[tokenizer.pad_id]] * (pad * k)
    width = max(map(len, negatives))
    ids_, mask = _pad(negatives, width, tokenizer.pad_id)
    batch['negative_input_ids'], batch['negative_attention_mask'] = (ids_.reshape(batch_size, k, width),
                                                                     mask.reshape(batch_size, k, width))
  for name in ('query', 'passage', 'negative'):
    if f'{name}_attention_mask' in batch:
      batch[f'{name}_attention_mask'][..., 0] = 1  # padding rows: keep every softmax row non-empty
  return {**batch, **make_labels(pairs, ids, rows, batch_size)}


def make_labels(pairs: Sequence[Pair], ids: tuple[np.ndarray, np.ndarray], rows: Sequence[int],
                batch_size: int) -> dict[str, np.ndarray]:
  """The batch's arrays other than tokens, per pair (padded to `batch_size` pairs): passage_ids [B],
  negative_ids [B, K] (with negatives), weights [B] and, with teacher scores, teacher_scores [B, 1 + K]."""
  chosen = [pairs[r] for r in rows]
  k = len(chosen[0].negatives) if chosen else 0
  pad = batch_size - len(chosen)
  positive_n, negative_nk = ids
  batch = {}
  # Padding rows get ids no real passage has (-1 - row), so they never mask a real row; their weight is 0.
  filler = -1 - np.arange(pad, dtype=np.int32)
  batch['passage_ids'] = np.concatenate([positive_n[list(rows)], filler])
  if k:
    batch['negative_ids'] = np.concatenate([negative_nk[list(rows)], np.repeat(filler[:, None], k, 1)])
  batch['weights'] = np.concatenate([np.ones(len(chosen), np.float32), np.zeros(pad, np.float32)])
  if chosen and chosen[0].scores:  # padding rows: zeros (weight 0, no loss)
    batch['teacher_scores'] = np.concatenate([np.array([p.scores for p in chosen], np.float32),
                                              np.zeros((pad, 1 + k), np.float32)])
  return batch
