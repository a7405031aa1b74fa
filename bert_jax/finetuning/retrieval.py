"""The retrieval task kind: a bi-encoder trained contrastively or distilled from teacher scores, run by the one
fine-tuning job (`finetuning.job`).

`Retrieval` is the task kind (`finetuning.kinds`) of `FinetuneConfig(task='retrieval')`: the starting checkpoint's
encoder under `Contrastive(spec)` (InfoNCE over the global batch; GradCache with optim.grad_accum_steps > 1) or, with
loss 'margin_mse' or 'kl', `Distillation` (each row's teacher scores of its candidates), trained on the pairs of
`train_file` (`pairs.read_pairs` by query_column / positive_column / negative_columns / score_columns), evaluated by
`retrieval_eval.evaluate_retrieval` on the BEIR-layout set in `beir_dir` (recall@1/@10, MRR@10, nDCG@10 at the full
size and at every Matryoshka size). A seed trains in seed_<n>/ and the workdir's final_metrics.json summarises the
seeds, as every fine-tuning run; config.json records the pooling (its 'task' entry), so the workdir's embeddings
are reproducible.

Batches: step s's pairs are `finetuning.batching.batch_indices(…, s)` (a fresh permutation every epoch), so the
data position is the step and a resumed run continues exactly. With `pack` (the default) every text of the batch is
packed into rows of max_seq_length tokens, several per row, each attending only to itself (`embedding.packed_pairs`):
the row count is rounded to a few sizes, so the train step compiles a handful of times. Without, each side is
padded to `pairs.bucket_width` of its longest text (at most max_query_length for queries, max_seq_length for
passages and negatives): the train step compiles once per width met, and short queries are not padded to a long
max_query_length. Either way the run reports train_padding_fraction. Evaluation pads (one side at a time).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from flax import nnx
import jax
import numpy as np

from bert_jax import distributed, files, hardware, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig
from bert_jax.embedding import beir, packed_pairs, pairs as pairs_lib, sts as sts_lib
from bert_jax.embedding.retrieval_eval import evaluate_retrieval
from bert_jax.embedding.contrastive import Contrastive
from bert_jax.embedding.distillation import Distillation
from bert_jax.model.biencoder import BiEncoder, ContrastiveSpec
from bert_jax.errors import ConfigError, DataError
from bert_jax.data import tables
from bert_jax.finetuning import batching, seeds
from bert_jax.finetuning.tasks import inputs
from bert_jax.model.attention import describe_attention
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim, scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused

TASK = 'retrieval'
MAIN_METRIC = 'eval_ndcg_at_10'


def spec_of(cfg: FinetuneConfig) -> ContrastiveSpec:
  """The contrastive spec of a retrieval config."""
  return ContrastiveSpec.of(cfg)


def objective_of(cfg: FinetuneConfig) -> Contrastive:
  """The objective of a retrieval config's loss: `Contrastive(spec)`, or `Distillation` for 'margin_mse' / 'kl'."""
  spec = spec_of(cfg)
  if cfg.loss == 'contrastive':
    return Contrastive(spec)
  return Distillation(spec, loss=cfg.loss, teacher_temperature=cfg.teacher_temperature)


def pair_columns(cfg: FinetuneConfig) -> pairs_lib.PairColumns:
  """The columns a retrieval config reads from its pairs file."""
  return pairs_lib.PairColumns(cfg.query_column, cfg.positive_column, cfg.negative_column_names(),
                               cfg.score_column_names())


def retrieval_model(cfg: FinetuneConfig, mesh, total_steps: int) -> StepModel:
  """StepModel(BiEncoder, its objective) of `cfg` (its model the starting checkpoint's)."""
  return _retrieval_model(cfg.model, spec_of(cfg), objective_of(cfg), cfg.optim, total_steps, cfg.mesh.rules, mesh)


@reused  # a run of the same model, spec, objective, optimizer, schedule and mesh in this process reuses its steps
def _retrieval_model(model_cfg: ModelConfig, spec: ContrastiveSpec, objective: Contrastive, optim_cfg: OptimConfig,
                     total_steps: int, rules: str, mesh) -> StepModel:
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: BiEncoder(model_cfg, spec, rngs=rngs, platform=platform), objective,
                   optim.make_optimizer(optim_cfg, total_steps), mesh,
                   schedule=optim.learning_rate_schedule(optim_cfg, total_steps),
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                   rules=shd.rules(rules), grad_accum_steps=optim_cfg.grad_accum_steps)


