"""Reading the pretraining data: cached NSP records → masked, resumable batches.

`pretraining_data` builds the records once; here `PretrainingDataset` gives random
access to one split of them and `PretrainingBatches` streams per-process numpy
training batches with dynamic masking (`make_batch`); `eval_batches` makes one pass
with fixed masks. Every batch is a pure function of (seed, batch position), so a
checkpoint only needs `position`, and P processes together produce exactly the
1-process global batch.

Batch format (B local batch, T max_seq_length, P max_predictions_per_seq):
  input_ids int32[B,T] (0-padded), token_type_ids int32[B,T], attention_mask int32[B,T],
  masked_lm_positions int32[B,P], masked_lm_ids int32[B,P], masked_lm_weights float32[B,P],
  next_sentence_labels int32[B] (0 = B follows A, 1 = random), nsp_weights float32[B].

Packed training batches (`data.pack`; `pack_batch`) hold the same examples and masks in R
rows of up to K = data.max_segments_per_row examples each (first-fit decreasing):
  input_ids, token_type_ids, attention_mask (= segment_ids > 0), position_ids (restart at 0
  in every example), segment_ids (1..K per example, 0 = padding): int32[R,T];
  masked_lm_positions (absolute in the row), masked_lm_ids int32[R,Pp], masked_lm_weights
  float32[R,Pp] with Pp = `packed_mlm_width(cfg)`; cls_positions (the row offset of each
  example's [CLS]), next_sentence_labels int32[R,K], nsp_weights float32[R,K] (0 = empty slot).
Evaluation batches are never packed.
"""

from __future__ import annotations

import functools
import math
import os
import queue
import threading
from typing import Iterator, Sequence

from array_record.python import array_record_data_source
import numpy as np

from bert_jax.data import masking, packing
from bert_jax.config import DataConfig
from bert_jax.errors import ConfigError, DataError
from bert_jax.data.prepare import META_FILE, Example, PreparedData, decode_record, read_meta


# ----------------------------------------------------------------------------- the dataset


class PretrainingDataset:
  """Random access to one split's records: `dataset[i] -> (tokens, len_a, is_random_next)`.

  `tokens` is int32[L] = [CLS] A [SEP] B [SEP] with len(A) == len_a.
  """

  def __init__(self, data: PreparedData | str, split: str = 'train'):
    """Opens `split` ('train' or 'eval') of a cache (a PreparedData or its directory)."""
    data_dir = data.dir if isinstance(data, PreparedData) else data
    if split not in ('train', 'eval'):
      raise ConfigError(f"split must be 'train' or 'eval', got {split!r}")
    meta = read_meta(data_dir)
    self._source = array_record_data_source.ArrayRecordDataSource(
        [os.path.join(data_dir, name) for name in meta[f'{split}_shards']])
    if len(self._source) != meta[f'num_{split}']:
      raise DataError(f'{data_dir}: {split} shards hold {len(self._source)} records, '
                      f'{META_FILE} says {meta[f"num_{split}"]}; delete the directory to '
                      'rebuild it')

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> Example:
    return decode_record(self._source[index])

  def get_many(self, indices: Sequence[int]) -> list[Example]:
    """Reads several records at once (one batched read per shard)."""
    return [decode_record(r) for r in self._source.__getitems__([int(i) for i in indices])]


# ----------------------------------------------------------------------------- batches


