"""Measuring the data pipeline: preparation MB/s and peak memory, loader tokens/s.

`experiments/benchmark_data.py` drives these. Peak memory is the resident set of the whole
process tree (this process and every worker it spawned), sampled from /proc, since the
workers are where the text lives. numpy only: no jax here, so spawned workers stay light.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from typing import Callable

import numpy as np

from bert_jax.config import DataConfig
from bert_jax.data import loader, prepare, tokenization
from bert_jax.errors import DataError


class TreeMemory:
  """Samples the summed RSS of this process and all its descendants in a thread (Linux /proc)."""

  def __init__(self, interval_s: float = 0.05):
    self.peak_bytes = 0
    self._interval = interval_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def __enter__(self) -> 'TreeMemory':
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    page = os.sysconf('SC_PAGE_SIZE')
    root = os.getpid()
    while not self._stop.is_set():
      self.peak_bytes = max(self.peak_bytes, _tree_rss_pages(root) * page)
      self._stop.wait(self._interval)


def _tree_rss_pages(root: int) -> int:
  children: dict[int, list[int]] = {}
  rss: dict[int, int] = {}
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/stat', encoding='ascii', errors='replace') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
      continue  # the process ended meanwhile
    pid, ppid = int(name), int(fields[1])
    children.setdefault(ppid, []).append(pid)
    rss[pid] = int(fields[21])  # field 24 of stat: resident pages
  total, todo = 0, [root]
  while todo:
    pid = todo.pop()
    total += rss.get(pid, 0)
    todo.extend(children.get(pid, ()))
  return total


def synthesize_corpus(source_files: list[str], out_dir: str, target_mb: float, seed: int = 0,
                      log: Callable[[str], None] = print) -> list[str]:
  """Writes copies of WikiExtractor files until `target_mb`, each copy changed so it is new text.

  Copy c of a file renumbers its documents and shuffles the sentences of every paragraph with
  a seed of its own: the same vocabulary and sentence statistics, but no document, pair or
  sampled sentence order repeats, and the held-out hash picks different documents.

  Returns:
    The written files (reused when they already exist with the same size target).
  """
  if not sum(os.path.getsize(f) for f in source_files):
    raise DataError(f'the corpus files to copy ({len(source_files)}) are all empty: give --corpus some text')
  os.makedirs(out_dir, exist_ok=True)
  target = int(target_mb * 1e6)
  written, total, copy = [], 0, 0
  while total < target:
    for src in source_files:
      if total >= target:
        break
      path = os.path.join(out_dir, f'copy{copy:04d}_{os.path.basename(src)}')
      if not os.path.exists(path):
        with open(src, encoding='utf-8') as f:
          text = f.read()
        rng = random.Random(f'{seed}-{copy}-{src}')
        _write_changed(text, path, copy, rng)
      written.append(path)
      total += os.path.getsize(path)
    copy += 1
  log(f'synthetic corpus: {len(written)} files, {total / 1e6:,.0f} MB in {out_dir}')
  return written


_DOC_ID = re.compile(r'<doc id="(\d+)"')


def _write_changed(text: str, path: str, copy: int, rng: random.Random) -> None:
  from bert_jax.data import readers  # pylint: disable=g-import-not-at-top
  out = []
  for line in text.split('\n'):
    if line.startswith('<doc '):
      line = _DOC_ID.sub(lambda m: f'<doc id="{copy}{m.group(1)}"', line)
    elif line and not line.startswith('</doc>'):
      sentences = readers.split_sentences(line)
      rng.shuffle(sentences)
      line = ' '.join(sentences)
    out.append(line)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write('\n'.join(out))
  os.replace(tmp, path)


def time_prepare(cfg: DataConfig, vocab_size: int, seed: int = 0,
                 log: Callable[[str], None] = print) -> dict:
  """Prepares `cfg` from scratch (its cache must not exist) and measures it.

  Returns:
    mb (input), seconds, mb_per_s, peak_rss_gib (process tree), workers, and the cache's stats.
  """
  t0 = time.time()
  with TreeMemory() as memory:
    prepared = prepare.prepare_pretraining_data(cfg, vocab_size=vocab_size, seed=seed, log=log)
  seconds = time.time() - t0
  mb = prepared.stats['bytes'] / 1e6
  build = prepare.read_build_info(prepared.dir)
  return dict(mb=round(mb, 1), seconds=round(seconds, 2), mb_per_s=round(mb / seconds, 2),
              peak_rss_gib=round(memory.peak_bytes / 2**30, 3), workers=build['workers'],
              phases=build['seconds'], dir=prepared.dir, train_pairs=prepared.num_train)


def tokenizer_sample(files: list[str], num: int, seed: int = 0) -> tuple[list[str], int]:
  """`num` distinct sentences for timing SentencePiece training, and how many are real.

  The corpus's distinct sentences come first; when there are fewer than `num`, the rest are
  variants of them with their words in a seeded random order: new sentences, but no new
  words, so the trainer's per-word work grows less than with as many real sentences.
  """
  from bert_jax.data import readers  # pylint: disable=g-import-not-at-top
  opts = readers.ReaderOptions()
  seen: dict[str, None] = {}
  pieces = [p for unit in readers.plan_units(files, opts, 16 << 20) for p in unit]
  for doc in readers.read_documents(pieces, opts):
    for sentence in doc:
      seen.setdefault(sentence)
      if len(seen) >= num:
        return list(seen), num
  real = list(seen)
  out, rng = dict(seen), random.Random(seed)
  while len(out) < num:
    words = rng.choice(real).split()
    rng.shuffle(words)
    out.setdefault(' '.join(words))
  return list(out), len(real)


def time_tokenizer_training(sentences: list[str], vocab_size: int, out_dir: str) -> float:
  """Seconds to train the preparation's SentencePiece model on `sentences`."""
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.time()
  tokenization.train_sentencepiece(sentences, os.path.join(out_dir, 'timed.model'), vocab_size,
                                   lower_case=DataConfig().lower_case, max_sentences=len(sentences))
  return time.time() - t0


