"""Packed batches of pairs for the bi-encoder: every text of a step's batch (queries, positives, hard negatives) in
rows of `row_length` tokens, several texts per row, instead of one padded row per text.

Each text keeps its own attention block (`segment_ids` 1, 2, ... in its row, 0 at padding) and positions that
restart at 0, so the encoder computes exactly what it computes on the text padded alone; `pooling.pool_segments`
pools each text from its own tokens and the batch says, per pair, which (row, slot) holds its query, its positive
and each negative (`model.biencoder` lists the arrays). The pairs' own arrays (passage_ids, negative_ids, weights,
teacher_scores) are `pairs.make_batch`'s, in the same order: the objective reads the same batch either way.

All texts share the rows (not one set of rows per side): a short query fills the room a passage leaves in its row,
and the encoder runs once per step, not once per side. Rows are filled first-fit decreasing (`data.packing`), at
most `slots(row_length)` texts a row (the pooled slots [R, S] are a fixed shape).

Shapes: the row count is rounded up (`row_count`) to a multiple of the mesh's batch shards and to a few sizes per
doubling, so a run compiles its step a handful of times, not once per batch. Micro-batches (`micro_batches` k > 1:
GradCache, or accumulation) are packed one by one, pairs j, j + k, ... in micro-batch j as the train step splits
a padded batch, each into as many rows, and interleaved (`finetuning.batching.interleave`): row r of micro-batch j
is row r * k + j, and its pairs point at rows of their own micro-batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax.data.packing import fit_rows
from bert_jax.embedding import pairs as pairs_lib

# The most texts a row holds: row_length // SLOT_TOKENS (texts this short are [CLS] + a few tokens + [SEP]).
SLOT_TOKENS = 8


def slots(row_length: int) -> int:
  """S, the most texts a row of `row_length` tokens holds (the pooled slots per row)."""
  return max(1, row_length // SLOT_TOKENS)


def row_count(needed: int, multiple: int = 1) -> int:
  """`needed` rows rounded up to a multiple of `multiple` and to one of 8 to 16 sizes per doubling (a step of
  `multiple` times a power of two, at most 1/8 of the rows): few compiled shapes, little padding."""
  step = max(1, multiple)
  while needed > 16 * step:
    step *= 2
  return max(step, -(-needed // step) * step)


def _fill(texts: Sequence[Sequence[int]], row: np.ndarray, offset: np.ndarray, rows: int, row_length: int,
          pad_id: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """(the token arrays of `texts` placed at (`row`, `offset`) in `rows` rows, each text's slot in its row)."""
  out = {'input_ids': np.full((rows, row_length), pad_id, np.int32),
         'segment_ids': np.zeros((rows, row_length), np.int32),
         'position_ids': np.zeros((rows, row_length), np.int32),
         'segment_lengths': np.zeros((rows, slots(row_length)), np.int32)}
  slot = np.zeros(len(texts), np.int32)
  used = np.zeros(rows, np.int32)
  for i, (text, r, o) in enumerate(zip(texts, row.tolist(), offset.tolist())):
    n = len(text)
    slot[i] = used[r]
    used[r] += 1
    out['input_ids'][r, o:o + n] = text
    out['segment_ids'][r, o:o + n] = slot[i] + 1
    out['position_ids'][r, o:o + n] = np.arange(n)
    out['segment_lengths'][r, slot[i]] = n
  return out, slot


def make_packed_batch(tokenizer, pairs: Sequence[pairs_lib.Pair], ids: tuple[np.ndarray, np.ndarray],
                      rows: Sequence[int], *, max_query_length: int, max_passage_length: int,
                      batch_size: int | None = None, micro_batches: int = 1,
                      rows_multiple: int = 1) -> dict[str, np.ndarray]:
  """`pairs.make_batch`'s batch of `pairs[rows]` with its texts packed (module docstring).

  Args:
    tokenizer: has `encode_inputs(text, None, max_length=...) -> (ids, types, truncated)` and `pad_id`.
    ids: `pairs.passage_ids(pairs)`.
    rows: which pairs, in batch order (at most `batch_size`; the rest are weight-0 padding pairs, which point at
      the first text of their micro-batch).
    micro_batches: k: packed one by one and interleaved; must divide batch_size.
    rows_multiple: each micro-batch's row count is a multiple of this (the mesh's batch shards).
  """
  batch_size = batch_size or len(rows)
  k = micro_batches
  if batch_size % k:
    raise ValueError(f'{k} micro-batches do not divide a batch of {batch_size} pairs')
  row_length = max(max_query_length, max_passage_length)
  labels = pairs_lib.make_labels(pairs, ids, rows, batch_size)
  chosen = [pairs[r] for r in rows]
  negatives = len(chosen[0].negatives) if chosen else 0

  def encode(text, limit):
    return tokenizer.encode_inputs(text, None, max_length=limit)[0]

  # Micro-batch j: pairs j, j + k, ... (padding pairs past the chosen ones have no texts).
  micro_texts = []
  for j in range(k):
    mine = chosen[j::k]
    micro_texts.append([encode(p.query, max_query_length) for p in mine] +
                       [encode(p.positive, max_passage_length) for p in mine] +
                       [encode(t, max_passage_length) for p in mine for t in p.negatives])
  fits = [fit_rows([len(t) for t in texts], row_length, max_per_row=slots(row_length)) for texts in micro_texts]
  num_rows = row_count(max(max(needed for _, _, needed in fits), 1), rows_multiple)  # every micro-batch alike
  micro, size = [], batch_size // k
  for j, (texts, (row, offset, _)) in enumerate(zip(micro_texts, fits)):
    tokens, slot = _fill(texts, row, offset, num_rows, row_length, tokenizer.pad_id)
    n = len(chosen[j::k])
    where = {}
    for side, start, shape in (('query', 0, (n,)), ('passage', n, (n,)), ('negative', 2 * n, (n, negatives))):
      count = int(np.prod(shape))
      at_row = np.zeros((size,) + shape[1:], np.int32)
      at_slot = np.zeros((size,) + shape[1:], np.int32)
      at_row[:n] = row[start:start + count].reshape(shape)
      at_slot[:n] = slot[start:start + count].reshape(shape)
      where[f'{side}_row'], where[f'{side}_segment'] = at_row, at_slot
    if not negatives:
      del where['negative_row'], where['negative_segment']
    micro.append({**tokens, **where})
  batch = {name: np.stack([m[name] for m in micro], axis=1).reshape(-1, *micro[0][name].shape[1:])
           for name in micro[0]}
  return {**batch, **labels}


def real_tokens(batch: dict[str, np.ndarray]) -> int:
  """The tokens of the packed batch's texts (the rest of its rows is padding)."""
  return int(batch['segment_lengths'].sum())


def lengths(batch: dict[str, np.ndarray], side: str, micro_batches: int = 1) -> np.ndarray:
  """The token count of each text of `side` ([B] or [B, K]; a padding pair's are its stand-in's), from a whole
  (host) packed batch of `micro_batches` interleaved micro-batches."""
  row, slot = batch[f'{side}_row'], batch[f'{side}_segment']
  pair = np.arange(len(row)).reshape((-1,) + (1,) * (row.ndim - 1))
  return batch['segment_lengths'][row * micro_batches + pair % micro_batches, slot]
