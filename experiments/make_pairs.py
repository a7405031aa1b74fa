"""Writes the built-in training pairs of the embedding recipe (docs/embeddings.md) for finetune.py:retrieval.

Stage 1, weak pairs from the pretraining corpus (an article's title -> its first paragraph, a paragraph -> the next):
  python experiments/make_pairs.py --source=enwiki --out=/tmp/pairs_enwiki --max_pairs=20000
Stage 2, SQuAD v1.1 question -> its paragraph, split by article (the last 8 held out as a BEIR-layout set):
  python experiments/make_pairs.py --source=squad --out=/tmp/pairs_squad

Writes OUT/train.jsonl (query, positive) and, for squad, OUT/beir/ (corpus.jsonl, queries.jsonl,
qrels/test.tsv) for --config.beir_dir. The inputs default to ../shared/data beside the checkout (--input: a
SQuAD JSON file, or a directory or comma-separated list of WikiExtractor files). A directory that holds
train.jsonl already is refused: nothing is overwritten. Ends with one JSON line of counts.
"""

import json
import os

from absl import flags

from bert_jax import files
from bert_jax.embedding import sources
from bert_jax.errors import ConfigError

import cli

SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'shared',
                           'data')
DEFAULT_INPUT = {'squad': os.path.join(SHARED_DATA, 'squad-v1.1', 'dev-v1.1.json'),
                 'enwiki': os.path.join(SHARED_DATA, 'enwiki-2015')}

_SOURCE = flags.DEFINE_enum('source', None, sorted(DEFAULT_INPUT), 'Which pairs to write.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Directory for train.jsonl (and beir/ for squad).', required=True)
_INPUT = flags.DEFINE_string('input', None, 'The source files (default: ../shared/data beside the checkout).')
_MAX_PAIRS = flags.DEFINE_integer('max_pairs', 0, 'enwiki: keep this many pairs after a seeded shuffle (0: all).')
_EVAL_ARTICLES = flags.DEFINE_integer('eval_articles', 8, 'squad: the last articles held out as the BEIR set.')
_SEED = flags.DEFINE_integer('seed', 0, 'enwiki: the shuffle.')


def _inputs(value: str) -> list[str]:
  if os.path.isdir(value):
    return sorted(os.path.join(value, n) for n in os.listdir(value) if not n.startswith('.')
                  and os.path.isfile(os.path.join(value, n)) and n not in ('README.md', 'SHA256SUMS'))
  return [p for p in value.split(',') if p]


def main(_):
  given = _INPUT.value or DEFAULT_INPUT[_SOURCE.value]
  paths = _inputs(given)
  missing = [p for p in paths if not os.path.isfile(p)]
  if not paths or missing:
    raise ConfigError(f'--input {", ".join(missing) or given}: no such file (give --input)')
  if _MAX_PAIRS.value < 0:
    raise ConfigError(f'--max_pairs={_MAX_PAIRS.value} must be >= 0')
  train = os.path.join(_OUT.value, 'train.jsonl')
  files.check_output(_OUT.value, 'directory', '--out')
  if os.path.exists(train):
    raise ConfigError(f'{train} exists; give another --out (nothing was written)')
  counts = {}
  if _SOURCE.value == 'squad':
    if len(paths) != 1:
      raise ConfigError('--input for squad is one SQuAD JSON file')
    pairs, beir = sources.squad_pairs(paths[0], _EVAL_ARTICLES.value)
    sources.write_beir(os.path.join(_OUT.value, 'beir'), beir)  # first: train.jsonl marks a finished directory
    counts.update(beir_queries=len(beir.queries), beir_corpus=len(beir.corpus), beir_dir=os.path.join(_OUT.value,
                                                                                                       'beir'))
  else:
    pairs = sources.enwiki_pairs(paths, _MAX_PAIRS.value, _SEED.value)
  counts = {'train_file': train, 'train_pairs': sources.write_pairs(train, pairs), **counts}
  print(json.dumps(counts), flush=True)


if __name__ == '__main__':
  cli.run(main, multihost=False)
