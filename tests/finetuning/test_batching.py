"""Fine-tuning batches: first-fit placement, per-example positions and segments, padding examples,
process blocks."""

import numpy as np
import pytest

from bert_jax.data import packing
from bert_jax.finetuning import batching

from harness.inputs import features


def test_first_fit_decreasing_places_every_length_without_overlap():
  lengths = [30, 5, 17, 40, 8, 8, 2, 33, 1]
  placed = packing.first_fit_decreasing(lengths, 48)
  used = {}
  for n, (row, offset) in zip(lengths, placed):
    assert offset + n <= 48
    for col in range(offset, offset + n):
      assert (row, col) not in used
      used[row, col] = True
  assert max(r for r, _ in placed) + 1 == 3  # 144 tokens fill 3 rows of 48 exactly
  with pytest.raises(ValueError, match='does not fit'):
    packing.first_fit_decreasing([49], 48)


@pytest.mark.parametrize('kind', ['classification', 'token', 'span'])
def test_packed_batch_holds_each_example_with_restarted_positions(kind):
  feats = features([12, 3, 20, 7, 9])
  batch = batching.make_batch(feats, kind, batch_size=8, row_length=32, pack=True, rows_multiple=4)
  assert batch['input_ids'].shape[0] % 4 == 0 and batch['input_ids'].shape[1] == 32
  np.testing.assert_array_equal(batch['weights'], [1] * 5 + [0] * 3)
  for e, f in enumerate(feats):
    r, o, n = batch['example_row'][e], batch['example_offset'][e], batch['example_length'][e]
    assert n == len(f)
    np.testing.assert_array_equal(batch['input_ids'][r, o:o + n], f.input_ids)
    np.testing.assert_array_equal(batch['token_type_ids'][r, o:o + n], f.token_type_ids)
    np.testing.assert_array_equal(batch['position_ids'][r, o:o + n], np.arange(n))
    segment = batch['segment_ids'][r, o:o + n]
    assert len(set(segment)) == 1 and segment[0] > 0
    assert (batch['segment_ids'][r] == segment[0]).sum() == n  # the segment is this example only
    if kind == 'token':
      np.testing.assert_array_equal(batch['labels'][r, o:o + n], f.token_labels)
    elif kind == 'span':
      assert (batch['start_positions'][e], batch['end_positions'][e]) == (f.start, f.end)
    else:
      assert batch['labels'][e] == f.label
  assert batch['input_ids'].size - sum(len(f) for f in feats) == (batch['segment_ids'] == 0).sum()
  cut = batching.rows_of_examples(batch['input_ids'], batch, len(feats))
  for f, ids in zip(feats, cut):
    np.testing.assert_array_equal(ids, f.input_ids)


def test_unpacked_batch_pads_each_example_to_a_multiple():
  feats = features([12, 3, 20])
  batch = batching.make_batch(feats, 'classification', batch_size=4, row_length=64, pack=False, pad_multiple=16)
  assert batch['input_ids'].shape == (4, 32)
  np.testing.assert_array_equal(batch['example_row'], [0, 1, 2, 0])
  np.testing.assert_array_equal(batch['example_offset'], [0, 0, 0, 0])
  np.testing.assert_array_equal(batch['segment_ids'][1], [1] * 3 + [0] * 29)


def test_process_blocks_split_rows_and_examples_in_order():
  host = batching.make_batch(features([12, 3, 20, 7, 9, 30], seed=1), 'span', batch_size=8, row_length=48,
                            pack=True, rows_multiple=4)
  assert batching.process_block(host, 0, 1) is host
  blocks = [batching.process_block(host, i, 2) for i in range(2)]
  for k, v in host.items():
    assert all(len(b[k]) == len(v) // 2 for b in blocks)
    np.testing.assert_array_equal(np.concatenate([b[k] for b in blocks]), v)
  with pytest.raises(ValueError, match='do not split into 3 process blocks'):
    batching.process_block(host, 0, 3)
