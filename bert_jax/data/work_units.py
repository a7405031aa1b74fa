"""Work units of a preparation, and what a worker does with one: read, split, tokenise, pair, write.

Everything a unit writes depends only on that unit (its text, the settings, the seed and the
unit's index), so the shards and meta.json are byte-identical however many workers or hosts
built them. Held-out documents are chosen by a keyed hash of their text (`eval_fraction`), or
are the documents of `eval_files`; random-next segments come from other documents of the same
unit and split (the held-out documents of a unit with only one of them borrow from the unit's
training documents: held-out text never enters a training pair).

A unit writes its shards and index files into the build directory, and its marker (`marker`: its
statistics) last, so a unit without one is built again. This module imports no jax: it runs in
spawned worker processes.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import random
import re
import time
from typing import Callable

from etils import epath
import numpy as np

from bert_jax import files
from bert_jax.data import corpus_formats, corpus_pieces, nsp, readers, records, tokenization

UNITS_DIR = 'units'  # in the build directory: the units' markers, index and count files
_ENCODE_BATCH = 4096  # sentences per tokenizer call: bounded memory for the id lists


@dataclasses.dataclass(frozen=True)
class Unit:
  """One work unit: whole documents from one or more files."""

  index: int
  pieces: tuple[corpus_pieces.Piece, ...]
  split: str  # 'corpus' (held out by hash), 'train' or 'eval' (the documents of eval_files)

  @property
  def nbytes(self) -> int:
    return sum(_piece_bytes(p) for p in self.pieces)


@dataclasses.dataclass(frozen=True)
class Job:
  """What a worker needs to build units (picklable; no jax)."""

  build_dir: str
  reader: corpus_formats.ReaderOptions
  seed: int
  eval_fraction: float
  max_seq_length: int
  short_seq_prob: float
  dupe_factor: int
  vocab_size: int
  tokenizer_path: str = ''
  objective: str = 'nsp'


_TOKENIZERS: dict[str, tokenization.Tokenizer] = {}


def _tokenizer(path: str) -> tokenization.Tokenizer:
  if path not in _TOKENIZERS:
    _TOKENIZERS[path] = tokenization.load_tokenizer(path)
  return _TOKENIZERS[path]


def _is_held_out(doc: list[str], seed: int, fraction: float) -> bool:
  """A keyed hash of the document's text below `fraction`: deterministic, needs no other document."""
  h = hashlib.blake2b('\n'.join(doc).encode('utf-8', 'surrogatepass'), digest_size=8,
                      key=seed.to_bytes(8, 'little', signed=True))
  return int.from_bytes(h.digest(), 'little') < fraction * 2.0**64


def documents(job: Job, unit: Unit, stats: dict | None = None):
  """Yields (split, document) for the unit's documents."""
  for doc in readers.read_documents(unit.pieces, job.reader, stats):
    if unit.split == 'corpus':
      yield ('eval' if _is_held_out(doc, job.seed, job.eval_fraction) else 'train'), doc
    else:
      yield unit.split, doc


def _tokenize(tokenizer, docs: list[list[str]], specials_seen: collections.Counter) -> nsp.TokenizedDocs:
  """Documents of sentences -> flat token ids, in bounded batches.

  A special token spelled in the text ("[SEP]" in a paper about BERT) is tokenised as text, never
  as its id: a record holds exactly the specials of its format. Each such spelling is counted in
  `specials_seen`, so the summary can say the corpus holds them.
  """
  sentences = [s for d in docs for s in d]
  flat_parts, length_parts = [], []
  spelled = _special_pattern(tokenizer.special_strings)
  for i in range(0, len(sentences), _ENCODE_BATCH):
    batch = sentences[i:i + _ENCODE_BATCH]
    specials_seen.update(spelled.findall('\n'.join(batch)))
    ids = tokenizer.encode_batch(batch, num_threads=1, specials_as_text=True)  # a worker is one core
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    flat_parts.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths.sum())))
    length_parts.append(lengths)
  lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64)
  tokens = np.concatenate(flat_parts) if flat_parts else np.zeros(0, np.int32)
  # Sentences the tokenizer leaves empty (stray symbols) vanish; documents left empty too.
  keep_sentences = lengths > 0
  doc_sizes = np.array([len(d) for d in docs], np.int64)
  doc_of_sentence = np.repeat(np.arange(len(docs)), doc_sizes)
  kept_per_doc = np.bincount(doc_of_sentence[keep_sentences], minlength=len(docs))
  kept_per_doc = kept_per_doc[kept_per_doc > 0]
  sentence_starts = np.concatenate([[0], np.cumsum(lengths[keep_sentences])]).astype(np.int64)
  doc_starts = np.concatenate([[0], np.cumsum(kept_per_doc)]).astype(np.int64)
  return nsp.TokenizedDocs(tokens, sentence_starts, doc_starts)


@functools.lru_cache(maxsize=4)
def _special_pattern(strings: tuple[str, ...]) -> re.Pattern:
  return re.compile('|'.join(re.escape(t) for t in sorted(strings, key=len, reverse=True)))