def make_batch(examples: Sequence[Example | None], position_seeds: Sequence[tuple[int, ...]], *,
               cfg: DataConfig, vocab_size: int, word_starts: np.ndarray | None) -> dict:
  """Pads and dynamically masks examples into one batch (format in the module docstring).

  Args:
    examples: records from PretrainingDataset; None gives an all-zero, zero-weight row.
    position_seeds: per example, the seed of its masking rng (np.random.default_rng).
    cfg: max_seq_length, max_predictions_per_seq, masked_lm_prob, whole_word_masking.
    vocab_size: range of random replacement tokens.
    word_starts: `tokenizer.word_start_table()`; required when cfg.whole_word_masking.

  Returns:
    A dict of numpy arrays with len(examples) rows.
  """
  if cfg.whole_word_masking and word_starts is None:
    raise ConfigError('data.whole_word_masking needs the tokenizer word_start_table()')
  b, t, p = len(examples), cfg.max_seq_length, cfg.max_predictions_per_seq
  batch = dict(
      input_ids=np.zeros((b, t), np.int32), token_type_ids=np.zeros((b, t), np.int32),
      attention_mask=np.zeros((b, t), np.int32),
      masked_lm_positions=np.zeros((b, p), np.int32), masked_lm_ids=np.zeros((b, p), np.int32),
      masked_lm_weights=np.zeros((b, p), np.float32),
      next_sentence_labels=np.zeros((b,), np.int32), nsp_weights=np.zeros((b,), np.float32))
  for row, (example, seed) in enumerate(zip(examples, position_seeds, strict=True)):
    if example is None:
      continue
    tokens, len_a, is_random_next = example
    n = len(tokens)
    if n > t:
      raise DataError(f'a record has {n} tokens but data.max_seq_length={t}; the cache was '
                      'built for another max_seq_length')
    masked, positions, labels = masking.mask_tokens(
        tokens, np.random.default_rng(seed), vocab_size=vocab_size, max_predictions=p,
        masked_lm_prob=cfg.masked_lm_prob,
        word_starts=word_starts if cfg.whole_word_masking else None)
    batch['input_ids'][row, :n] = masked
    batch['token_type_ids'][row, len_a + 2:n] = 1  # B and its [SEP]
    batch['attention_mask'][row, :n] = 1
    k = len(positions)
    batch['masked_lm_positions'][row, :k] = positions
    batch['masked_lm_ids'][row, :k] = labels
    batch['masked_lm_weights'][row, :k] = 1.0
    batch['next_sentence_labels'][row] = int(is_random_next)
    batch['nsp_weights'][row] = 1.0
  return batch


# ----------------------------------------------------------------------------- packing


@functools.lru_cache(maxsize=8)
def packed_mlm_width(cfg: DataConfig) -> int:
  """Pp, the masked-LM slots of a packed row: the most that any examples sharing one can need.

  An example of L tokens ([CLS] A [SEP] B [SEP]) gets at most min(masking.num_predictions(L),
  L - 3) predictions; the widest row is the best choice of up to K lengths summing to at most
  T, found by a small dynamic programme (seq 128, P 20, K 4: 21 slots, where one full example
  needs 19).
  """
  t, p, prob = cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.masked_lm_prob
  n_l = np.array([0] + [min(masking.num_predictions(l, p, prob), max(l - 3, 0)) for l in range(1, t + 1)])
  best_u = np.zeros(t + 1, np.int64)  # best_u[u]: most predictions of the examples so far in u tokens
  for _ in range(cfg.max_segments_per_row):
    best_u = np.array([np.max(best_u[u::-1] + n_l[:u + 1]) for u in range(t + 1)])
  return int(best_u[t])


def _placement(lengths: Sequence[int], cfg: DataConfig) -> tuple[list[tuple[int, int]], int]:
  placed = packing.first_fit_decreasing(lengths, cfg.max_seq_length, cfg.max_segments_per_row)
  return placed, max((r for r, _ in placed), default=-1) + 1


def packed_num_rows(lengths_per_process: Sequence[Sequence[int]], cfg: DataConfig) -> int:
  """Rows of every process's packed batch: the most any process needs, rounded up.

  Every process must give the same number of rows. Rather than agreeing with a collective
  (a host sync every step, and unsafe from the prefetch thread, which would interleave it
  with the training step's collectives in a different order on each host), every process
  packs the lengths of all processes' examples (reading the global batch's records) and so
  computes the same answer; with one process this is just its own row count.

  Args:
    lengths_per_process: the token counts of each process's examples (0 = padding example).
    cfg: max_seq_length, max_segments_per_row, pack_rows_multiple.
  """
  return _rounded_rows(max(_placement([n for n in lengths if n], cfg)[1] for lengths in lengths_per_process), cfg)


