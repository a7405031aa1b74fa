"""Fine-tuning batches of variable-length features: packed several per row, or one per padded row.

Packed: a batch's examples are placed into rows of `row_length` tokens by first-fit
decreasing (`data.packing`); each gets its own segment id (attention stays inside it) and
positions that restart at 0, so the model computes exactly what it computes on the example
alone, without spending work on padding. Unpacked: one example per row, rows padded to the
batch's longest example rounded up to `pad_multiple`. Either way the number of rows is rounded
up to `rows_multiple` so only a few shapes are ever compiled.

Every batch also carries per-example arrays (`example_row`, `example_offset`,
`example_length`, `weights`; padding examples have weight 0) so heads and losses can find
each example in the rows. Labels: `labels` [E] (classification int32, regression float32), [E, L] (multilabel:
multi-hot float32)
or [R, T] int32 (token kind, -100 = no loss); `start_positions`/`end_positions` [E], relative
to the example's first token (span kind).

Groups (`TrainBatches(group_size=g)`): the features are whole groups of g, one after another; a batch takes
batch_size groups whole (g * batch_size example slots) and carries `group_ids` [E], each example's group index
in its (micro-)batch (padding examples: indices past the real groups).

A step's batch is a pure function of (seed, step): the order is a per-epoch permutation, so
resuming needs only the step. Every process builds the same host batch and feeds its block.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from bert_jax.data.packing import first_fit_decreasing
from bert_jax.finetuning.tasks.base import IGNORE, Feature
from bert_jax.model.heads import SEQUENCE_KINDS


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def bucket_rows(needed: int, batch_size: int, rows_multiple: int) -> int:
  """`needed` rows rounded up to `rows_multiple` times a power of two, at most `batch_size` rounded up to
  `rows_multiple` (a packed batch never needs more): scoring batch after batch of packed pairs then compiles at most
  1 + log2(batch_size / rows_multiple) shapes, each at most twice the rows it needs."""
  top, rows = _round_up(max(batch_size, 1), rows_multiple), rows_multiple
  while rows < needed and rows < top:
    rows *= 2
  return max(min(rows, top), _round_up(needed, rows_multiple))


def make_batch(features: Sequence[Feature], kind: str, *, batch_size: int, row_length: int, pack: bool,
               rows_multiple: int = 1, pad_multiple: int = 16, num_rows: int | None = None,
               bucket: bool = False) -> dict[str, np.ndarray]:
  """Arrays for up to `batch_size` features (fewer: the rest are zero-weight padding examples).

  Args:
    features: the batch's features, each at most `row_length` tokens.
    kind: the head kind (model.heads.HEAD_KINDS).
    batch_size: number of example slots E.
    row_length: the longest row (max_seq_length).
    pack: pack several features per row; else one per row.
    rows_multiple: round the number of rows up to a multiple of this.
    pad_multiple: unpacked rows are padded to a multiple of this (at most `row_length`).
    num_rows: at least this many rows (the same shapes for several batches); unpacked rows are then
      `row_length` wide.
    bucket: packed, the number of rows from a few fixed counts (`bucket_rows`): batch after batch of a long
      scoring run compiles a handful of shapes, not one per packing outcome.
  """
  if len(features) > batch_size:
    raise ValueError(f'{len(features)} features for a batch of {batch_size}')
  lengths = [len(f) for f in features]
  if pack:
    placed = first_fit_decreasing(lengths, row_length)
    needed = max([r for r, _ in placed], default=0) + 1
    width = row_length
  else:
    placed = [(i, 0) for i in range(len(features))]
    needed = batch_size
    width = row_length if num_rows else min(row_length, _round_up(max(lengths, default=1), pad_multiple))
  needed = bucket_rows(needed, batch_size, rows_multiple) if bucket and pack else needed
  num_rows = max(_round_up(needed, rows_multiple), num_rows or 0)
  batch = {k: np.zeros((num_rows, width), np.int32)
           for k in ('input_ids', 'token_type_ids', 'segment_ids', 'position_ids')}
  for k in ('example_row', 'example_offset'):
    batch[k] = np.zeros((batch_size,), np.int32)
  batch['example_length'] = np.ones((batch_size,), np.int32)
  batch['weights'] = np.zeros((batch_size,), np.float32)
  if kind == 'token':
    batch['labels'] = np.full((num_rows, width), IGNORE, np.int32)
  elif kind in SEQUENCE_KINDS:
    shape = (batch_size,) + (np.shape(features[0].label) if kind == 'multilabel' and features else ())
    batch['labels'] = np.zeros(shape, np.int32 if kind == 'classification' else np.float32)
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
    elif kind in SEQUENCE_KINDS:
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


def batch_indices(num_train: int, batch_size: int, seed: int, step: int, shuffle: bool = True) -> np.ndarray:
  """The training-set indices of step `step`'s batch: a fresh permutation every epoch."""
  per_epoch = math.ceil(num_train / batch_size)
  epoch, i = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(num_train) if shuffle else np.arange(num_train)
  return order[i * batch_size:(i + 1) * batch_size]