def build_unit(job: Job, unit: Unit, _) -> dict:
  """Reads, tokenises, pairs and writes one unit; leaves its marker last. Returns its stats."""
  t0 = time.time()
  read_stats: dict = {}
  docs: dict[str, list[list[str]]] = {'train': [], 'eval': []}
  for split, doc in documents(job, unit, read_stats):
    docs[split].append(doc)
  t_read = time.time()
  tokenizer = _tokenizer(job.tokenizer_path)
  specials_seen = collections.Counter()
  tokenized = {split: _tokenize(tokenizer, d, specials_seen) for split, d in docs.items()}
  t_tokenize = time.time()
  out = dict(unit=unit.index, bytes=int(read_stats.get('bytes', 0)),
             invalid_utf8=int(read_stats.get('invalid_utf8', 0)),
             invalid_utf8_first=read_stats.get('invalid_utf8_first'),
             formats=read_stats.get('formats', {}), special_text=dict(specials_seen), splits={})
  dtype = records.token_dtype(job.vocab_size)  # records are assembled in it: written without a copy
  template = tokenization.template_of(tokenizer)  # a pair record's specials: [CLS] A [SEP] B [SEP], or RoBERTa's
  for split in ('train', 'eval'):
    t = tokenized[split]
    if job.objective != 'none':
      pool = tokenized['train'] if split == 'eval' and job.objective == 'nsp' else None
      rng = random.Random(f'{job.seed}-{unit.index}-{split}')  # str seeds hash alike everywhere
      pairs = nsp.create_pairs(t, max_seq_length=job.max_seq_length, short_seq_prob=job.short_seq_prob,
                               dupe_factor=job.dupe_factor if split == 'train' else 1, rng=rng,
                               random_pool=pool, sentence_order=job.objective == 'sop',
                               specials=template.pair_specials)
      used_pool = pool if (pool is not None and t.num_docs < 2 and pool.num_docs) else None
      runs = nsp.record_runs(t, pairs, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pool=used_pool,
                             dtype=dtype, template=template)
      len_a, random_next = pairs[:, 1] - pairs[:, 0], pairs[:, 4]
    else:  # masked LM only: FULL-SENTENCES records, all segment A (len_a = length - 2), label 0
      ranges, stream = nsp.full_sentence_records(t, max_seq_length=job.max_seq_length, sep_id=tokenizer.sep_id)
      runs = nsp.full_sentence_runs(ranges, stream, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, dtype=dtype)
      len_a, random_next = ranges[:, 1] - ranges[:, 0], np.zeros(len(ranges), np.int64)
    index = records.make_index(runs.bounds, len_a, random_next)
    base = os.path.join(job.build_dir, UNITS_DIR, f'{unit.index:05d}.{split}')
    counts = np.zeros(job.vocab_size, '<i8') if split == 'train' else None
    if len(len_a):
      atomic(os.path.join(job.build_dir, records.shard_name(split, unit.index)),
             lambda p: _write_records(p, runs, counts))
    atomic(base + '.index.npy', lambda p: _save_npy(p, index))
    if counts is not None:
      atomic(base + '.counts.npy', lambda p: _save_npy(p, counts))
    out['splits'][split] = dict(documents=t.num_docs, sentences=int(len(t.sentence_starts) - 1),
                                tokens=int(len(t.tokens)), pairs=int(len(len_a)), random_next=int(random_next.sum()))
  out['seconds'] = dict(read=t_read - t0, tokenize=t_tokenize - t_read, pairs_write=time.time() - t_tokenize)
  write_json(marker(job.build_dir, unit.index), out)  # last: the unit is complete
  return out


def _write_records(path: str, runs: nsp.RecordRuns, counts: np.ndarray | None) -> None:
  """Writes the records' tokens to a shard a block at a time, adding them to `counts` (int64[vocab]) if given."""
  with files.open(path, 'wb') as f:
    for block in runs.blocks():
      records.write_tokens(f, block)
      if counts is not None:
        counts += np.bincount(block, minlength=len(counts))


def marker(build_dir: str, unit: int) -> str:
  return os.path.join(build_dir, UNITS_DIR, f'{unit:05d}.json')


def _piece_bytes(piece: corpus_pieces.Piece) -> int:
  if piece.end >= 0:
    return piece.end - piece.start
  with epath.Path(piece.path).open('rb') as f:  # stat() looks up owner names, absent in some containers
    return f.seek(0, 2)


def atomic(path: str, write: Callable[[str], None]) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  write(tmp)
  os.replace(tmp, path)


def _save_npy(path: str, array: np.ndarray) -> None:
  with files.open(path, 'wb') as f:
    np.save(f, array)


def write_json(path: str, obj) -> None:
  def write(p):
    with files.open(p, 'w', encoding='utf-8') as f:
      json.dump(obj, f, indent=2, sort_keys=True)
      f.write('\n')
  atomic(path, write)
