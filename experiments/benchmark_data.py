"""Benchmarks the data pipeline: preparation MB/s and peak memory, then loader tokens/s; prints tables.

  # Preparation of the enwiki sample with a given tokenizer, 1 and 2 workers, then the loader:
  python experiments/benchmark_data.py --tokenizer=/path/tokenizer.model --workers=1,2
  # A synthetic 1 GB corpus (copies of ../shared/data/enwiki-2015 with per-copy changes):
  python experiments/benchmark_data.py --synthesize_mb=1000 --tokenizer=... --workers=1,2
  # One row per corpus shape (enwiki prose, docs with code, jsonl of long documents) and vocabulary size,
  # 64 MB each, with given SentencePiece models of 8,000 and 30,522 pieces (trained once on all shapes):
  python experiments/benchmark_data.py --shapes=enwiki,docs,jsonl --shape_mb=64 --vocab_sizes=8000,30522 --workers=2
  # SentencePiece training alone, on a sample of 1M sentences:
  python experiments/benchmark_data.py --tokenizer_only=1000000
  # Loader only, over an existing cache:
  python experiments/benchmark_data.py --loader_only=~/.cache/bert_jax/<fingerprint> --batch_size=256 --seq_len=128,512

Without --tokenizer a SentencePiece model is trained first (its time is reported apart).
Every preparation starts from an empty cache under --scratch. numpy only: no jax.
"""

import json
import os
import platform
import shutil

from absl import flags

from bert_jax.config import DataConfig
from bert_jax.data import corpus_files
from bert_jax.errors import BertJaxError, ConfigError

import cli
from tools import data_benchmark as bm

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENWIKI = os.path.join(os.path.dirname(_REPO), 'shared', 'data', 'enwiki-2015')

_CORPUS = flags.DEFINE_string('corpus', _ENWIKI, 'Corpus files (comma-separated files, globs, directories).')
_SYNTH = flags.DEFINE_float('synthesize_mb', 0, 'Instead: copies of --corpus with per-copy changes up to this many MB.')
_TOKENIZER = flags.DEFINE_string('tokenizer', '', 'data.tokenizer (SentencePiece .model or HF WordPiece); '
                                 'empty trains a SentencePiece model of --vocab_size.')
_VOCAB = flags.DEFINE_integer('vocab_size', 30522, 'Vocabulary size (of the given tokenizer, or to train).')
_WORKERS = flags.DEFINE_list('workers', ['1', '2'], 'Preparation worker counts.')
_UNIT_MB = flags.DEFINE_integer('unit_mb', 16, 'data.unit_mb.')
_SAMPLE = flags.DEFINE_integer('sample_sentences', 1_000_000, 'data.tokenizer_sample_sentences.')
_SCRATCH = flags.DEFINE_string('scratch', '/tmp/bert_jax_data_bench', 'Synthetic corpus and caches go here.')
_BATCH = flags.DEFINE_list('batch_size', ['256'], 'Loader global batch sizes.')
_SEQ = flags.DEFINE_list('seq_len', ['128'], 'Loader sequence lengths (each needs its own preparation).')
_LOADER_WORKERS = flags.DEFINE_list('loader_workers', ['0', '1', '2'], 'Loader worker processes (0 = a thread).')
_BATCHES = flags.DEFINE_integer('batches', 200, 'Timed loader batches.')
_PACK = flags.DEFINE_bool('pack', False, 'Time packed batches too.')
_LOADER_ONLY = flags.DEFINE_string('loader_only', '', 'A prepared cache directory: time the loader only.')
_SHAPES = flags.DEFINE_list('shapes', [], f'Instead of --corpus: synthesised corpora of these shapes '
                            f'({", ".join(bm.SHAPES)}), --shape_mb each, a table row per shape and vocabulary size.')
_SHAPE_MB = flags.DEFINE_float('shape_mb', 64, 'With --shapes: MB of each corpus shape.')
_VOCABS = flags.DEFINE_list('vocab_sizes', ['8000', '30522'], 'With --shapes: a SentencePiece model of each size is '
                            'trained once on every shape (or --tokenizer is given, of --vocab_size) and given.')
_SPM_ONLY = flags.DEFINE_integer('tokenizer_only', 0, 'Only time SentencePiece training (--vocab_size pieces) on '
                                 'this many distinct sentences of --corpus (topped up with word-order variants).')


def _ints(flag, minimum: int) -> list[int]:
  """The values of a list flag as integers >= minimum; ConfigError naming the flag otherwise."""
  try:
    values = [int(v) for v in flag.value]
  except ValueError:
    values = []
  if not values or min(values) < minimum:
    raise ConfigError(f'--{flag.name}={",".join(flag.value)}: give comma-separated integers >= {minimum}')
  return values


def _check_flags() -> None:
  for flag, minimum in ((_WORKERS, 0), (_BATCH, 1), (_SEQ, 8), (_LOADER_WORKERS, 0), (_VOCABS, 6)):
    _ints(flag, minimum)
  for flag, positive in ((_SYNTH, False), (_SHAPE_MB, True), (_BATCHES, True), (_SPM_ONLY, False), (_UNIT_MB, True),
                         (_SAMPLE, True), (_VOCAB, True)):
    if flag.value < 0 or (positive and flag.value == 0):
      raise ConfigError(f'--{flag.name}={flag.value} must be {"positive" if positive else ">= 0"}')
  if _LOADER_ONLY.value and not os.path.isfile(os.path.join(_LOADER_ONLY.value, 'meta.json')):
    raise ConfigError(f'--loader_only={_LOADER_ONLY.value} is not a prepared cache directory (no meta.json)')


