"""Tests for bert_jax.data.loader: batches, resume, process splits, worker processes, eval batches."""

import dataclasses
import functools
import multiprocessing
import time

import numpy as np
import pytest

from bert_jax.config import DataConfig
from bert_jax.data import loader as ip, masking, tokenization
from bert_jax.errors import ConfigError, DataError

from harness.faults import SpyDataset
from harness.references import reference_first_fit_decreasing

# ----------------------------------------------------------------------------- setup


@functools.cache
def _vocab(tokenizer_path, special_ids, masking='token'):
  tokenizer = tokenization.load_tokenizer(tokenizer_path)
  return ip.Vocab.from_tokenizer(tokenizer, special_ids, masking)


def vocab_of(data, masking='token'):
  return _vocab(data.tokenizer_path, data.special_ids, masking)


def _batches(prepared, split='train', fail_on_call=None, fail_on_index=None, spy=True, **kwargs):
  cfg, data = prepared
  args = dict(global_batch_size=8, seed=0, cfg=cfg, vocab=vocab_of(data))
  args.update(kwargs)
  dataset = ip.PretrainingDataset(data.dir, split)
  if spy:
    dataset = SpyDataset(dataset, fail_on_call, fail_on_index)
  return ip.PretrainingBatches(dataset, **args)


def _reads(batches):
  return batches.maker.dataset.read


def _take(batches, n):
  with batches:
    return [next(batches) for _ in range(n)]


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _row(batch, r):
  return {k: v[r] for k, v in batch.items()}


# ----------------------------------------------------------------------------- the dataset


def test_dataset_records_and_stored_lengths(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data)  # a PreparedData or its directory
  assert len(dataset) == data.num_train and len(ip.PretrainingDataset(data.dir, 'eval')) == data.num_eval
  indices = [5, 0, len(dataset) - 1, 5]
  rows = dataset.gather(indices, cfg.max_seq_length)
  for row, i in enumerate(indices):
    tokens, len_a, is_random_next = dataset[i]
    n = len(tokens)
    np.testing.assert_array_equal(rows.tokens[row], np.pad(tokens, (0, cfg.max_seq_length - n)))
    assert (rows.lengths[row], rows.len_a[row], rows.random_next[row]) == (n, len_a, is_random_next)
    ids = data.special_ids
    assert tokens[0] == ids.cls and tokens[len_a + 1] == ids.sep and tokens[-1] == ids.sep
    assert n <= cfg.max_seq_length
  # Packed multi-process batches plan rows from these stored lengths: they must be exact.
  every = dataset.gather(np.arange(len(dataset)), cfg.max_seq_length)
  np.testing.assert_array_equal(dataset.lengths, every.lengths)
  np.testing.assert_array_equal(every.tokens > 0, np.arange(cfg.max_seq_length) < every.lengths[:, None])
  with pytest.raises(ConfigError, match='split'):
    ip.PretrainingDataset(data, 'test')


# ----------------------------------------------------------------------------- batches


