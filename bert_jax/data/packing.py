"""First-fit-decreasing packing of variable-length examples into rows (pretraining and fine-tuning).

Each example gets its own segment id in its row (attention stays inside it) and positions that
restart at 0, so the model computes exactly what it computes on the example alone.
"""

from __future__ import annotations

from typing import Sequence


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
