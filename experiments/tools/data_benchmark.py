"""Measuring the data pipeline: preparation MB/s and peak memory, loader tokens/s.

`experiments/benchmark_data.py` drives these. Peak memory is the resident set of the whole
process tree (this process and every worker it spawned), sampled from /proc, since the
workers are where the text lives. numpy only: no jax here, so spawned workers stay light.

Corpora of several shapes are synthesised here (`SHAPES`), since throughput depends on the
text as much as on its size: Wikipedia prose (copies of the enwiki sample), technical
documentation with code (short lines, many short sentences, tiny documents: the Python
standard library's docstrings and sources) and jsonl with long documents (many enwiki
articles per JSON object).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import inspect
import io
import json
import multiprocessing
import os
import pkgutil
import random
import re
import sys
import threading
import time
from typing import Callable
import warnings

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
        rng = random.Random(f'{seed}-{copy}-{os.path.basename(src)}')  # the same copy wherever the source lies
        _write_changed(text, path, copy, rng)
      written.append(path)
      total += os.path.getsize(path)
    copy += 1
  log(f'synthetic corpus: {len(written)} files, {total / 1e6:,.0f} MB in {out_dir}')
  return written


_DOC_ID = re.compile(r'<doc id="(\d+)"')


def _write_changed(text: str, path: str, copy: int, rng: random.Random) -> None:
  from bert_jax.data import sentence_split  # pylint: disable=g-import-not-at-top
  out = []
  for line in text.split('\n'):
    if line.startswith('<doc '):
      line = _DOC_ID.sub(lambda m: f'<doc id="{copy}{m.group(1)}"', line)
    elif line and not line.startswith('</doc>'):
      sentences = sentence_split.split_sentences(line)
      rng.shuffle(sentences)
      line = ' '.join(sentences)
    out.append(line)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write('\n'.join(out))
  os.replace(tmp, path)


# ----------------------------------------------------------------------------- corpus shapes

# Corpus shapes the benchmark builds: name -> (what it is, the reader's DataConfig fields).
SHAPES = {
    'enwiki': ('WikiExtractor prose: copies of the enwiki sample', {}),
    'docs': ('technical documentation with code, plain text: short lines, many short sentences', {}),
    'jsonl': ('jsonl, long documents: 10-40 enwiki articles per object', {}),
}


def shape_corpus(shape: str, source_files: list[str], out_dir: str, target_mb: float, seed: int = 0,
                 log: Callable[[str], None] = print) -> list[str]:
  """The files of corpus `shape` (see `SHAPES`) of about `target_mb`, written under `out_dir` (reused)."""
  if shape == 'enwiki':
    return synthesize_corpus(source_files, os.path.join(out_dir, f'enwiki_{target_mb:g}mb'), target_mb, seed, log)
  if shape == 'docs':
    return docs_corpus(os.path.join(out_dir, f'docs_{target_mb:g}mb'), target_mb, seed, log)
  if shape == 'jsonl':
    copies = synthesize_corpus(source_files, os.path.join(out_dir, f'enwiki_{target_mb:g}mb'), target_mb, seed, log)
    return jsonl_corpus(copies, os.path.join(out_dir, f'jsonl_{target_mb:g}mb'), seed, log)
  raise DataError(f'unknown corpus shape {shape!r}; expected one of {", ".join(SHAPES)}')


# Standard-library modules that are not documentation (or do something when imported).
_NOT_DOCS = frozenset('antigravity this idlelib tkinter turtle turtledemo test tests lib2to3 ensurepip venv msilib '
                      'winreg winsound msvcrt nt pydoc_data curses readline distutils'.split())


def stdlib_pages() -> list[str]:
  """Documentation pages of the standard library: per module, class and function its qualified
  name and signature, its docstring (hard-wrapped prose, examples) and, for functions, its source."""
  warnings.simplefilter('ignore')
  modules = []
  for name in sorted(n for n in sys.stdlib_module_names if not n.startswith('_') and n not in _NOT_DOCS):
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        module = importlib.import_module(name)
    except BaseException:  # pylint: disable=broad-except  # absent or platform-specific: not needed
      continue
    modules.append(module)
    for info in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):
      if any(p in _NOT_DOCS or p.startswith('_') for p in info.name.split('.')[1:]):
        continue
      try:
        with contextlib.redirect_stdout(io.StringIO()):
          modules.append(importlib.import_module(info.name))
      except BaseException:  # pylint: disable=broad-except
        pass
  pages, seen = [], set()
  for module in modules:
    if doc := inspect.getdoc(module):
      pages.append(f'{module.__name__}\n{doc}')
    for name, obj in sorted(vars(module).items()):
      if name.startswith('_') or id(obj) in seen or getattr(obj, '__module__', None) != module.__name__:
        continue
      seen.add(id(obj))
      members = [(name, obj)]
      if inspect.isclass(obj):
        members += [(f'{name}.{k}', v) for k, v in sorted(vars(obj).items()) if not k.startswith('_') and callable(v)]
      for qualname, member in members:
        try:
          signature = str(inspect.signature(member))
        except (TypeError, ValueError):
          signature = ''
        try:
          source = inspect.getsource(member).rstrip() if inspect.isfunction(member) else ''
        except (OSError, TypeError):
          source = ''
        pages.append('\n'.join(p for p in (f'{module.__name__}.{qualname}{signature}', inspect.getdoc(member) or '',
                                            source) if p))
  return pages


def docs_corpus(out_dir: str, target_mb: float, seed: int = 0, log: Callable[[str], None] = print) -> list[str]:
  """Technical documentation with code, as plain text, until `target_mb`: `stdlib_pages` in copies.

  The pages are collected in a spawned process (importing the whole standard library has side
  effects this one should not carry). Copy c shuffles the page order and the sentences of every
  line that has several, and numbers the page titles, with a seed of its own; a blank line ends a
  page and every paragraph of a docstring, so documents are tiny.

  Returns:
    The written files, about 8 MB each (reused when they already exist).
  """
  from bert_jax.data import sentence_split  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  target = int(target_mb * 1e6)
  written, total, pages = [], 0, None
  while total < target:
    path = os.path.join(out_dir, f'docs{len(written):04d}.txt')
    if not os.path.exists(path):
      if pages is None:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as pool:
          pages = pool.submit(stdlib_pages).result()
      rng = random.Random(f'{seed}-docs-{len(written)}')
      out, size = [], 0
      while size < 8e6:
        order = list(range(len(pages)))
        rng.shuffle(order)
        for i in order:
          lines = pages[i].split('\n')
          lines[0] = f'{lines[0]} [{len(written)}.{len(out)}]'
          for j, line in enumerate(lines):
            if '. ' in line and not line.startswith(' '):
              sentences = sentence_split.split_sentences(line)
              rng.shuffle(sentences)
              lines[j] = ' '.join(sentences)
          out.append('\n'.join(lines))
          size += len(out[-1]) + 2
          if size >= 8e6:
            break
      _write_text(path, '\n\n'.join(out) + '\n')
    written.append(path)
    total += os.path.getsize(path)
  log(f'docs corpus: {len(written)} files, {total / 1e6:,.0f} MB in {out_dir}')
  return written


def jsonl_corpus(wikiextractor_files: list[str], out_dir: str, seed: int = 0,
                 log: Callable[[str], None] = print) -> list[str]:
  """The documents of WikiExtractor files as jsonl, 10-40 articles (paragraph lines) per object: long documents.

  Returns:
    The written files, one per input file (reused when they already exist).
  """
  os.makedirs(out_dir, exist_ok=True)
  written, total = [], 0
  for k, src in enumerate(wikiextractor_files):
    path = os.path.join(out_dir, os.path.basename(src) + '.jsonl')
    if not os.path.exists(path):
      with open(src, encoding='utf-8') as f:
        articles = [[line for line in body.split('\n')[2:] if line.strip()]
                    for body in re.split(r'<doc [^>]*>\n|</doc>\n?', f.read()) if body.strip()]
      rng = random.Random(f'{seed}-jsonl-{k}')
      lines, i = [], 0
      while i < len(articles):
        n = rng.randint(10, 40)
        text = '\n'.join(p for a in articles[i:i + n] for p in a)
        lines.append(json.dumps({'id': f'{k}-{i}', 'text': text}, ensure_ascii=False))
        i += n
      _write_text(path, '\n'.join(lines) + '\n')
    written.append(path)
    total += os.path.getsize(path)
  log(f'jsonl corpus: {len(written)} files, {total / 1e6:,.0f} MB in {out_dir}')
  return written


def _write_text(path: str, text: str) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, path)


def given_tokenizer(files_by_shape: dict[str, list[str]], vocab_size: int, out_dir: str,
                    sentences_per_shape: int = 200_000, log: Callable[[str], None] = print) -> str:
  """A SentencePiece model of `vocab_size` pieces trained (once, then reused) on sentences of every shape.

  Returns:
    Its path: what data.tokenizer is given, so the timed preparations train nothing.
  """
  path = os.path.join(out_dir, f'tokenizer_{"_".join(sorted(files_by_shape))}_{vocab_size}.model')
  if os.path.exists(path):
    return path
  from bert_jax.data import corpus_formats, corpus_pieces, readers  # pylint: disable=g-import-not-at-top
  sentences = []
  for files in files_by_shape.values():
    opts = corpus_formats.ReaderOptions()
    pieces = [p for unit in corpus_pieces.plan_units(files, opts, 16 << 20) for p in unit]
    before = len(sentences)
    for doc in readers.read_documents(pieces, opts):
      sentences.extend(doc)
      if len(sentences) - before >= sentences_per_shape:
        break
  t0 = time.time()
  tokenization.train_sentencepiece(sentences, path, vocab_size, lower_case=DataConfig().lower_case)
  log(f'tokenizer: {vocab_size:,} pieces trained on {len(sentences):,} sentences in {time.time() - t0:.0f} s: {path}')
  return path


def time_prepare(cfg: DataConfig, vocab_size: int, seed: int = 0,
                 log: Callable[[str], None] = print) -> dict:
  """Prepares `cfg` from scratch (its cache must not exist) and measures it.

  Returns:
    mb (input), seconds, mb_per_s (and per worker), peak_rss_gib (process tree), workers, the
    build's phases (wall seconds) and worker_seconds (summed over units), each worker phase's
    MB per worker-second (`read_mb_per_s`, ...), the cache directory and its training pairs.
  """
  t0 = time.time()
  with TreeMemory() as memory:
    prepared = prepare.prepare_pretraining_data(cfg, vocab_size=vocab_size, seed=seed, log=log)
  seconds = time.time() - t0
  mb = prepared.stats['bytes'] / 1e6
  build = prepare.read_build_info(prepared.dir)
  worker_seconds = build.get('worker_seconds') or {}
  out = dict(mb=round(mb, 1), seconds=round(seconds, 2), mb_per_s=round(mb / seconds, 2),
             mb_per_s_per_worker=round(mb / seconds / build['workers'], 2),
             peak_rss_gib=round(memory.peak_bytes / 2**30, 3), workers=build['workers'],
             phases=build['seconds'], worker_seconds=worker_seconds, dir=prepared.dir,
             train_pairs=prepared.num_train)
  for phase, s in worker_seconds.items():
    out[f'{phase}_mb_per_s'] = round(mb / s, 1) if s > 0 else None
  return out


def tokenizer_sample(files: list[str], num: int, seed: int = 0) -> tuple[list[str], int]:
  """`num` distinct sentences for timing SentencePiece training, and how many are real.

  The corpus's distinct sentences come first; when there are fewer than `num`, the rest are
  variants of them with their words in a seeded random order: new sentences, but no new
  words, so the trainer's per-word work grows less than with as many real sentences.
  """
  from bert_jax.data import corpus_formats, corpus_pieces, readers  # pylint: disable=g-import-not-at-top
  opts = corpus_formats.ReaderOptions()
  seen: dict[str, None] = {}
  pieces = [p for unit in corpus_pieces.plan_units(files, opts, 16 << 20) for p in unit]
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
  vocab = loader.Vocab.from_tokenizer(tokenizer, prepared.special_ids, cfg.masking)
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