def test_batch_layout(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data)
  vocab = vocab_of(data)
  ids = data.special_ids
  batches = _batches(prepared, prefetch=0)
  batch = next(batches)
  b, t, p = 8, cfg.max_seq_length, cfg.max_predictions_per_seq
  expected = dict(input_ids=((b, t), np.int32), token_type_ids=((b, t), np.int32),
                  attention_mask=((b, t), np.int32), masked_lm_positions=((b, p), np.int32),
                  masked_lm_ids=((b, p), np.int32), masked_lm_weights=((b, p), np.float32),
                  next_sentence_labels=((b,), np.int32), nsp_weights=((b,), np.float32))
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
  # Epoch 0 starts at a shuffled record order: the keyed permutation of the record indices.
  reads = _reads(batches)
  assert reads == batches.maker.record_indices(np.arange(b)).tolist()
  assert len(set(reads)) == b and reads != list(range(b))
  for row in range(b):
    tokens, len_a, is_random_next = dataset[reads[row]]
    n = len(tokens)
    assert batch['attention_mask'][row].tolist() == [1] * n + [0] * (t - n)
    assert batch['token_type_ids'][row].tolist() == [0] * (len_a + 2) + [1] * (n - len_a - 2) + \
        [0] * (t - n)
    assert batch['next_sentence_labels'][row] == int(is_random_next)
    k = int(batch['masked_lm_weights'][row].sum())
    assert k == masking.num_predictions(n, p, cfg.masked_lm_prob) > 0
    assert batch['masked_lm_weights'][row].tolist() == [1.0] * k + [0.0] * (p - k)
    pos = batch['masked_lm_positions'][row, :k]
    assert (np.diff(pos) > 0).all() and (batch['masked_lm_positions'][row, k:] == 0).all()
    assert not vocab.special_v[tokens[pos]].any()  # never [CLS]/[SEP]
    np.testing.assert_array_equal(batch['masked_lm_ids'][row, :k], tokens[pos])
    assert (batch['masked_lm_ids'][row, k:] == 0).all()
    keep = np.setdiff1d(np.arange(n), pos)
    np.testing.assert_array_equal(batch['input_ids'][row, keep], tokens[keep])
    corrupted = batch['input_ids'][row, pos]
    assert ((corrupted == ids.mask) | ~vocab.special_v[corrupted]).all()
    assert (batch['input_ids'][row, n:] == ids.pad).all()
  assert (batch['input_ids'] == ids.mask).sum() > 0.6 * batch['masked_lm_weights'].sum()
  assert batch['nsp_weights'].tolist() == [1.0] * b


def test_batches_deterministic_and_prefetch_matches(prepared):
  first = _take(_batches(prepared), 3)
  for other in (_take(_batches(prepared), 3), _take(_batches(prepared, prefetch=0), 3),
                _take(_batches(prepared, prefetch=5), 3)):
    for a, b in zip(first, other):
      _assert_same(a, b)
  different = _take(_batches(prepared, seed=1), 1)[0]
  assert not np.array_equal(first[0]['input_ids'], different['input_ids'])


def test_resume_continues_the_stream(prepared):
  full = _batches(prepared)
  reference = _take(full, 6)
  assert full.position == 6
  for prefetch in (2, 0):
    resumed = _batches(prepared, start_position=4, prefetch=prefetch)
    assert resumed.position == 4
    for a, b in zip(reference[4:], _take(resumed, 2)):
      _assert_same(a, b)
    assert resumed.position == 6
  # batch_at is the same pure function of (seed, k), whatever has been consumed.
  _assert_same(_batches(prepared, prefetch=0).batch_at(5), reference[5])


def test_processes_split_global_batches(prepared):
  one = _batches(prepared)
  procs = [_batches(prepared, process_index=p, process_count=2) for p in range(2)]
  reference = _take(one, 3)
  local = [_take(p, 3) for p in procs]
  for k in range(3):
    assert local[0][k]['input_ids'].shape[0] == 4
    for key in reference[k]:
      np.testing.assert_array_equal(
          np.concatenate([local[0][k][key], local[1][k][key]]), reference[k][key])
  # Each process reads only its own block of every batch (the threads may have read ahead).
  reads = [_reads(p) for p in procs]
  assert len(reads[0]) >= 12 and len(reads[1]) >= 12 and not set(reads[0]) & set(reads[1])
  for k in range(3):
    assert reads[0][4 * k:4 * k + 4] + reads[1][4 * k:4 * k + 4] == _reads(one)[8 * k:8 * k + 8]


