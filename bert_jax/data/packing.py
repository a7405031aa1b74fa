"""Batches of variable-length features: packed several per row, or one per padded row.

Packed: a batch's examples are placed into rows of `row_length` tokens by first-fit
decreasing; each gets its own segment id (attention stays inside it) and positions that
restart at 0, so the model computes exactly what it computes on the example alone, without
spending work on padding. Unpacked: one example per row, rows padded to the batch's longest
example rounded up to `pad_multiple`. Either way the number of rows is rounded up to
`rows_multiple` so only a few shapes are ever compiled.

Every batch also carries per-example arrays (`example_row`, `example_offset`,
`example_length`, `weights`; padding examples have weight 0) so heads and losses can find
each example in the rows. Labels: `labels` [E] (classification int32, regression float32)
or [R, T] int32 (token kind, -100 = no loss); `start_positions`/`end_positions` [E], relative
to the example's first token (span kind).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax.tasks.base import IGNORE, Feature


def first_fit_decreasing(lengths: Sequence[int], row_length: int,
                         max_per_row: int | None = None) -> list[tuple[int, int]]:
  """(row, offset) for each length, filling rows of `row_length` longest-first.

  With `max_per_row`, a row takes at most that many lengths.
  """
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  free: list[int] = []  # room left in each row
  count: list[int] = []  # lengths placed in each row
  placed = [(0, 0)] * len(lengths)
  for i in order:
    n = lengths[i]
    if n > row_length:
      raise ValueError(f'feature of length {n} does not fit rows of {row_length}')
    for r, room in enumerate(free):
      if room >= n and (max_per_row is None or count[r] < max_per_row):
        placed[i] = (r, row_length - room)
        free[r] -= n
        count[r] += 1
        break
    else:
      placed[i] = (len(free), 0)
      free.append(row_length - n)
      count.append(1)
  return placed


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def make_batch(features: Sequence[Feature], kind: str, *, batch_size: int, row_length: int, pack: bool,
               rows_multiple: int = 1, pad_multiple: int = 16) -> dict[str, np.ndarray]:
  """Arrays for up to `batch_size` features (fewer: the rest are zero-weight padding examples).

  Args:
    features: the batch's features, each at most `row_length` tokens.
    kind: the head kind ('classification', 'regression', 'token' or 'span').
    batch_size: number of example slots E.
    row_length: the longest row (max_seq_length).
    pack: pack several features per row; else one per row.
    rows_multiple: round the number of rows up to a multiple of this.
    pad_multiple: unpacked rows are padded to a multiple of this (at most `row_length`).
  """
  if len(features) > batch_size:
    raise ValueError(f'{len(features)} features for a batch of {batch_size}')
  lengths = [len(f) for f in features]
  if pack:
    placed = first_fit_decreasing(lengths, row_length)
    num_rows = max([r for r, _ in placed], default=0) + 1
    width = row_length
  else:
    placed = [(i, 0) for i in range(len(features))]
    num_rows = batch_size
    width = min(row_length, _round_up(max(lengths, default=1), pad_multiple))
  num_rows = _round_up(num_rows, rows_multiple)
  batch = {k: np.zeros((num_rows, width), np.int32)
           for k in ('input_ids', 'token_type_ids', 'segment_ids', 'position_ids')}
  for k in ('example_row', 'example_offset'):
    batch[k] = np.zeros((batch_size,), np.int32)
  batch['example_length'] = np.ones((batch_size,), np.int32)
  batch['weights'] = np.zeros((batch_size,), np.float32)
  if kind == 'token':
    batch['labels'] = np.full((num_rows, width), IGNORE, np.int32)
  elif kind in ('classification', 'regression'):
    batch['labels'] = np.zeros((batch_size,), np.float32 if kind == 'regression' else np.int32)
  else:
    batch['start_positions'] = np.zeros((batch_size,), np.int32)
    batch['end_positions'] = np.zeros((batch_size,), np.int32)
  segment_count = np.zeros((num_rows,), np.int32)
  for e, (f, (row, offset)) in enumerate(zip(features, placed)):
    n = len(f)
    cols = slice(offset, offset + n)
    segment_count[row] += 1
    batch['input_ids'][row, cols] = f.input_ids
    batch['token_type_ids'][row, cols] = f.token_type_ids
    batch['segment_ids'][row, cols] = segment_count[row]
    batch['position_ids'][row, cols] = np.arange(n)
    batch['example_row'][e], batch['example_offset'][e], batch['example_length'][e] = row, offset, n
    batch['weights'][e] = 1.0
    if kind == 'token':
      batch['labels'][row, cols] = f.token_labels
    elif kind in ('classification', 'regression'):
      batch['labels'][e] = f.label
    else:
      batch['start_positions'][e], batch['end_positions'][e] = f.start, f.end
  return batch


def rows_of_examples(values_btc: np.ndarray, batch: dict[str, np.ndarray], count: int) -> list[np.ndarray]:
  """Cuts each of the first `count` examples' tokens out of per-row values [R, T, ...]."""
  out = []
  for e in range(count):
    r, o, n = batch['example_row'][e], batch['example_offset'][e], batch['example_length'][e]
    out.append(values_btc[r, o:o + n])
  return out
