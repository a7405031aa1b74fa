"""Reading the pretraining data: prepared NSP records -> masked, resumable batches.

`prepare` builds the records once; here `PretrainingDataset` gives random access to one split
of them, `BatchMaker` builds this process's rows of any global batch with dynamic masking, and
`PretrainingBatches` streams them, built ahead in a thread or in grain worker processes;
`eval_batches` makes one pass with fixed masks. Every batch is a pure function of (seed, batch
position): the record order of epoch e is a keyed bijection of the record indices
(`hashing.permute`, no permutation array, so any corpus size), and each row's masks come from
a counter-based hash of (seed, stream position) (`masking.mask_batch`). A checkpoint therefore
only needs `position`, and P processes together produce exactly the 1-process global batch.

Batch format (B local batch, T max_seq_length, P max_predictions_per_seq):
  input_ids int32[B,T] (padded with the tokenizer's [PAD]), token_type_ids int32[B,T],
  attention_mask int32[B,T], masked_lm_positions int32[B,P], masked_lm_ids int32[B,P],
  masked_lm_weights float32[B,P], next_sentence_labels int32[B] (0 = B follows A, 1 = random),
  nsp_weights float32[B] (0 for padding rows, and everywhere with data.objective=none).
  With data.objective=sop the label is 1 when A and B are swapped.

Packed training batches (`data.pack`; `pack_batch`) hold the same examples and masks in R
rows of up to K = data.max_segments_per_row examples each (first-fit decreasing):
  input_ids, token_type_ids, attention_mask (= segment_ids > 0), position_ids (restart at 0
  in every example), segment_ids (1..K per example, 0 = padding): int32[R,T];
  masked_lm_positions (absolute in the row), masked_lm_ids int32[R,Pp], masked_lm_weights
  float32[R,Pp] with Pp = `packed_mlm_width(cfg)`; cls_positions (the row offset of each
  example's [CLS]), next_sentence_labels int32[R,K], nsp_weights float32[R,K] (0 = empty slot).
Every process packs its own rows into as many rows as the fullest process needs, which it
knows from the record lengths in the split's index, without reading others' records.
Evaluation batches are never packed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import queue
import threading
from typing import Iterator, Sequence

import numpy as np

from bert_jax.config import DataConfig
from bert_jax.data import hashing, masking, packing
from bert_jax.data.records import Example, PreparedData, RecordReader, Rows, SpecialIds, load_prepared_data
from bert_jax.errors import ConfigError, DataError

# Key purposes of hashing.key(seed, purpose, ...): kept apart so no two streams share randomness.
_ORDER, _TRAIN_MASKS, _EVAL_MASKS = 0, 1, 2


# ----------------------------------------------------------------------------- the dataset


class PretrainingDataset:
  """Random access to one split's records: `dataset[i] -> (tokens, len_a, is_random_next)`.

  `tokens` is int32[L] = [CLS] A [SEP] B [SEP] with len(A) == len_a. Picklable: a worker
  process reopens the shards it is handed.
  """

  def __init__(self, data: PreparedData | str, split: str = 'train'):
    """Opens `split` ('train' or 'eval') of a prepared cache (a PreparedData or its directory)."""
    if split not in ('train', 'eval'):
      raise ConfigError(f"split must be 'train' or 'eval', got {split!r}")
    self.data = data if isinstance(data, PreparedData) else load_prepared_data(data)
    self.split = split
    self._num = self.data.num_train if split == 'train' else self.data.num_eval
    self._source = None
    if len(self.source) != self._num:
      raise DataError(f'{self.data.dir}: {split} shards hold {len(self.source)} records, meta.json says '
                      f'{self._num}; delete the directory to rebuild it')

  @property
  def source(self) -> RecordReader:
    if self._source is None:
      self._source = self.data.reader(self.split)
    return self._source

  @property
  def lengths(self) -> np.ndarray:
    """uint16[N]: every record's token count (a memory-mapped column of the index)."""
    return self.source.index['length']

  def record_lengths(self, indices: np.ndarray) -> np.ndarray:
    """The token counts of the records at `indices`."""
    return self.lengths[indices]

  def __getstate__(self):
    return {**self.__dict__, '_source': None}

  def __len__(self) -> int:
    return self._num

  def __getitem__(self, index: int) -> Example:
    return self.source[int(index)]

  def gather(self, indices: Sequence[int], width: int) -> Rows:
    """The records at `indices` as rows of `width` tokens (`records.RecordReader.gather`)."""
    return self.source.gather(indices, width)


