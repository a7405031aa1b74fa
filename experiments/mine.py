"""Hard negatives for a pairs file, mined with an embedding model (bert_jax/embedding/mining.py: the semantics are
sentence-transformers' `util.mine_hard_negatives`).

  python experiments/mine.py --model=PATH --train_file=pairs.jsonl --output=mined.jsonl \
      --num_negatives=3 --range_min=2 --range_max=50 --sampling=top
  python experiments/mine.py --model=PATH --train_file=pairs.jsonl --corpus_file=corpus.jsonl \
      --output=mined.jsonl --relative_margin=0.05 --sampling=random --seed=1 --scores
  python experiments/mine.py ... --layout=pairs --output=labelled.jsonl   # (query, passage, label) rows

PATH is any embedding model: a sentence-transformers or Hugging Face directory, a retrieval workdir
(finetune.py:retrieval) or another bert_jax workdir; its pooling, normalisation and length are its own
(experiments/embed.py says how), the flags --pooling, --normalize and --max_length win when given.

The pairs file (CSV, TSV, JSONL or Parquet, compressed or not, local or gs://) has a query and a positive column;
a query on several rows has several positives, and none of them is ever its negative. The corpus is the file's
positives (deduplicated), or --corpus_file's --corpus_column (every positive must be in it).

--layout=negatives (default) writes one JSONL row per input row: {"query", "positive", "negatives": [K texts]}
(+ "scores": [the positive's, then each negative's] with --scores), what finetune.py:retrieval reads with
--config.negative_columns=negatives (and distils with --config.score_columns=scores --config.loss=margin_mse or
kl), and finetune.py:rerank reads as groups (a listwise loss; with --config.score_column=scores the teacher's). A
row whose query has fewer than K negatives left in the window (after the margins) is skipped, counted in a warning
line and in the summary (an error when no row is left).
--layout=pairs writes labelled (query, passage, label) rows for a cross-encoder (+ "score" with --scores): each
positive (1), then each negative found (0).

Resuming: embedded blocks of --block_size texts are kept in --cache_dir (default OUTPUT.cache beside the output),
named by a digest of the model's weights, its embedding settings and the block's texts, each written atomically;
after a kill (-9 or SIGTERM) the same command embeds only what was not finished and writes the same output. The
output is written atomically at the end, then the cache is removed (--keep_cache keeps it). An existing output is
refused unless --overwrite. Ends by printing one JSON line of counts.
"""

import hashlib
import json
import sys
import time

from absl import flags
import jax
import numpy as np

from bert_jax import files, inference
from bert_jax.data import tables
from bert_jax.embedding import mining, pairs as pairs_lib, search
from bert_jax.errors import ConfigError, DataError
from bert_jax.interop import pretrained
from bert_jax.runs import reporting

import cli

_MODEL = flags.DEFINE_string('model', None, 'The embedding model: HF or sentence-transformers directory, or a '
                             'bert_jax workdir.', required=True)
_TRAIN_FILE = flags.DEFINE_string('train_file', None, 'The pairs: CSV, TSV, JSONL or Parquet.', required=True)
_CORPUS_FILE = flags.DEFINE_string('corpus_file', None, "Passages to mine from (default: the pairs' positives).")
_CORPUS_COLUMN = flags.DEFINE_string('corpus_column', 'text', "--corpus_file's column of passages.")
_OUTPUT = flags.DEFINE_string('output', None, 'The JSONL file to write (.gz, .bz2, .xz: compressed).',
                              required=True)
_LAYOUT = flags.DEFINE_enum('layout', 'negatives', mining.LAYOUTS, 'negatives: {query, positive, negatives}; '
                            'pairs: {query, passage, label}.')
_NUM_NEGATIVES = flags.DEFINE_integer('num_negatives', 3, 'Negatives per query (K).')
_RANGE_MIN = flags.DEFINE_integer('range_min', 2, 'Skip this many best candidates.')
_RANGE_MAX = flags.DEFINE_integer('range_max', 50, 'The last rank a negative may have.')
_SAMPLING = flags.DEFINE_enum('sampling', 'top', mining.SAMPLINGS, 'top: the first K of the window; random: K '
                              'drawn from it (--seed).')
