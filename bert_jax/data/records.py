"""The prepared cache on disk: record layout, shards, and the manifest that describes them.

A complete cache directory holds
  meta.json          the manifest, written last (a directory without it is never read):
                     shards, record counts, tokenizer and its special ids, corpus statistics;
                     a pure function of the inputs, byte-identical however many workers or
                     hosts built it
  build.json         how this copy was built: workers, processes, seconds per phase
  tokenizer.model    (SentencePiece) or tokenizer.json + vocab.txt (WordPiece)
  {train,eval}-NNNNN.array_record   one shard per work unit and split
  {train,eval}.lengths.npy          uint16 token count of every record, in index order, so
                     packing can plan rows without reading records

One record per NSP pair, a little-endian int32 array: [is_random_next, len_a, CLS A SEP B SEP].
"""

from __future__ import annotations

import dataclasses
import json
import os

from array_record.python import array_record_module
import numpy as np

from bert_jax.errors import DataError

# Bump when records would change for the same inputs (layout, NSP algorithm, corpus parsing,
# tokenizer training): code is not part of the cache fingerprint, this constant is.
FORMAT_VERSION = 3
META_FILE = 'meta.json'
BUILD_FILE = 'build.json'
# group_size:1 makes every record its own chunk: O(1) random access for shuffled reads.
# Uncompressed: records are small int32 arrays, and zstd per record made writing 7x and
# reading 2x slower (30k records: 0.57 s -> 0.08 s to write) for 16% less disk.
WRITER_OPTIONS = 'group_size:1,uncompressed'
# One thread per reader: loader workers parallelise across processes instead.
READER_OPTIONS = 'readahead_buffer_size:0,max_parallelism:1'

Example = tuple[np.ndarray, int, bool]  # (tokens int32[L], len_a, is_random_next)


def shard_name(split: str, unit: int) -> str:
  return f'{split}-{unit:05d}.array_record'


def lengths_name(split: str) -> str:
  return f'{split}.lengths.npy'


def write_shard(path: str, flat: np.ndarray, bounds: np.ndarray) -> None:
  """Writes records flat[bounds[i]:bounds[i+1]] to a new ArrayRecord file at `path`."""
  writer = array_record_module.ArrayRecordWriter(path, WRITER_OPTIONS)
  data = flat.astype('<i4', copy=False).tobytes()
  for lo, hi in zip((bounds[:-1] * 4).tolist(), (bounds[1:] * 4).tolist()):
    writer.write(data[lo:hi])
  writer.close()


class ShardReader:
  """Random access to the records of several shards as one index space (opened lazily, picklable)."""

  def __init__(self, paths: list[str], counts: list[int]):
    self.paths = list(paths)
    self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    self._readers = None

  def __len__(self) -> int:
    return int(self.starts[-1])

  def __getstate__(self):
    return {**self.__dict__, '_readers': None}

  def read(self, indices: np.ndarray) -> list[bytes]:
    """The records at `indices`, in that order (each shard read once, in ascending order)."""
    if self._readers is None:
      self._readers = [array_record_module.ArrayRecordReader(p, READER_OPTIONS) for p in self.paths]
    indices = np.asarray(indices, np.int64)
    if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
      raise IndexError(f'record index out of range [0, {len(self)})')
    order = np.argsort(indices, kind='stable')
    sorted_idx = indices[order]
    shard_of = np.searchsorted(self.starts, sorted_idx, side='right') - 1
    out: list[bytes] = [b''] * len(indices)
    bounds = np.flatnonzero(np.diff(shard_of)) + 1
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(indices)]):
      if lo == hi:
        continue
      shard = int(shard_of[lo])
      got = self._readers[shard].read((sorted_idx[lo:hi] - self.starts[shard]).tolist())
      for pos, record in zip(order[lo:hi].tolist(), got):
        out[pos] = record
    return out


def decode_record(record: bytes) -> Example:
  """A record as (tokens int32[L] = [CLS] A [SEP] B [SEP], len_a, is_random_next)."""
  rec = np.frombuffer(record, dtype='<i4')
  return rec[2:], int(rec[1]), bool(rec[0])


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

  def reader(self, split: str) -> ShardReader:
    """Random access to the split's records (record i of the split = index i)."""
    meta = read_meta(self.dir)
    return ShardReader([os.path.join(self.dir, name) for name in meta[f'{split}_shards']],
                       meta[f'{split}_shard_records'])

  def lengths(self, split: str) -> np.ndarray:
    """uint16[num records]: every record's token count, memory-mapped."""
    return np.load(os.path.join(self.dir, lengths_name(split)), mmap_mode='r')


def load_prepared_data(data_dir: str) -> PreparedData:
  """Describes an existing cache directory; DataError if it is incomplete."""
  meta = read_meta(data_dir)
  return PreparedData(dir=data_dir, tokenizer_path=os.path.join(data_dir, meta['tokenizer']['file']),
                      num_train=meta['num_train'], num_eval=meta['num_eval'],
                      most_frequent_token=meta['most_frequent_token'],
                      special_ids=SpecialIds(**meta['tokenizer']['special_ids']), stats=meta['stats'])


def read_meta(data_dir: str) -> dict:
  """The contents of a cache directory's meta.json; DataError if it is incomplete."""
  path = os.path.join(data_dir, META_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise DataError(f'{data_dir} is not a complete prepared cache ({META_FILE} missing); prepare it '
                    'with experiments/prepare_data.py') from None
  if meta.get('format_version') != FORMAT_VERSION:
    raise DataError(f'{data_dir} was prepared by another bert_jax (format {meta.get("format_version")}, '
                    f'this one reads {FORMAT_VERSION}); prepare the data again')
  return meta