# ----------------------------------------------------------------------------- batches


@dataclasses.dataclass(frozen=True)
class Vocab:
  """What masking needs to know of the tokenizer."""

  special_ids: SpecialIds
  special_v: np.ndarray  # bool[V]: never masked or drawn
  word_starts_v: np.ndarray | None  # bool[V] for whole-word and span masking, else None

  @functools.cached_property  # computed once per Vocab (per worker process)
  def replace_ids(self) -> np.ndarray:
    """int32: the ids a random replacement draws from (not special, not [UNK])."""
    ids = np.flatnonzero(~self.special_v)
    return ids[ids != self.special_ids.unk].astype(np.int32)

  @classmethod
  def from_tokenizer(cls, tokenizer, special_ids: SpecialIds, masking: str = 'token') -> 'Vocab':
    """`masking` as data.masking: word starts are looked up for whole-word and span masking."""
    return cls(special_ids, tokenizer.special_table(),
               tokenizer.word_start_table() if masking != 'token' else None)


def make_batch(rows: Rows, keys_b: np.ndarray, *, cfg: DataConfig, vocab: Vocab,
               masked_lm_prob: float | None = None) -> dict:
  """Pads and dynamically masks records into one batch (format in the module docstring).

  Args:
    rows: the records (`PretrainingDataset.gather`, max_seq_length wide); a row of length 0
      gives an all-padding, zero-weight row.
    keys_b: uint64[B], each row's masking key (`hashing.key(seed, purpose, position)`).
    cfg: max_seq_length, max_predictions_per_seq, masked_lm_prob, masking, objective.
    vocab: the tokenizer's special ids and tables.
    masked_lm_prob: the masking rate of this batch (a schedule's); None = cfg.masked_lm_prob.

  Returns:
    A dict of numpy arrays with B rows.
  """
  if cfg.masking != 'token' and vocab.word_starts_v is None:
    raise ConfigError(f'data.masking={cfg.masking} needs the tokenizer word_start_table()')
  t = cfg.max_seq_length
  if rows.tokens.shape[1] != t:
    raise ValueError(f'rows are {rows.tokens.shape[1]} tokens wide, data.max_seq_length is {t}')
  lengths_b = rows.lengths
  ids_bt, positions, ids, weights = masking.mask_batch(
      rows.tokens, lengths_b, keys_b, special_v=vocab.special_v, replace_ids=vocab.replace_ids,
      mask_id=vocab.special_ids.mask, max_predictions=cfg.max_predictions_per_seq,
      masked_lm_prob=cfg.masked_lm_prob if masked_lm_prob is None else masked_lm_prob,
      word_starts_v=vocab.word_starts_v if cfg.masking != 'token' else None,
      span=(cfg.span_p, cfg.span_max_words) if cfg.masking == 'span' else None)
  cols = np.arange(t)
  real_bt = cols < lengths_b[:, None]
  ids_bt = np.where(real_bt, ids_bt, vocab.special_ids.pad).astype(np.int32)
  return dict(
      input_ids=ids_bt,
      token_type_ids=(real_bt & (cols >= rows.len_a[:, None] + 2)).astype(np.int32),  # B and its [SEP]
      attention_mask=real_bt.astype(np.int32),
      masked_lm_positions=positions, masked_lm_ids=ids, masked_lm_weights=weights,
      next_sentence_labels=rows.random_next.astype(np.int32),
      nsp_weights=((lengths_b > 0) & cfg.sentence_pairs).astype(np.float32))  # objective none: no pair loss


# ----------------------------------------------------------------------------- packing