_SEED = flags.DEFINE_integer('seed', 0, 'The random sampling.')
_ABSOLUTE_MARGIN = flags.DEFINE_float('absolute_margin', None, "Keep a negative only when its score + m <= the "
                                      "query's lowest positive score.")
_RELATIVE_MARGIN = flags.DEFINE_float('relative_margin', None, 'Keep a negative only when its score <= s+ - |s+| * m '
                                      "(s+: the query's lowest positive score).")
_MAX_SCORE = flags.DEFINE_float('max_score', None, 'Keep a negative only when it scores at most this.')
_MIN_SCORE = flags.DEFINE_float('min_score', None, 'Keep a negative only when it scores at least this.')
_SCORES = flags.DEFINE_boolean('scores', False, "Write each row's scores (for distillation).")
_QUERY_COLUMN = flags.DEFINE_string('query_column', 'query', 'The pairs file\'s query column.')
_POSITIVE_COLUMN = flags.DEFINE_string('positive_column', 'positive', 'The pairs file\'s positive column.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Texts per encoder call.')
_BLOCK_SIZE = flags.DEFINE_integer('block_size', search.DEFAULT_BLOCK_SIZE, 'Texts embedded, cached and searched '
                                   'at a time.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', None, "Tokens per text (default: the model's).")
_POOLING = flags.DEFINE_enum('pooling', None, inference.POOLINGS, "Pooling (default: the model's).")
_NORMALIZE = flags.DEFINE_boolean('normalize', None, "L2-normalise (default: the model's).")
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, 'Where embedded blocks are kept until the output is written '
                                 '(default: OUTPUT.cache).')
_KEEP_CACHE = flags.DEFINE_boolean('keep_cache', False, 'Keep --cache_dir after the output is written.')
_OVERWRITE = flags.DEFINE_boolean('overwrite', False, 'Replace an existing --output.')


def _read_pairs(path: str) -> list[pairs_lib.Pair]:
  names = tables.column_names(path)
  if not names:  # an empty file: the reader says so
    return pairs_lib.read_pairs(path)
  for flag, column in (('query_column', _QUERY_COLUMN.value), ('positive_column', _POSITIVE_COLUMN.value)):
    if column not in names:
      raise DataError(f'{path}:1: no column {column!r}; the file has {", ".join(map(repr, names)) or "none"} (set '
                      f'--{flag})')
  return pairs_lib.read_pairs(path, pairs_lib.PairColumns(_QUERY_COLUMN.value, _POSITIVE_COLUMN.value))


def _read_corpus(path: str) -> list[str]:
  names, records = tables.records(path, 'corpus file')
  if _CORPUS_COLUMN.value not in names:
    raise DataError(f'{path}:1: no column {_CORPUS_COLUMN.value!r}; the file has '
                    f'{", ".join(map(repr, names)) or "none"} (set --corpus_column)')
  return [tables.text_at(path, line, record, _CORPUS_COLUMN.value) for line, record in records]


