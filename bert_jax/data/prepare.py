"""Preparing pretraining data: a corpus -> NSP pairs in token shards, streamed and in parallel.

The corpus is cut into work units (`corpus_pieces.plan_units`: whole documents, about
`data.unit_mb` each; big files split at document boundaries, small ones grouped). Each unit is
read, split into sentences, tokenised, paired (`nsp`) and written to its own shards by one
worker process (`work_units`), so memory is bounded by the unit size and the worker count,
never by the corpus. With N jax processes, process i builds units i, i+N, ...; each also runs
`data.num_workers` local worker processes (`worker_pool`; spawned: they never inherit a started
jax runtime). Everything a unit writes depends only on that unit, so the shards and meta.json
are byte-identical however many workers or hosts built them.

Without `data.tokenizer` a SentencePiece model is trained first, on a sample of the training
sentences that is independent of how the work was split (`tokenizer_sample`).

The cache is named by a fingerprint of its inputs (`cache_identity`). The build happens in
`<cache_dir>/<fingerprint>.partial/`: each finished unit leaves a marker and is skipped when a
killed build is run again; the manifest (meta.json, from the units' merged statistics:
`unit_stats`) is written last and the directory renamed to `<cache_dir>/<fingerprint>/`, the
only place training reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Callable, Sequence

from bert_jax import files
from bert_jax.config import DataConfig
from bert_jax.data import (cache_identity, corpus_files, corpus_formats, corpus_pieces, records, tokenization,
                           tokenizer_sample, unit_stats, work_units, worker_pool)
from bert_jax.data.records import META_FILE, PreparedData, load_prepared_data
from bert_jax.errors import BertJaxError, DataError

_LOCK_POLL_S = 2.0


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
    reader = corpus_formats.ReaderOptions(format=cfg.format, text_field=cfg.text_field,
                                          hard_wrapped=cfg.hard_wrapped)
    train_paths = corpus_files.resolve_files(cfg.train_files)
    eval_paths = corpus_files.resolve_files(cfg.eval_files) if cfg.eval_files else []
    fingerprint, legacy = cache_identity.fingerprints(cfg, train_paths, eval_paths, given, vocab_size, seed)
  except BertJaxError as e:
    error = e
  if sync(error is not None):
    raise error or DataError('another process could not read the data inputs; its error says why')
  places = cache_identity.cache_dirs(cfg.cache_dir)
  cache_dir = next((d for d in places if cache_identity.holds(d, fingerprint, legacy)), places[0])
  final_dir = os.path.join(cache_dir, fingerprint)
  if process_index == 0:
    cache_identity.link_earlier_cache(cache_dir, legacy, final_dir, log)
  sync(False)  # every process sees the link
  if files.exists(os.path.join(final_dir, META_FILE)):
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
    if files.exists(os.path.join(final_dir, META_FILE)):  # built by the run we waited for
      log(f'prepared data: reusing {final_dir}')
      return dataclasses.replace(load_prepared_data(final_dir), legacy_fingerprint=legacy)
    _build(cfg, reader, train_paths, eval_paths, given, vocab_size, seed, final_dir, fingerprint, process_index,
           process_count, sync, log)
  finally:
    if lock is not None:
      lock.release()
  log(f'prepared data written to {final_dir}')
  return dataclasses.replace(load_prepared_data(final_dir), legacy_fingerprint=legacy)


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
      shutil.rmtree(os.path.join(final_dir, work_units.UNITS_DIR), ignore_errors=True)  # markers: build-time only
    except OSError:
      if not files.exists(os.path.join(final_dir, META_FILE)):
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
    self.workers = cfg.num_workers if cfg.num_workers > 0 else len(worker_pool.allowed_cores())
    self.units: list[work_units.Unit] = []
    self.seconds: dict[str, float] = {}
    self.tokenizer_file = ''

  def plan(self) -> None:
    t0 = time.time()
    os.makedirs(os.path.join(self.dir, work_units.UNITS_DIR), exist_ok=True)
    if self.process_index == 0:  # half-written files of workers killed mid-unit (their units have no marker)
      for root, _, names in os.walk(self.dir):
        for name in names:
          if '.tmp-' in name:
            os.remove(os.path.join(root, name))
    unit_bytes = self.cfg.unit_mb << 20
    groups = [(g, 'eval' if self.eval_paths else 'corpus')
              for g in corpus_pieces.plan_units(self.train_paths, self.reader, unit_bytes)]
    if not groups:
      raise DataError(f'corpus {self.cfg.train_files!r} has no text')
    if self.eval_paths:
      groups = [(g, 'train') for g, _ in groups]
      eval_groups = corpus_pieces.plan_units(self.eval_paths, self.reader, unit_bytes)
      if not eval_groups:
        raise DataError(f'eval corpus {self.cfg.eval_files!r} has no text')
      groups += [(g, 'eval') for g in eval_groups]
    self.units = [work_units.Unit(i, tuple(g), split) for i, (g, split) in enumerate(groups)]
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
    if self.process_index != 0 or files.exists(path):
      return  # trained by process 0 (others wait at the barrier), or by an earlier attempt
    job = self._job()
    sample = tokenizer_sample.BottomK(self.cfg.tokenizer_sample_sentences)
    for unit_sample in self._map(tokenizer_sample.sample_unit, job, [u for u in self.units if u.split != 'eval'],
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
            if not files.exists(work_units.marker(self.dir, u.index))]
    done = len(self.units[self.process_index::self.process_count]) - len(mine)
    if done:
      self.log(f'prepare: {done} unit(s) already built by an earlier run; building {len(mine)}')
    for _ in self._map(work_units.build_unit, self._job(), mine, None, 'units'):
      pass
    self.seconds['units'] = time.time() - t0

  def manifest(self) -> None:
    if self.process_index != 0:
      return
    t0 = time.time()
    missing = [u.index for u in self.units if not files.exists(work_units.marker(self.dir, u.index))]
    if missing:
      raise DataError(f'units {missing[:5]} of {self.dir} were not built: with several processes, '
                      'data.cache_dir must be one directory all of them share')
    tokenizer = tokenization.load_tokenizer(os.path.join(self.dir, self.tokenizer_file))
    stats, splits = unit_stats.merge_unit_stats(self.dir, self.units, self.vocab_size, tokenizer)
    train_name = f'corpus {self.cfg.train_files!r}'
    if self.cfg.sentence_pairs:
      unit_stats.check_pairs(self.cfg, stats, splits, train_name, bool(self.eval_paths), self.log)
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
                                                                *cache_identity.RECORD_FIELDS)})
    self.seconds['manifest'] = time.time() - t0
    special_text = stats.pop('special_text')  # in build.json: meta.json stays as earlier versions wrote it
    invalid_first = stats.pop('invalid_utf8_first')
    build = dict(workers=self.workers, processes=self.process_count,
                 seconds={k: round(v, 2) for k, v in self.seconds.items()},
                 worker_seconds=stats.pop('worker_seconds', None), special_tokens_as_text=special_text)
    work_units.write_json(os.path.join(self.dir, records.BUILD_FILE), build)
    work_units.write_json(os.path.join(self.dir, META_FILE), meta)  # last: it marks the cache complete
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

  def _job(self) -> work_units.Job:
    c = self.cfg
    return work_units.Job(build_dir=self.dir, reader=self.reader, seed=self.seed, eval_fraction=c.eval_fraction,
                          max_seq_length=c.max_seq_length, short_seq_prob=c.short_seq_prob,
                          dupe_factor=c.dupe_factor, vocab_size=self.vocab_size, objective=c.objective,
                          tokenizer_path=os.path.join(self.dir, self.tokenizer_file) if self.tokenizer_file else '')

  def _map(self, fn, job: work_units.Job, units: Sequence[work_units.Unit], arg, what: str):
    """Yields fn(job, unit, arg) for every unit (any order), in worker processes, with progress (`worker_pool`)."""
    return worker_pool.map_units(fn, job, units, arg, what, workers=self.workers,
                                 first_core=self.process_index * self.workers, log=self.log)


def read_build_info(data_dir: str) -> dict:
  """build.json of a cache: workers, processes, seconds per phase (wall) and per worker step."""
  with files.open(os.path.join(data_dir, records.BUILD_FILE), encoding='utf-8') as f:
    return json.load(f)