def test_a_rows_masks_depend_only_on_its_stream_position(prepared):
  """Stream position s is the same masked row however the global batch is split or sized."""
  num = 24

  def rows_by_position(global_batch_size, process_count):
    rows = {}
    local = global_batch_size // process_count
    for p in range(process_count):
      batches = _batches(prepared, global_batch_size=global_batch_size, process_index=p,
                         process_count=process_count, prefetch=0)
      for k in range(-(-num // global_batch_size)):
        batch = batches.batch_at(k)
        for r in range(local):
          rows[k * global_batch_size + p * local + r] = _row(batch, r)
    return rows

  reference = rows_by_position(8, 1)
  for global_batch_size, process_count in ((8, 2), (8, 4), (8, 8), (4, 1), (12, 3), (24, 2)):
    other = rows_by_position(global_batch_size, process_count)
    for s in range(num):
      _assert_same(other[s], reference[s])

  # make_batch alone: a row's masks depend on its record and key only, not on the other rows
  # of its batch nor on how wide the batch is padded.
  cfg, data = prepared
  vocab = vocab_of(data)
  dataset = ip.PretrainingDataset(data)
  indices = [3, 1, 4, 1, 5]
  keys = np.array([11, 12, 13, 14, 15], np.uint64)
  batch = ip.make_batch(dataset.gather(indices, cfg.max_seq_length), keys, cfg=cfg, vocab=vocab)
  wide_cfg = dataclasses.replace(cfg, max_seq_length=cfg.max_seq_length + 40)
  for r, i in enumerate(indices):
    alone = ip.make_batch(dataset.gather([i], cfg.max_seq_length), keys[r:r + 1], cfg=cfg, vocab=vocab)
    _assert_same(_row(alone, 0), _row(batch, r))
    one = dataset.gather([i], wide_cfg.max_seq_length)
    after_padding = ip.Rows(*(np.concatenate([np.zeros_like(a), a]) for a in dataclasses.astuple(one)))
    wide = ip.make_batch(after_padding, np.array([0, keys[r]], np.uint64), cfg=wide_cfg, vocab=vocab)
    for key, value in _row(batch, r).items():
      got = wide[key][1]
      if key in ('input_ids', 'token_type_ids', 'attention_mask'):
        assert (got[cfg.max_seq_length:] == (data.special_ids.pad if key == 'input_ids' else 0)).all()
        got = got[:cfg.max_seq_length]
      np.testing.assert_array_equal(got, value, err_msg=key)
  # Rows 1 and 3 hold the same record under different keys: different masks.
  assert not np.array_equal(batch['masked_lm_positions'][1], batch['masked_lm_positions'][3])


def test_epochs_cover_every_record_with_new_masks(prepared):
  cfg, data = prepared
  n = data.num_eval  # a small split: several epochs are cheap
  b = next(b for b in (5, 7, 3) if n % b)  # batches that straddle the epoch boundary
  batches = _batches(prepared, split='eval', global_batch_size=b, prefetch=0)
  stream = [batches.batch_at(k) for k in range(-(-2 * n // b))]
  rows = {key: np.concatenate([batch[key] for batch in stream])[:2 * n] for key in stream[0]}
  reads = _reads(batches)[:2 * n]
  assert sorted(reads[:n]) == sorted(reads[n:]) == list(range(n))
  assert reads[:n] != reads[n:]  # reshuffled each epoch
  assert reads == batches.maker.record_indices(np.arange(2 * n)).tolist()
  first_seen = {index: s for s, index in enumerate(reads[:n])}
  same_masks = sum(np.array_equal(rows['masked_lm_positions'][first_seen[index]],
                                  rows['masked_lm_positions'][n + s])
                   for s, index in enumerate(reads[n:]))
  assert same_masks < 0.2 * n
  # Another seed shuffles differently.
  other = _batches(prepared, split='eval', global_batch_size=b, prefetch=0, seed=1)
  assert other.maker.record_indices(np.arange(n)).tolist() != reads[:n]


def test_producer_errors_reach_the_consumer(prepared):
  batches = _batches(prepared, fail_on_call=2)
  next(batches)
  with pytest.raises(OSError, match='disk on fire'):
    next(batches)
  with pytest.raises(OSError, match='disk on fire'):
    next(batches)
  batches.close()
  batches.close()
  closed = _batches(prepared)
  closed.close()
  with pytest.raises(RuntimeError, match='closed'):
    next(closed)
  on_demand = _batches(prepared, fail_on_call=1, prefetch=0)
  with pytest.raises(OSError, match='disk on fire'):
    next(on_demand)


def test_whole_word_batches(prepared):
  cfg, data = prepared
  wwm_cfg = dataclasses.replace(cfg, masking='whole_word')
  with pytest.raises(ConfigError, match='masking=whole_word'):
    next(_batches(prepared, cfg=wwm_cfg, prefetch=0))
  vocab = vocab_of(data, masking='whole_word')
  batches = _batches(prepared, cfg=wwm_cfg, vocab=vocab, prefetch=0)
  dataset = ip.PretrainingDataset(data)
  whole_words = 0
  for k in range(2):
    batch = batches.batch_at(k)
    assert batch['masked_lm_weights'].sum() > 0
    for row, index in enumerate(_reads(batches)[8 * k:8 * k + 8]):
      tokens = dataset[index][0]
      n = len(tokens)
      masked = np.zeros(n, bool)
      masked[batch['masked_lm_positions'][row, batch['masked_lm_weights'][row] > 0]] = True
      # A word: a start piece (or a piece after a special token) and the non-start pieces after it.
      candidate = ~vocab.special_v[tokens]
      starts = candidate & (vocab.word_starts_v[tokens] | ~np.concatenate([[False], candidate[:-1]]))
      word = np.cumsum(starts)
      for w in np.unique(word[candidate]):
        pieces = masked[candidate & (word == w)]
        assert pieces.all() or not pieces.any()  # all of a word's pieces, or none
        whole_words += int(pieces.all() and len(pieces) > 1)
      assert not masked[~candidate].any()
  assert whole_words > 0


def test_span_batches_take_whole_words_in_runs(prepared):
  cfg, data = prepared
  words = _batches(prepared, cfg=dataclasses.replace(cfg, masking='whole_word'),
                   vocab=vocab_of(data, masking='whole_word'), prefetch=0).batch_at(0)
  span_cfg = dataclasses.replace(cfg, masking='span')
  with pytest.raises(ConfigError, match='masking=span'):
    next(_batches(prepared, cfg=span_cfg, prefetch=0))
  spans = _batches(prepared, cfg=span_cfg, vocab=vocab_of(data, masking='span'), prefetch=0).batch_at(0)

  def runs(batch):  # maximal runs of consecutive masked positions
    return [len(r) for row, w in zip(batch['masked_lm_positions'], batch['masked_lm_weights'])
            for r in np.split(row[w > 0], np.flatnonzero(np.diff(row[w > 0]) != 1) + 1)]
  # Spans of 3.8 words on average against single words: far longer runs, about as many predictions.
  assert np.mean(runs(spans)) > 1.8 * np.mean(runs(words))
  n_spans, n_words = spans['masked_lm_weights'].sum(), words['masked_lm_weights'].sum()
  assert abs(n_spans - n_words) < 0.1 * n_words


def test_mask_rate_schedule_moves_linearly_and_eval_masks_at_its_end(prepared):
  cfg, data = prepared
  sched = dataclasses.replace(cfg, masked_lm_prob=0.3, masked_lm_prob_end=0.1, max_predictions_per_seq=0)
  assert sched.max_predictions_per_seq == 20  # ceil(0.3 * 64): the schedule's highest rate
  batches = _batches(prepared, cfg=sched, prefetch=0, total_steps=11, global_batch_size=32)
  rates = [batches.maker.masked_lm_prob(k) for k in (0, 5, 10, 20)]
  np.testing.assert_allclose(rates, [0.3, 0.2, 0.1, 0.1])
  for k, rate in ((0, 0.3), (5, 0.2), (10, 0.1)):
    batch = batches.batch_at(k)
    real = batch['attention_mask'].sum(1)
    np.testing.assert_array_equal(batch['masked_lm_weights'].sum(1),
                                  np.minimum(masking.num_predictions(real, 20, rate), real - 3))
  # The same rows and keys at a constant rate of 0.2 give batch 5 exactly.
  flat = _batches(prepared, cfg=dataclasses.replace(sched, masked_lm_prob=0.2, masked_lm_prob_end=0.0),
                  prefetch=0, global_batch_size=32)
  _assert_same(flat.batch_at(5), batches.batch_at(5))
  held_out = next(ip.eval_batches(ip.PretrainingDataset(data, 'eval'), batch_size=32, seed=0, cfg=sched,
                                  vocab=vocab_of(data)))
  real = held_out['attention_mask'].sum(1)
  np.testing.assert_array_equal(held_out['masked_lm_weights'].sum(1),
                                np.where(real > 0, np.minimum(masking.num_predictions(real, 20, 0.1), real - 3), 0))


def test_eval_batches_pad_the_last_batch(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data.dir, 'eval')
  n = len(dataset)
  size = next(s for s in (10, 14, 6, 4) if n % s)  # the last batch is padded
  args = dict(batch_size=size, seed=0, cfg=cfg, vocab=vocab_of(data))
  batches = list(ip.eval_batches(dataset, **args))
  assert len(batches) == -(-n // size) and n % size
  weights = np.concatenate([b['nsp_weights'] for b in batches])
  assert weights.tolist() == [1.0] * n + [0.0] * (len(weights) - n)
  last = batches[-1]
  pad = last['nsp_weights'] == 0
  assert (last['masked_lm_weights'][pad] == 0).all() and (last['input_ids'][pad] == data.special_ids.pad).all()
  assert (last['attention_mask'][pad] == 0).all() and (last['masked_lm_positions'][pad] == 0).all()
  _assert_same(batches[0], next(ip.eval_batches(dataset, **args)))  # fixed masks
  other_seed = next(ip.eval_batches(dataset, **{**args, 'seed': 1}))
  assert not np.array_equal(other_seed['masked_lm_positions'], batches[0]['masked_lm_positions'])
  labels = [dataset[i][2] for i in range(n)]
  assert np.concatenate([b['next_sentence_labels'] for b in batches])[:n].tolist() == labels
  lengths = np.concatenate([b['attention_mask'].sum(1) for b in batches])[:n]
  np.testing.assert_array_equal(lengths, [len(dataset[i][0]) for i in range(n)])  # record order
  per_process = [list(ip.eval_batches(dataset, process_index=p, process_count=2, **args))
                 for p in range(2)]
  assert len(per_process[0]) == len(per_process[1]) == len(batches)
  with pytest.raises(ConfigError, match=f'multiple of the process count {size + 1}'):
    ip.eval_batches(dataset, process_index=0, process_count=size + 1, **args)
  for k, batch in enumerate(batches):
    for key in batch:
      np.testing.assert_array_equal(
          np.concatenate([per_process[0][k][key], per_process[1][k][key]]), batch[key])


def test_a_capped_pass_reads_rows_spread_over_the_split_masked_as_in_a_whole_pass(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data.dir, 'eval')
  n = len(dataset)
  args = dict(batch_size=4, seed=0, cfg=cfg, vocab=vocab_of(data))
  rows = lambda batches: [r for b in batches for r, w in zip(b['input_ids'], b['nsp_weights']) if w]
  whole = rows(ip.eval_batches(dataset, **args))
  assert len(whole) == n > 7
  whole_positions = np.concatenate([b['masked_lm_positions'] for b in ip.eval_batches(dataset, **args)])[:n]
  for cap in (1, 3, 6, n - 1):
    capped = list(ip.eval_batches(dataset, max_rows=cap, **args))
    assert len(capped) == -(-cap // 4)
    read = [i * n // cap for i in range(cap)]  # evenly spread, the first and the spread's last included
    assert len(set(read)) == cap and read[0] == 0 and read[-1] >= n - 1 - n // cap
    for got, i in zip(rows(capped), read, strict=True):
      np.testing.assert_array_equal(got, whole[i])
    # A row's masks are keyed by its record: the same as in the whole pass.
    capped_positions = np.concatenate([b['masked_lm_positions'] for b in capped])[:cap]
    np.testing.assert_array_equal(capped_positions, whole_positions[read])
  for cap in (0, n, n + 5):  # no cap, or one the split is within: the whole pass
    for a, b in zip(ip.eval_batches(dataset, max_rows=cap, **args), ip.eval_batches(dataset, **args), strict=True):
      _assert_same(a, b)
  per_process = [list(ip.eval_batches(dataset, process_index=p, process_count=2, max_rows=6, **args))
                 for p in range(2)]
  for k, batch in enumerate(ip.eval_batches(dataset, max_rows=6, **args)):
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([per_process[0][k][key], per_process[1][k][key]]), batch[key])


@pytest.mark.parametrize('kwargs, pattern', [
    (dict(process_count=3), 'multiple of the process count 3'),
    (dict(global_batch_size=0), 'positive multiple'),
    (dict(process_index=2, process_count=2), 'process 2 of 2'),
    (dict(process_index=-1, process_count=2), 'process -1 of 2'),
    (dict(seed=-1), 'seed=-1'),
    (dict(start_position=-1), 'start_position=-1'),
])
def test_bad_arguments_are_refused(prepared, kwargs, pattern):
  with pytest.raises(ConfigError, match=pattern):
    _batches(prepared, **kwargs)


def test_records_longer_than_max_seq_length_are_refused(prepared):
  cfg, data = prepared
  short = dataclasses.replace(cfg, max_seq_length=16)
  with pytest.raises(Exception, match='max_seq_length=16'):
    ip.PretrainingDataset(data).gather([0], short.max_seq_length)
  with pytest.raises(Exception, match='max_seq_length=16'):
    next(ip.eval_batches(ip.PretrainingDataset(data, 'eval'), batch_size=4, seed=0, cfg=short, vocab=vocab_of(data)))


# ----------------------------------------------------------------------------- worker processes


@pytest.mark.slow
def test_worker_processes_give_the_same_stream(prepared):
  reference = _take(_batches(prepared, prefetch=0, global_batch_size=4), 6)
  before = set(multiprocessing.active_children())
  start = time.perf_counter()
  batches = _batches(prepared, spy=False, global_batch_size=4, workers=2)
  first = next(batches)
  startup_s = time.perf_counter() - start
  workers = set(multiprocessing.active_children()) - before
  assert len(workers) == 2, workers
  stream = [first] + [next(batches) for _ in range(5)]
  assert batches.position == 6
  batches.close()
  batches.close()
  for a, b in zip(reference, stream):
    _assert_same(a, b)
  # close() ends the worker processes.
  deadline = time.monotonic() + 30
  while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(w.is_alive() for w in workers)
  with pytest.raises(RuntimeError, match='closed'):
    next(batches)
  assert startup_s < 60, f'grain workers took {startup_s:.1f} s to give the first batch'

  # Resuming with workers continues the identical stream, and a worker's error reaches the
  # consumer in stream order: here reading a record of batch 5 fails (in whichever worker).
  maker = ip.BatchMaker(ip.PretrainingDataset(prepared[1]), global_batch_size=4, seed=0, cfg=prepared[0],
                        vocab=vocab_of(prepared[1]))
  bad_record = int(maker.record_indices(np.array([5 * 4 + 2]))[0])
  resumed = _batches(prepared, global_batch_size=4, workers=2, start_position=3, prefetch=1,
                     fail_on_index=bad_record)
  try:
    assert resumed.position == 3
    for a in reference[3:5]:
      _assert_same(a, next(resumed))
    assert resumed.position == 5
    with pytest.raises(OSError, match='disk on fire'):
      next(resumed)
  finally:
    resumed.close()


# ----------------------------------------------------------------------------- packing


def _reference_pack_batch(batch, cfg, num_rows=None):
  """pack_batch as first written, a loop over the examples; the vectorised one must give the same arrays."""
  lengths = batch['attention_mask'].sum(1)
  real = np.flatnonzero(lengths > 0)
  placed = reference_first_fit_decreasing(lengths[real].tolist(), cfg.max_seq_length, cfg.max_segments_per_row)
  needed = max((r for r, _ in placed), default=-1) + 1
  if num_rows is None:
    num_rows = ip._rounded_rows(needed, cfg)
  r, t, k, pp = num_rows, cfg.max_seq_length, cfg.max_segments_per_row, ip.packed_mlm_width(cfg)
  out = {name: np.zeros((r, t), np.int32) for name in
         ('input_ids', 'token_type_ids', 'attention_mask', 'position_ids', 'segment_ids')}
  out.update(masked_lm_positions=np.zeros((r, pp), np.int32), masked_lm_ids=np.zeros((r, pp), np.int32),
             masked_lm_weights=np.zeros((r, pp), np.float32), cls_positions=np.zeros((r, k), np.int32),
             next_sentence_labels=np.zeros((r, k), np.int32), nsp_weights=np.zeros((r, k), np.float32))
  segments, predictions = np.zeros((r,), np.int64), np.zeros((r,), np.int64)
  for e, (row, offset) in zip(real.tolist(), placed):
    n, s = int(lengths[e]), int(segments[row])
    cols = slice(offset, offset + n)
    segments[row] += 1
    out['input_ids'][row, cols] = batch['input_ids'][e, :n]
    out['token_type_ids'][row, cols] = batch['token_type_ids'][e, :n]
    out['attention_mask'][row, cols] = 1
    out['position_ids'][row, cols] = np.arange(n)
    out['segment_ids'][row, cols] = s + 1
    out['cls_positions'][row, s] = offset
    out['next_sentence_labels'][row, s] = batch['next_sentence_labels'][e]
    out['nsp_weights'][row, s] = batch['nsp_weights'][e]
    slots = np.flatnonzero(batch['masked_lm_weights'][e])
    j = int(predictions[row])
    if j + len(slots) > pp:
      raise DataError('too many masked-LM slots')
    out['masked_lm_positions'][row, j:j + len(slots)] = batch['masked_lm_positions'][e, slots] + offset
    out['masked_lm_ids'][row, j:j + len(slots)] = batch['masked_lm_ids'][e, slots]
    out['masked_lm_weights'][row, j:j + len(slots)] = batch['masked_lm_weights'][e, slots]
    predictions[row] += len(slots)
  return out


def _random_unpacked_batch(rng, batch_size, seq, predictions):
  """A make_batch-like batch: random lengths (0 = padding row), tokens, segments and masks."""
  lengths = rng.integers(0, seq + 1, batch_size) * (rng.random(batch_size) < 0.9)
  if rng.random() < 0.5:  # BERT pairs: mostly near full
    lengths = np.clip((rng.normal(0.8, 0.3, batch_size) * seq).astype(int), 0, seq)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  weights = np.zeros((batch_size, predictions), np.float32)
  positions, ids = np.zeros((batch_size, predictions), np.int32), np.zeros((batch_size, predictions), np.int32)
  for row, n in enumerate(lengths.tolist()):
    m = int(rng.integers(0, min(predictions, max(n - 3, 0), masking.num_predictions(n, predictions, 0.15)) + 1))
    weights[row, :m] = 1
    positions[row, :m] = np.sort(rng.choice(np.arange(1, max(n, 2)), m, replace=False))
    ids[row, :m] = rng.integers(5, 1000, m)
  return dict(input_ids=rng.integers(5, 1000, (batch_size, seq)).astype(np.int32) * mask,
              token_type_ids=(rng.random((batch_size, seq)) < 0.5).astype(np.int32) * mask, attention_mask=mask,
              masked_lm_positions=positions, masked_lm_ids=ids, masked_lm_weights=weights,
              next_sentence_labels=rng.integers(0, 2, batch_size).astype(np.int32),
              nsp_weights=(lengths > 0).astype(np.float32))


def test_pack_batch_matches_the_per_example_loop():
  rng = np.random.default_rng(0)
  refused = 0
  for trial in range(300):
    seq = int(rng.choice([16, 64, 128]))
    cfg = DataConfig(max_seq_length=seq, max_segments_per_row=int(rng.choice([1, 2, 4, 8])),
                     pack_rows_multiple=int(rng.choice([1, 8])))
    batch = _random_unpacked_batch(rng, int(rng.integers(0, 64)), seq, cfg.max_predictions_per_seq)
    lengths = batch['attention_mask'].sum(1)
    num_rows = None if trial % 2 else ip._placement(lengths[lengths > 0], cfg)[2] + trial % 3
    try:
      want = _reference_pack_batch(batch, cfg, num_rows)
    except DataError:  # more masked positions than masking gives: refused by both
      with pytest.raises(DataError, match='masked-LM slots'):
        ip.pack_batch(batch, cfg, num_rows)
      refused += 1
      continue
    got = ip.pack_batch(batch, cfg, num_rows)
    assert want.keys() == got.keys()
    for key in want:
      assert got[key].dtype == want[key].dtype, key
      np.testing.assert_array_equal(got[key], want[key], err_msg=f'{key} (trial {trial})')
  assert refused < 30  # nearly every batch is packed and compared
