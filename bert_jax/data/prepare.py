"""Building the pretraining data: documents → NSP pairs → ArrayRecord cache.

Offline (once per corpus/config, cached): `prepare_pretraining_data` reads the corpus,
trains or loads the tokenizer, builds BERT's sentence-pair instances
(`create_nsp_instances`) and writes them as ArrayRecord shards plus `meta.json` into a
directory keyed by a fingerprint of its inputs; `load_prepared_data` describes an
existing one. `input_pipeline` reads the records back and turns them into batches.

Record layout (`encode_record` / `decode_record`), one little-endian int32 array per
instance: [is_random_next, len_a, CLS A SEP B SEP].
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
import time

from absl import logging
from array_record.python import array_record_module
import numpy as np

from bert_jax.data import readers as corpus
from bert_jax.data import tokenization
from bert_jax.config import DataConfig
from bert_jax.errors import ConfigError, DataError
from bert_jax.data.tokenization import CLS_ID, NUM_SPECIAL, SEP_ID

# Bump when records would change (layout, NSP algorithm, corpus parsing, tokenizer
# training): code is not part of the cache fingerprint, this constant is.
FORMAT_VERSION = 2
META_FILE = 'meta.json'
_TOKENIZER = 'tokenizer.model'
# group_size:1 makes every record its own chunk: O(1) random access for shuffled reads.
_WRITER_OPTIONS = 'group_size:1'
# DataConfig fields that change the records; masking happens later, per batch.
_RECORD_FIELDS = ('eval_fraction', 'lower_case', 'max_seq_length', 'short_seq_prob',
                  'dupe_factor', 'num_shards')

Example = tuple[np.ndarray, int, bool]  # (tokens int32[L], len_a, is_random_next)


# ----------------------------------------------------------------------------- NSP pairs


def create_nsp_instances(documents: list[list[list[int]]], *, max_seq_length: int,
                         short_seq_prob: float, dupe_factor: int, rng: random.Random,
                         name: str = 'the corpus') -> list[tuple[list[int], list[int], bool]]:
  """Builds (tokens_a, tokens_b, is_random_next) pairs as google-research/bert does.

  Per document, sentences are accumulated up to a target length (max_seq_length - 3,
  or with probability `short_seq_prob` a random shorter one), split at a random
  sentence boundary into A and B; with probability 0.5 B is replaced by text from
  another document and the unused sentences are put back. Pairs are then truncated to
  fit, trimming the longer side at a random end. Unlike the original, a one-sentence
  chunk is paired with its next sentence half of the time and one-sentence documents
  give no pairs, so labels stay 50/50 even when sentences are long.

  Args:
    documents: documents of sentences of token ids (no special tokens).
    max_seq_length: T; pairs have at most T - 3 tokens, leaving room for [CLS] [SEP] [SEP].
    short_seq_prob: probability of a shorter target length.
    dupe_factor: passes over the documents (each pairs differently).
    rng: the randomness.
    name: what the documents are, for error messages.

  Returns:
    The instances, shuffled.
  """
  documents = [d for d in ([s for s in doc if s] for doc in documents) if d]
  require_multi_sentence_document(documents, name)
  if len(documents) < 2:
    raise DataError(f'{name} has a single document; NSP needs at least two to draw random '
                    'next segments from')
  instances = []
  for _ in range(dupe_factor):
    for doc_index in range(len(documents)):
      if len(documents[doc_index]) < 2:
        continue  # could only give random-next pairs; still a source of random segments
      instances.extend(_instances_from_document(documents, doc_index, max_seq_length,
                                                short_seq_prob, rng))
  rng.shuffle(instances)
  return instances


def require_multi_sentence_document(documents, name: str) -> None:
  """Raises DataError unless some document has two sentences (NSP needs true next pairs)."""
  if not any(len(d) >= 2 for d in documents):
    raise DataError(f'no document in {name} has two sentences; NSP needs documents of several '
                    'sentences (in plain text, blank lines separate documents)')


def _instances_from_document(documents, doc_index, max_seq_length, short_seq_prob, rng):
  document = documents[doc_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  chunk: list[list[int]] = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      if len(chunk) == 1 and i + 1 < len(document) and rng.random() >= 0.5:
        # A lone (long) sentence gets its true continuation half of the time. Original BERT
        # made every one-sentence chunk random-next, which skews labels away from 50/50
        # when sentences are long relative to max_seq_length; truncation makes it fit.
        i += 1
        chunk.append(document[i])
        a_end, is_random_next = 1, False
      else:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        is_random_next = len(chunk) == 1 or rng.random() < 0.5
      tokens_a = [t for s in chunk[:a_end] for t in s]
      tokens_b: list[int] = []
      if is_random_next:
        target_b_length = target_seq_length - len(tokens_a)
        # Unlike BERT's 10 tries, always pick a different document.
        other = rng.randint(0, len(documents) - 2)
        other_doc = documents[other + (other >= doc_index)]
        for sentence in other_doc[rng.randint(0, len(other_doc) - 1):]:
          tokens_b.extend(sentence)
          if len(tokens_b) >= target_b_length:
            break
        i -= len(chunk) - a_end  # the unused sentences start the next chunk
      else:
        tokens_b = [t for s in chunk[a_end:] for t in s]
      _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
      instances.append((tokens_a, tokens_b, is_random_next))
      chunk, chunk_length = [], 0
    i += 1
  return instances


def _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    # Trimming both ends at random avoids always keeping the start of a text.
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


# ----------------------------------------------------------------------------- the cache


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """A complete pretokenised cache directory (see `prepare_pretraining_data`)."""

  dir: str
  tokenizer_path: str
  num_train: int
  num_eval: int
  most_frequent_token: int  # the MLM baseline's constant prediction
  stats: dict


def prepare_pretraining_data(cfg: DataConfig, *, vocab_size: int, seed: int) -> PreparedData:
  """Builds (or reuses) the pretokenised NSP instances for `cfg`.

  The cache lives at `cfg.cache_dir/<fingerprint>`, keyed by the input files' paths and
  contents, the record-shaping DataConfig fields, `vocab_size`, `seed` and
  FORMAT_VERSION. It is built in a temporary directory and renamed into place, and
  `meta.json` marks it complete, so an interrupted build is never reused. Building is
  deterministic, so hosts without a shared filesystem build identical caches.

  Args:
    cfg: the data config.
    vocab_size: model.vocab_size: the size of the tokenizer to train, or to check a given
      one against.
    seed: picks the held-out documents and pairs sentences.

  Returns:
    The cache's description.
  """
  _check_config(cfg)
  if cfg.tokenizer:  # fail on a vocab mismatch before any slow work
    tokenization.check_vocab_size(tokenization.SentencePieceTokenizer(cfg.tokenizer), vocab_size)
  train_paths = corpus.resolve_files(cfg.train_files)
  eval_paths = corpus.resolve_files(cfg.eval_files) if cfg.eval_files else []
  fingerprint = _fingerprint(cfg, train_paths, eval_paths, vocab_size, seed)
  out_dir = os.path.join(cfg.cache_dir, fingerprint)
  if os.path.exists(os.path.join(out_dir, META_FILE)):
    logging.info('reusing pretokenised data at %s', out_dir)
    return load_prepared_data(out_dir)
  os.makedirs(cfg.cache_dir, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f'.tmp-{fingerprint}-', dir=cfg.cache_dir)
  try:
    _build(cfg, train_paths, eval_paths, vocab_size, seed, tmp_dir, fingerprint)
    try:
      os.rename(tmp_dir, out_dir)
    except OSError:
      if not os.path.exists(os.path.join(out_dir, META_FILE)):
        raise
      shutil.rmtree(tmp_dir)  # another process finished the same cache first
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  logging.info('pretokenised data written to %s', out_dir)
  return load_prepared_data(out_dir)


def load_prepared_data(data_dir: str) -> PreparedData:
  """Describes an existing cache directory; DataError if it is incomplete."""
  meta = read_meta(data_dir)
  return PreparedData(dir=data_dir, tokenizer_path=os.path.join(data_dir, _TOKENIZER),
                      num_train=meta['num_train'], num_eval=meta['num_eval'],
                      most_frequent_token=meta['most_frequent_token'], stats=meta['stats'])


def _check_config(cfg: DataConfig) -> None:
  problems = []
  if cfg.max_seq_length < 5:
    problems.append(f'data.max_seq_length={cfg.max_seq_length} must be at least 5')
  if cfg.max_predictions_per_seq < 1:
    problems.append(f'data.max_predictions_per_seq={cfg.max_predictions_per_seq} must be >= 1')
  if not 0 < cfg.masked_lm_prob < 1:
    problems.append(f'data.masked_lm_prob={cfg.masked_lm_prob} must be in (0, 1)')
  if not 0 <= cfg.short_seq_prob <= 1:
    problems.append(f'data.short_seq_prob={cfg.short_seq_prob} must be in [0, 1]')
  if cfg.dupe_factor < 1 or cfg.num_shards < 1:
    problems.append('data.dupe_factor and data.num_shards must be >= 1')
  if not cfg.eval_files and not 0 < cfg.eval_fraction < 1:
    problems.append(f'data.eval_fraction={cfg.eval_fraction} must be in (0, 1) when '
                    'data.eval_files is empty')
  if problems:
    raise ConfigError('; '.join(problems))


def _file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _fingerprint(cfg, train_paths, eval_paths, vocab_size, seed) -> str:
  key = dict(
      format=FORMAT_VERSION, vocab_size=vocab_size, seed=seed,
      train=[(p, _file_sha256(p)) for p in train_paths],
      eval=[(p, _file_sha256(p)) for p in eval_paths],
      tokenizer=_file_sha256(cfg.tokenizer) if cfg.tokenizer else None,
      fields={f: getattr(cfg, f) for f in _RECORD_FIELDS})
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _build(cfg, train_paths, eval_paths, vocab_size, seed, out_dir, fingerprint) -> None:
  """Writes shards, tokenizer and (last) meta.json into `out_dir`."""
  t0 = time.time()
  train_name = f'corpus {cfg.train_files!r}'
  train_docs, stats = corpus.read_documents(train_paths)
  logging.info('read %d documents, %d sentences from %d files (%.1fs)', stats['documents'],
               stats['sentences'], stats['files'], time.time() - t0)
  require_multi_sentence_document(train_docs, train_name)  # before holding any out
  if eval_paths:
    eval_docs, eval_stats = corpus.read_documents(eval_paths)
    eval_name = f'eval corpus {cfg.eval_files!r}'
    stats['invalid_utf8'] += eval_stats['invalid_utf8']
  else:
    train_docs, eval_docs = _hold_out(train_docs, cfg.eval_fraction, seed, train_name)
    eval_name = f'the documents held out of {train_name}'

  tokenizer_path = os.path.join(out_dir, _TOKENIZER)
  if cfg.tokenizer:
    shutil.copyfile(cfg.tokenizer, tokenizer_path)  # the cache stays self-contained
    tokenizer = tokenization.SentencePieceTokenizer(tokenizer_path)
  else:
    tokenizer = tokenization.train_sentencepiece(
        (s for d in train_docs for s in d), tokenizer_path, vocab_size, cfg.lower_case, seed=seed)
    logging.info('trained a %d-piece tokenizer (%.1fs)', vocab_size, time.time() - t0)
  tokenization.check_vocab_size(tokenizer, vocab_size)

  splits = {}
  for split, docs, name, dupe, rng_seed in (
      ('train', train_docs, train_name, cfg.dupe_factor, seed),
      ('eval', eval_docs, eval_name, 1, seed + 1)):
    token_docs = _tokenize(tokenizer, docs)
    instances = create_nsp_instances(
        token_docs, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
        dupe_factor=dupe, rng=random.Random(rng_seed), name=name)
    shards, counts_v = _write_split(out_dir, split, instances, cfg.num_shards, vocab_size)
    splits[split] = dict(shards=shards, num=len(instances), counts=counts_v, docs=len(docs),
                         random=sum(r for _, _, r in instances))
    logging.info('%s: %d documents → %d instances in %d shards (%.1fs)', split, len(docs),
                 len(instances), len(shards), time.time() - t0)

  random_fraction = splits['train']['random'] / splits['train']['num']
  if abs(random_fraction - 0.5) > 0.05:
    logging.warning('%.0f%% of NSP pairs are random-next, not about 50%% (few multi-sentence '
                    'documents?)', 100 * random_fraction)
  counts_v = splits['train']['counts']
  counts_v[:NUM_SPECIAL] = 0
  stats.update(
      train_documents=splits['train']['docs'], eval_documents=splits['eval']['docs'],
      train_tokens=int(counts_v.sum()),
      random_next_fraction=round(random_fraction, 4),
      build_seconds=round(time.time() - t0, 1))
  meta = dict(format_version=FORMAT_VERSION, fingerprint=fingerprint, vocab_size=vocab_size,
              seed=seed, num_train=splits['train']['num'], num_eval=splits['eval']['num'],
              train_shards=splits['train']['shards'], eval_shards=splits['eval']['shards'],
              most_frequent_token=int(np.argmax(counts_v)), stats=stats,
              data_config=dataclasses.asdict(cfg))
  with open(os.path.join(out_dir, META_FILE), 'w') as f:
    json.dump(meta, f, indent=2)


def _hold_out(docs, fraction, seed, name):
  # Two documents at least on each side: NSP draws random segments from another document.
  num_eval = max(2, round(len(docs) * fraction))
  if len(docs) - num_eval < 2:
    raise DataError(f'{name} has only {len(docs)} documents, too few to hold out '
                    f'{num_eval} for eval; add documents or set --config.data.eval_files')
  held = set(random.Random(seed).sample(range(len(docs)), num_eval))
  return ([d for i, d in enumerate(docs) if i not in held],
          [d for i, d in enumerate(docs) if i in held])


def _tokenize(tokenizer, docs: list[list[str]]) -> list[list[list[int]]]:
  ids = tokenizer.encode_batch([s for d in docs for s in d])
  out, k = [], 0
  for d in docs:
    out.append(ids[k:k + len(d)])
    k += len(d)
  return out


def _write_split(out_dir, split, instances, num_shards, vocab_size):
  """Writes contiguous shards of records (see `encode_record`)."""
  num_shards = max(1, min(num_shards, len(instances)))
  bounds = np.linspace(0, len(instances), num_shards + 1).astype(int)
  names, counts_v = [], np.zeros(vocab_size, np.int64)
  for k in range(num_shards):
    names.append(f'{split}-{k:05d}-of-{num_shards:05d}.array_record')
    writer = array_record_module.ArrayRecordWriter(os.path.join(out_dir, names[-1]),
                                                   _WRITER_OPTIONS)
    shard_tokens = []
    for a, b, is_random in instances[bounds[k]:bounds[k + 1]]:
      record = encode_record(a, b, is_random)
      writer.write(record)
      shard_tokens.append(decode_record(record)[0])
    writer.close()
    if shard_tokens:
      counts_v += np.bincount(np.concatenate(shard_tokens), minlength=vocab_size)
  return names, counts_v


def read_meta(data_dir: str) -> dict:
  """The contents of a cache directory's meta.json; DataError if it is incomplete."""
  path = os.path.join(data_dir, META_FILE)
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise DataError(f'{data_dir} is not a complete pretokenised cache ({META_FILE} missing); '
                    'build it with prepare_pretraining_data') from None


# ----------------------------------------------------------------------------- records


def encode_record(tokens_a: list[int], tokens_b: list[int], is_random_next: bool) -> bytes:
  """One instance as a record: int32 [is_random_next, len_a, CLS A SEP B SEP]."""
  return np.array([int(is_random_next), len(tokens_a), CLS_ID, *tokens_a, SEP_ID, *tokens_b,
                   SEP_ID], '<i4').tobytes()


def decode_record(record: bytes) -> Example:
  """A record as (tokens int32[L] = [CLS] A [SEP] B [SEP], len_a, is_random_next)."""
  rec = np.frombuffer(record, dtype='<i4').astype(np.int32)
  return rec[2:], int(rec[1]), bool(rec[0])
