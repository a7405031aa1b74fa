"""Semantic similarity (STS) of scored sentence pairs: Spearman's correlation of the embeddings' cosine with the
gold scores, as STS-B and MTEB's STS tasks report it.

A file of scored pairs is CSV, TSV, JSONL or Parquet (`data.tables.records`) with two text columns and a
score column (by default `sentence1`, `sentence2`, `score`, STS-B's names in Hugging Face datasets). Every bad row
is one DataError naming the file and line.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.metrics import spearman

DEFAULT_COLUMNS = ('sentence1', 'sentence2', 'score')


@dataclasses.dataclass(frozen=True)
class ScoredPairs:
  """Two texts and a gold similarity score per row."""

  first: list[str]
  second: list[str]
  scores: list[float]


def read_scored_pairs(path: str, columns: Sequence[str] = DEFAULT_COLUMNS) -> ScoredPairs:
  """The scored pairs of `path` by `columns` (first text, second text, score)."""
  if len(columns) != 3:
    raise DataError(f'STS columns are three (first text, second text, score), got {", ".join(columns)}')
  names, records = tables.records(path)
  for column in columns:
    tables.find_column(path, names, column, column, flags='--config.sts_columns')
  first, second, scores = [], [], []
  for line, record in records:
    texts = [tables.text_at(path, line, record, c) for c in columns[:2]]
    try:
      score = float(record.get(columns[2]))
    except (TypeError, ValueError):
      score = math.nan
    if not math.isfinite(score):
      raise DataError(f'{path}:{line}: score {record.get(columns[2])!r} is not a finite number')
    first.append(texts[0])
    second.append(texts[1])
    scores.append(score)
  if len(scores) < 2 or len(set(scores)) < 2:
    raise DataError(f'{path}: a correlation needs at least two pairs with different scores')
  return ScoredPairs(first, second, scores)


def sts_spearman(data: ScoredPairs, embed: Callable[[Sequence[str]], np.ndarray]) -> float:
  """Spearman's correlation of cos(embed(first), embed(second)) with the gold scores."""
  a, b = (np.asarray(embed(texts), np.float64) for texts in (data.first, data.second))
  if a.shape != b.shape or len(a) != len(data.scores):
    raise DataError(f'the embedding function returned {a.shape} and {b.shape} for {len(data.scores)} pairs')
  cosine = np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
  return spearman(cosine, data.scores)
