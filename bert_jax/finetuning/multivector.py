"""The multivector task kind: a ColBERT-style multi-vector encoder trained on pairs, run by the one fine-tuning job.

`MultiVector` is the task kind (`finetuning.kinds`) of `FinetuneConfig(task='multivector')` (`MultiVectorConfig`):
the starting checkpoint's encoder and a token projection (`model.colbert.MultiVectorEncoder`) under
`embedding.late_interaction.MultiVectorObjective` (MaxSim InfoNCE over the global batch, or KL from teacher scores),
trained on the pairs of `train_file` (the retrieval kind's reader and columns: `pairs.read_pairs`), evaluated by
exact MaxSim on the BEIR-layout set in `beir_dir`, streamed over document blocks
(`embedding.multivector_eval.evaluate_multivector`: recall@1/@10, MRR@10, nDCG@10). Token rows (markers, the query's
[MASK] filling, the document's unscored punctuation) are `embedding.late_interaction.MultiVectorInputs`'. config.json's
'task' entry records how the token vectors are made, so `export_hf.py` writes the sentence-transformers
`MultiVectorEncoder` folder of a workdir (`interop.st_multivector`).

Batches: the retrieval kind's (`batching.batch_indices` of the step, `pairs.make_batch`), each text encoded with its
marker; documents padded to `pairs.bucket_width` of the longest (at most document_length), queries to exactly
query_length.
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
from bert_jax.embedding.late_interaction import MultiVectorInputs, MultiVectorObjective, TokenSpec
from bert_jax.embedding.multivector_eval import evaluate_multivector
from bert_jax.finetuning import batching, retrieval, seeds
from bert_jax.model.attention import describe_attention
from bert_jax.model.colbert import MultiVectorEncoder, MultiVectorSpec
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused

TASK = 'multivector'
MAIN_METRIC = 'eval_ndcg_at_10'


def objective_of(cfg: FinetuneConfig) -> MultiVectorObjective:
  return MultiVectorObjective(spec=MultiVectorSpec.of(cfg), loss=cfg.loss, teacher_temperature=cfg.teacher_temperature)


def multivector_model(cfg: FinetuneConfig, mesh, total_steps: int) -> StepModel:
  """StepModel(MultiVectorEncoder, its objective) of `cfg` (its encoder the starting checkpoint's)."""
  return _multivector_model(cfg.model, MultiVectorSpec.of(cfg), objective_of(cfg), cfg.optim, total_steps,
                            cfg.mesh.rules, mesh)


@reused  # a run of the same model, spec, objective, optimizer, schedule and mesh in this process reuses its steps
def _multivector_model(model_cfg: ModelConfig, spec: MultiVectorSpec, objective: MultiVectorObjective,
                       optim_cfg: OptimConfig, total_steps: int, rules: str, mesh) -> StepModel:
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: MultiVectorEncoder(model_cfg, spec, rngs=rngs, platform=platform), objective,
                   optim.make_optimizer(optim_cfg, total_steps), mesh,
                   schedule=optim.learning_rate_schedule(optim_cfg, total_steps),
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                   rules=shd.rules(rules), grad_accum_steps=optim_cfg.grad_accum_steps)


def token_settings(cfg: FinetuneConfig) -> dict[str, Any]:
  """How a run's token vectors are made: config.json's 'task' entry, read back by the export."""
  return {'projection_dim': cfg.projection_dim, 'query_length': cfg.query_length,
          'document_length': cfg.document_length, 'markers': cfg.markers, 'skip_punctuation': cfg.skip_punctuation}


class MultiVector:
  """The task kind of a multi-vector encoder trained on pairs (`finetuning.kinds.TaskKind`)."""

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
    retrieval.check_pairs_and_beir(cfg, TASK)

  @staticmethod
  def check(cfg: FinetuneConfig, mesh) -> None:
    """The projection and the lengths against the model, the batch sizes against the mesh."""
    MultiVectorSpec.of(cfg).check(cfg.model.hidden_size)
    retrieval.check_lengths_and_batches(cfg, mesh, ('query_length', 'document_length'))

  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None:
    """The training pairs (none when only evaluating) and the held-out BEIR set, before the starting weights."""
    del saved
    self.train, self.held_out = retrieval.read_pairs_and_beir(cfg, self.evaluation)

  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> _PreparedRun:
    return _PreparedRun(cfg, tokenizer, self.train, self.held_out, mesh)

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]:
    """What a run of `cfg` trains, in words, and a builder of its model (plan.py: --print_config)."""
    del notes
    spec = MultiVectorSpec.of(cfg)
    return (f'encoder, token vectors projected to {spec.projection_dim}: a multi-vector encoder (MaxSim)',
            lambda: MultiVectorEncoder(model, spec, rngs=nnx.Rngs(0)))


