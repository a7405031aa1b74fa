"""The sparse task kind: a SPLADE encoder trained on pairs, run by the one fine-tuning job (`finetuning.job`).

`Sparse` is the task kind (`finetuning.kinds`) of `FinetuneConfig(task='sparse')` (`config.SparseConfig`): the
starting checkpoint's encoder and masked-LM head (`model.sparse_encoder.SparseEncoder`; a fresh head tied to the word
embeddings when the checkpoint has none) under `embedding.splade.SparseRanking` (the ranking loss on dot products of
term weights over the global batch, plus the FLOPS regularisers of queries and documents with their quadratic
warm-up), trained on the pairs of `train_file` with the retrieval kind's reader and batches, and evaluated on the
BEIR-layout set in `beir_dir` by exact dot products of the term weights (`retrieval_eval.evaluate_retrieval`,
normalize=False: corpus blocks of search_block_size texts, split over the mesh): recall@1/@10, MRR@10, nDCG@10
and the mean number of non-zero terms per query and per document.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from flax import nnx
import jax
import numpy as np

from bert_jax import distributed, hardware, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig
from bert_jax.embedding import beir, pairs as pairs_lib
from bert_jax.embedding.retrieval_eval import evaluate_retrieval
from bert_jax.embedding.splade import SparseRanking, regularizer_factor
from bert_jax.errors import ConfigError
from bert_jax.finetuning import retrieval, seeds
from bert_jax.model.attention import describe_attention
from bert_jax.model.sparse_encoder import SparseEncoder
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused

TASK = 'sparse'
MAIN_METRIC = 'eval_ndcg_at_10'


def objective_of(cfg: FinetuneConfig) -> SparseRanking:
  return SparseRanking(temperature=cfg.temperature, query_weight=cfg.query_regularizer_weight,
                       document_weight=cfg.document_regularizer_weight)


def sparse_model(cfg: FinetuneConfig, mesh, total_steps: int) -> StepModel:
  """StepModel(SparseEncoder, SparseRanking) of `cfg`."""
  return _sparse_model(cfg.model, objective_of(cfg), cfg.optim, total_steps, cfg.mesh.rules, mesh)


@reused  # a run of the same model, objective, optimizer, schedule and mesh in this process reuses its steps
def _sparse_model(model_cfg: ModelConfig, objective: SparseRanking, optim_cfg: OptimConfig, total_steps: int,
                  rules: str, mesh) -> StepModel:
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: SparseEncoder(model_cfg, rngs=rngs, platform=platform), objective,
                   optim.make_optimizer(optim_cfg, total_steps), mesh,
                   schedule=optim.learning_rate_schedule(optim_cfg, total_steps),
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                   rules=shd.rules(rules), grad_accum_steps=optim_cfg.grad_accum_steps)


def check_vocabulary(tokenizer, model: ModelConfig, checkpoint: str) -> None:
  """ConfigError unless the tokenizer's vocabulary is the model's: a term weight is indexed by token id."""
  if tokenizer.vocab_size != model.vocab_size:
    raise ConfigError(f'sparse: the tokenizer of {checkpoint} has {tokenizer.vocab_size} tokens but the model '
                      f'{model.vocab_size} word embeddings; SPLADE gives one weight per vocabulary term, so they '
                      'must match (give the tokenizer the model was trained with)')


class Sparse:
  """The task kind of a SPLADE encoder trained on pairs (`finetuning.kinds.TaskKind`)."""

  preparing = 'loading the checkpoint and reading the pairs and the retrieval set'

  @staticmethod
  def runs(task: str) -> bool:
    return task == TASK

  def __init__(self, cfg: FinetuneConfig, evaluation: bool = False):
    retrieval.require_inputs(cfg, TASK, evaluation)
    self.evaluation = evaluation
    self.train: list[pairs_lib.Pair] = []
    self.held_out: beir.BeirSet | None = None

  @staticmethod
  def check_inputs(cfg: FinetuneConfig) -> None:
    """The pairs file (its columns) and the BEIR directory exist and can be read (first lines only)."""
    retrieval.check_pairs_and_beir(cfg, TASK)

  @staticmethod
  def check(cfg: FinetuneConfig, mesh) -> None:
    retrieval.check_lengths_and_batches(cfg, mesh, ('max_seq_length', 'max_query_length'))

  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None:
    del saved
    self.train, self.held_out = retrieval.read_pairs_and_beir(cfg, self.evaluation)

  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> _PreparedRun:
    check_vocabulary(tokenizer, cfg.model, cfg.init_checkpoint)
    return _PreparedRun(cfg, tokenizer, self.train, self.held_out, mesh)

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]:
    del cfg, notes
    return ('encoder + masked-LM head, SPLADE max pooling: a sparse encoder',
            lambda: SparseEncoder(model, rngs=nnx.Rngs(0)))



class SparseBatches(retrieval.RetrievalBatches):
  """The retrieval kind's batches of pairs, each side padded (never packed: the SPLADE max-pooling reads one text
  per row), each with its step's FLOPS warm-up factor (`regularizer_factor`, one value per row: the batch's rows are
  what the mesh splits)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, pack=False, **kwargs)

  def __next__(self) -> dict[str, np.ndarray]:
    factor = regularizer_factor(self.position, self.cfg.regularizer_warmup_steps)
    out = super().__next__()
    out['regularizer_factor'] = np.full(len(out['weights']), factor, np.float32)
    return out