def _identity(model, settings) -> str:
  """The model's weights and embedding settings, as a digest: what an embedded block depends on."""
  digest = hashlib.sha256()
  for path, leaf in sorted(jax.tree_util.tree_leaves_with_path(model.params), key=lambda x: jax.tree_util.keystr(x[0])):
    array = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f'{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}'.encode())
    digest.update(array.tobytes())
  digest.update(json.dumps([settings.pooling, settings.normalize, settings.max_seq_length]).encode())
  return digest.hexdigest()


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the summary line
  start = time.time()
  spec = mining.MiningSpec(
      num_negatives=_NUM_NEGATIVES.value, range_min=_RANGE_MIN.value, range_max=_RANGE_MAX.value,
      absolute_margin=_ABSOLUTE_MARGIN.value, relative_margin=_RELATIVE_MARGIN.value, max_score=_MAX_SCORE.value,
      min_score=_MIN_SCORE.value, sampling=_SAMPLING.value, seed=_SEED.value)
  if _BATCH_SIZE.value < 1 or _BLOCK_SIZE.value < 1:
    raise ConfigError('--batch_size and --block_size must be positive')
  output = _OUTPUT.value
  files.check_output(output, 'file')
  if files.exists(output) and not _OVERWRITE.value:
    raise ConfigError(f'{output} exists; give another --output or --overwrite (nothing was written)')
  # Bad input fails before the (slow) model load.
  train = _read_pairs(_TRAIN_FILE.value)
  corpus = _read_corpus(_CORPUS_FILE.value) if _CORPUS_FILE.value else None
  corpus_name = f'the corpus {_CORPUS_FILE.value}' if _CORPUS_FILE.value else f'the corpus of {_TRAIN_FILE.value}'
  mining.prepare(train, spec, corpus, corpus_name, _TRAIN_FILE.value)
  pretrained.describe(_MODEL.value, 'model').check_weights()
  model = pretrained.load_encoder(_MODEL.value)
  settings = inference.embedding_settings(_MODEL.value, model, pooling=_POOLING.value, normalize=_NORMALIZE.value,
                                          max_length=_MAX_LENGTH.value)

  truncated = [0, 0]  # texts cut to max_length, texts embedded: one warning at the end, not one per call

  def count(cut, texts):
    truncated[0] += cut
    truncated[1] += texts

  def embed(texts):
    return inference.embed(model, [(t, None) for t in texts], max_length=settings.max_seq_length,
                           batch_size=_BATCH_SIZE.value, pooling=settings.pooling, normalize=settings.normalize,
                           progress=False, sentence_only=True, on_truncated=count)['sentence_embedding']

  cache_dir = _CACHE_DIR.value or output + '.cache'
  cache = mining.BlockCache(cache_dir, _identity(model, settings))
  mesh = jax.make_mesh((jax.device_count(),), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  mined = mining.mine(train, embed, spec, corpus=corpus, block_size=_BLOCK_SIZE.value,
                      batch_size=_BATCH_SIZE.value * 8, mesh=mesh, cache=cache,
                      corpus_name=corpus_name, pairs_name=_TRAIN_FILE.value)
  stats = mined.stats
  if truncated[0]:
    reporting.log(f'warning: {truncated[0]} of the {truncated[1]} texts embedded in this run were longer than '
                  f'max_length={settings.max_seq_length} tokens and were truncated')
  if _LAYOUT.value == 'negatives':
    if stats['short_rows'] == len(train):
      raise DataError(f'no query has {spec.num_negatives} negatives left in the rank window '
                      f'({spec.range_min}, {spec.range_max}] after the filters (removed: {stats["removed"]}): widen '
                      'the window or loosen the margins (nothing was written)')
    rows = mined.negative_rows(train, _SCORES.value)
  else:
    rows = mined.pair_rows(_SCORES.value)
  if stats['short_rows']:
    reporting.log(f'warning: {stats["short_queries"]} of {stats["queries"]} queries ({stats["short_rows"]} rows) have '
                  f'fewer than {spec.num_negatives} negatives left in the window after the filters (removed: '
                  f'{stats["removed"]})' + ('; their rows are skipped' if _LAYOUT.value == 'negatives' else
                                            '; their pairs hold the negatives found'))
  mining.write_jsonl(output, rows)
  if not _KEEP_CACHE.value:
    cache.remove()
  print(json.dumps({'output': output, 'layout': _LAYOUT.value, 'written': len(rows), **stats,
                    'cached_blocks_read': cache.hits, 'pooling': settings.pooling, 'normalize': settings.normalize,
                    'max_length': settings.max_seq_length, 'seconds': round(time.time() - start, 2)}), flush=True)


if __name__ == '__main__':
  cli.run(main, multihost=False)