class MultiVectorBatches:
  """This process's block of each training step's batch of pairs, from step `start` on (`train.loop.Batches`)."""

  def __init__(self, train: Sequence[pairs_lib.Pair], rows: MultiVectorInputs, cfg: FinetuneConfig, *, seed: int,
               start: int, block: tuple[int, int]):
    self.train, self.rows, self.cfg, self.seed, self.block = train, rows, cfg, seed, block
    self.ids = pairs_lib.passage_ids(train)
    self.limits = {'passage': cfg.document_length, 'negative': cfg.document_length}
    self.position = start
    self.last_sizes: dict[str, int] | None = None

  def __next__(self) -> dict[str, np.ndarray]:
    cfg = self.cfg
    chosen = batching.batch_indices(len(self.train), cfg.batch_size, self.seed, self.position, cfg.shuffle)
    self.position += 1
    host = pairs_lib.make_batch(self.rows.tokenizer, self.train, self.ids, [int(i) for i in chosen],
                                max_query_length=cfg.query_length, max_passage_length=cfg.document_length,
                                batch_size=cfg.batch_size, encode_side=self.rows.encode)
    pad_to = retrieval._pad_to  # pylint: disable=protected-access
    host = self.rows.finish(pad_to(host, self.limits, self.rows.tokenizer.pad_id))
    masks = [v for k, v in host.items() if k.endswith('_attention_mask')]
    self.last_sizes = {'rows': cfg.batch_size, 'examples': len(chosen),
                       'row_tokens': int(sum(m.size for m in masks)),
                       'real_tokens': int(sum(m[:len(chosen)].sum() for m in masks))}
    return batching.process_block(host, *self.block)

  def close(self) -> None:
    pass


class _PreparedRun:
  """A multivector run's built model and what reads it: batches, evaluation, lines and results."""

  eval_first = True  # the starting encoder (a fresh projection) first: what the training adds is read off
  main_metric = MAIN_METRIC

  def __init__(self, cfg: FinetuneConfig, tokenizer, train: Sequence[pairs_lib.Pair], held_out: beir.BeirSet, mesh):
    self.cfg, self.train, self.held_out = cfg, train, held_out
    self.rows = MultiVectorInputs(tokenizer, TokenSpec.of(cfg))  # ConfigError: a query length below the marker's
    negatives = f' ({len(self.train[0].negatives)} hard negatives each)' if self.train else ''
    if self.train and cfg.loss == 'kl':
      negatives += ', distilled from their teacher scores (kl)'
    reporting.log(f'{TASK}: {len(self.train)} training pairs{negatives}, '
                  f'eval {len(self.held_out.queries)} queries against {len(self.held_out.texts)} passages')
    self.total_steps = cfg.total_steps(len(self.train)) if self.train else 1
    reporting.log(describe_attention(cfg.model, hardware.resolve(mesh=mesh)))
    self.model = multivector_model(cfg, mesh, self.total_steps)
    self.block, self.mesh = distributed.process_batch_block(mesh), mesh

  def batches(self, seed: int, position: int, step: int) -> MultiVectorBatches:
    cfg = self.cfg
    reporting.log(f'seed {seed}: training {self.total_steps - step} of {self.total_steps} steps, batch '
                  f'{cfg.batch_size} pairs ({cfg.optim.grad_accum_steps} micro-batches), {len(self.train)} pairs')
    return MultiVectorBatches(self.train, self.rows, cfg, seed=seed, start=position, block=self.block)

  def token_vectors(self, params, texts: Sequence[str], side: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 token vectors [n, T, D], score masks [n, T]) of at most eval_batch_size `texts` as queries or
    passages ('query' or 'passage')."""
    size = self.cfg.eval_batch_size
    limit = self.cfg.query_length if side == 'query' else self.cfg.document_length
    host = self.rows.rows(texts, side, size, limit)
    batch = self.model.global_batch(batching.process_block(host, *self.block))
    outputs = self.model.predict_step(params, self.model.rest, batch)
    vectors = np.asarray(jax.device_get(outputs['embeddings'][side]))[:len(texts)]
    return vectors, host[f'{side}_score_mask'][:len(texts)]

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    """recall@1/@10, MRR@10 and nDCG@10 by exact MaxSim ('eval_<metric>')."""
    del step, output_dir
    t0 = time.time()
    scores = evaluate_multivector(self.held_out, lambda texts, side: self.token_vectors(params, texts, side),
                                  batch_size=self.cfg.eval_batch_size, mesh=self.mesh)
    return {retrieval.metric_name(k): v for k, v in scores.items()} | {'eval_wall_s': time.time() - t0}

  def saved_config(self) -> dict[str, Any]:
    """The workdir's config.json: the config, and how its token vectors are made."""
    return {'finetune': self.cfg.to_dict(),
            'task': {'name': TASK, 'kind': TASK, 'num_labels': 0, 'label_names': [], 'similarity': 'maxsim',
                     **token_settings(self.cfg)}}

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    return Report(run_dir, label=f'seed {seed}: ', progress_keys=('loss', 'accuracy'),
                  eval_keys=(MAIN_METRIC, 'eval_mrr_at_10', 'eval_recall_at_10', 'eval_wall_s'),
                  curves_dir=workdir.path, curves_metrics=[MAIN_METRIC],
                  divergence_hint='Lower --config.optim.learning_rate or raise --config.temperature')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    workdir.write_results(result, run_dir)
    seeds.log_result(MAIN_METRIC, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s
    return {'task': TASK, 'init_checkpoint': self.cfg.init_checkpoint, 'qrels_absent': dict(self.held_out.absent),
            **seeds.summarize(per_run, main_metric=MAIN_METRIC)}