def process_block(host: dict[str, np.ndarray], index: int, count: int) -> dict[str, np.ndarray]:
  """Block `index` of `count` of every array's leading axis (rows [R, ...] or example slots [E]).

  The blocks of all processes, in order, are the whole host batch, as
  `jax.make_array_from_process_local_data` assembles them.
  """
  if count == 1:
    return host
  out = {}
  for k, v in host.items():
    if len(v) % count:
      raise ValueError(f'{k} has {len(v)} rows, which do not split into {count} process blocks')
    size = len(v) // count
    out[k] = v[index * size:(index + 1) * size]
  return out


def interleave(micro: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """k self-contained micro-batches as one batch whose every k-th row (and example slot) is micro-batch i's.

  The train step splits a batch into micro-batches by taking every k-th row (`train.step`), so each
  stays spread over every batch shard; the per-example arrays point at rows of their own micro-batch.
  Every micro-batch must have the same shapes (`make_batch(..., num_rows=...)`).
  """
  return {k: np.stack([m[k] for m in micro], axis=1).reshape(-1, *micro[0][k].shape[1:]) for k in micro[0]}


def with_groups(batch: dict[str, np.ndarray], group_size: int) -> dict[str, np.ndarray]:
  """`batch` (of whole groups of `group_size` features, in order) with `group_ids`: example slot e's is
  e // group_size."""
  return {**batch, 'group_ids': np.arange(len(batch['weights']), dtype=np.int32) // group_size}


class TrainBatches:
  """This process's block of each training step's batch, from step `start` on (`train.loop.Batches`).

  With `micro_batches` k > 1 (gradient accumulation) the batch is k micro-batches of batch_size / k
  examples (or groups), each packed on its own, interleaved (`interleave`). With `group_size` g > 1 the features
  are groups of g in order and batch_size counts groups (`with_groups`).
  """

  def __init__(self, features: Sequence[Feature], kind: str, *, batch_size: int, row_length: int, pack: bool,
               rows_multiple: int, seed: int, shuffle: bool, start: int, block: tuple[int, int],
               micro_batches: int = 1, group_size: int = 1):
    self.features, self.kind, self.seed, self.shuffle, self.block = features, kind, seed, shuffle, block
    self.batch_size, self.row_length, self.pack, self.rows_multiple = batch_size, row_length, pack, rows_multiple
    self.micro_batches, self.group_size = micro_batches, group_size
    self.position = start
    self.last_sizes: dict[str, int] | None = None  # of the whole (host) batch: see train.loop

  def __next__(self) -> dict[str, np.ndarray]:
    g = self.group_size
    chosen = batch_indices(len(self.features) // g, self.batch_size, self.seed, self.position, self.shuffle)
    self.position += 1
    features = [self.features[i * g + j] for i in chosen for j in range(g)]
    k = self.micro_batches
    grouped = (lambda b: with_groups(b, g)) if g > 1 else (lambda b: b)  # pylint: disable=unnecessary-lambda-assignment
    if k == 1:
      host = grouped(make_batch(features, self.kind, batch_size=self.batch_size * g, row_length=self.row_length,
                                pack=self.pack, rows_multiple=self.rows_multiple))
    else:
      size, multiple = self.batch_size // k * g, self.rows_multiple // k
      parts = [features[i * size:(i + 1) * size] for i in range(k)]
      pack = lambda p, **rows: grouped(make_batch(p, self.kind, batch_size=size, row_length=self.row_length,  # pylint: disable=unnecessary-lambda-assignment
                                                  pack=self.pack, rows_multiple=multiple, **rows))
      micro = [pack(p) for p in parts]
      rows = max(m['input_ids'].shape[0] for m in micro)  # all micro-batches get as many rows: repack the shorter
      host = interleave([m if m['input_ids'].shape[0] == rows else pack(p, num_rows=rows)
                         for m, p in zip(micro, parts)])
    self.last_sizes = {'real_tokens': sum(len(f) for f in features), 'row_tokens': host['input_ids'].size,
                       'rows': host['input_ids'].shape[0], 'examples': len(features)}
    return process_block(host, *self.block)

  def close(self) -> None:
    pass
