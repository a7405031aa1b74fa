"""The prepared cache on disk: record layout, shards, and the manifest that describes them.

A complete cache directory holds
  meta.json          the manifest, written last (a directory without it is never read):
                     shards, record counts, token dtype, tokenizer and its special ids, corpus
                     statistics; a pure function of the inputs, byte-identical however many
                     workers or hosts built it
  build.json         how this copy was built: workers, processes, seconds per phase
  tokenizer.model    (SentencePiece) or tokenizer.json + vocab.txt (WordPiece)
  {train,eval}-NNNNN.tokens   one shard per work unit and split: the records' tokens back to
                     back, raw little-endian uint16 (int32 when the vocabulary needs it)
  {train,eval}.index.npy      one `INDEX_DTYPE` row per record, in index order: where its
                     tokens start in its shard, its length, len(A) and the NSP label

A record is [CLS] A [SEP] B [SEP] plus (len_a, is_random_next). Both files are memory-mapped
for reading, so a record costs one index row and one slice, however many shards a batch spans
(ArrayRecord, one record per chunk, cost a read per record and per shard: docs/results.md).
Like Megatron-LM's indexed datasets, this needs the cache on a local or mounted (gcsfuse)
filesystem.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from bert_jax import files
from bert_jax.errors import DataError
from bert_jax.files import check_regular

# Bump when records would change for the same inputs (layout, NSP algorithm, corpus parsing,
# tokenizer training): code is not part of the cache fingerprint, this constant is.
FORMAT_VERSION = 4
META_FILE = 'meta.json'
BUILD_FILE = 'build.json'
INDEX_DTYPE = np.dtype([('offset', '<i8'), ('length', '<u2'), ('len_a', '<u2'), ('random_next', 'u1')])

Example = tuple[np.ndarray, int, bool]  # (tokens int32[L], len_a, is_random_next)


def shard_name(split: str, unit: int) -> str:
  return f'{split}-{unit:05d}.tokens'


def index_name(split: str) -> str:
  return f'{split}.index.npy'


def token_dtype(vocab_size: int) -> str:
  """The narrowest little-endian dtype that holds every id of the vocabulary."""
  return '<u2' if vocab_size <= 1 << 16 else '<i4'


def make_index(bounds: np.ndarray, len_a: np.ndarray, random_next: np.ndarray) -> np.ndarray:
  """INDEX_DTYPE rows for records tokens[bounds[i]:bounds[i + 1]] of one shard."""
  index = np.zeros(len(bounds) - 1, INDEX_DTYPE)
  index['offset'] = bounds[:-1]
  index['length'] = np.diff(bounds)
  index['len_a'] = len_a
  index['random_next'] = random_next
  return index


@dataclasses.dataclass
class Rows:
  """Records gathered into rows: tokens int32[B, W] (0 after each record), lengths, len_a and
  random_next int64[B]. A row of length 0 is padding."""

  tokens: np.ndarray
  lengths: np.ndarray
  len_a: np.ndarray
  random_next: np.ndarray

  def padded(self, num_rows: int) -> 'Rows':
    """These rows followed by padding rows up to num_rows."""
    extra = num_rows - len(self.lengths)
    pad = lambda a: np.concatenate([a, np.zeros((extra, *a.shape[1:]), a.dtype)])
    return Rows(pad(self.tokens), pad(self.lengths), pad(self.len_a), pad(self.random_next))


class RecordReader:
  """Random access to one split's records across its shards (memory-mapped lazily; picklable)."""

  def __init__(self, paths: list[str], counts: list[int], index_path: str, dtype: str):
    self.paths, self.index_path, self.dtype = list(paths), index_path, dtype
    self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    self._index = None
    self._shards: list[np.ndarray | None] = [None] * len(self.paths)

  def __len__(self) -> int:
    return int(self.starts[-1])

  def __getstate__(self):
    return {**self.__dict__, '_index': None, '_shards': [None] * len(self.paths)}

  @property
  def index(self) -> np.ndarray:
    """INDEX_DTYPE[N], memory-mapped."""
    if self._index is None:
      self._index = np.load(self.index_path, mmap_mode='r')
    return self._index

  def _shard(self, s: int) -> np.ndarray:
    if self._shards[s] is None:  # a plain ndarray view: slicing a np.memmap is several times slower
      self._shards[s] = np.memmap(self.paths[s], self.dtype, mode='r').view(np.ndarray)
    return self._shards[s]

  def gather(self, indices: Sequence[int], width: int) -> Rows:
    """The records at `indices`, in that order, as rows of `width` tokens."""
    indices = np.asarray(indices, np.int64)
    if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
      raise IndexError(f'record index out of range [0, {len(self)})')
    rows = self.index[indices]
    lengths = rows['length'].astype(np.int64)
    if len(lengths) and lengths.max() > width:
      raise DataError(f'a record has {lengths.max()} tokens but data.max_seq_length={width}; the data '
                      'was prepared for another max_seq_length')
    tokens = np.zeros((len(indices), width), np.int32)
    shards = np.searchsorted(self.starts, indices, side='right') - 1
    for row, (s, offset, n) in enumerate(zip(shards.tolist(), rows['offset'].tolist(), lengths.tolist())):
      tokens[row, :n] = self._shard(s)[offset:offset + n]
    return Rows(tokens, lengths, rows['len_a'].astype(np.int64), rows['random_next'].astype(np.int64))

  def __getitem__(self, i: int) -> Example:
    rows = self.gather([i], int(self.index['length'][i]))
    return rows.tokens[0], int(rows.len_a[0]), bool(rows.random_next[0])