def main(_):
  _check_flags()
  print(f'machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; python '
        f'{platform.python_version()}')
  if _SPM_ONLY.value:
    sentences, real = bm.tokenizer_sample(corpus_files.resolve_files(_CORPUS.value), _SPM_ONLY.value)
    seconds = bm.time_tokenizer_training(sentences, _VOCAB.value, _SCRATCH.value)
    print(f'SentencePiece training: {len(sentences):,} sentences ({real:,} distinct corpus sentences, the rest '
          f'word-order variants), {_VOCAB.value:,} pieces: {seconds:.1f} s')
    return
  seq_lens = [int(s) for s in _SEQ.value]
  caches = {}
  if _SHAPES.value and not _LOADER_ONLY.value:
    caches = run_shapes(seq_lens)
  elif _LOADER_ONLY.value:
    caches = {int(json.load(open(os.path.join(_LOADER_ONLY.value, 'meta.json')))['data_config']['max_seq_length']):
              _LOADER_ONLY.value}
  else:
    files = corpus_files.resolve_files(_CORPUS.value)
    if _SYNTH.value:
      files = bm.synthesize_corpus(files, os.path.join(_SCRATCH.value, f'corpus_{_SYNTH.value:g}mb'), _SYNTH.value)
    rows = []
    for seq in seq_lens:
      for workers in [int(w) for w in _WORKERS.value]:
        cache = os.path.join(_SCRATCH.value, f'cache_seq{seq}_w{workers}')
        shutil.rmtree(cache, ignore_errors=True)
        cfg = DataConfig(train_files=','.join(files), cache_dir=cache, tokenizer=_TOKENIZER.value,
                         num_workers=workers, unit_mb=_UNIT_MB.value, max_seq_length=seq,
                         max_predictions_per_seq=max(1, seq * 20 // 128),
                         tokenizer_sample_sentences=_SAMPLE.value)
        row = bm.time_prepare(cfg, _VOCAB.value, log=lambda m: print(m, flush=True))
        row.update(seq_len=seq)
        rows.append(row)
        caches[seq] = row['dir']
        print(json.dumps(row), flush=True)
    print('\npreparation (whole process tree):\n')
    print(bm.format_table(rows, ['seq_len', 'workers', 'mb', 'seconds', 'mb_per_s', 'peak_rss_gib', 'train_pairs']))
  loader_rows = []
  for seq, cache in caches.items():
    for b in [int(x) for x in _BATCH.value]:
      for w in [int(x) for x in _LOADER_WORKERS.value]:
        for pack in ([False, True] if _PACK.value else [False]):
          cfg = DataConfig(max_seq_length=seq, max_predictions_per_seq=max(1, seq * 20 // 128), pack=pack)
          row = bm.time_loader(cache, cfg, batch_size=b, workers=w, batches=_BATCHES.value)
          loader_rows.append(row)
          print(json.dumps(row), flush=True)
  print('\nloader:\n')
  print(bm.format_table(loader_rows, ['seq_len', 'batch_size', 'workers', 'pack', 'tokens_per_s', 'batches_per_s']))


_SHAPE_COLUMNS = ['shape', 'vocab', 'seq_len', 'workers', 'mb', 'seconds', 'mb_per_s', 'mb_per_s_per_worker',
                  'peak_rss_gib', 'read_mb_per_s', 'tokenize_mb_per_s', 'pairs_write_mb_per_s', 'train_pairs']


def run_shapes(seq_lens: list[int]) -> dict[int, str]:
  """Prepares every corpus shape with every vocabulary and worker count; prints the table. {seq_len: a cache}."""
  for shape in _SHAPES.value:
    if shape not in bm.SHAPES:
      raise BertJaxError(f'unknown corpus shape {shape!r} in --shapes; expected some of {", ".join(bm.SHAPES)}')
  # Only the enwiki copies and their jsonl need --corpus.
  source = corpus_files.resolve_files(_CORPUS.value) if set(_SHAPES.value) - {'docs'} else []
  files = {shape: bm.shape_corpus(shape, source, os.path.join(_SCRATCH.value, 'corpora'), _SHAPE_MB.value)
           for shape in _SHAPES.value}
  if _TOKENIZER.value:
    tokenizers = {_VOCAB.value: _TOKENIZER.value}
  else:
    tokenizers = {int(v): bm.given_tokenizer(files, int(v), _SCRATCH.value) for v in _VOCABS.value}
  rows, caches = [], {}
  for shape, shape_files in files.items():
    fields = bm.SHAPES[shape][1]
    for vocab, tokenizer in tokenizers.items():
      for seq in seq_lens:
        for workers in [int(w) for w in _WORKERS.value]:
          cache = os.path.join(_SCRATCH.value, f'cache_{shape}_v{vocab}_seq{seq}_w{workers}')
          shutil.rmtree(cache, ignore_errors=True)
          cfg = DataConfig(train_files=','.join(shape_files), cache_dir=cache, tokenizer=tokenizer,
                           num_workers=workers, unit_mb=_UNIT_MB.value, max_seq_length=seq,
                           max_predictions_per_seq=max(1, seq * 20 // 128), **fields)
          row = bm.time_prepare(cfg, vocab, log=lambda m: print(m, flush=True))
          row.update(shape=shape, vocab=vocab, seq_len=seq)
          rows.append(row)
          caches[seq] = row['dir']
          print(json.dumps(row), flush=True)
  print('\npreparation by corpus shape (whole process tree; phase rates are MB per worker-second):\n')
  print(bm.format_table(rows, _SHAPE_COLUMNS))
  return caches


if __name__ == '__main__':
  cli.run(main, multihost=False)