class Retrieval:
  """The task kind of a bi-encoder trained contrastively on pairs (`finetuning.kinds.TaskKind`)."""

  preparing = 'loading the checkpoint and reading the pairs and the retrieval set'

  @staticmethod
  def runs(task: str) -> bool:
    return task == TASK

  def __init__(self, cfg: FinetuneConfig, evaluation: bool = False):
    require_inputs(cfg, TASK, evaluation)
    self.evaluation = evaluation
    self.train: list[pairs_lib.Pair] = []
    self.held_out: beir.BeirSet | None = None
    self.sts: sts_lib.ScoredPairs | None = None

  @staticmethod
  def check_inputs(cfg: FinetuneConfig) -> None:
    """The pairs file (its columns), the BEIR directory and the STS file exist and can be read (first lines only)."""
    check_pairs_and_beir(cfg, TASK)
    names = inputs.column_names(cfg.sts_file) if cfg.sts_file else None
    for column in (c.strip() for c in cfg.sts_columns.split(',')) if names is not None else ():
      tables.find_column(cfg.sts_file, names, column, column, flags='--config.sts_columns')

  @staticmethod
  def check(cfg: FinetuneConfig, mesh) -> None:
    """The config against its model and the mesh."""
    spec_of(cfg).check(cfg.model.hidden_size)  # Matryoshka dims against the hidden size, the temperature's bounds
    check_lengths_and_batches(cfg, mesh, ('max_seq_length', 'max_query_length'))

  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None:
    """The training pairs (none when only evaluating), the held-out BEIR set and the scored pairs (STS), if any:
    read before the starting weights."""
    del saved
    self.train, self.held_out = read_pairs_and_beir(cfg, self.evaluation)
    self.sts = _sts(cfg)

  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> _PreparedRun:
    return _PreparedRun(cfg, tokenizer, self.train, self.held_out, self.sts, mesh)

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]:
    """What a run of `cfg` trains, in words, and a builder of its model (plan.py: --print_config)."""
    del notes
    spec = spec_of(cfg)
    return f'encoder, {cfg.pooling} pooling: a bi-encoder, retrieval', lambda: BiEncoder(model, spec, rngs=nnx.Rngs(0))


# What every kind trained on pairs and evaluated on a BEIR set shares (retrieval, sparse, multivector): its inputs
# required, checked, read, and its lengths and batch sizes checked against the model and the mesh.


def require_inputs(cfg: FinetuneConfig, task: str, evaluation: bool = False) -> None:
  """ConfigError without a train_file (unless only evaluating) or a beir_dir; `task` names the run."""
  if not evaluation and not cfg.train_file:
    raise ConfigError(f'{task}: set --config.train_file to a CSV, TSV, JSONL or Parquet file of pairs '
                      f'(columns {cfg.query_column!r}, {cfg.positive_column!r})')
  if not cfg.beir_dir:
    raise ConfigError(f'{task}: set --config.beir_dir to a BEIR-layout directory (corpus.jsonl, queries.jsonl, '
                      'qrels/<split>.tsv) to evaluate on')


def check_lengths_and_batches(cfg: FinetuneConfig, mesh, lengths: Sequence[str]) -> None:
  """The `lengths` fields against the model's positions, the batch sizes against the mesh and the accumulation."""
  for name in lengths:
    scaffold.check_sequence_length(cfg, name, getattr(cfg, name), cfg.model)
  scaffold.check_batch_sizes(cfg, mesh)
  if cfg.batch_size % cfg.optim.grad_accum_steps:
    raise ConfigError(f'batch_size={cfg.batch_size} must divide into optim.grad_accum_steps='
                      f'{cfg.optim.grad_accum_steps} micro-batches')


