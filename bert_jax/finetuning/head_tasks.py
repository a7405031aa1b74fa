"""The head tasks' kind: an encoder with a task head (classification, regression, multi-label, tagging, span
answers) on features of the task's files (`tasks.get_task`: GLUE, CoNLL-2003, SQuAD, your own files).

`HeadTasks` is the task kind (`finetuning.kinds`) of every `FinetuneConfig.task` that `tasks.get_task` knows: it
featurises the task once, trains `head_model(kind)` under `Finetuning(kind)` (its loss over the features' labels) and
scores the per-feature logits with the task's own metrics.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from flax import nnx
import jax
import numpy as np
import optax

from bert_jax import distributed, files, hardware, metrics, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig
from bert_jax.config.migration import METRIC_SCALE
from bert_jax.errors import BertJaxError
from bert_jax.finetuning import batching, class_weights, seeds
from bert_jax.finetuning.head_objective import Finetuning
from bert_jax.finetuning.tasks import get_task, inputs, task_names
from bert_jax.finetuning.tasks.base import Feature
from bert_jax.model import heads
from bert_jax.model.attention import describe_attention
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.heads import SEQUENCE_KINDS, head_model
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim, scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused


def finetuning_model(model_cfg: ModelConfig, kind: str, num_labels: int, tx: optax.GradientTransformation, mesh,
                     schedule=None, rules=shd.LOGICAL_AXIS_RULES, grad_accum_steps: int = 1,
                     objective: Finetuning | None = None) -> StepModel:
  """The head model of `kind` under its fine-tuning objective (default `Finetuning(kind)`), as a StepModel (one for
  every seed)."""
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: head_model(kind, model_cfg, num_labels, rngs=rngs, platform=platform),
                   objective or Finetuning(kind), tx, mesh, schedule=schedule,
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1), rules=rules,
                   grad_accum_steps=grad_accum_steps)


@reused  # a run of the same model, head, optimizer, schedule and mesh in this process reuses its steps
def _run_model(model_cfg: ModelConfig, objective: Finetuning, num_labels: int, optim_cfg: OptimConfig,
               total_steps: int, rules: str, mesh) -> StepModel:
  return finetuning_model(model_cfg, objective.kind, num_labels, optim.make_optimizer(optim_cfg, total_steps), mesh,
                          schedule=optim.learning_rate_schedule(optim_cfg, total_steps), rules=shd.rules(rules),
                          grad_accum_steps=optim_cfg.grad_accum_steps, objective=objective)


class HeadTasks:
  """The task kind of a head model on a task's features (`finetuning.kinds.TaskKind`)."""

  preparing = 'loading the checkpoint and featurising the task'

  @staticmethod
  def runs(task: str) -> bool:
    return task in task_names()

  def __init__(self, cfg: FinetuneConfig, evaluation: bool = False):
    self.task, self.evaluation = get_task(cfg.task), evaluation
    self.recorded_labels: tuple[str, ...] = ()

  check_inputs = staticmethod(inputs.check_inputs)  # the task's files: exist, readable, the named columns (first lines)

  def check(self, cfg: FinetuneConfig, mesh) -> None:
    scaffold.check_sequence_length(cfg, 'max_seq_length', cfg.max_seq_length, cfg.model)
    scaffold.check_batch_sizes(cfg, mesh)

  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None:
    """The label names a workdir recorded: a workdir's stay the ones it was trained with (older GLUE runs: '0'/'1');
    a task that reads its labels from the data (classify) takes them too, so a resumed or re-evaluated run keeps
    their order. The task's files are featurised in `prepare` (before the starting weights are read)."""
    del cfg
    self.recorded_labels = tuple(((saved or {}).get('task') or {}).get('label_names') or ())
    if hasattr(self.task, 'recorded_labels'):
      self.task.recorded_labels = list(self.recorded_labels)

  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> _PreparedRun:
    return _PreparedRun(cfg, self.task, tokenizer, mesh, evaluation=self.evaluation,
                        recorded_labels=self.recorded_labels)

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]:
    """What a run of `cfg` trains, in words, and a builder of its model (plan.py: --print_config)."""
    task = get_task(cfg.task)
    num_labels = _planned_labels(task, cfg, notes)
    if num_labels is None:
      return (f'encoder only; the {task.kind} head adds {model.hidden_size + 1:,} per label, {cfg.task}',
              lambda: BertEncoder(model, rngs=nnx.Rngs(0)))
    labels = f'; {num_labels} labels' if task.kind in ('classification', 'multilabel', 'token') else ''
    return (f'encoder + {task.kind} head, {cfg.task}{labels}',
            lambda: heads.head_model(task.kind, model, num_labels, rngs=nnx.Rngs(0)))