@functools.lru_cache(maxsize=8)
def packed_mlm_width(cfg: DataConfig) -> int:
  """Pp, the masked-LM slots of a packed row: the most that any examples sharing one can need.

  An example of L tokens ([CLS] A [SEP] B [SEP]) gets at most min(masking.num_predictions(L),
  L - 3) predictions; the widest row is the best choice of up to K lengths summing to at most
  T, found by a small dynamic programme (seq 128, P 20, K 4: 21 slots, where one full example
  needs 19).
  """
  t, p, prob = cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.max_masked_lm_prob
  n_l = np.array([0] + [min(masking.num_predictions(l, p, prob), max(l - 3, 0)) for l in range(1, t + 1)])
  best_u = np.zeros(t + 1, np.int64)  # best_u[u]: most predictions of the examples so far in u tokens
  for _ in range(cfg.max_segments_per_row):
    best_u = np.array([np.max(best_u[u::-1] + n_l[:u + 1]) for u in range(t + 1)])
  return int(best_u[t])


def _placement(lengths: Sequence[int] | np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, int]:
  """(rows, offsets, number of rows) of `packing.fit_rows` for examples of these lengths."""
  return packing.fit_rows(lengths, cfg.max_seq_length, cfg.max_segments_per_row)


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
  return _rounded_rows(max(_placement([n for n in lengths if n], cfg)[2] for lengths in lengths_per_process), cfg)


