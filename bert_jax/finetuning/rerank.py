"""The rerank task kind: a cross-encoder, run by the one fine-tuning job (`finetuning.job`).

`Rerank` is the task kind (`finetuning.kinds`) of `FinetuneConfig(task='rerank')` (`config.task_configs.
RerankConfig`): BERT reads a query and a passage together as one sentence pair ([CLS] q [SEP] p [SEP], token types
0 then 1) and one logit on [CLS] scores the pair (`model.heads`' regression head, num_labels 1). Its training rows
are the (query, passage, label) or (query, passage, score) rows of train_file (CSV, TSV, JSONL, Parquet; the layout
`experiments/mine.py --layout=pairs` writes), read by `data.tables`, or groups (query, positive, [negatives…],
optionally [teacher scores]: `--layout=negatives`, `finetuning.rerank_groups`; a file with negatives_column and no
passage_column). The loss (`loss_of`) is binary cross-entropy with logits on 0/1 labels (label_column; a group's
positive 1, its negatives 0), squared error on teacher scores (score_column), or listwise: softmax cross-entropy over
each group's logits (with teacher scores the KL divergence to their softmax), every group of a batch whole and
batch_size counting groups.

Rows are tokenized once into head-task `Feature`s and PACKED into rows of max_seq_length tokens with per-example
attention (`finetuning.batching`, as every head task): no compute is spent on padding. The query is cut to
max_query_length tokens (at a word boundary), the pair to max_seq_length (longest first).

Evaluation:
  with beir_dir and first_stage: each query's top rerank_top_k of the first stage (`embedding.first_stage`: an
    embedding model directory, which embeds the BEIR set's queries and corpus once and searches exactly; or a TREC
    run file, read with the BEIR set before the weights) are scored by the cross-encoder and reordered
    (`rerank_first_stage`, which experiments/rerank.py calls too); nDCG@10, MRR@10 and recall@rerank_top_k before
    ('eval_first_stage_*') and after ('eval_*') reranking (`embedding.ranking`); main metric eval_ndcg_at_10.
  without: eval_fraction of the rows held out (split_seed): eval_loss, and eval_accuracy (labels; the main metric)
    or eval_spearman (scores; the main metric); groups (held out whole): eval_loss, eval_mrr_at_10 (the positive's
    rank among its group; the main metric) and eval_top1_accuracy.

A step's batch is `batching.batch_indices(…, step)` of the training features, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any, Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import distributed, files, hardware, metrics, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig
from bert_jax.data import tables
from bert_jax.embedding import beir, first_stage, ranking, trec
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning import batching, rerank_groups, seeds
from bert_jax.finetuning.head_objective import MODEL_INPUTS
from bert_jax.finetuning.predictor import Predictor
from bert_jax.finetuning.rerank_groups import RerankGroup
from bert_jax.finetuning.tasks import inputs
from bert_jax.finetuning.tasks.base import Feature
from bert_jax.model.attention import describe_attention
from bert_jax.model.heads import BertForSequenceClassification
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim, scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused

TASK = 'rerank'
KIND = 'regression'  # the batching's and the head's kind: one float target per example, one logit


@dataclasses.dataclass(frozen=True)
class RerankPair:
  query: str
  passage: str
  target: float  # the 0/1 label or the teacher score
  line: int = 0


# --- the objective -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RerankObjective:
  """The `Objective` of the cross-encoder: binary cross-entropy with logits on 0/1 labels ('bce') or squared error
  on teacher scores ('mse'), over real examples (weights 1; padding examples 0); or 'listwise' over whole groups
  (`rerank_groups.listwise_losses`: labels are target probabilities, `group_ids` each example's group), its count
  the groups (the targets sum to 1 over each)."""

  loss: str = 'bce'
  terms: tuple[str, ...] = ('task',)
  couples_rows: bool = False  # each example's loss is its own: micro-batch losses add up

  def forward(self, module, batch, *, deterministic: bool):
    """Logits [E, 1]."""
    return module(*(batch[k] for k in MODEL_INPUTS), deterministic=deterministic)

  def losses(self, logits, batch) -> jax.Array:
    target = batch['labels'].astype(jnp.float32)
    if self.loss == 'listwise':
      return rerank_groups.listwise_losses(logits[:, 0].astype(jnp.float32), target, batch['group_ids'],
                                           batch['weights'])
    if self.loss == 'mse':
      return jnp.square(logits[:, 0] - target)
    return optax.sigmoid_binary_cross_entropy(logits[:, 0], target)

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    w = batch['weights'].astype(jnp.float32)
    return {'task_loss_sum': jnp.sum(self.losses(outputs, batch) * w), 'task_count': self.counts(batch)['task']}

  def counts(self, batch) -> dict[str, jax.Array]:
    w = batch['weights'].astype(jnp.float32)
    return {'task': jnp.sum(w * batch['labels'].astype(jnp.float32)) if self.loss == 'listwise' else jnp.sum(w)}

  def summarize(self, sums) -> dict[str, Any]:
    return {'loss': sums['task_loss_sum'] / jnp.maximum(sums['task_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)


def loss_of(cfg: FinetuneConfig, groups: bool) -> str:
  """cfg.loss, or the one its training rows imply: groups 'listwise', pairs with score_column 'mse', else 'bce'."""
  return cfg.loss or ('listwise' if groups else 'mse' if cfg.uses_scores() else 'bce')


@reused  # a run of the same model, loss, optimizer, schedule and mesh in this process reuses its steps
def _rerank_model(model_cfg: ModelConfig, loss: str, optim_cfg: OptimConfig, total_steps: int, rules: str,
                  mesh) -> StepModel:
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: BertForSequenceClassification(model_cfg, 1, rngs=rngs, platform=platform),
                   RerankObjective(loss), optim.make_optimizer(optim_cfg, total_steps), mesh,
                   schedule=optim.learning_rate_schedule(optim_cfg, total_steps),
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                   rules=shd.rules(rules), grad_accum_steps=optim_cfg.grad_accum_steps)


def rerank_model(cfg: FinetuneConfig, loss: str, mesh, total_steps: int) -> StepModel:
  """StepModel(one-logit sequence head, RerankObjective(loss)) of `cfg` (its model the starting checkpoint's)."""
  return _rerank_model(cfg.model, loss, cfg.optim, total_steps, cfg.mesh.rules, mesh)


# --- the rows ------------------------------------------------------------------------------------------------------

def _columns(cfg: FinetuneConfig) -> tuple[str, ...]:
  return (cfg.query_column, cfg.passage_column, cfg.score_column if cfg.uses_scores() else cfg.label_column)


def _flags(cfg: FinetuneConfig) -> str:
  target = '--config.score_column' if cfg.uses_scores() else '--config.label_column'
  return f'--config.query_column, --config.passage_column, {target}'


def check_columns(path: str, names: Sequence[str], cfg: FinetuneConfig) -> None:
  """DataError for a column of the file's layout (pairs or groups: `rerank_groups.is_groups`) that it lacks, or
  for loss='listwise' on pairs."""
  groups = rerank_groups.is_groups(cfg, names)
  if cfg.loss == 'listwise' and not groups:
    raise DataError(f"{path}: loss='listwise' scores groups, but the file has no column {cfg.negatives_column!r} "
                    '(groups: query, positive, negatives; set --config.negatives_column) or has '
                    f'{cfg.passage_column!r} (pairs)')
  for column in rerank_groups.columns(cfg) if groups else _columns(cfg):
    if column not in names:
      raise tables.missing_column(path, column, names, rerank_groups.flags(cfg) if groups else _flags(cfg))


def _target(path: str, line: int, value: Any, cfg: FinetuneConfig) -> float:
  if cfg.uses_scores():
    try:
      score = float(value)
    except (TypeError, ValueError):
      score = math.nan
    if isinstance(value, bool) or not math.isfinite(score):
      raise DataError(f'{path}:{line}: {cfg.score_column!r} must be a finite number (a teacher score), got {value!r}')
    return score
  label = {0: 0.0, 1: 1.0, '0': 0.0, '1': 1.0, 'false': 0.0, 'true': 1.0}.get(
      value.strip().lower() if isinstance(value, str) else value)
  if label is None or isinstance(value, float) and value not in (0.0, 1.0):
    raise DataError(f'{path}:{line}: {cfg.label_column!r} must be 0 or 1, got {value!r} (teacher scores: set '
                    '--config.score_column)')
  return label


def read_rows(cfg: FinetuneConfig) -> list[RerankPair] | list[RerankGroup]:
  """The (query, passage, target) rows of train_file, or its groups (`rerank_groups.read_groups`); DataError naming
  the file and line of a bad row."""
  path = cfg.train_file
  names, records = tables.records(path, 'training file')
  check_columns(path, names, cfg)
  if rerank_groups.is_groups(cfg, names):
    return rerank_groups.read_groups(path, records, cfg)
  target = _columns(cfg)[2]
  return [RerankPair(tables.text_at(path, line, r, cfg.query_column), tables.text_at(path, line, r, cfg.passage_column),
                     _target(path, line, tables.value_at(path, line, r, target), cfg), line)
          for line, r in records]


def split_rows(rows: Sequence[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
  """(training rows, held-out rows): `fraction` of the rows (pairs or groups; at least one when > 0) drawn with
  `seed`."""
  if fraction <= 0 or len(rows) < 2:
    return list(rows), []
  held = max(1, int(round(len(rows) * fraction)))
  order = np.random.default_rng(seed).permutation(len(rows))
  chosen = set(order[:held].tolist())
  return [r for i, r in enumerate(rows) if i not in chosen], [r for i, r in enumerate(rows) if i in chosen]


def _cut_query(tokenizer, query: str, limit: int) -> str:
  """`query`, or its longest word prefix of at most `limit` tokens ([CLS] and [SEP] included; one word at least)."""
  if not tokenizer.encode_inputs(query, None, max_length=limit)[2]:
    return query
  words = query.split()
  lo, hi = 1, len(words)  # the longest prefix that fits, by bisection
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if tokenizer.encode_inputs(' '.join(words[:mid]), None, max_length=limit)[2]:
      hi = mid - 1
    else:
      lo = mid
  return ' '.join(words[:lo])


def pair_feature(tokenizer, query: str, passage: str, target: float, *, max_query_length: int,
                 max_seq_length: int) -> Feature:
  """[CLS] q [SEP] p [SEP] with token types 0/1 (the tokenizer's pair template), the query first cut to
  max_query_length tokens, the pair to max_seq_length (longest first)."""
  ids, types, _ = tokenizer.encode_inputs(_cut_query(tokenizer, query, max_query_length), passage,
                                          max_length=max_seq_length)
  return Feature(np.asarray(ids, np.int32), np.asarray(types, np.int32), label=float(target))


def features(tokenizer, rows: Sequence[RerankPair] | Sequence[RerankGroup], cfg: FinetuneConfig,
             loss: str) -> list[Feature]:
  """The pairs' features; a group's passages' in order, each with its target (`rerank_groups.targets`)."""
  pair = functools.partial(pair_feature, tokenizer, max_query_length=cfg.max_query_length,
                           max_seq_length=cfg.max_seq_length)
  if rows and isinstance(rows[0], RerankGroup):
    return [pair(g.query, p, t) for g in rows
            for p, t in zip(g.passages, rerank_groups.targets(g, loss, cfg.teacher_temperature))]
  return [pair(r.query, r.passage, r.target) for r in rows]


# --- predictions --------------------------------------------------------------------------------------------------

class Predictions:
  """experiments/predict.py on a reranker (`finetuning.predict` asks the kind): a (query, passage) pair per row,
  scored as training and evaluation score it (`pair_feature`, packed). Each row's 'score' is the logit; a model
  trained with binary cross-entropy also gives 'probability', its sigmoid (sentence-transformers'
  CrossEncoder.predict gives the same two: with an identity activation, and by default)."""

  @staticmethod
  def row(text: str | None, text_pair: str | None, where: str = '') -> dict[str, str]:
    if not (isinstance(text, str) and text.strip() and isinstance(text_pair, str) and text_pair.strip()):
      raise DataError(f'{where}: ' * bool(where) + 'a reranker scores (query, passage) pairs: give both (--text=QUERY '
                      '--text_pair=PASSAGE, or query<TAB>passage per line of --input)')
    return {'query': text, 'passage': text_pair}

  @staticmethod
  def read_rows(path: str, fmt: str, cfg: FinetuneConfig) -> list[dict[str, str]]:
    """A table (CSV, TSV, JSONL, Parquet: by the run's query_column and passage_column, as it trained; a label or
    score column is not needed), or plain text ('txt', or a TSV without those columns): query<TAB>passage per
    line."""
    table = tables.FORMATS.get(tables.extension(path))
    if fmt in ('auto', 'jsonl', 'tsv') and table and (table != 'tsv' or {cfg.query_column, cfg.passage_column}
                                                      <= set(inputs.column_names(path) or ())):
      names, records = tables.records(path, 'input file')
      for column in (cfg.query_column, cfg.passage_column):
        if column not in names:
          raise tables.missing_column(path, column, names)
      return [{'query': tables.text_at(path, line, r, cfg.query_column),
               'passage': tables.text_at(path, line, r, cfg.passage_column)} for line, r in records]
    if fmt not in ('auto', 'txt', 'tsv'):
      raise DataError(f'{path}: --format={fmt} is not a reranker\'s input; give query<TAB>passage lines or a '
                      f'table with columns {cfg.query_column!r} and {cfg.passage_column!r}')
    with files.open(path, encoding='utf-8', errors='replace') as f:
      lines = [(i, line.rstrip('\r\n')) for i, line in enumerate(f, 1) if line.strip()]
    if not lines:
      raise DataError(f'input file {path} has no text')
    rows = []
    for i, line in lines:
      parts = line.split('\t')
      if len(parts) != 2:
        raise DataError(f'{path} line {i}: {len(parts)} tab-separated fields; a reranker scores query<TAB>passage')
      rows.append(Predictions.row(*parts, where=f'{path} line {i}'))
    return rows

  @staticmethod
  def predict(tuned, rows: Sequence[dict[str, str]], *, batch_size: int, log) -> list[dict[str, float]]:
    cfg = tuned.finetune
    feats = [pair_feature(tuned.tokenizer, r['query'], r['passage'], 0.0, max_query_length=cfg.max_query_length,
                          max_seq_length=cfg.max_seq_length) for r in rows]
    logits = Predictor(tuned, batch_size, log, pack=True).scores(feats).tolist()
    if tuned.task.get('loss', 'mse' if cfg.uses_scores() else 'bce') != 'bce':
      return [{'score': l} for l in logits]
    return [{'score': l, 'probability': float(1 / (1 + np.exp(-l)))} for l in logits]

  @staticmethod
  def tsv_lines(rows: Sequence[dict[str, str]], outputs: Sequence[dict[str, float]]) -> list[str]:
    clean = lambda s: str(s).replace('\t', ' ').replace('\n', ' ')  # pylint: disable=unnecessary-lambda-assignment
    keys = list(outputs[0]) if outputs else ['score']
    return ['\t'.join(['query', 'passage', *keys])] + [
        '\t'.join([clean(r['query']), clean(r['passage']), *(f'{o[k]:.6g}' for k in keys)])
        for r, o in zip(rows, outputs)]


# --- the kind ------------------------------------------------------------------------------------------------------

def _needs_train_file() -> ConfigError:
  return ConfigError('rerank: set --config.train_file to a CSV, TSV, JSONL or Parquet file of (query, passage, label) '
                     'or (query, passage, score) rows, or of (query, positive, negatives) groups (experiments/mine.py '
                     '--layout=pairs or --layout=negatives writes one)')


class Rerank:
  """The task kind of a cross-encoder on labelled or scored pairs or on groups (`finetuning.kinds.TaskKind`)."""

  preparing = 'loading the checkpoint, reading the pairs and retrieving with the first stage'
  predictions = Predictions  # experiments/predict.py scores (query, passage) pairs

  @staticmethod
  def runs(task: str) -> bool:
    return task == TASK

  def __init__(self, cfg: FinetuneConfig, evaluation: bool = False):
    if not evaluation and not cfg.train_file:
      raise _needs_train_file()
    if evaluation and not cfg.beir_dir:
      raise ConfigError('rerank: evaluating a workdir again needs --config.beir_dir and --config.first_stage')
    self.evaluation = evaluation
    self.train: list[RerankPair] | list[RerankGroup] = []
    self.held_out: list[RerankPair] | list[RerankGroup] = []
    self.loss = loss_of(cfg, False)
    self.beir_set: beir.BeirSet | None = None
    self.run_ids: np.ndarray | None = None  # a TREC run's ranking, read with the BEIR set (before the weights)

  @staticmethod
  def check_inputs(cfg: FinetuneConfig) -> None:
    """The pairs file (its columns), the BEIR directory and the first stage exist and can be read (first lines)."""
    if not cfg.train_file:
      raise _needs_train_file()
    names = inputs.column_names(cfg.train_file)
    if names is not None:
      check_columns(cfg.train_file, names, cfg)
    if cfg.beir_dir and not files.is_remote(cfg.beir_dir):
      if not files.isdir(cfg.beir_dir):
        raise DataError(f'BEIR directory {cfg.beir_dir} does not exist (it holds corpus.jsonl, queries.jsonl and '
                        'qrels/<split>.tsv)')
      for name, what in (('corpus.jsonl', 'corpus file'), ('queries.jsonl', 'queries file'),
                         (os.path.join('qrels', f'{cfg.beir_split}.tsv'), f'qrels file of beir_split={cfg.beir_split!r}')):
        inputs.first_lines(beir.find(os.path.join(cfg.beir_dir, name)), what, 1)
    if cfg.first_stage:
      first_stage.check(cfg.first_stage)

  @staticmethod
  def check(cfg: FinetuneConfig, mesh) -> None:
    scaffold.check_sequence_length(cfg, 'max_seq_length', cfg.max_seq_length, cfg.model)
    scaffold.check_batch_sizes(cfg, mesh)

  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None:
    """The training rows (none when only evaluating; without beir_dir, eval_fraction of them held out), the loss
    they imply (evaluating: the run's) and the BEIR set: read before the starting weights."""
    if self.evaluation and saved:
      self.loss = saved.get('task', {}).get('loss', self.loss)
    if not self.evaluation:
      rows = read_rows(cfg)
      self.loss = loss_of(cfg, bool(rows) and isinstance(rows[0], RerankGroup))
      if cfg.max_train_samples > 0:
        rows = rows[:cfg.max_train_samples]
      train, held_out = (rows, []) if cfg.beir_dir else split_rows(rows, cfg.eval_fraction, cfg.split_seed)
      if not train:
        raise DataError(f'{cfg.train_file}: no training pairs')
      self.train, self.held_out = train, held_out
    if cfg.beir_dir:
      self.beir_set = beir.read_beir(cfg.beir_dir, cfg.beir_split)
      if first_stage.is_run_file(cfg.first_stage):
        self.run_ids = first_stage.ranking(cfg.first_stage, self.beir_set, cfg.rerank_top_k, cfg.eval_batch_size,
                                           log=_log)

  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> _PreparedRun:
    return _PreparedRun(cfg, tokenizer, self.train, self.held_out, self.beir_set, self.run_ids, mesh, self.loss)

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]:
    del notes
    try:
      names = inputs.column_names(cfg.train_file) if cfg.train_file else None
    except DataError:
      names = None
    loss = cfg.loss or ('(inferred from train_file)' if names is None
                        else loss_of(cfg, rerank_groups.is_groups(cfg, names)))
    return (f'encoder + one-logit head on [CLS] of (query, passage): a cross-encoder, {loss} loss',
            lambda: BertForSequenceClassification(model, 1, rngs=nnx.Rngs(0)))


def _metric_names(scores: dict[str, float], prefix: str) -> dict[str, float]:
  return {prefix + k.replace('@', '_at_'): v for k, v in scores.items()}


def rerank_first_stage(data: beir.BeirSet, ids_qk: np.ndarray, score: Callable[[list[Feature]], np.ndarray],
                       tokenizer, *, top_k: int, max_query_length: int, max_seq_length: int
                       ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
  """A first stage's ranking reranked by a cross-encoder, and both evaluated: the rerank task's evaluation and
  experiments/rerank.py's.

  Args:
    data: the BEIR set.
    ids_qk: the first stage's corpus indices [Q, k] per query, best first (`embedding.first_stage.ranking`;
      trec.EMPTY past a query's candidates).
    score: features -> the cross-encoder's logit of each [n] (`pair_feature`s of (query, passage)).
    top_k: the k of recall@k (the first stage's depth).

  Returns:
    (the reranked indices [Q, k] (trec.EMPTY last), their logits (-inf at EMPTY), {'eval_ndcg_at_10',
    'eval_mrr_at_10', 'eval_recall_at_<top_k>' after reranking, the same 'eval_first_stage_*' before}).
  """
  passages, ids_qk = data.passages(), np.asarray(ids_qk)
  real = ids_qk != trec.EMPTY
  feats = [pair_feature(tokenizer, data.queries[q], passages[ids_qk[q, j]], 0.0, max_query_length=max_query_length,
                        max_seq_length=max_seq_length) for q, j in zip(*np.nonzero(real))]  # row-major: real's order
  scores_qk = np.full(ids_qk.shape, -np.inf, np.float32)
  scores_qk[real] = score(feats) if feats else np.zeros((0,), np.float32)
  order = np.argsort(-scores_qk, axis=1, kind='stable')  # ties keep the first stage's order; EMPTY stays last
  reranked, scores_qk = np.take_along_axis(ids_qk, order, axis=1), np.take_along_axis(scores_qk, order, axis=1)
  before = ranking.ranking_metrics(ids_qk, data.qrels, recall_at=(top_k,))
  after = ranking.ranking_metrics(reranked, data.qrels, recall_at=(top_k,))
  return reranked, scores_qk, {**_metric_names(after, 'eval_'), **_metric_names(before, 'eval_first_stage_')}


def _log(message: str) -> None:
  reporting.log(f'{TASK}: {message}')


class _PreparedRun:
  """A rerank run's features and built model, and what reads them."""

  def __init__(self, cfg: FinetuneConfig, tokenizer, train: Sequence[RerankPair] | Sequence[RerankGroup],
               held_out: Sequence[RerankPair] | Sequence[RerankGroup], beir_set: beir.BeirSet | None,
               run_ids: np.ndarray | None, mesh, loss: str):
    self.cfg, self.tokenizer, self.beir_set, self.mesh, self.loss = cfg, tokenizer, beir_set, mesh, loss
    t0 = time.time()
    # groups: each group's size; the listwise loss batches them whole (`group_size`), the others pair by pair
    rows = train or held_out
    self.group_size = len(rows[0].passages) if rows and isinstance(rows[0], RerankGroup) else 1
    self.train = features(tokenizer, train, cfg, loss)
    self.held_out = features(tokenizer, held_out, cfg, loss)
    self.held_out_targets = np.array([f.label for f in self.held_out], np.float32)
    units = 'pairs' if self.group_size == 1 else f'groups of {self.group_size}'
    self.batch_unit = units if loss == 'listwise' else 'pairs'
    self.num_units = len(self.train) // (self.group_size if loss == 'listwise' else 1)
    self.first_stage: np.ndarray | None = None
    if beir_set is not None:
      self.first_stage = run_ids if run_ids is not None else first_stage.ranking(
          cfg.first_stage, beir_set, cfg.rerank_top_k, cfg.eval_batch_size, mesh, log=_log)
      self.main_metric, self.eval_first = 'eval_ndcg_at_10', True  # step 0: what the training adds is read off
      what = (f'eval: rerank the top {cfg.rerank_top_k} of {cfg.first_stage} for {len(beir_set.queries)} queries '
              f'against {len(beir_set.texts)} passages')
    else:
      self.main_metric = ('eval_mrr_at_10' if self.group_size > 1 else 'eval_spearman' if cfg.uses_scores()
                          else 'eval_accuracy')
      self.eval_first = False
      what = f'eval {len(held_out)} held-out {units}'
    reporting.log(f'{TASK}: {len(train)} training {units} ({loss} loss), {what} '
                  f'(featurised in {time.time() - t0:.1f}s)')
    self.total_steps = cfg.total_steps(self.num_units) if self.train else 1
    reporting.log(describe_attention(cfg.model, hardware.resolve(mesh=mesh)))
    self.model = rerank_model(cfg, loss, mesh, self.total_steps)
    self.rows_multiple = 2 * shd.num_batch_shards(mesh) * cfg.optim.grad_accum_steps
    self.block = distributed.process_batch_block(mesh)

  def batches(self, seed: int, position: int, step: int) -> batching.TrainBatches:
    cfg = self.cfg
    reporting.log(f'seed {seed}: training {self.total_steps - step} of {self.total_steps} steps, batch '
                  f'{cfg.batch_size} {self.batch_unit}, {self.num_units} {self.batch_unit}, packed rows')
    return batching.TrainBatches(self.train, KIND, batch_size=cfg.batch_size, row_length=cfg.max_seq_length,
                                 pack=True, rows_multiple=self.rows_multiple, seed=seed, shuffle=cfg.shuffle,
                                 start=position, block=self.block, micro_batches=cfg.optim.grad_accum_steps,
                                 group_size=self.group_size if self.loss == 'listwise' else 1)

  def scores(self, params, feats: Sequence[Feature], label: str = 'scoring pairs') -> np.ndarray:
    """The cross-encoder's logit of each feature, in order [n] (packed rows of eval_batch_size pairs)."""
    out: list[np.ndarray] = []
    size = self.cfg.eval_batch_size
    ticker = reporting.Ticker(label, -(-len(feats) // size))
    for i in range(0, len(feats), size):
      chunk = feats[i:i + size]
      host = batching.make_batch(chunk, KIND, batch_size=size, row_length=self.cfg.max_seq_length, pack=True,
                                 rows_multiple=self.rows_multiple, bucket=True)  # a few shapes to compile
      batch = self.model.global_batch(batching.process_block(host, *self.block))
      logits = np.asarray(jax.device_get(self.model.predict_step(params, self.model.rest, batch)))
      out.append(logits[:len(chunk), 0])
      ticker.tick(i // size + 1)
    return np.concatenate(out) if out else np.zeros((0,), np.float32)

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    del step, output_dir
    t0 = time.time()
    out = self._rerank(params) if self.beir_set is not None else self._held_out(params)
    return {**out, 'eval_wall_s': time.time() - t0}

  def _rerank(self, params) -> dict[str, Any]:
    """nDCG@10, MRR@10, recall@rerank_top_k of the first stage ('eval_first_stage_*') and reranked ('eval_*')."""
    cfg = self.cfg
    return rerank_first_stage(self.beir_set, self.first_stage, lambda feats: self.scores(params, feats, 'reranking'),
                              self.tokenizer, top_k=cfg.rerank_top_k, max_query_length=cfg.max_query_length,
                              max_seq_length=cfg.max_seq_length)[2]

  def _held_out(self, params) -> dict[str, Any]:
    if not self.held_out:
      return {self.main_metric: float('nan'), 'eval_loss': float('nan')}
    logits = self.scores(params, self.held_out, 'evaluating held-out pairs')
    target = self.held_out_targets
    if self.loss == 'listwise':
      loss = float(np.mean(rerank_groups.group_losses(*(a.reshape(-1, self.group_size) for a in (logits, target)))))
    elif self.loss == 'mse':
      loss = float(np.mean((logits - target) ** 2))
    else:
      loss = float(np.mean(np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits)))))
    if self.group_size > 1:
      ranked = rerank_groups.ranking_metrics(logits.reshape(-1, self.group_size))
      return {'eval_loss': loss, **_metric_names(ranked, 'eval_')}
    if self.loss == 'mse':
      return {'eval_loss': loss, 'eval_spearman': float(metrics.spearman(logits.tolist(), target.tolist()))}
    return {'eval_loss': loss, 'eval_accuracy': float(np.mean((logits > 0) == (target > 0.5)))}

  def saved_config(self) -> dict[str, Any]:
    cfg = self.cfg
    return {'finetune': cfg.to_dict(), 'task': {'name': TASK, 'kind': KIND, 'num_labels': 1, 'label_names': [],
                                                'loss': self.loss}}

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    keys = ((self.main_metric, 'eval_mrr_at_10', 'eval_first_stage_ndcg_at_10') if self.beir_set is not None
            else (self.main_metric, 'eval_loss'))
    return Report(run_dir, label=f'seed {seed}: ', eval_keys=keys + ('eval_wall_s',), curves_dir=workdir.path,
                  curves_metrics=[self.main_metric], divergence_hint='Lower --config.optim.learning_rate')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    workdir.write_results(result, run_dir)
    seeds.log_result(self.main_metric, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s
    extra = {'first_stage': self.cfg.first_stage, 'rerank_top_k': self.cfg.rerank_top_k,
             'qrels_absent': dict(self.beir_set.absent)} if self.beir_set is not None else {}
    return {'task': TASK, 'init_checkpoint': self.cfg.init_checkpoint, 'loss': self.loss, **extra,
            **seeds.summarize(per_run, main_metric=self.main_metric)}