def read_pairs_and_beir(cfg: FinetuneConfig, evaluation: bool) -> tuple[list[pairs_lib.Pair], beir.BeirSet]:
  """The training pairs (none when only evaluating; at most max_train_samples) and the held-out BEIR set."""
  train = []
  if not evaluation:
    train = pairs_lib.read_pairs(cfg.train_file, pair_columns(cfg))
    if cfg.max_train_samples > 0:
      train = train[:cfg.max_train_samples]
    if not train:
      raise DataError(f'{cfg.train_file}: no training pairs')
  return train, beir.read_beir(cfg.beir_dir, cfg.beir_split)


def check_pairs_and_beir(cfg: FinetuneConfig, task: str) -> None:
  """The pairs file of a config with the retrieval columns (its columns) and its BEIR directory exist and can be read
  (first lines only); `task` names the run in the errors."""
  require_inputs(cfg, task)
  names = inputs.column_names(cfg.train_file)
  if names is not None:
    pairs_lib.check_columns(cfg.train_file, names, pair_columns(cfg))
  if not files.is_remote(cfg.beir_dir):
    if not files.isdir(cfg.beir_dir):
      raise DataError(f'BEIR directory {cfg.beir_dir} does not exist (it holds corpus.jsonl, queries.jsonl and '
                      'qrels/<split>.tsv)')
    for name, what in (('corpus.jsonl', 'corpus file'), ('queries.jsonl', 'queries file'),
                       (os.path.join('qrels', f'{cfg.beir_split}.tsv'), f'qrels file of beir_split={cfg.beir_split!r}')):
      inputs.first_lines(beir.find(os.path.join(cfg.beir_dir, name)), what, 1)


def embed_texts(model: StepModel, params, tokenizer, texts: Sequence[str], side: str, limit: int, batch_size: int,
                block: tuple[int, int], width: int) -> np.ndarray:
  """The predict step's `embeddings[side]` [n, width] of `texts` (as queries or passages, cut at `limit` tokens),
  `batch_size` at a time, each chunk padded to `pairs.bucket_width` of its longest text."""
  out = []
  for i in range(0, len(texts), batch_size):
    chunk = list(texts[i:i + batch_size])
    rows = [tokenizer.encode_inputs(t, None, max_length=limit)[0] for t in chunk]
    rows += [[tokenizer.pad_id]] * (batch_size - len(chunk))
    bucket = pairs_lib.bucket_width(max(map(len, rows)), limit)
    ids, mask = pairs_lib._pad(rows, bucket, tokenizer.pad_id)  # pylint: disable=protected-access
    host = {f'{side}_input_ids': ids, f'{side}_attention_mask': mask}
    batch = model.global_batch(batching.process_block(host, *block))
    outputs = model.predict_step(params, model.rest, batch)
    out.append(np.asarray(jax.device_get(outputs['embeddings'][side]))[:len(chunk)])
  return np.concatenate(out) if out else np.zeros((0, width), np.float32)


def _sts(cfg: FinetuneConfig) -> sts_lib.ScoredPairs | None:
  if not cfg.sts_file:
    return None
  return sts_lib.read_scored_pairs(cfg.sts_file, tuple(c.strip() for c in cfg.sts_columns.split(',')))


def metric_name(metric: str) -> str:
  """'ndcg@10' -> 'eval_ndcg_at_10' (names that flags, TensorBoard and JSON readers take as they are)."""
  return 'eval_' + metric.replace('@', '_at_')


def _pad_to(batch: dict[str, np.ndarray], limits: dict[str, int], pad_id: int) -> dict[str, np.ndarray]:
  """Each side's token arrays padded (ids with `pad_id`, masks with 0) to `pairs.bucket_width` of their width."""
  out = dict(batch)
  for side, limit in limits.items():
    for name, fill in (('input_ids', pad_id), ('attention_mask', 0)):
      key = f'{side}_{name}'
      if key in out:
        a = out[key]
        width = pairs_lib.bucket_width(a.shape[-1], limit)
        out[key] = np.concatenate([a, np.full(a.shape[:-1] + (width - a.shape[-1],), fill, a.dtype)], axis=-1)
  return out