def _planned_labels(task, cfg: FinetuneConfig, notes: list[str]) -> int | None:
  """The task's label count: its own, label_names', or the training file's (None, with a note, when unreadable)."""
  if not hasattr(task, 'planned_label_names'):  # a task whose labels are its own (GLUE, CoNLL-2003, SQuAD, qa)
    return task.num_labels
  if task.kind == 'regression':
    return 1
  if not cfg.label_names and not cfg.train_file:
    notes.append('labels: the training file\'s, and none is set (--config.train_file)')
    return None
  try:
    names = task.planned_label_names(cfg)
  except BertJaxError as e:
    notes.append(f'labels: the training file\'s, which cannot be read: {e}')
    return None
  notes.append(f'labels: {", ".join(names)} ({"label_names" if cfg.label_names else "the training file"})')
  return len(names)


class _PreparedRun:
  """A fine-tuning run's featurised task and built model (made whole in `__init__`), and what reads them."""

  eval_first = False  # the starting checkpoint has no trained head to evaluate

  def __init__(self, cfg: FinetuneConfig, task, tokenizer, mesh, evaluation: bool = False,
               recorded_labels: tuple[str, ...] = ()):
    self.cfg, self.task, self.evaluation, self.recorded_labels = cfg, task, evaluation, recorded_labels
    t0 = time.time()
    self.train = [] if evaluation else task.train_features(cfg, tokenizer)
    self.evals = task.eval_sets(cfg, tokenizer)
    reporting.log(f'{task.name}: {len(self.train)} training features, eval '
                  + ', '.join(f'{e.name} {len(e.features)}' for e in self.evals)
                  + f' (featurised in {time.time() - t0:.1f}s)')
    if not evaluation and not self.train:
      raise BertJaxError(f'{task.name}: no training examples')
    self.main_metric = f'{self.evals[0].name}_{task.main_metric}'
    self.total_steps = cfg.total_steps(len(self.train)) if self.train else 1
    reporting.log(describe_attention(cfg.model, hardware.resolve(mesh=mesh)))
    self.class_weights = () if evaluation else self._class_weights(cfg, task)
    objective = Finetuning(task.kind, class_weights=self.class_weights,
                           label_smoothing=getattr(cfg, 'label_smoothing', 0.0))
    self.model = _run_model(cfg.model, objective, task.num_labels, cfg.optim, self.total_steps, cfg.mesh.rules, mesh)
    self.rows_multiple = 2 * shd.num_batch_shards(mesh) * cfg.optim.grad_accum_steps
    self.block = distributed.process_batch_block(mesh)

  def _class_weights(self, cfg: FinetuneConfig, task) -> tuple[float, ...]:
    """`cfg.class_weights` resolved against the task's labels and training features (and logged)."""
    spec = getattr(cfg, 'class_weights', '')
    if not spec:
      return ()
    names = list(getattr(task, 'label_names', None) or [])
    counts, total = class_weights.label_counts(self.train, task.kind, task.num_labels)
    weights = class_weights.resolve(spec, task.kind, names, counts, total)
    reporting.log(class_weights.describe(weights, names, counts))
    return weights

  def batches(self, seed: int, position: int, step: int) -> batching.TrainBatches:
    cfg = self.cfg
    reporting.log(f'seed {seed}: training {self.total_steps - step} of {self.total_steps} steps, batch '
                  f'{cfg.batch_size}, {len(self.train)} features, {"packed" if cfg.pack else "padded"} rows')
    return batching.TrainBatches(self.train, self.task.kind, batch_size=cfg.batch_size, row_length=cfg.max_seq_length,
                                 pack=cfg.pack, rows_multiple=self.rows_multiple, seed=seed, shuffle=cfg.shuffle,
                                 start=position, block=self.block, micro_batches=cfg.optim.grad_accum_steps)

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    """Every eval set's metrics ('<set>_<metric>') and eval_wall_s; predictions written to `output_dir` if given."""
    del step
    t0, held_out = time.time(), {}
    for eval_set in self.evals:
      logits = self.predict(params, eval_set.features, label=f'evaluating {eval_set.name}')
      # Every process has all the logits and scores them; process 0 alone writes the predictions.
      scores = self.task.evaluate(eval_set, logits, output_dir if jax.process_index() == 0 else None)
      held_out.update({f'{eval_set.name}_{k}': v for k, v in scores.items()})
      if self.task.kind == 'classification':  # what always answering the set's most frequent class scores
        held_out[f'{eval_set.name}_majority_accuracy'] = metrics.majority_accuracy(eval_set.data.labels)
      if self.evaluation and self.task.kind == 'classification':  # evaluate.py: how each class fares
        self._class_report(eval_set, logits, output_dir)
    return {**held_out, 'eval_wall_s': time.time() - t0}

  def _class_report(self, eval_set, logits: list[np.ndarray], output_dir: str | None) -> None:
    """Logs `metrics.class_report` of a classification eval set; writes it to report_<set>.txt in `output_dir`."""
    names = list(getattr(self.task, 'label_names', None) or range(self.task.num_labels))
    preds = np.array([int(np.argmax(l)) for l in logits], np.int64)
    report = metrics.class_report(preds, eval_set.data.labels, [str(n) for n in names])
    reporting.log(f'{eval_set.name}, per class:\n{report}')
    if output_dir is not None and jax.process_index() == 0:
      files.write_text_atomic(os.path.join(output_dir, f'report_{eval_set.name}.txt'), report + '\n')

  def predict(self, params, features: list[Feature], label: str = 'predicting') -> list[np.ndarray]:
    """Logits for each feature, in order (see tasks.base for the shapes), on every process; a progress line
    (`label`) every 10 s of a long one."""
    out: list[np.ndarray] = []
    size, kind = self.cfg.eval_batch_size, self.task.kind
    ticker = reporting.Ticker(label, -(-len(features) // size))
    for i in range(0, len(features), size):
      chunk = features[i:i + size]
      host = batching.make_batch(chunk, kind, batch_size=size, row_length=self.cfg.max_seq_length,
                                 pack=self.cfg.pack, rows_multiple=self.rows_multiple)
      batch = self.model.global_batch(batching.process_block(host, *self.block))
      logits = np.asarray(jax.device_get(self.model.predict_step(params, self.model.rest, batch)))
      out.extend(logits[:len(chunk)] if kind in SEQUENCE_KINDS
                 else batching.rows_of_examples(logits, host, len(chunk)))
      ticker.tick(i // size + 1)
    return out

  def saved_config(self) -> dict[str, Any]:
    """The workdir's config.json: the config, and the task (its head kind, label count and names)."""
    task = self.task
    return {'finetune': self.cfg.to_dict(), 'task': {'name': task.name, 'kind': task.kind,
                                                     'num_labels': task.num_labels,
                                                     'label_names': list(self.recorded_labels)
                                                                    or list(getattr(task, 'label_names', []))}}

  def curve_metrics(self) -> list[str]:
    return [f'{e.name}_{self.task.main_metric}' for e in self.evals]

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    return Report(run_dir, label=f'seed {seed}: ', eval_keys=(self.main_metric, 'eval_wall_s'),
                  curves_dir=workdir.path, curves_metrics=self.curve_metrics(),
                  divergence_hint='Lower --config.optim.learning_rate')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    """A seed's final_metrics.json and its line (the training loop drew every seed's curves so far when it ended)."""
    workdir.write_results({**result, **METRIC_SCALE}, run_dir)
    seeds.log_result(self.main_metric, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s  # each seed has its train_wall_s and eval_wall_s
    weights = {'class_weights': dict(zip(map(str, self.task.label_names), self.class_weights))} \
        if self.class_weights else {}
    return {'task': self.task.name, 'init_checkpoint': self.cfg.init_checkpoint,
            **seeds.summarize(per_run, main_metric=self.main_metric), **weights, **METRIC_SCALE}