def _rounded_rows(needed: int, cfg: DataConfig) -> int:
  # Positive pack_rows_multiple and max_segments_per_row: pretraining.pretrain_run.validate_config.
  return -(-max(needed, 1) // cfg.pack_rows_multiple) * cfg.pack_rows_multiple


def pack_batch(batch: dict, cfg: DataConfig, num_rows: int | None = None) -> dict:
  """Packs a `make_batch` batch several examples per row (format in the module docstring).

  The model computes the same per-example outputs on the packed rows (attention stays
  inside an example, positions restart, NSP pools each example's [CLS]); padding examples
  (no tokens) are dropped.

  Args:
    batch: unpacked rows from `make_batch`.
    cfg: max_seq_length, max_segments_per_row, pack_rows_multiple, masking fields.
    num_rows: rows to emit (`packed_num_rows`); by default this batch's own count.

  Returns:
    A dict of numpy arrays with num_rows rows.
  """
  lengths = batch['attention_mask'].sum(1)
  real = np.flatnonzero(lengths > 0)
  rows, offsets, needed = _placement(lengths[real], cfg)
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
  if not len(real):
    return out
  b, width = batch['input_ids'].shape
  n = lengths[real]
  slots = _before_within(rows)  # a row's examples in batch order
  # Every packed position reads one position of the unpacked arrays followed by `t` zeros: the
  # rows' examples in offset order, each its first n tokens, then padding from the zeros. The
  # reads are runs, gathered through one running-sum index (as nsp's records).
  used = np.bincount(rows, weights=n, minlength=r).astype(np.int64)
  starts = np.concatenate([rows * t + offsets, np.arange(r) * t + used])  # in the packed rows
  sources = np.concatenate([real * width, np.full(r, b * width)])
  runs = np.concatenate([n, t - used])
  order = np.argsort(starts, kind='stable')
  starts, sources, runs = starts[order], sources[order], runs[order]
  keep = runs > 0
  starts, sources, runs = starts[keep], sources[keep], runs[keep]
  index = np.ones(r * t, np.int64)
  jumps = sources.copy()
  jumps[1:] -= sources[:-1] + runs[:-1] - 1
  index[starts] = jumps
  np.cumsum(index, out=index)
  zeros = np.zeros(t, np.int32)
  for name in ('input_ids', 'token_type_ids'):
    out[name] = np.concatenate([batch[name].ravel(), zeros])[index].reshape(r, t)
  out['attention_mask'] = (index < b * width).astype(np.int32).reshape(r, t)
  out['position_ids'] = _positions(b, width, t)[index].reshape(r, t)
  segment = np.zeros(b, np.int32)
  segment[real] = slots + 1
  out['segment_ids'] = np.concatenate([np.repeat(segment, width), zeros])[index].reshape(r, t)
  out['cls_positions'][rows, slots] = offsets
  out['next_sentence_labels'][rows, slots] = batch['next_sentence_labels'][real]
  out['nsp_weights'][rows, slots] = batch['nsp_weights'][real]
  # Masked-LM slots: a row's predictions are its examples' (in batch order, each in slot order).
  e, p = np.nonzero(batch['masked_lm_weights'][real])  # by example, then slot
  count = np.bincount(e, minlength=len(real))
  # Slot j in the row: the predictions of the row's examples before e, then e's own before this one.
  j = _before_within(rows, count)[e] + np.arange(len(e)) - np.repeat(np.cumsum(count) - count, count)
  if len(j) and j.max() >= pp:
    raise DataError(f'a packed row needs more than {pp} masked-LM slots; packed_mlm_width no '
                    'longer bounds masking.mask_tokens')
  p_width = batch['masked_lm_weights'].shape[1]
  dst, src = rows[e] * pp + j, real[e] * p_width + p
  out['masked_lm_positions'].ravel()[dst] = batch['masked_lm_positions'].ravel()[src] + offsets[e]
  out['masked_lm_ids'].ravel()[dst] = batch['masked_lm_ids'].ravel()[src]
  out['masked_lm_weights'].ravel()[dst] = batch['masked_lm_weights'].ravel()[src]
  return out


@functools.lru_cache(maxsize=8)
def _positions(rows: int, width: int, pad: int) -> np.ndarray:
  """Each position's column in `rows` rows of `width`, then `pad` zeros (read-only)."""
  out = np.concatenate([np.tile(np.arange(width, dtype=np.int32), rows), np.zeros(pad, np.int32)])
  out.flags.writeable = False
  return out


def _before_within(groups: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
  """For each element, the sum of `values` (1 each by default) over the earlier elements of its group."""
  values = np.ones(len(groups), np.int64) if values is None else values
  order = np.argsort(groups, kind='stable')
  grouped, before = groups[order], np.cumsum(values[order]) - values[order]
  out = np.empty(len(groups), np.int64)
  out[order] = before - before[np.searchsorted(grouped, grouped, side='left')]
  return out


def record_lengths(dataset, indices: np.ndarray) -> np.ndarray:
  """The token counts of a dataset's records at `indices`: its own lookup (a mixture reads them corpus by corpus),
  else its `lengths` column."""
  lookup = getattr(dataset, 'record_lengths', None)
  return lookup(indices) if lookup else dataset.lengths[indices]


class BatchMaker:
  """This process's rows of global training batch k: a pure function of (seed, k).

  Global batch k holds stream positions s in [k*B, (k+1)*B) (in a phase of a run: `stream_positions`); position s is
  record
  permute(s % N, key(seed, 0, s // N)) of the training split (a new order every epoch), masked
  with key(seed, 1, s) at the rate of batch k in a mask-rate schedule of `total_steps` batches
  (data.masked_lm_prob_end). Process p builds rows [p*B/P, (p+1)*B/P). Picklable, numpy only:
  grain worker processes call it.
  """

  def __init__(self, dataset: PretrainingDataset, *, global_batch_size: int, seed: int, cfg: DataConfig,
               vocab: Vocab, process_index: int = 0, process_count: int = 1, total_steps: int = 0,
               first_batch: int = 0, first_example: int = 0, schedule_start: int = 0):
    if global_batch_size <= 0 or global_batch_size % process_count:
      raise ConfigError(f'global batch size {global_batch_size} must be a positive multiple '
                        f'of the process count {process_count}')
    if seed < 0 or not 0 <= process_index < process_count:
      raise ConfigError(f'bad stream arguments: seed={seed}, process {process_index} of {process_count}')
    if not len(dataset):
      raise DataError('the training split has no records')
    self.dataset, self.cfg, self.vocab, self.seed = dataset, cfg, vocab, seed
    self.global_batch_size = global_batch_size
    self.local_batch_size = global_batch_size // process_count
    self.row_offset = process_index * self.local_batch_size
    self.process_count = process_count
    self.total_steps, self.schedule_start = total_steps, schedule_start
    self.first_batch, self.first_example = first_batch, first_example

  def masked_lm_prob(self, k: int) -> float:
    """The masking rate of global batch k (constant without a schedule; a phase's schedule runs over its
    `total_steps` from `schedule_start`)."""
    return self.cfg.masked_lm_prob_at((k - self.schedule_start) / max(self.total_steps - 1, 1))

  def stream_positions(self, k: int) -> np.ndarray:
    """The stream positions of global batch k's rows: B of them from first_example + (k - first_batch) x B (a
    phase of a run starts where the run's examples so far end: every example counted, whatever the batch sizes)."""
    start = self.first_example + (k - self.first_batch) * self.global_batch_size
    return np.arange(start, start + self.global_batch_size, dtype=np.int64)

  def record_indices(self, positions: np.ndarray) -> np.ndarray:
    """The records at stream positions (int64[...]): the epoch's keyed permutation (a mixture orders its own:
    `mixture.MixtureDataset.record_indices`)."""
    if hasattr(self.dataset, 'record_indices'):
      return self.dataset.record_indices(positions, self.seed)
    n = len(self.dataset)
    epochs, within = np.divmod(positions, n)
    out = np.empty_like(positions)
    for epoch in np.unique(epochs).tolist():  # a batch spans one epoch, rarely two
      sel = epochs == epoch
      out[sel] = hashing.permute(within[sel], n, int(hashing.key(self.seed, _ORDER, epoch)))
    return out

  def __call__(self, k: int) -> dict:
    k = int(k)
    every = self.stream_positions(k)
    mine = slice(self.row_offset, self.row_offset + self.local_batch_size)
    # Only the record indices of other processes' rows are computed; their records are never read.
    indices = self.record_indices(every if self.cfg.pack and self.process_count > 1 else every[mine])
    local = indices[mine] if len(indices) > self.local_batch_size else indices
    batch = make_batch(self.dataset.gather(local, self.cfg.max_seq_length),
                       hashing.key(self.seed, _TRAIN_MASKS, every[mine]), cfg=self.cfg, vocab=self.vocab,
                       masked_lm_prob=self.masked_lm_prob(k))
    if not self.cfg.pack:
      return batch
    num_rows = None  # one process: as many rows as its own examples need
    if self.process_count > 1:
      # Every process must emit the same number of packed rows; the stored record lengths
      # give every process's row count without reading their records.
      lengths = np.asarray(record_lengths(self.dataset, indices), np.int64)
      num_rows = packed_num_rows(lengths.reshape(self.process_count, self.local_batch_size).tolist(), self.cfg)
    return pack_batch(batch, self.cfg, num_rows)


class _Failure:

  def __init__(self, error: BaseException):
    self.error = error


class PretrainingBatches:
  """Infinite, resumable, per-process stream of training batches (`BatchMaker`'s, in order).

  `position` counts the global batches consumed; pass it back as `start_position` to continue
  the identical stream. Batches are built ahead: by `workers` grain worker processes
  (`MapDataset.range(...).map(maker).to_iter_dataset().mp_prefetch(...)`: each worker builds
  every W-th batch, the order is kept), or with workers=0 by one thread of this process.
  """

  def __init__(self, dataset: PretrainingDataset, *, global_batch_size: int, seed: int,
               cfg: DataConfig, vocab: Vocab, process_index: int = 0, process_count: int = 1,
               start_position: int = 0, prefetch: int = 2, workers: int = 0, total_steps: int = 0,
               first_batch: int = 0, first_example: int = 0, schedule_start: int = 0):
    """Starts the stream (call `close()` when done).

    Args:
      dataset: the 'train' split.
      global_batch_size: B, rows per optimizer step over all processes.
      seed: shuffling and masking seed (>= 0).
      cfg: data config (sequence length, masking, packing).
      vocab: the tokenizer's special ids and tables (`Vocab.from_tokenizer`).
      process_index: this process's block of rows (`distributed.process_batch_block`).
      process_count: number of blocks; must divide B.
      start_position: global batches already consumed (from a checkpoint).
      prefetch: batches built ahead per worker (or in the thread); 0 with workers=0 builds on demand.
      workers: grain worker processes; 0 = a thread.
      total_steps: the run's length, for a mask-rate schedule (data.masked_lm_prob_end): a phase's length.
      first_batch, first_example: a phase's first global batch and the stream position it starts at (the
        examples the run consumed before it).
      schedule_start: the batch a (phase's) mask-rate schedule starts at.
    """
    if start_position < 0:
      raise ConfigError(f'bad stream arguments: start_position={start_position}')
    self.maker = BatchMaker(dataset, global_batch_size=global_batch_size, seed=seed, cfg=cfg, vocab=vocab,
                            process_index=process_index, process_count=process_count, total_steps=total_steps,
                            first_batch=first_batch, first_example=first_example, schedule_start=schedule_start)
    self.position = start_position
    self.last_sizes: dict[str, int] | None = None
    self._error: BaseException | None = None
    self._queue: queue.Queue | None = None
    self._grain = None
    self._stop = threading.Event()
    if workers > 0:
      # grain reads its settings from absl flags, parsed by the entry points (tests: conftest.py).
      import grain  # pylint: disable=g-import-not-at-top
      ds = grain.MapDataset.range(start_position, start_position + (1 << 40)).map(self.maker)
      # No threads or read-ahead inside a worker (grain's defaults: 16 threads, 500 elements):
      # each worker builds `prefetch` batches ahead, one at a time.
      self._grain = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)).mp_prefetch(
          grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=max(prefetch, 1))))
    elif prefetch > 0:
      self._queue = queue.Queue(maxsize=prefetch)
      self._thread = threading.Thread(target=self._produce, args=(start_position,), daemon=True,
                                      name='PretrainingBatches')
      self._thread.start()

  def batch_at(self, k: int) -> dict:
    """This process's rows of global batch k (a pure function of seed and k)."""
    return self.maker(k)

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
    if self._stop.is_set():
      raise RuntimeError('PretrainingBatches is closed')
    if self._grain is not None:
      batch = next(self._grain)
    elif self._queue is None:
      batch = self.batch_at(self.position)
    else:
      item = self._queue.get()
      if isinstance(item, _Failure):
        self._error = item.error
        raise item.error
      batch = item
    self.last_sizes = self._global_sizes(self.position, batch)
    self.position += 1
    return batch

  def _global_sizes(self, k: int, local: dict) -> dict[str, int]:
    """Global batch k's rows, row tokens, real tokens and examples (`train.loop.Batches.last_sizes`): its
    record lengths come from the index, every process's block has the same rows."""
    maker = self.maker
    every = maker.stream_positions(k)
    lengths = record_lengths(maker.dataset, maker.record_indices(every))
    rows = local['input_ids'].shape[0] * maker.process_count
    return {'rows': rows, 'row_tokens': rows * local['input_ids'].shape[1],
            'real_tokens': int(np.minimum(lengths, maker.cfg.max_seq_length).sum()),
            'examples': maker.global_batch_size}

  def close(self) -> None:
    """Stops the prefetch thread or worker processes (idempotent)."""
    self._stop.set()
    if self._grain is not None:
      self._grain.close()
      self._grain = None
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
                 vocab: Vocab, process_index: int = 0, process_count: int = 1, max_rows: int = 0) -> Iterator[dict]:
  """One pass over a split in record order, with fixed masks (keyed by (seed, 2, index)) at the
  rate a schedule ends at (`DataConfig.eval_masked_lm_prob`).

  Every process yields ceil(N / batch_size) batches; rows past the end are padding
  with nsp_weights and masked_lm_weights 0. With 0 < max_rows < N, the pass reads N = max_rows rows spread
  evenly over the split (row floor(i * split size / max_rows) for i < max_rows), each masked as in a whole pass.

  Args:
    dataset: usually the 'eval' split.
    batch_size: global batch size, a multiple of process_count.
    seed: masking seed.
    cfg: data config (sequence length, masking).
    vocab: the tokenizer's special ids and tables.
    process_index: this process.
    process_count: number of processes.
    max_rows: at most this many rows, spread over the split (0: all).

  Returns:
    An iterator over this process's rows of each global batch.
  """
  if batch_size <= 0 or batch_size % process_count:
    raise ConfigError(f'eval batch size {batch_size} must be a positive multiple of the '
                      f'process count {process_count}')
  size, local = len(dataset), batch_size // process_count
  n = max_rows if 0 < max_rows < size else size  # the rows the pass reads

  def generate():  # a separate generator so bad arguments fail at the call, not at first use
    for k in range(math.ceil(n / batch_size)):
      start = k * batch_size + process_index * local
      indices = np.arange(start, start + local, dtype=np.int64)
      real = indices < n  # a prefix; the rest pad the batch (their masks are never read)
      indices[real] = indices[real] * size // n  # the i-th row read is record floor(i * size / n): i without a cap
      rows = dataset.gather(indices[real], cfg.max_seq_length).padded(local)
      yield make_batch(rows, hashing.key(seed, _EVAL_MASKS, indices), cfg=cfg, vocab=vocab,
                       masked_lm_prob=cfg.eval_masked_lm_prob)

  return generate()