def time_loader(data_dir: str, cfg: DataConfig, *, batch_size: int, workers: int, batches: int,
                seed: int = 0) -> dict:
  """Loader throughput over a prepared cache: tokens/s of `batches` batches after a warm-up."""
  prepared = loader.load_prepared_data(data_dir)
  tokenizer = tokenization.load_tokenizer(prepared.tokenizer_path)
  vocab = loader.Vocab.from_tokenizer(tokenizer, prepared.special_ids, cfg.whole_word_masking)
  dataset = loader.PretrainingDataset(prepared, 'train')
  with loader.PretrainingBatches(dataset, global_batch_size=batch_size, seed=seed, cfg=cfg, vocab=vocab,
                                 workers=workers, prefetch=4) as stream:
    for _ in range(max(2, workers * 2)):  # warm-up: worker start-up, first reads
      next(stream)
    t0 = time.perf_counter()
    for _ in range(batches):
      batch = next(stream)
    seconds = time.perf_counter() - t0
  assert batch['input_ids'].shape[1] == cfg.max_seq_length
  tokens = batches * batch_size * cfg.max_seq_length
  return dict(batch_size=batch_size, seq_len=cfg.max_seq_length, workers=workers, pack=cfg.pack,
              tokens_per_s=round(tokens / seconds), batches_per_s=round(batches / seconds, 1))


def format_table(rows: list[dict], columns: list[str]) -> str:
  widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
  lines = [' | '.join(c.ljust(w) for c, w in zip(columns, widths)),
           '-|-'.join('-' * w for w in widths)]
  lines += [' | '.join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
  return '\n'.join(lines)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f'{v:,.2f}'
  if isinstance(v, (int, np.integer)):
    return f'{v:,}'
  return '' if v is None else str(v)
