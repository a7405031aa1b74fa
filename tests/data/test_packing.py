"""Tests for bert_jax.data.packing: first-fit decreasing as the per-length loop it replaced places lengths."""

import random

import numpy as np
import pytest

from bert_jax.data import packing

from harness.references import reference_first_fit_decreasing


def test_first_fit_decreasing_places_as_the_reference_loop():
  rng = random.Random(0)
  for _ in range(3000):
    row_length = rng.choice([8, 16, 128, 512])
    if rng.random() < 0.5:  # BERT pairs: mostly near full
      lengths = [min(row_length, max(1, int(rng.gauss(0.8, 0.3) * row_length))) for _ in range(rng.randint(0, 60))]
    else:
      lengths = [rng.randint(0, row_length) for _ in range(rng.randint(0, 60))]
    max_per_row = rng.choice([None, 0, 1, 2, 4, 8])
    want = reference_first_fit_decreasing(lengths, row_length, max_per_row)
    assert packing.first_fit_decreasing(lengths, row_length, max_per_row) == want, (lengths, row_length, max_per_row)
    rows, offsets, num_rows = packing.fit_rows(np.array(lengths, np.int64), row_length, max_per_row)
    assert list(zip(rows.tolist(), offsets.tolist())) == want and num_rows == len({r for r, _ in want})


def test_a_length_over_the_row_is_refused_as_before():
  with pytest.raises(ValueError, match='feature of length 50 does not fit rows of 48'):
    packing.first_fit_decreasing([3, 50, 49, 7], 48)