class RetrievalBatches:
  """This process's block of each training step's batch of pairs, from step `start` on (`train.loop.Batches`):
  packed (`pack`, cfg.pack when None: `packed_pairs`, `rows_multiple` the mesh's batch shards) or each side
  padded."""

  def __init__(self, train: Sequence[pairs_lib.Pair], tokenizer, cfg: FinetuneConfig, *, seed: int, start: int,
               block: tuple[int, int], rows_multiple: int = 1, pack: bool | None = None):
    self.train, self.tokenizer, self.cfg, self.seed, self.block = train, tokenizer, cfg, seed, block
    self.rows_multiple, self.pack = rows_multiple, cfg.pack if pack is None else pack
    self.ids = pairs_lib.passage_ids(train)
    self.limits = {'query': cfg.max_query_length, 'passage': cfg.max_seq_length, 'negative': cfg.max_seq_length}
    self.position = start
    self.last_sizes: dict[str, int] | None = None

  def __next__(self) -> dict[str, np.ndarray]:
    cfg = self.cfg
    # Through the module (not an imported name): a test can stop the run at a step's batch.
    chosen = batching.batch_indices(len(self.train), cfg.batch_size, self.seed, self.position, cfg.shuffle)
    self.position += 1
    if self.pack:
      host = packed_pairs.make_packed_batch(
          self.tokenizer, self.train, self.ids, [int(i) for i in chosen], max_query_length=cfg.max_query_length,
          max_passage_length=cfg.max_seq_length, batch_size=cfg.batch_size,
          micro_batches=cfg.optim.grad_accum_steps, rows_multiple=self.rows_multiple)
      self.last_sizes = {'rows': host['input_ids'].shape[0], 'examples': len(chosen),
                         'row_tokens': int(host['input_ids'].size), 'real_tokens': packed_pairs.real_tokens(host),
                         'unpacked_tokens': self._padded_tokens(host, len(chosen))}
      return batching.process_block(host, *self.block)
    host = pairs_lib.make_batch(self.tokenizer, self.train, self.ids, [int(i) for i in chosen],
                                max_query_length=cfg.max_query_length, max_passage_length=cfg.max_seq_length,
                                batch_size=cfg.batch_size)
    host = _pad_to(host, self.limits, self.tokenizer.pad_id)
    masks = [v for k, v in host.items() if k.endswith('_attention_mask')]
    self.last_sizes = {'rows': cfg.batch_size, 'examples': len(chosen),
                       'row_tokens': int(sum(m.size for m in masks)),
                       'real_tokens': int(sum(m[:len(chosen)].sum() for m in masks))}
    return batching.process_block(host, *self.block)

  def _padded_tokens(self, host: dict[str, np.ndarray], count: int) -> int:
    """The tokens of the same batch padded (pack=False): each side's rows at the bucket of its longest text."""
    total = 0
    for side, limit in self.limits.items():
      if f'{side}_row' in host:
        n = packed_pairs.lengths(host, side, self.cfg.optim.grad_accum_steps)[:count]
        total += host[f'{side}_row'].size * pairs_lib.bucket_width(int(n.max()), limit)
    return total

  def close(self) -> None:
    pass


