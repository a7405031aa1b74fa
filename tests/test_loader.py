"""Tests for bert_jax.input_pipeline: batches, resume, sharding, eval batches."""

import dataclasses

import numpy as np
import pytest

from bert_jax.data import loader as ip
from bert_jax.errors import ConfigError
from bert_jax.data.tokenization import MASK_ID, SentencePieceTokenizer

from conftest import SMALL_VOCAB as VOCAB


# ----------------------------------------------------------------------------- setup




# ----------------------------------------------------------------------------- batches


class _SpyDataset:
  """Wraps a dataset and records which indices were read."""

  def __init__(self, dataset, fail_on_call=None):
    self.dataset, self.read, self.calls, self.fail_on_call = dataset, [], 0, fail_on_call

  def __len__(self):
    return len(self.dataset)

  def get_many(self, indices):
    self.calls += 1
    if self.calls == self.fail_on_call:
      raise OSError('disk on fire')
    self.read.extend(indices)
    return self.dataset.get_many(indices)


def _batches(prepared, split='train', fail_on_call=None, **kwargs):
  cfg, data = prepared
  args = dict(global_batch_size=8, seed=0, cfg=cfg, vocab_size=VOCAB, word_starts=None)
  args.update(kwargs)
  dataset = _SpyDataset(ip.PretrainingDataset(data.dir, split), fail_on_call)
  return ip.PretrainingBatches(dataset, **args)


def _take(batches, n):
  with batches:
    return [next(batches) for _ in range(n)]


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_batch_layout(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data)  # a PreparedData or its directory
  batches = _batches(prepared, prefetch=0)
  batch = next(batches)
  b, t, p = 8, cfg.max_seq_length, cfg.max_predictions_per_seq
  expected = dict(input_ids=((b, t), np.int32), token_type_ids=((b, t), np.int32),
                  attention_mask=((b, t), np.int32), masked_lm_positions=((b, p), np.int32),
                  masked_lm_ids=((b, p), np.int32), masked_lm_weights=((b, p), np.float32),
                  next_sentence_labels=((b,), np.int32), nsp_weights=((b,), np.float32))
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
  perm = np.random.default_rng((0, 0)).permutation(len(dataset))
  for row in range(b):
    tokens, len_a, is_random_next = dataset[perm[row]]
    n = len(tokens)
    assert batch['attention_mask'][row].tolist() == [1] * n + [0] * (t - n)
    assert batch['token_type_ids'][row].tolist() == [0] * (len_a + 2) + [1] * (n - len_a - 2) + \
        [0] * (t - n)
    assert batch['next_sentence_labels'][row] == int(is_random_next)
    k = int(batch['masked_lm_weights'][row].sum())
    assert k == min(p, round(n * cfg.masked_lm_prob))
    pos = batch['masked_lm_positions'][row, :k]
    np.testing.assert_array_equal(batch['masked_lm_ids'][row, :k], tokens[pos])
    keep = np.setdiff1d(np.arange(n), pos)
    np.testing.assert_array_equal(batch['input_ids'][row, keep], tokens[keep])
    assert (batch['input_ids'][row, n:] == 0).all()
  assert (batch['input_ids'] == MASK_ID).sum() > 0.6 * batch['masked_lm_weights'].sum()
  assert batch['nsp_weights'].tolist() == [1.0] * b


def test_batches_deterministic_and_prefetch_matches(prepared):
  first = _take(_batches(prepared), 3)
  for other in (_take(_batches(prepared), 3), _take(_batches(prepared, prefetch=0), 3)):
    for a, b in zip(first, other):
      _assert_same(a, b)
  different = _take(_batches(prepared, seed=1), 1)[0]
  assert not np.array_equal(first[0]['input_ids'], different['input_ids'])


def test_resume_continues_the_stream(prepared):
  full = _batches(prepared)
  reference = _take(full, 6)
  assert full.position == 6
  resumed = _batches(prepared, start_position=4)
  assert resumed.position == 4
  for a, b in zip(reference[4:], _take(resumed, 2)):
    _assert_same(a, b)
  assert resumed.position == 6


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
  reads = [p._dataset.read for p in procs]  # pylint: disable=protected-access
  assert len(reads[0]) == len(reads[1]) >= 12 and not set(reads[0]) & set(reads[1])
  with pytest.raises(ConfigError, match='multiple of the process count 3'):
    _batches(prepared, process_count=3)


def test_epochs_cover_every_record_with_new_masks(prepared):
  cfg, data = prepared
  n = data.num_eval  # a small split: several epochs are cheap
  batches = _batches(prepared, split='eval', global_batch_size=1, prefetch=0)
  stream = [batches.batch_at(s) for s in range(2 * n)]
  reads = batches._dataset.read  # pylint: disable=protected-access
  assert sorted(reads[:n]) == sorted(reads[n:]) == list(range(n))
  assert reads[:n] != reads[n:]  # reshuffled each epoch
  first_seen = {index: s for s, index in enumerate(reads[:n])}
  same_masks = sum(np.array_equal(stream[first_seen[index]]['masked_lm_positions'],
                                  stream[n + s]['masked_lm_positions'])
                   for s, index in enumerate(reads[n:]))
  assert same_masks < 0.2 * n


def test_producer_errors_reach_the_consumer(prepared):
  batches = _batches(prepared, fail_on_call=2)
  next(batches)
  with pytest.raises(OSError, match='disk on fire'):
    next(batches)
  with pytest.raises(OSError, match='disk on fire'):
    next(batches)
  batches.close()
  batches.close()


def test_whole_word_batches(prepared):
  cfg, data = prepared
  wwm_cfg = dataclasses.replace(cfg, whole_word_masking=True)
  with pytest.raises(ConfigError, match='whole_word_masking'):
    next(_batches(prepared, cfg=wwm_cfg, prefetch=0))
  table = SentencePieceTokenizer(data.tokenizer_path).word_start_table()
  batch = next(_batches(prepared, cfg=wwm_cfg, word_starts=table, prefetch=0))
  assert batch['masked_lm_weights'].sum() > 0


def test_eval_batches_pad_the_last_batch(prepared):
  cfg, data = prepared
  dataset = ip.PretrainingDataset(data.dir, 'eval')
  n = len(dataset)
  size = 6 if n % 6 else 4
  args = dict(batch_size=size, seed=0, cfg=cfg, vocab_size=VOCAB, word_starts=None)
  batches = list(ip.eval_batches(dataset, **args))
  assert len(batches) == -(-n // size) and n % size
  weights = np.concatenate([b['nsp_weights'] for b in batches])
  assert weights.tolist() == [1.0] * n + [0.0] * (len(weights) - n)
  last = batches[-1]
  pad = last['nsp_weights'] == 0
  assert (last['masked_lm_weights'][pad] == 0).all() and (last['input_ids'][pad] == 0).all()
  assert (last['attention_mask'][pad] == 0).all()
  _assert_same(batches[0], next(ip.eval_batches(dataset, **args)))  # fixed masks
  labels = [dataset[i][2] for i in range(n)]
  assert np.concatenate([b['next_sentence_labels'] for b in batches])[:n].tolist() == labels
  per_process = [list(ip.eval_batches(dataset, process_index=p, process_count=2, **args))
                 for p in range(2)]
  assert len(per_process[0]) == len(per_process[1]) == len(batches)
  with pytest.raises(ConfigError, match='multiple of the process count 5'):
    ip.eval_batches(dataset, process_index=0, process_count=5, **args)
  for k, batch in enumerate(batches):
    for key in batch:
      np.testing.assert_array_equal(
          np.concatenate([per_process[0][k][key], per_process[1][k][key]]), batch[key])