def _rounded_rows(needed: int, cfg: DataConfig) -> int:
  # Positive pack_rows_multiple and max_segments_per_row: train_lib.validate_config.
  return -(-max(needed, 1) // cfg.pack_rows_multiple) * cfg.pack_rows_multiple


def pack_batch(batch: dict, cfg: DataConfig, num_rows: int | None = None) -> dict:
  """Packs a `make_batch` batch several examples per row (format in the module docstring).

  The model computes the same per-example outputs on the packed rows (attention stays
  inside an example, positions restart, NSP pools each example's [CLS]); padding examples
  (zero nsp_weight) are dropped.

  Args:
    batch: unpacked rows from `make_batch`.
    cfg: max_seq_length, max_segments_per_row, pack_rows_multiple, masking fields.
    num_rows: rows to emit (`packed_num_rows`); by default this batch's own count.

  Returns:
    A dict of numpy arrays with num_rows rows.
  """
  lengths = batch['attention_mask'].sum(1)
  real = np.flatnonzero(batch['nsp_weights'] > 0)
  placed, needed = _placement(lengths[real].tolist(), cfg)
  if num_rows is None:
    num_rows = _rounded_rows(needed, cfg)
  if num_rows < needed:
    raise ValueError(f'{len(real)} examples need {needed} packed rows, got {num_rows}')
  r, t, k, pp = num_rows, cfg.max_seq_length, cfg.max_segments_per_row, packed_mlm_width(cfg)
  out = {name: np.zeros((r, t), np.int32) for name in
         ('input_ids', 'token_type_ids', 'attention_mask', 'position_ids', 'segment_ids')}
  out.update(masked_lm_positions=np.zeros((r, pp), np.int32), masked_lm_ids=np.zeros((r, pp), np.int32),
             masked_lm_weights=np.zeros((r, pp), np.float32), cls_positions=np.zeros((r, k), np.int32),
             next_sentence_labels=np.zeros((r, k), np.int32), nsp_weights=np.zeros((r, k), np.float32))
  segments = np.zeros((r,), np.int64)
  predictions = np.zeros((r,), np.int64)
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
      raise DataError(f'a packed row needs more than {pp} masked-LM slots; packed_mlm_width no '
                      'longer bounds masking.mask_tokens')
    out['masked_lm_positions'][row, j:j + len(slots)] = batch['masked_lm_positions'][e, slots] + offset
    out['masked_lm_ids'][row, j:j + len(slots)] = batch['masked_lm_ids'][e, slots]
    out['masked_lm_weights'][row, j:j + len(slots)] = batch['masked_lm_weights'][e, slots]
    predictions[row] += len(slots)
  return out


class _Failure:

  def __init__(self, error: BaseException):
    self.error = error


class PretrainingBatches:
  """Infinite, resumable, per-process stream of training batches.

  Global batch k holds stream positions s in [k*B, (k+1)*B); position s is example
  perm_e[s % N] of epoch e = s // N, perm_e = default_rng((seed, e)).permutation(N),
  masked with default_rng((seed, 1, s)): masks change every epoch yet depend only on
  (seed, s). Process p builds rows [p*B/P, (p+1)*B/P) of each global batch.
  `position` counts the global batches consumed; pass it back as `start_position`
  to continue the identical stream. With `cfg.pack` each process packs its own rows
  (`pack_batch`) into as many rows as the fullest process needs (`packed_num_rows`).
  """

  def __init__(self, dataset: PretrainingDataset, *, global_batch_size: int, seed: int,
               cfg: DataConfig, vocab_size: int, word_starts: np.ndarray | None,
               process_index: int = 0, process_count: int = 1, start_position: int = 0,
               prefetch: int = 2):
    """Starts the stream (and its prefetch thread; call `close()` when done).

    Args:
      dataset: the 'train' split.
      global_batch_size: B, rows per optimizer step over all processes.
      seed: shuffling and masking seed (>= 0).
      cfg: data config (sequence length, masking).
      vocab_size: range of random replacement tokens.
      word_starts: `tokenizer.word_start_table()`; needed for whole-word masking.
      process_index: this process (jax.process_index()).
      process_count: number of processes (jax.process_count()); must divide B.
      start_position: global batches already consumed (from a checkpoint).
      prefetch: batches built ahead in a background thread; 0 builds on demand.
    """
    if global_batch_size <= 0 or global_batch_size % process_count:
      raise ConfigError(f'global batch size {global_batch_size} must be a positive multiple '
                        f'of the process count {process_count}')
    if seed < 0 or start_position < 0 or not 0 <= process_index < process_count:
      raise ConfigError(f'bad stream arguments: seed={seed}, start_position={start_position}, '
                        f'process {process_index} of {process_count}')
    if not len(dataset):
      raise DataError('the training split has no records')
    self._dataset = dataset
    self._global_batch_size = global_batch_size
    self._local_batch_size = global_batch_size // process_count
    self._row_offset = process_index * self._local_batch_size
    self._seed = seed
    self._make = dict(cfg=cfg, vocab_size=vocab_size, word_starts=word_starts)
    self._cfg = cfg
    self._process_count = process_count
    self._perms: dict[int, np.ndarray] = {}
    self.position = start_position
    self._error: BaseException | None = None
    self._queue: queue.Queue | None = None
    self._stop = threading.Event()
    if prefetch > 0:
      self._queue = queue.Queue(maxsize=prefetch)
      self._thread = threading.Thread(target=self._produce, args=(start_position,), daemon=True,
                                      name='PretrainingBatches')
      self._thread.start()

  def batch_at(self, k: int) -> dict:
    """This process's rows of global batch k (a pure function of seed and k)."""
    n = len(self._dataset)
    start = k * self._global_batch_size + self._row_offset
    stream_pos = range(start, start + self._local_batch_size)
    num_rows = None  # one process: as many rows as its own examples need
    if self._cfg.pack and self._process_count > 1:
      # Every process must emit the same number of packed rows: read every process's examples
      # for their lengths (see packed_num_rows) and keep this process's block.
      global_pos = range(k * self._global_batch_size, (k + 1) * self._global_batch_size)
      every = self._dataset.get_many([self._permutation(s // n)[s % n] for s in global_pos])
      local = self._local_batch_size
      num_rows = packed_num_rows([[len(ex[0]) for ex in every[i:i + local]]
                                  for i in range(0, len(every), local)], self._cfg)
      examples = every[self._row_offset:self._row_offset + local]
    else:
      examples = self._dataset.get_many([self._permutation(s // n)[s % n] for s in stream_pos])
    batch = make_batch(examples, [(self._seed, 1, s) for s in stream_pos], **self._make)
    return pack_batch(batch, self._cfg, num_rows) if self._cfg.pack else batch

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 2:  # a batch rarely spans more than two epochs
        self._perms.pop(min(self._perms))
      self._perms[epoch] = np.random.default_rng((self._seed, epoch)).permutation(
          len(self._dataset))
    return self._perms[epoch]

  def _produce(self, k: int) -> None:
    while not self._stop.is_set():
      try:
        item = self.batch_at(k)
      except BaseException as e:  # pylint: disable=broad-except
        item = _Failure(e)  # re-raised in the consumer's thread
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          pass
      if isinstance(item, _Failure):
        return
      k += 1

  def __iter__(self) -> 'PretrainingBatches':
    return self

  def __next__(self) -> dict:
    if self._error is not None:
      raise self._error
    if self._queue is None:
      batch = self.batch_at(self.position)
    else:
      if self._stop.is_set():
        raise RuntimeError('PretrainingBatches is closed')
      item = self._queue.get()
      if isinstance(item, _Failure):
        self._error = item.error
        raise item.error
      batch = item
    self.position += 1
    return batch

  def close(self) -> None:
    """Stops the prefetch thread (idempotent)."""
    self._stop.set()
    if self._queue is not None:
      while self._thread.is_alive():
        try:  # unblock a producer waiting on a full queue
          self._queue.get_nowait()
        except queue.Empty:
          pass
        self._thread.join(timeout=0.05)

  def __enter__(self) -> 'PretrainingBatches':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def eval_batches(dataset: PretrainingDataset, *, batch_size: int, seed: int, cfg: DataConfig,
                 vocab_size: int, word_starts: np.ndarray | None, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict]:
  """One pass over a split in record order, with fixed masks (seeded by (seed, 2, index)).

  Every process yields ceil(N / batch_size) batches; rows past the end are padding
  with nsp_weights and masked_lm_weights 0.

  Args:
    dataset: usually the 'eval' split.
    batch_size: global batch size, a multiple of process_count.
    seed: masking seed.
    cfg: data config (sequence length, masking).
    vocab_size: range of random replacement tokens.
    word_starts: `tokenizer.word_start_table()`, for whole-word masking.
    process_index: this process.
    process_count: number of processes.

  Returns:
    An iterator over this process's rows of each global batch.
  """
  if batch_size <= 0 or batch_size % process_count:
    raise ConfigError(f'eval batch size {batch_size} must be a positive multiple of the '
                      f'process count {process_count}')
  n, local = len(dataset), batch_size // process_count

  def generate():  # a separate generator so bad arguments fail at the call, not at first use
    for k in range(math.ceil(n / batch_size)):
      start = k * batch_size + process_index * local
      indices = range(start, start + local)
      real = [i for i in indices if i < n]
      examples = dataset.get_many(real) if real else []
      examples += [None] * (local - len(real))
      yield make_batch(examples, [(seed, 2, i) for i in indices], cfg=cfg, vocab_size=vocab_size,
                       word_starts=word_starts)

  return generate()