class _PreparedRun:
  """A sparse run's built model and what reads it: batches, evaluation, lines and results."""

  eval_first = True  # the starting encoder's retrieval first (step 0)
  main_metric = MAIN_METRIC

  def __init__(self, cfg: FinetuneConfig, tokenizer, train: Sequence[pairs_lib.Pair], held_out: beir.BeirSet, mesh):
    self.cfg, self.tokenizer, self.train, self.held_out = cfg, tokenizer, train, held_out
    negatives = f' ({len(self.train[0].negatives)} hard negatives each)' if self.train else ''
    reporting.log(f'{TASK}: {len(self.train)} training pairs{negatives}, '
                  f'eval {len(self.held_out.queries)} queries against {len(self.held_out.texts)} passages')
    self.total_steps = cfg.total_steps(len(self.train)) if self.train else 1
    reporting.log(describe_attention(cfg.model, hardware.resolve(mesh=mesh)))
    self.model = sparse_model(cfg, mesh, self.total_steps)
    self.block, self.mesh = distributed.process_batch_block(mesh), mesh

  def starting_weights(self, params: dict[str, Any]) -> dict[str, Any]:
    """The starting checkpoint's encoder, and its masked-LM head when it has one (`finetuning.job`)."""
    if 'mlm' in params:
      return {'bert': params['bert'], 'mlm': params['mlm']}
    reporting.log(f'{TASK}: {self.cfg.init_checkpoint} has no masked-LM head: a fresh one, its decoder the word '
                  'embeddings (tied)')
    return {'bert': params['bert']}

  def batches(self, seed: int, position: int, step: int) -> SparseBatches:
    cfg = self.cfg
    reporting.log(f'seed {seed}: training {self.total_steps - step} of {self.total_steps} steps, batch '
                  f'{cfg.batch_size} pairs ({cfg.optim.grad_accum_steps} micro-batches), {len(self.train)} pairs')
    return SparseBatches(self.train, self.tokenizer, cfg, seed=seed, start=position, block=self.block)

  def weights(self, params, texts: Sequence[str], side: str, limit: int) -> np.ndarray:
    """Term weights [n, V] of `texts` (as queries or passages, cut at `limit` tokens)."""
    return retrieval.embed_texts(self.model, params, self.tokenizer, texts, side, limit, self.cfg.eval_batch_size,
                                 self.block, self.cfg.model.vocab_size)

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    """recall@1/@10, MRR@10 and nDCG@10 by exact dot products, and the mean non-zero terms per query / document."""
    del step, output_dir
    t0, cfg = time.time(), self.cfg
    nonzero = {'query': [0, 0], 'passage': [0, 0]}  # side -> [non-zero terms, texts]

    def counted(side: str, limit: int):
      def fn(texts):
        w = self.weights(params, texts, side, limit)
        nonzero[side][0] += int(np.count_nonzero(w))
        nonzero[side][1] += len(w)
        return w
      return fn

    scores = evaluate_retrieval(
        self.held_out, counted('passage', cfg.max_seq_length), embed_queries=counted('query', cfg.max_query_length),
        batch_size=cfg.eval_batch_size, block_size=cfg.search_block_size, mesh=self.mesh, normalize=False,
        label='evaluating sparse retrieval')
    out = {retrieval.metric_name(k): v for k, v in scores.items()}
    out['eval_query_nonzero'] = nonzero['query'][0] / max(nonzero['query'][1], 1)
    out['eval_document_nonzero'] = nonzero['passage'][0] / max(nonzero['passage'][1], 1)
    return {**out, 'eval_wall_s': time.time() - t0}

  def saved_config(self) -> dict[str, Any]:
    """The workdir's config.json: the config, and how its term weights are made."""
    cfg = self.cfg
    return {'finetune': cfg.to_dict(),
            'task': {'name': TASK, 'kind': TASK, 'num_labels': 0, 'label_names': [],
                     'term_weights': 'splade_max', 'similarity': 'dot'}}

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    return Report(run_dir, label=f'seed {seed}: ', progress_keys=('loss', 'ranking_loss', 'accuracy',
                                                                  'query_nonzero', 'document_nonzero'),
                  eval_keys=(MAIN_METRIC, 'eval_mrr_at_10', 'eval_recall_at_10', 'eval_query_nonzero',
                             'eval_document_nonzero', 'eval_wall_s'),
                  curves_dir=workdir.path, curves_metrics=[MAIN_METRIC],
                  divergence_hint='Lower --config.optim.learning_rate or the regularizer weights')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    workdir.write_results(result, run_dir)
    seeds.log_result(MAIN_METRIC, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s
    return {'task': TASK, 'init_checkpoint': self.cfg.init_checkpoint,
            'qrels_absent': dict(self.held_out.absent), **seeds.summarize(per_run, main_metric=MAIN_METRIC)}