def write_shard(path: str, tokens: np.ndarray, dtype: str) -> None:
  """Writes a shard's tokens (already checked to fit `dtype`)."""
  with files.open(path, 'wb') as f:
    write_tokens(f, tokens.astype(dtype, copy=False))


def write_tokens(f, tokens: np.ndarray) -> None:
  """Appends tokens to an open shard file as little-endian values of their dtype (no copy when they are)."""
  f.write(np.ascontiguousarray(tokens, tokens.dtype.newbyteorder('<')).data.cast('B'))


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The tokenizer's special ids as the records and masking use them."""

  pad: int
  unk: int
  cls: int
  sep: int
  mask: int


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """A complete prepared cache directory."""

  dir: str
  tokenizer_path: str  # what tokenization.load_tokenizer reads
  num_train: int
  num_eval: int
  most_frequent_token: int  # the MLM baseline's constant prediction
  special_ids: SpecialIds
  stats: dict
  # The same data's fingerprint under earlier versions (absolute paths, not contents): checkpoints of runs that
  # an earlier version wrote name their data by it.
  legacy_fingerprint: str | None = None

  def reader(self, split: str) -> RecordReader:
    """Random access to the split's records (record i of the split = index i)."""
    meta = read_meta(self.dir)
    return RecordReader([os.path.join(self.dir, name) for name in meta[f'{split}_shards']],
                        meta[f'{split}_shard_records'], os.path.join(self.dir, index_name(split)),
                        meta['token_dtype'])


def load_prepared_data(data_dir: str) -> PreparedData:
  """Describes an existing cache directory after `verify`ing it; DataError if it is incomplete or damaged."""
  meta = read_meta(data_dir)
  try:
    verify(data_dir, meta)
    return PreparedData(dir=data_dir, tokenizer_path=os.path.join(data_dir, meta['tokenizer']['file']),
                        num_train=meta['num_train'], num_eval=meta['num_eval'],
                        most_frequent_token=meta['most_frequent_token'],
                        special_ids=SpecialIds(**meta['tokenizer']['special_ids']), stats=meta['stats'])
  except (KeyError, TypeError) as e:
    raise DataError(_damaged(data_dir, f'{META_FILE} lacks {e}')) from None


def _damaged(data_dir: str, what: str) -> str:
  return (f'prepared data cache {data_dir} is damaged: {what}; delete that directory and run the same command '
          'again to prepare it anew')


def read_meta(data_dir: str) -> dict:
  """The contents of a cache directory's meta.json; DataError if it is incomplete or unreadable."""
  path = os.path.join(data_dir, META_FILE)
  check_regular(path, 'cache manifest')
  try:
    with files.open(path, encoding='utf-8') as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise DataError(f'{data_dir} is not a complete prepared cache ({META_FILE} missing); prepare it '
                    'with experiments/prepare_data.py') from None
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise DataError(_damaged(data_dir, f'{META_FILE} is unreadable ({type(e).__name__}: '
                                       f'{str(e).splitlines()[0] if str(e) else ""})')) from None
  if not isinstance(meta, dict):
    raise DataError(_damaged(data_dir, f'{META_FILE} is not a JSON object'))
  if meta.get('format_version') != FORMAT_VERSION:
    raise DataError(f'{data_dir} was prepared by another bert_jax (format {meta.get("format_version")}, '
                    f'this one reads {FORMAT_VERSION}); prepare the data again')
  return meta


def verify(data_dir: str, meta: dict) -> None:
  """Cheap consistency checks of a cache against its manifest, before any batch is read.

  Each split's index has the manifest's record count and dtype, and each shard's size equals the
  tokens its records span (its last record's offset + length): O(shards) reads, whatever the corpus
  size. A truncated or missing shard, index or manifest field is DataError saying how to rebuild.
  """
  itemsize = np.dtype(meta['token_dtype']).itemsize
  for split in ('train', 'eval'):
    path = os.path.join(data_dir, index_name(split))
    check_regular(path, 'cache index')
    try:
      index = np.load(path, mmap_mode='r')
    except (OSError, ValueError) as e:
      raise DataError(_damaged(data_dir, f'{index_name(split)} is unreadable ({type(e).__name__}: '
                                         f'{str(e).splitlines()[0] if str(e) else ""})')) from None
    counts = meta[f'{split}_shard_records']
    if index.dtype != INDEX_DTYPE or len(index) != meta[f'num_{split}'] or sum(counts) != len(index):
      raise DataError(_damaged(data_dir, f'{index_name(split)} holds {len(index):,} records, the manifest '
                                         f'{meta[f"num_{split}"]:,}'))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    for name, lo, hi in zip(meta[f'{split}_shards'], starts[:-1], starts[1:]):
      shard = os.path.join(data_dir, name)
      check_regular(shard, 'cache shard')
      try:
        size = files.getsize(shard)
      except OSError:
        raise DataError(_damaged(data_dir, f'shard {name} is missing')) from None
      want = (int(index[hi - 1]['offset']) + int(index[hi - 1]['length'])) * itemsize if hi > lo else 0
      if size != want or (hi > lo and int(index[lo]['offset']) != 0):
        raise DataError(_damaged(data_dir, f'shard {name} has {size:,} bytes, its index says {want:,}'))
