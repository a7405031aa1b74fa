"""Preparing pretraining data: a corpus -> NSP pairs in token shards, streamed and in parallel.

The corpus is cut into work units (`readers.plan_units`: whole documents, about
`data.unit_mb` each; big files split at document boundaries, small ones grouped). Each unit is
read, split into sentences, tokenised, paired (`nsp`) and written to its own shards by one
worker process, so memory is bounded by the unit size and the worker count, never by the
corpus. With N jax processes, process i builds units i, i+N, ...; each also runs
`data.num_workers` local worker processes (spawned: they never inherit a started jax runtime).

Everything a unit writes depends only on that unit (its text, the settings, the seed and the
unit's index), so the shards and meta.json are byte-identical however many workers or hosts
built them. Held-out documents are chosen by a keyed hash of their text (`eval_fraction`), or
are the documents of `eval_files`; random-next segments come from other documents of the same
unit and split (the held-out documents of a unit with only one of them borrow from the unit's
training documents: held-out text never enters a training pair).

Without `data.tokenizer` a SentencePiece model is trained first, on a seeded sample of at most
`data.tokenizer_sample_sentences` distinct training sentences: the ones with the smallest
keyed hash, collected per unit while streaming and merged, so the sample too is independent of
how the work was split.

The build happens in `<cache_dir>/<fingerprint>.partial/`: each finished unit leaves a marker
and is skipped when a killed build is run again; the manifest (meta.json) is written last and
the directory renamed to `<cache_dir>/<fingerprint>/`, the only place training reads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import dataclasses
import functools
import hashlib
import heapq
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import threading
import time
from typing import Callable, Sequence

from etils import epath
import numpy as np

from bert_jax import files
from bert_jax.config import DataConfig
from bert_jax.data import nsp, readers, records, tokenization
from bert_jax.data.records import META_FILE, PreparedData, load_prepared_data
from bert_jax.errors import BertJaxError, DataError

# DataConfig fields that change the records (masking happens later, per batch); with the
# inputs' contents, the seed and records.FORMAT_VERSION they make the cache fingerprint.
RECORD_FIELDS = ('eval_fraction', 'lower_case', 'max_seq_length', 'short_seq_prob', 'dupe_factor',
                 'format', 'text_field', 'hard_wrapped', 'unit_mb', 'tokenizer_sample_sentences')
_UNITS_DIR = 'units'
_ENCODE_BATCH = 4096  # sentences per tokenizer call: bounded memory for the id lists
_PROGRESS_EVERY_S = 5.0
_LOCK_POLL_S = 2.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclasses.dataclass(frozen=True)
class Unit:
  """One work unit: whole documents from one or more files."""

  index: int
  pieces: tuple[readers.Piece, ...]
  split: str  # 'corpus' (held out by hash), 'train' or 'eval' (the documents of eval_files)

  @property
  def nbytes(self) -> int:
    return sum(_piece_bytes(p) for p in self.pieces)


@dataclasses.dataclass(frozen=True)
class _Job:
  """What a worker needs to build units (picklable; no jax)."""

  build_dir: str
  reader: readers.ReaderOptions
  seed: int
  eval_fraction: float
  max_seq_length: int
  short_seq_prob: float
  dupe_factor: int
  vocab_size: int
  tokenizer_path: str = ''
  objective: str = 'nsp'


def prepare_pretraining_data(cfg: DataConfig, *, vocab_size: int, seed: int,
                             process_index: int = 0, process_count: int = 1,
                             sync: Callable[[bool], bool] | None = None,
                             log: Callable[[str], None] | None = None) -> PreparedData:
  """Builds (or reuses) the prepared records (NSP or SOP pairs, or full sentences) for `cfg`.

  Args:
    cfg: the data config.
    vocab_size: model.vocab_size: the size of the tokenizer to train, or to check a given one
      against.
    seed: picks the held-out documents, the tokenizer sample and the pairs.
    process_index: this process among those preparing together (jax.process_index()).
    process_count: how many prepare together; they must share `cfg.cache_dir`.
    sync: with several processes, a barrier that takes this process's failure flag and
      returns whether any process failed.
    log: prints progress (process 0's); default: print on process 0.

  Returns:
    The complete cache's description.
  """
  log = log or (lambda msg: print(msg, flush=True) if process_index == 0 else None)
  sync = sync or (lambda failed: failed)
  error = None
  try:  # every process checks its inputs, then all agree, so none waits at a barrier for one that left
    given = tokenization.load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    if given is not None:  # fail on a vocab mismatch before any slow work
      tokenization.check_vocab_size(given, vocab_size)
    reader = readers.ReaderOptions(format=cfg.format, text_field=cfg.text_field,
                                   hard_wrapped=cfg.hard_wrapped)
    train_paths = readers.resolve_files(cfg.train_files)
    eval_paths = readers.resolve_files(cfg.eval_files) if cfg.eval_files else []
    fingerprint, legacy = _fingerprints(cfg, train_paths, eval_paths, given, vocab_size, seed)
  except BertJaxError as e:
    error = e
  if sync(error is not None):
    raise error or DataError('another process could not read the data inputs; its error says why')
  final_dir = os.path.join(cfg.cache_dir, fingerprint)
  if process_index == 0:
    _link_earlier_cache(cfg.cache_dir, legacy, final_dir, log)
  sync(False)  # every process sees the link
  if os.path.exists(os.path.join(final_dir, META_FILE)):
    log(f'prepared data: reusing {final_dir}')
    return dataclasses.replace(load_prepared_data(final_dir), legacy_fingerprint=legacy)
  # One build of a cache at a time: process 0 holds <fingerprint>.lock, and a second preparation of
  # the same cache waits for it, then reuses what it built.
  error, lock = None, None
  try:
    if process_index == 0:
      lock = _lock_cache(final_dir, log)
  except BertJaxError as e:
    error = e
  if sync(error is not None):
    raise error or DataError('another process could not lock the data cache; its error says why')
  try:
    if os.path.exists(os.path.join(final_dir, META_FILE)):  # built by the run we waited for
      log(f'prepared data: reusing {final_dir}')
      return dataclasses.replace(load_prepared_data(final_dir), legacy_fingerprint=legacy)
    _build(cfg, reader, train_paths, eval_paths, given, vocab_size, seed, final_dir, fingerprint, process_index,
           process_count, sync, log)
  finally:
    if lock is not None:
      lock.release()
  log(f'prepared data written to {final_dir}')
  return dataclasses.replace(load_prepared_data(final_dir), legacy_fingerprint=legacy)


def _link_earlier_cache(cache_dir: str, legacy: str, final_dir: str, log) -> None:
  """Serves the cache an earlier version prepared of the same data (named by its files' absolute paths) under
  the content-keyed name too: a relative link inside `cache_dir`, so an upgrade does not prepare a corpus again.
  Local caches only (remote filesystems have no links: those prepare again)."""
  earlier = os.path.join(cache_dir, legacy)
  if ('://' in cache_dir or os.path.lexists(final_dir) or legacy == os.path.basename(final_dir)
      or not os.path.exists(os.path.join(earlier, META_FILE))):
    return
  try:
    os.symlink(legacy, final_dir, target_is_directory=True)
  except FileExistsError:  # another run linked or built it meanwhile
    return
  log(f'prepared data: the cache an earlier version prepared of these files, {earlier}, serves as {final_dir}')


def _lock_cache(final_dir: str, log) -> files.Lock:
  """Takes `<final_dir>.lock`, waiting while a live process on this host holds it."""
  try:
    os.makedirs(os.path.dirname(final_dir) or '.', exist_ok=True)
  except OSError as e:
    raise DataError(f'cannot create the data cache directory {os.path.dirname(final_dir)}: {e.strerror}') from None
  lock, told = files.Lock(final_dir + '.lock', log), False
  while True:
    try:
      held = lock.acquire()
    except OSError as e:
      raise DataError(f'cannot write in the data cache directory {os.path.dirname(final_dir)}: {e.strerror}') from None
    if held is None:
      return lock
    if held.get('remote') or 'note' in held:
      raise DataError(f'data cache {final_dir} is being prepared by {files.describe_holder(held)}; wait for it to '
                      f'finish (the same command then reuses it), or delete {lock.path} if that run is gone')
    if not told:
      log(f'prepare: waiting for {files.describe_holder(held)}, which is preparing the same data into '
          f'{final_dir}.partial; its cache will be reused')
      told = True
    time.sleep(_LOCK_POLL_S)


def _build(cfg, reader, train_paths, eval_paths, given, vocab_size, seed, final_dir, fingerprint, process_index,
           process_count, sync, log) -> None:
  """Runs the build steps in `<final_dir>.partial`, every process together, then renames it to `final_dir`."""
  build_dir = final_dir + '.partial'
  builder = _Builder(cfg, reader, train_paths, eval_paths, given, vocab_size, seed, build_dir,
                     fingerprint, process_index, process_count, log)
  for step in (builder.plan, builder.tokenizer, builder.build_units, builder.manifest):
    error = None
    try:
      step()
    except BertJaxError as e:
      error = e
    if sync(error is not None):
      if process_index == 0:  # bad input: leave nothing behind (a killed build stays, to resume)
        shutil.rmtree(build_dir, ignore_errors=True)
      raise error or DataError('another process failed while preparing the data; its error says why')
  if process_index == 0:
    try:
      os.rename(build_dir, final_dir)
      shutil.rmtree(os.path.join(final_dir, _UNITS_DIR), ignore_errors=True)  # markers: build-time only
    except OSError:
      if not os.path.exists(os.path.join(final_dir, META_FILE)):
        raise
      shutil.rmtree(build_dir, ignore_errors=True)  # the same cache finished elsewhere first
  sync(False)


class _Builder:
  """The steps of one build, in order: plan, tokenizer, build_units, manifest."""

  def __init__(self, cfg, reader, train_paths, eval_paths, given, vocab_size, seed, build_dir,
               fingerprint, process_index, process_count, log):
    self.cfg, self.reader, self.given = cfg, reader, given
    self.train_paths, self.eval_paths = train_paths, eval_paths
    self.vocab_size, self.seed, self.dir, self.fingerprint = vocab_size, seed, build_dir, fingerprint
    self.process_index, self.process_count, self.log = process_index, process_count, log
    self.workers = cfg.num_workers if cfg.num_workers > 0 else len(_cores())
    self.units: list[Unit] = []
    self.seconds: dict[str, float] = {}
    self.tokenizer_file = ''

  def plan(self) -> None:
    t0 = time.time()
    os.makedirs(os.path.join(self.dir, _UNITS_DIR), exist_ok=True)
    if self.process_index == 0:  # half-written files of workers killed mid-unit (their units have no marker)
      for root, _, names in os.walk(self.dir):
        for name in names:
          if '.tmp-' in name:
            os.remove(os.path.join(root, name))
    unit_bytes = self.cfg.unit_mb << 20
    groups = [(g, 'eval' if self.eval_paths else 'corpus')
              for g in readers.plan_units(self.train_paths, self.reader, unit_bytes)]
    if not groups:
      raise DataError(f'corpus {self.cfg.train_files!r} has no text')
    if self.eval_paths:
      groups = [(g, 'train') for g, _ in groups]
      eval_groups = readers.plan_units(self.eval_paths, self.reader, unit_bytes)
      if not eval_groups:
        raise DataError(f'eval corpus {self.cfg.eval_files!r} has no text')
      groups += [(g, 'eval') for g in eval_groups]
    self.units = [Unit(i, tuple(g), split) for i, (g, split) in enumerate(groups)]
    total = sum(u.nbytes for u in self.units)
    self.log(f'prepare: {len(self.units)} work units, {total / 1e6:,.1f} MB, {self.workers} worker(s) '
             f'x {self.process_count} process(es) -> {self.dir}')
    self.seconds['plan'] = time.time() - t0

  def tokenizer(self) -> None:
    t0 = time.time()
    if self.given is not None:  # copied in, so the cache is self-contained; meta.json comes last anyway
      if self.process_index == 0:
        self.tokenizer_file = os.path.basename(tokenization.save_tokenizer(self.given, self.dir))
      else:
        self.tokenizer_file = tokenization.tokenizer_file_name(self.given)
      return
    self.tokenizer_file = tokenization.SPIECE_FILE
    path = os.path.join(self.dir, self.tokenizer_file)
    if self.process_index != 0 or os.path.exists(path):
      return  # trained by process 0 (others wait at the barrier), or by an earlier attempt
    job = self._job()
    sample = _BottomK(self.cfg.tokenizer_sample_sentences)
    for unit_sample in self._map(_sample_unit, job, [u for u in self.units if u.split != 'eval'],
                                 sample.k, 'tokenizer sample'):
      for h, sentence in unit_sample:
        sample.add(h, sentence)
    sentences = sample.sentences()
    self.log(f'prepare: training a {self.vocab_size}-piece SentencePiece model on {len(sentences):,} '
             'sampled sentences')
    t1 = time.time()
    tokenization.train_sentencepiece(sentences, path, self.vocab_size, self.cfg.lower_case, seed=self.seed)
    self.seconds['tokenizer_sample'] = t1 - t0
    self.seconds['tokenizer_train'] = time.time() - t1

  def build_units(self) -> None:
    t0 = time.time()
    tokenizer = tokenization.load_tokenizer(os.path.join(self.dir, self.tokenizer_file))
    tokenization.check_vocab_size(tokenizer, self.vocab_size)
    mine = [u for u in self.units[self.process_index::self.process_count]
            if not os.path.exists(_marker(self.dir, u.index))]
    done = len(self.units[self.process_index::self.process_count]) - len(mine)
    if done:
      self.log(f'prepare: {done} unit(s) already built by an earlier run; building {len(mine)}')
    for _ in self._map(_build_unit, self._job(), mine, None, 'units'):
      pass
    self.seconds['units'] = time.time() - t0

  def manifest(self) -> None:
    if self.process_index != 0:
      return
    t0 = time.time()
    missing = [u.index for u in self.units if not os.path.exists(_marker(self.dir, u.index))]
    if missing:
      raise DataError(f'units {missing[:5]} of {self.dir} were not built: with several processes, '
                      'data.cache_dir must be one directory all of them share')
    tokenizer = tokenization.load_tokenizer(os.path.join(self.dir, self.tokenizer_file))
    stats, splits = _merge_unit_stats(self.dir, self.units, self.vocab_size, tokenizer)
    train_name = f'corpus {self.cfg.train_files!r}'
    if self.cfg.sentence_pairs:
      _check_pairs(self.cfg, stats, splits, train_name, bool(self.eval_paths), self.log)
    elif not splits['train']['num'] or not splits['eval']['num']:
      raise DataError(f'{train_name} gave {splits["train"]["num"]} training and {splits["eval"]["num"]} held-out '
                      'sequences; masked-LM training needs both (add text, or set data.eval_fraction or '
                      'data.eval_files)')
    special = {k: int(getattr(tokenizer, f'{k}_id')) for k in ('pad', 'unk', 'cls', 'sep', 'mask')}
    meta = dict(format_version=records.FORMAT_VERSION, fingerprint=self.fingerprint,
                vocab_size=self.vocab_size, token_dtype=records.token_dtype(self.vocab_size), seed=self.seed,
                tokenizer=dict(type=type(tokenizer).__name__, file=self.tokenizer_file, special_ids=special),
                num_train=splits['train']['num'], num_eval=splits['eval']['num'],
                train_shards=splits['train']['shards'], eval_shards=splits['eval']['shards'],
                train_shard_records=splits['train']['shard_records'],
                eval_shard_records=splits['eval']['shard_records'],
                most_frequent_token=stats.pop('most_frequent_token'), num_units=len(self.units), stats=stats,
                data_config={f: getattr(self.cfg, f) for f in ('train_files', 'eval_files', 'tokenizer', 'objective',
                                                                *RECORD_FIELDS)})
    self.seconds['manifest'] = time.time() - t0
    special_text = stats.pop('special_text')  # in build.json: meta.json stays as earlier versions wrote it
    invalid_first = stats.pop('invalid_utf8_first')
    build = dict(workers=self.workers, processes=self.process_count,
                 seconds={k: round(v, 2) for k, v in self.seconds.items()},
                 worker_seconds=stats.pop('worker_seconds', None), special_tokens_as_text=special_text)
    _write_json(os.path.join(self.dir, records.BUILD_FILE), build)
    _write_json(os.path.join(self.dir, META_FILE), meta)  # last: it marks the cache complete
    what = {'nsp': f'NSP pairs ({stats["random_next_fraction"]:.1%} random-next)',
            'sop': f'SOP pairs ({stats["random_next_fraction"]:.1%} swapped)',
            'none': 'full-sentence sequences (masked LM only)'}[self.cfg.objective]
    self.log(f'prepare: {stats["documents"]:,} documents, {stats["sentences"]:,} sentences -> '
             f'{meta["num_train"]:,} training and {meta["num_eval"]:,} held-out {what}, '
             f'{stats["train_tokens"]:,} training tokens')
    if stats['invalid_utf8']:
      self.log(f'warning: {stats["invalid_utf8"]:,} invalid UTF-8 byte sequence(s) in the corpus were replaced '
               f'with U+FFFD (the first in {invalid_first})')
    if special_text:
      self.log(f'prepare: the corpus spells special tokens {sum(special_text.values()):,} times ('
               + ', '.join(f'{t} {n:,}' for t, n in special_text.items()) + '); they were tokenised as text, '
               'never as control tokens (counts in build.json)')

  # ------------------------------------------------------------------ helpers

  def _job(self) -> _Job:
    c = self.cfg
    return _Job(build_dir=self.dir, reader=self.reader, seed=self.seed, eval_fraction=c.eval_fraction,
                max_seq_length=c.max_seq_length, short_seq_prob=c.short_seq_prob, dupe_factor=c.dupe_factor,
                vocab_size=self.vocab_size, objective=c.objective,
                tokenizer_path=os.path.join(self.dir, self.tokenizer_file) if self.tokenizer_file else '')

  def _map(self, fn, job: _Job, units: Sequence[Unit], arg, what: str):
    """Yields fn(job, unit, arg) for every unit (any order), in worker processes, with progress.

    Each worker (or this thread, when one worker does all) is pinned to its own core,
    counting on from process_index * workers so that processes sharing a host spread out.
    """
    progress = _Progress(what, units, self.log)
    first_core = self.process_index * self.workers
    if self.workers == 1 or len(units) <= 1:
      before = _pin(first_core)
      try:
        for unit in units:
          result = fn(job, unit, arg)
          progress.done(unit)
          yield result
      finally:
        if before is not None:
          os.sched_setaffinity(0, before)
    else:
      ctx = multiprocessing.get_context('spawn')  # never fork a process that may run jax
      started = ctx.Value('i', 0)
      with concurrent.futures.ProcessPoolExecutor(min(self.workers, len(units)), mp_context=ctx,
                                                  initializer=_init_worker,
                                                  initargs=(started, first_core, os.getpid())) as pool:
        futures = {pool.submit(fn, job, u, arg): u for u in units}
        try:
          for future in concurrent.futures.as_completed(futures):
            result = future.result()
            progress.done(futures[future])
            yield result
        except BaseException:  # an error, a signal (Preempted) or Ctrl-C: stop the units in progress too
          for f in futures:
            f.cancel()
          _stop_workers(pool)
          raise
    progress.finish()


class _Progress:
  """Process-0 progress lines: units done, MB read, MB/s, ETA."""

  def __init__(self, what: str, units: Sequence[Unit], log):
    self.what, self.log = what, log
    self.total_units, self.total_bytes = len(units), sum(u.nbytes for u in units)
    self.units = self.bytes = self.printed = 0
    self.t0 = self.last = time.time()

  def done(self, unit: Unit) -> None:
    self.units += 1
    self.bytes += unit.nbytes
    if time.time() - self.last >= _PROGRESS_EVERY_S:
      self._print()

  def finish(self) -> None:
    if self.total_units and self.printed < self.units:  # the last line, unless already printed
      self._print()

  def _print(self) -> None:
    self.last = now = time.time()
    self.printed = self.units
    rate = self.bytes / max(now - self.t0, 1e-9)
    eta = (self.total_bytes - self.bytes) / rate if rate > 0 else float('inf')
    eta_s = f'{eta:.0f}s' if eta != float('inf') else '?'
    self.log(f'prepare {self.what}: {self.units}/{self.total_units} units | {self.bytes / 1e6:,.1f}/'
             f'{self.total_bytes / 1e6:,.1f} MB | {rate / 1e6:.2f} MB/s | ETA {eta_s}')


# ---------------------------------------------------------------------------- worker side


def _cores() -> list[int]:
  """The cores this process may run on."""
  return sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else list(range(os.cpu_count() or 1))


def _pin(k: int) -> set[int] | None:
  """Pins the calling thread to the k-th allowed core (mod their count); returns the old set.

  A worker left to the scheduler migrates between cores, which slows pure-Python work
  (docs/results.md has the figure).
  """
  if not hasattr(os, 'sched_setaffinity'):
    return None
  before = os.sched_getaffinity(0)
  cores = sorted(before)
  os.sched_setaffinity(0, {cores[k % len(cores)]})
  return before


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Kills the pool's worker processes at once (their units are unfinished: no marker, rebuilt on resume)."""
  terminate = getattr(pool, 'terminate_workers', None)  # Python >= 3.14
  if terminate is not None:
    terminate()
    return
  for process in list((getattr(pool, '_processes', None) or {}).values()):
    process.terminate()
  for process in list((getattr(pool, '_processes', None) or {}).values()):
    process.join(5)


def _die_with_parent(parent: int) -> None:
  """Makes this worker exit when the process that started it dies (kill -9 included)."""
  try:  # Linux: the kernel sends SIGKILL when the parent goes
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent:  # it died before prctl took effect
    os._exit(1)  # pylint: disable=protected-access

  def watch():  # elsewhere (and as a second guard): reparented means orphaned
    while os.getppid() == parent:
      time.sleep(1.0)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, daemon=True, name='parent-watch').start()


def _init_worker(started, first_core: int, parent: int) -> None:
  _die_with_parent(parent)
  # The parent turns SIGTERM/SIGINT into stopping the whole pool; a worker must not die on its own
  # (a Ctrl-C reaches every process of the terminal's group) and leave the pool broken.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # One core per worker: the libraries' own thread pools would oversubscribe the machine
  # (`_tokenize` also asks for one thread).
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  with started.get_lock():
    k = started.value
    started.value += 1
  _pin(first_core + k)


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


def _sentence_hash(sentence: str, key: bytes) -> int:
  return int.from_bytes(hashlib.blake2b(sentence.encode('utf-8', 'surrogatepass'), digest_size=8,
                                        key=key).digest(), 'little')


def _documents(job: _Job, unit: Unit, stats: dict | None = None):
  """Yields (split, document) for the unit's documents."""
  for doc in readers.read_documents(unit.pieces, job.reader, stats):
    if unit.split == 'corpus':
      yield ('eval' if _is_held_out(doc, job.seed, job.eval_fraction) else 'train'), doc
    else:
      yield unit.split, doc


class _BottomK:
  """The k distinct sentences with the smallest hashes seen so far: a bounded, order-free sample."""

  def __init__(self, k: int):
    self.k = k
    self._heap: list[tuple[int, str]] = []  # (-hash, sentence): a max-heap of the k smallest
    self._seen: set[str] = set()

  def add(self, h: int, sentence: str) -> None:
    if sentence in self._seen:
      return
    if len(self._heap) < self.k:
      heapq.heappush(self._heap, (-h, sentence))
      self._seen.add(sentence)
    elif -self._heap[0][0] > h:
      self._seen.discard(heapq.heappushpop(self._heap, (-h, sentence))[1])
      self._seen.add(sentence)

  def items(self) -> list[tuple[int, str]]:
    return [(-nh, s) for nh, s in self._heap]

  def sentences(self) -> list[str]:
    """The sample in hash order (a fixed order for the tokenizer trainer)."""
    return [s for _, s in sorted(self.items())]


def _sample_unit(job: _Job, unit: Unit, k: int) -> list[tuple[int, str]]:
  """The unit's k distinct training sentences with the smallest keyed hashes."""
  key = (job.seed + 1).to_bytes(8, 'little', signed=True)
  sample = _BottomK(k)
  for split, doc in _documents(job, unit):
    if split == 'train':
      for sentence in doc:
        sample.add(_sentence_hash(sentence, key), sentence)
  return sample.items()


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


def _build_unit(job: _Job, unit: Unit, _) -> dict:
  """Reads, tokenises, pairs and writes one unit; leaves its marker last. Returns its stats."""
  t0 = time.time()
  read_stats: dict = {}
  docs: dict[str, list[list[str]]] = {'train': [], 'eval': []}
  for split, doc in _documents(job, unit, read_stats):
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
  for split in ('train', 'eval'):
    t = tokenized[split]
    if job.objective != 'none':
      pool = tokenized['train'] if split == 'eval' and job.objective == 'nsp' else None
      rng = random.Random(f'{job.seed}-{unit.index}-{split}')  # str seeds hash alike everywhere
      pairs = nsp.create_pairs(t, max_seq_length=job.max_seq_length, short_seq_prob=job.short_seq_prob,
                               dupe_factor=job.dupe_factor if split == 'train' else 1, rng=rng,
                               random_pool=pool, sentence_order=job.objective == 'sop')
      used_pool = pool if (pool is not None and t.num_docs < 2 and pool.num_docs) else None
      runs = nsp.record_runs(t, pairs, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pool=used_pool,
                             dtype=dtype)
      len_a, random_next = pairs[:, 1] - pairs[:, 0], pairs[:, 4]
    else:  # masked LM only: FULL-SENTENCES records, all segment A (len_a = length - 2), label 0
      ranges, stream = nsp.full_sentence_records(t, max_seq_length=job.max_seq_length, sep_id=tokenizer.sep_id)
      runs = nsp.full_sentence_runs(ranges, stream, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, dtype=dtype)
      len_a, random_next = ranges[:, 1] - ranges[:, 0], np.zeros(len(ranges), np.int64)
    index = records.make_index(runs.bounds, len_a, random_next)
    base = os.path.join(job.build_dir, _UNITS_DIR, f'{unit.index:05d}.{split}')
    counts = np.zeros(job.vocab_size, '<i8') if split == 'train' else None
    if len(len_a):
      _atomic(os.path.join(job.build_dir, records.shard_name(split, unit.index)),
              lambda p: _write_records(p, runs, counts))
    _atomic(base + '.index.npy', lambda p: _save_npy(p, index))
    if counts is not None:
      _atomic(base + '.counts.npy', lambda p: _save_npy(p, counts))
    out['splits'][split] = dict(documents=t.num_docs, sentences=int(len(t.sentence_starts) - 1),
                                tokens=int(len(t.tokens)), pairs=int(len(len_a)), random_next=int(random_next.sum()))
  out['seconds'] = dict(read=t_read - t0, tokenize=t_tokenize - t_read, pairs_write=time.time() - t_tokenize)
  _write_json(_marker(job.build_dir, unit.index), out)  # last: the unit is complete
  return out


def _write_records(path: str, runs: nsp.RecordRuns, counts: np.ndarray | None) -> None:
  """Writes the records' tokens to a shard a block at a time, adding them to `counts` (int64[vocab]) if given."""
  with open(path, 'wb') as f:
    for block in runs.blocks():
      records.write_tokens(f, block)
      if counts is not None:
        counts += np.bincount(block, minlength=len(counts))


# ---------------------------------------------------------------------------- manifest


def _check_pairs(cfg: DataConfig, stats: dict, splits: dict, train_name: str, has_eval_files: bool, log) -> None:
  """Refuses a corpus that gives no NSP/SOP pairs on either side; warns when labels are unbalanced."""
  task = cfg.objective.upper()
  if not splits['train']['num'] and not splits['eval']['num']:
    raise DataError(f'no document in {train_name} has two sentences; {task} needs documents of several '
                    'sentences (in plain text, blank lines separate documents; or set data.objective=none)')
  if cfg.objective == 'sop' and not splits['train']['num']:
    raise DataError(f'{train_name} gave no training pairs; SOP needs a training document of two sentences '
                    '(add text, or lower data.eval_fraction)')
  if stats['train_documents'] < 2 or not splits['train']['num']:
    raise DataError(f'{train_name} has {stats["train_documents"]} training document(s), '
                    f'{splits["train"]["num"]} training pairs; NSP needs two documents at least, one of '
                    'them of two sentences (add text, or lower data.eval_fraction)')
  if not splits['eval']['num']:
    where = (f'eval corpus {cfg.eval_files!r} has no document of two sentences' if has_eval_files
             else f'no document of two sentences was held out of {train_name} (eval_fraction='
                  f'{cfg.eval_fraction}, {stats["eval_documents"]} held-out documents)')
    raise DataError(f'{where}; raise data.eval_fraction or set data.eval_files')
  fraction = stats['random_next_fraction']
  if abs(fraction - 0.5) > 0.05:
    log(f'warning: {fraction:.0%} of {task} pairs have label 1, not about 50% (few multi-sentence '
        'documents?)')


def _merge_unit_stats(build_dir: str, units: Sequence[Unit], vocab_size: int, tokenizer):
  """Sums the units' markers in unit order; writes the split index files. (stats, splits)."""
  splits = {s: dict(num=0, shards=[], shard_records=[], documents=0, sentences=0, tokens=0, random=0) for s in ('train', 'eval')}
  totals = dict(bytes=0, invalid_utf8=0, formats={}, special_text=collections.Counter())
  counts = np.zeros(vocab_size, np.int64)
  worker_seconds = dict(read=0.0, tokenize=0.0, pairs_write=0.0)
  for u in units:
    with open(_marker(build_dir, u.index), encoding='utf-8') as f:
      m = json.load(f)
    totals['bytes'] += m['bytes']
    totals['invalid_utf8'] += m['invalid_utf8']
    totals['invalid_utf8_first'] = totals.get('invalid_utf8_first') or m.get('invalid_utf8_first')
    totals['special_text'].update(m.get('special_text', {}))  # a marker written before counting: none
    for name, n in m['formats'].items():
      totals['formats'][name] = totals['formats'].get(name, 0) + n
    for k in worker_seconds:
      worker_seconds[k] += m['seconds'][k]
    for split, s in m['splits'].items():
      agg = splits[split]
      agg['num'] += s['pairs']
      agg['documents'] += s['documents']
      agg['sentences'] += s['sentences']
      agg['tokens'] += s['tokens']
      agg['random'] += s['random_next']
      if s['pairs']:
        agg['shards'].append(records.shard_name(split, u.index))
        agg['shard_records'].append(s['pairs'])
      if split == 'train':
        counts += np.load(os.path.join(build_dir, _UNITS_DIR, f'{u.index:05d}.train.counts.npy'))
  for split, agg in splits.items():
    _atomic(os.path.join(build_dir, records.index_name(split)),
            lambda p, split=split, n=agg['num']: _join_indexes(p, build_dir, units, split, n))
  counts[tokenizer.special_table()] = 0
  train, evals = splits['train'], splits['eval']
  stats = dict(
      files=len({p.path for u in units for p in u.pieces}), bytes=totals['bytes'],
      documents=train['documents'] + evals['documents'], sentences=train['sentences'] + evals['sentences'],
      train_documents=train['documents'], eval_documents=evals['documents'],
      train_sentences=train['sentences'], eval_sentences=evals['sentences'],
      corpus_tokens=train['tokens'] + evals['tokens'], train_tokens=int(counts.sum()),
      train_pairs=train['num'], eval_pairs=evals['num'],
      random_next_fraction=round(train['random'] / max(train['num'], 1), 4),
      eval_random_next_fraction=round(evals['random'] / max(evals['num'], 1), 4),
      invalid_utf8=totals['invalid_utf8'], formats=totals['formats'],
      most_frequent_token=int(np.argmax(counts)),
      worker_seconds={k: round(v, 2) for k, v in worker_seconds.items()},
      special_text=dict(totals['special_text'].most_common()), invalid_utf8_first=totals.get('invalid_utf8_first'))
  return stats, splits


def _join_indexes(path: str, build_dir: str, units: Sequence[Unit], split: str, num: int) -> None:
  """Concatenates the units' index files into one .npy, a unit at a time (bounded memory)."""
  out = np.lib.format.open_memmap(path, mode='w+', dtype=records.INDEX_DTYPE, shape=(num,))
  at = 0
  for u in units:
    part = np.load(os.path.join(build_dir, _UNITS_DIR, f'{u.index:05d}.{split}.index.npy'))
    out[at:at + len(part)] = part
    at += len(part)
  out.flush()
  del out


# ---------------------------------------------------------------------------- small helpers


def _file_digest(path: str) -> tuple[int, str]:
  """(size, sha256) of a file's bytes."""
  h, size = hashlib.sha256(), 0
  with epath.Path(path).open('rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
      size += len(block)
  return size, h.hexdigest()


def _fingerprints(cfg, train_paths, eval_paths, given, vocab_size, seed) -> tuple[str, str]:
  """(the cache's fingerprint, the same data's fingerprint under earlier versions).

  The fingerprint names the data by its contents: each file's size and sha256 in the order the files are read
  (which is all preparation reads of them), not where they are, so a moved checkout or corpus is the same data.
  Earlier versions keyed the files by their absolute paths; that key is computed too, for their checkpoints.
  """
  digests = {p: _file_digest(p) for p in (*train_paths, *eval_paths)}
  key = dict(
      format=records.FORMAT_VERSION, vocab_size=vocab_size, seed=seed,
      tokenizer=[_file_digest(p)[1] for p in tokenization.tokenizer_files(given)] if given else None,
      fields={f: getattr(cfg, f) for f in RECORD_FIELDS})
  if not given:  # a trained tokenizer's bytes depend on how it is trained
    key['tokenizer_training'] = tokenization.SENTENCEPIECE_TRAINING
  elif isinstance(given, tokenization.WordPieceTokenizer):  # earlier caches turned spelled specials into ids
    key['special_strings'] = 'as_text'
  if cfg.objective != 'nsp':  # only then: caches of NSP pairs keep their fingerprints
    key['objective'] = {'none': 'mlm_full_sentences', 'sop': 'sop'}[cfg.objective]
  by_content = {**key, 'train': [list(digests[p]) for p in train_paths], 'eval': [list(digests[p]) for p in eval_paths],
                'identity': 'content'}
  by_path = {**key, 'train': [(_absolute(p), digests[p][1]) for p in train_paths],
             'eval': [(_absolute(p), digests[p][1]) for p in eval_paths]}
  return tuple(hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16] for k in (by_content, by_path))


def _absolute(path: str) -> str:
  return path if '://' in path else os.path.abspath(path)


def _marker(build_dir: str, unit: int) -> str:
  return os.path.join(build_dir, _UNITS_DIR, f'{unit:05d}.json')


def _piece_bytes(piece: readers.Piece) -> int:
  if piece.end >= 0:
    return piece.end - piece.start
  with epath.Path(piece.path).open('rb') as f:  # stat() looks up owner names, absent in some containers
    return f.seek(0, 2)


def _atomic(path: str, write: Callable[[str], None]) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  write(tmp)
  os.replace(tmp, path)


def _save_npy(path: str, array: np.ndarray) -> None:
  with open(path, 'wb') as f:
    np.save(f, array)


def _write_json(path: str, obj) -> None:
  def write(p):
    with open(p, 'w', encoding='utf-8') as f:
      json.dump(obj, f, indent=2, sort_keys=True)
      f.write('\n')
  _atomic(path, write)


def read_build_info(data_dir: str) -> dict:
  """build.json of a cache: workers, processes, seconds per phase (wall) and per worker step."""
  with open(os.path.join(data_dir, records.BUILD_FILE), encoding='utf-8') as f:
    return json.load(f)
