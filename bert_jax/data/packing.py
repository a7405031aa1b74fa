"""First-fit-decreasing packing of variable-length examples into rows (pretraining and fine-tuning).

Each example gets its own segment id in its row (attention stays inside it) and positions that
restart at 0, so the model computes exactly what it computes on the example alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def first_fit_decreasing(lengths: Sequence[int], row_length: int,
                         max_per_row: int | None = None) -> list[tuple[int, int]]:
  """(row, offset) for each length, filling rows of `row_length` longest-first.

  With `max_per_row`, a row takes at most that many lengths.
  """
  rows, offsets, _ = fit_rows(lengths, row_length, max_per_row)
  return list(zip(rows.tolist(), offsets.tolist()))


def fit_rows(lengths: Sequence[int] | np.ndarray, row_length: int,
             max_per_row: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
  """`first_fit_decreasing` as arrays: (rows int64[N], offsets int64[N], number of rows).

  Each length, longest first (equal ones in their given order), goes to the first row it fits
  in row order. A length over half a row never fits beside one placed before it (every one of
  those is at least as long), so those open a row each, all at once; the rest are placed one by
  one, searching only rows that can still take a length (a full row, or one with less room than
  the shortest length, never can).
  """
  lengths = np.asarray(lengths, np.int64).reshape(-1)
  num = len(lengths)
  rows, offsets = np.zeros(num, np.int64), np.zeros(num, np.int64)
  if not num:
    return rows, offsets, 0
  order = np.argsort(-lengths, kind='stable')
  ordered = lengths[order]
  if ordered[0] > row_length:
    raise ValueError(f'feature of length {ordered[0]} does not fit rows of {row_length}')
  shortest = int(ordered[-1])
  most = num if max_per_row is None else max_per_row
  big = int(np.searchsorted(-ordered, -(row_length // 2), side='left'))  # lengths over half a row
  rows[order[:big]] = np.arange(big)
  free = (row_length - ordered[:big]).tolist()  # room left in each row
  count = [1] * big  # lengths placed in each row
  open_rows = np.flatnonzero(row_length - ordered[:big] >= shortest).tolist() if most > 1 else []
  rest_rows, rest_offsets = [], []
  for n in ordered[big:].tolist():
    for at, r in enumerate(open_rows):
      if free[r] >= n:
        rest_rows.append(r)
        rest_offsets.append(row_length - free[r])
        free[r] -= n
        count[r] += 1
        if free[r] < shortest or count[r] >= most:
          del open_rows[at]
        break
    else:
      r = len(free)
      rest_rows.append(r)
      rest_offsets.append(0)
      free.append(row_length - n)
      count.append(1)
      if free[r] >= shortest and most > 1:
        open_rows.append(r)
  rows[order[big:]] = rest_rows
  offsets[order[big:]] = rest_offsets
  return rows, offsets, len(free)