class _PreparedRun:
  """A retrieval run's built model and what reads it: batches, evaluation, lines and results."""

  eval_first = True  # the starting encoder's retrieval first (step 0): what the training adds is read off
  main_metric = MAIN_METRIC

  def __init__(self, cfg: FinetuneConfig, tokenizer, train: Sequence[pairs_lib.Pair], held_out: beir.BeirSet,
               sts: sts_lib.ScoredPairs | None, mesh):
    self.cfg, self.tokenizer, self.train, self.held_out, self.sts = cfg, tokenizer, train, held_out, sts
    negatives = f' ({len(self.train[0].negatives)} hard negatives each)' if self.train else ''
    if self.train and cfg.loss != 'contrastive':
      negatives += f', distilled from their teacher scores ({cfg.loss})'
    reporting.log(f'{TASK}: {len(self.train)} training pairs{negatives}, '
                  f'eval {len(self.held_out.queries)} queries against {len(self.held_out.texts)} passages')
    self.total_steps = self.cfg.total_steps(len(self.train)) if self.train else 1
    reporting.log(describe_attention(self.cfg.model, hardware.resolve(mesh=mesh)))
    self.model = retrieval_model(self.cfg, mesh, self.total_steps)
    self.block, self.mesh = distributed.process_batch_block(mesh), mesh
    self.dims = self.cfg.retrieval_dims()

  def batches(self, seed: int, position: int, step: int) -> RetrievalBatches:
    cfg = self.cfg
    reporting.log(f'seed {seed}: training {self.total_steps - step} of {self.total_steps} steps, batch '
                  f'{cfg.batch_size} pairs ({cfg.optim.grad_accum_steps} micro-batches), {len(self.train)} pairs, '
                  f'{"packed" if cfg.pack else "padded"} rows')
    return RetrievalBatches(self.train, self.tokenizer, cfg, seed=seed, start=position, block=self.block,
                            rows_multiple=shd.num_batch_shards(self.mesh))

  def embed(self, params, texts: Sequence[str], side: str, limit: int) -> np.ndarray:
    """Normalised embeddings [n, D] of `texts` (as queries or passages, cut at `limit` tokens), eval_batch_size at
    a time, each chunk padded to `pairs.bucket_width` of its longest text."""
    return embed_texts(self.model, params, self.tokenizer, texts, side, limit, self.cfg.eval_batch_size,
                       self.block, self.cfg.model.hidden_size)

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    """recall@1/@10, MRR@10 and nDCG@10 ('eval_<metric>', 'eval_<metric>_dim<d>' per Matryoshka size and
    'eval_<metric>_<precision>' per quantized precision)."""
    del step, output_dir  # no predictions are written yet
    t0 = time.time()
    hidden = self.cfg.model.hidden_size
    # One batch of eval_batch_size texts per call: the progress lines count every batch.
    scores = evaluate_retrieval(
        self.held_out, lambda texts: self.embed(params, texts, 'passage', self.cfg.max_seq_length),
        embed_queries=lambda texts: self.embed(params, texts, 'query', self.cfg.max_query_length),
        batch_size=self.cfg.eval_batch_size, dims=tuple(d for d in self.dims if d != hidden), mesh=self.mesh,
        precisions=self.cfg.eval_precision_names())
    out = {metric_name(k): v for k, v in scores.items() if k not in ('matryoshka', 'precision')}
    for d, per_dim in (scores.get('matryoshka') or {}).items():
      out.update({f'{metric_name(k)}_dim{d}': v for k, v in per_dim.items()})
    for p, per_precision in (scores.get('precision') or {}).items():
      out.update({f'{metric_name(k)}_{p}': v for k, v in per_precision.items()})
    if self.sts is not None:  # both sentences embedded as passages (one encoder, the passage length)
      out['eval_sts_spearman'] = sts_lib.sts_spearman(
          self.sts, lambda texts: self.embed(params, texts, 'passage', self.cfg.max_seq_length))
    return {**out, 'eval_wall_s': time.time() - t0}

  def saved_config(self) -> dict[str, Any]:
    """The workdir's config.json: the config, and how its embeddings are made (pooling, normalised, sizes)."""
    cfg = self.cfg
    return {'finetune': cfg.to_dict(),
            'task': {'name': TASK, 'kind': TASK, 'num_labels': 0, 'label_names': [],
                     'pooling': cfg.pooling, 'normalize': True, 'matryoshka_dims': list(cfg.retrieval_dims()),
                     'similarity': 'cosine'}}

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    return Report(run_dir, label=f'seed {seed}: ', progress_keys=('loss', 'accuracy', 'temperature'),
                  eval_keys=(MAIN_METRIC, 'eval_mrr_at_10', 'eval_recall_at_10', 'eval_wall_s'),
                  curves_dir=workdir.path, curves_metrics=[MAIN_METRIC],
                  divergence_hint='Lower --config.optim.learning_rate or raise --config.temperature')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    workdir.write_results(result, run_dir)  # the training loop drew the curves when it ended
    seeds.log_result(MAIN_METRIC, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s
    # The qrels rows naming ids the BEIR set lacks (beir.BeirSet.absent): skipped queries, unretrievable documents.
    return {'task': TASK, 'init_checkpoint': self.cfg.init_checkpoint, 'pooling': self.cfg.pooling,
            'qrels_absent': dict(self.held_out.absent), **seeds.summarize(per_run, main_metric=MAIN_METRIC)}
