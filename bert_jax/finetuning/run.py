"""Fine-tuning: what a fine-tuning run brings to the one scaffold (`train.run`), and evaluating it again.

A `FinetuningJob` describes the starting checkpoint (its architecture and tokenizer), featurises
the task once, and trains each seed in `workdir/seed_<n>/` (a run directory of the scaffold:
resumed from its latest checkpoint, or evaluated only when complete). Each seed logs
metrics_train.jsonl and metrics_eval.jsonl and writes its final_metrics.json; the workdir's holds
every metric's per-seed values, mean and sample std, and workdir/curves.png is redrawn after each
seed. `evaluate_again` restores a finished workdir's checkpoints and evaluates them, writing beside
the training results (seed_<n>/eval_step<N>[_<file>]/), never over them.

Several processes (jax.distributed, started by the entry points' multi-host flags) run the same
run: each featurises the whole task (fine-tuning sets are small, and this keeps every input
decision local and identical), builds the same host batch and feeds only its block of it
(`distributed.process_batch_block`). Predictions come back replicated, so every process scores
them; process 0 alone prints and writes predictions, metrics and config.json, while all of them
save and restore the Orbax checkpoints together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Collection

import jax
import numpy as np
import optax

from bert_jax import distributed, files, hardware, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig, facts, upgrade_saved
from bert_jax.config.migration import METRIC_SCALE
from bert_jax.data.tokenization import load_tokenizer
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.finetuning import batching
from bert_jax.finetuning.objective import Finetuning
from bert_jax.finetuning.tasks import get_task, metrics
from bert_jax.finetuning.tasks.base import Feature
from bert_jax.finetuning.tasks.inputs import check_inputs
from bert_jax.interop.pretrained import NO_INIT_CHECKPOINT, describe, finetuning_tokenizer
from bert_jax.model.attention import describe_attention
from bert_jax.model.heads import SEQUENCE_KINDS, head_model
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import optim, run as scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused


def finetuning_model(model_cfg: ModelConfig, kind: str, num_labels: int, tx: optax.GradientTransformation, mesh,
                     schedule=None, rules=shd.LOGICAL_AXIS_RULES, grad_accum_steps: int = 1) -> StepModel:
  """The head model of `kind` under its fine-tuning objective, as a StepModel (one for every seed)."""
  platform = hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: head_model(kind, model_cfg, num_labels, rngs=rngs, platform=platform),
                   Finetuning(kind), tx, mesh, schedule=schedule,
                   state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1), rules=rules,
                   grad_accum_steps=grad_accum_steps)


@reused  # a run of the same model, head, optimizer, schedule and mesh in this process reuses its steps
def _run_model(model_cfg: ModelConfig, kind: str, num_labels: int, optim_cfg: OptimConfig, total_steps: int,
               rules: str, mesh) -> StepModel:
  return finetuning_model(model_cfg, kind, num_labels, optim.make_optimizer(optim_cfg, total_steps), mesh,
                          schedule=optim.learning_rate_schedule(optim_cfg, total_steps), rules=shd.rules(rules),
                          grad_accum_steps=optim_cfg.grad_accum_steps)


class FinetuningJob:
  """A fine-tuning run for the scaffold (`train.run.Job`): one run directory per seed.

  Args:
    cfg: the run's config.
    explicit_model_fields: model fields the user set (as pretraining's); the rest of the model
      (its architecture, and its dropout unless given) is the starting checkpoint's.
    evaluation: only evaluate the workdir's checkpoints again; the starting checkpoint is not read
      (cfg.model is the one the run was fine-tuned with).
  """

  kind = 'finetuning'
  preparing = 'loading the checkpoint and featurising the task'

  def __init__(self, cfg: FinetuneConfig, explicit_model_fields: Collection[str] = (), *, evaluation: bool = False):
    self._task = get_task(cfg.task)
    if not evaluation and not cfg.init_checkpoint:
      raise ConfigError(NO_INIT_CHECKPOINT)
    self.cfg, self._evaluation, self._explicit_model_fields = cfg, evaluation, explicit_model_fields
    self._inputs_of: dict[str, _Inputs] = {}

  def validate(self, mesh, workdir: Workdir) -> None:
    self._inputs(mesh, workdir)

  def _inputs(self, mesh, workdir: Workdir) -> _Inputs:
    """The starting checkpoint, the config with its architecture, and the tokenizer, checked; read once per
    workdir (`validate` then `prepare`: the starting checkpoint is described, and its lines printed, once)."""
    if workdir.path not in self._inputs_of:
      self._inputs_of[workdir.path] = self._read_inputs(mesh, workdir)
    return self._inputs_of[workdir.path]

  def _read_inputs(self, mesh, workdir: Workdir) -> _Inputs:
    cfg, source = self.cfg, None
    if not self._evaluation:  # the starting checkpoint sets the architecture
      source = describe(cfg.init_checkpoint, 'init_checkpoint')
      source.check_weights()
      cfg = dataclasses.replace(cfg, model=source.model_config(cfg.model, self._explicit_model_fields))
    scaffold.check_sequence_length(cfg, 'max_seq_length', cfg.max_seq_length, cfg.model)
    scaffold.check_batch_sizes(cfg, mesh)
    saved = workdir.config()
    if saved is not None and not self._evaluation:
      scaffold.check_same_run(saved['finetune'], cfg, f'workdir {workdir.path}')
    tokenizer = self._tokenizer(cfg, source, workdir, saved)
    # A workdir's label names stay the ones it was trained with (older GLUE runs: '0'/'1'); a task that reads its
    # labels from the data (classify) takes them too, so a resumed or re-evaluated run keeps their order.
    recorded = tuple(((saved or {}).get('task') or {}).get('label_names') or ())
    if hasattr(self._task, 'recorded_labels'):
      self._task.recorded_labels = list(recorded)
    vocab = tokenizer.vocab_size
    if vocab > cfg.model.vocab_size:
      raise ConfigError(f'the tokenizer of {cfg.init_checkpoint} has {vocab} tokens but the model only '
                        f'{cfg.model.vocab_size} embeddings')
    return _Inputs(cfg, source, tokenizer, recorded)

  def _tokenizer(self, cfg: FinetuneConfig, source, workdir: Workdir, saved: dict[str, Any] | None):
    """The workdir's own tokenizer when it holds one (refused for training when the starting checkpoint's
    is no longer that one), else the starting checkpoint's."""
    if self._evaluation:
      return finetuning_tokenizer(workdir, saved)
    theirs, own = source.tokenizer(), workdir.tokenizer_file()
    if own is None:
      return theirs
    tokenizer = load_tokenizer(own)
    if tokenizer.identity() != theirs.identity():
      raise ConfigError(f'the tokenizer of the starting checkpoint {cfg.init_checkpoint} is not the one this run '
                        f'was fine-tuned with ({own}): that path now holds another model. Restore it, or use a new '
                        '--workdir')
    return tokenizer

  def prepare(self, mesh, workdir: Workdir) -> scaffold.Prepared:
    inputs = self._inputs(mesh, workdir)
    cfg, task = inputs.cfg, self._task
    # The task's data first: a bad row is reported before the starting checkpoint's weights are read.
    run = _PreparedRun(cfg, task, inputs.tokenizer, mesh, evaluation=self._evaluation)
    params = None
    if inputs.source is not None:
      params, _ = inputs.source.params(None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
    return scaffold.Prepared(
        cfg=cfg, stages=(scaffold.Stage(run.total_steps, run.model),), main_metric=run.main_metric,
        tokenizer=inputs.tokenizer, saved_config=self._saved_config(cfg, inputs.recorded_labels),
        run_dirs=_run_dirs(cfg, workdir),
        batches=run.batches, evaluate=run.evaluate,
        check_meta=lambda meta, run_dir: scaffold.check_same_run(upgrade_saved(meta['config']), cfg, run_dir,
                                                                 meta['step']),
        report=lambda seed, run_dir: run.report(seed, run_dir, workdir),
        results=run.results, run_done=lambda seed, run_dir, result: run.done(seed, run_dir, result, workdir),
        weights=None if params is None else (lambda: {'bert': params['bert']}))

  def _saved_config(self, cfg: FinetuneConfig, recorded_labels: tuple[str, ...]) -> dict[str, Any]:
    task = self._task
    return {'finetune': cfg.to_dict(), 'task': {'name': task.name, 'kind': task.kind,
                                                'num_labels': task.num_labels,
                                                'label_names': list(recorded_labels)
                                                               or list(getattr(task, 'label_names', []))}}


@dataclasses.dataclass(frozen=True)
class _Inputs:
  """What a fine-tuning run starts from, checked: its config (the starting checkpoint's architecture), that
  checkpoint (None when evaluating again) and the tokenizer."""

  cfg: FinetuneConfig
  source: Any
  tokenizer: Any
  recorded_labels: tuple[str, ...] = ()  # the label names the workdir recorded when it trained before


def log_result(main: str, seed: int, result: dict[str, Any]) -> None:
  """A seed's line: its main metric (and best step), and how long evaluating took."""
  best = f' (best step {result["best_step"]})' if 'best_step' in result else ''
  reporting.log(f'seed {seed} step {result["step"]}: {main} {result[main]:.4f}{best} '
                f'(eval {reporting.format_duration(result["eval_wall_s"])})')


def _run_dirs(cfg: FinetuneConfig, workdir: Workdir) -> tuple[tuple[int, str], ...]:
  """(seed, seed_<n>/) of each seed."""
  return tuple((s, workdir.seed_dir(s)) for s in range(cfg.seed, cfg.seed + cfg.num_seeds))


class _PreparedRun:
  """A fine-tuning run's featurised task and built model (made whole in `__init__`), and what reads them."""

  def __init__(self, cfg: FinetuneConfig, task, tokenizer, mesh, evaluation: bool = False):
    self.cfg, self.task, self.evaluation = cfg, task, evaluation
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
    self.model = _run_model(cfg.model, task.kind, task.num_labels, cfg.optim, self.total_steps, cfg.mesh.rules, mesh)
    self.rows_multiple = 2 * shd.num_batch_shards(mesh) * cfg.optim.grad_accum_steps
    self.block = distributed.process_batch_block(mesh)

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

  def curve_metrics(self) -> list[str]:
    return [f'{e.name}_{self.task.main_metric}' for e in self.evals]

  def report(self, seed: int, run_dir: str, workdir: Workdir) -> Report:
    return Report(run_dir, label=f'seed {seed}: ', eval_keys=(self.main_metric, 'eval_wall_s'),
                  curves_dir=workdir.path, curves_metrics=self.curve_metrics(),
                  divergence_hint='Lower --config.optim.learning_rate')

  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir: Workdir) -> None:
    """A seed's final_metrics.json and its line (the training loop drew every seed's curves so far when it ended)."""
    workdir.write_results({**result, **METRIC_SCALE}, run_dir)
    log_result(self.main_metric, seed, result)

  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    del wall_s  # each seed has its train_wall_s and eval_wall_s
    return {'task': self.task.name, 'init_checkpoint': self.cfg.init_checkpoint,
            **summarize_seeds(per_run, main_metric=self.main_metric), **METRIC_SCALE}


def finetune(cfg: FinetuneConfig, workdir: str, explicit_model_fields: Collection[str] = ()) -> dict[str, Any]:
  """Trains every seed (or finishes, or only evaluates, what a rerun finds done) and returns the metrics
  over all seeds. A field of another task's, a missing file or column is refused first (nothing read or written)."""
  cfg.check_task_fields()
  check_inputs(cfg)
  return scaffold.train(FinetuningJob(cfg, explicit_model_fields), workdir)


def evaluate_again(workdir: str, step: int | None = None, overrides: dict[str, Any] | None = None,
                   output_dir: str | None = None) -> dict[str, Any]:
  """Restores each seed's checkpoint `step` (None: the latest) of a fine-tuning workdir and evaluates it.

  The config is the workdir's own with `overrides` of its evaluation fields (the `evaluation` fact:
  eval_file, eval_batch_size, seed, num_seeds, SQuAD's answer settings, ...). Results go beside the
  training ones, or under `output_dir` in the same layout: seed_<n>/eval_step<N>[_<eval file>]/
  (predictions, final_metrics.json) and eval_step<N>[_<eval file>].json over the seeds; the training
  results are never overwritten. A read-only workdir (shared, archived) is only read: no lock, and
  the results go to the caller (stdout) and `output_dir` alone.
  """
  wd = Workdir(workdir)
  saved = wd.config()
  if saved is None or 'finetune' not in saved:
    raise ConfigError(f'{workdir} holds no fine-tuning run to evaluate (no config.json); train first')
  unknown = sorted(set(overrides or {}) - set(facts(FinetuneConfig, 'evaluation')))
  if unknown:
    raise ConfigError(f'{", ".join(unknown)} cannot change when a workdir is evaluated again; its training config '
                      f'is its own (evaluation settings: {", ".join(facts(FinetuneConfig, "evaluation"))})')
  if output_dir:
    files.check_output(output_dir, 'directory', '--output_dir')
  read_only = not files.writable(workdir)
  results = Workdir(output_dir) if output_dir else (None if read_only else wd)  # None: stdout only
  if read_only:
    reporting.log(f'warning: {workdir} is read-only: nothing is written there; the results go to stdout'
                  + (f' and {output_dir}' if output_dir else ' (give --output_dir=DIR to keep them)'))
  cfg = FinetuneConfig.from_dict({**saved['finetune'], **(overrides or {})})
  cfg.check_task_fields(names=set(overrides or {}))  # an evaluation setting of another task's is refused
  if cfg.task == 'retrieval':  # a bi-encoder on its BEIR set; embedding.run builds on this module, hence here
    from bert_jax.embedding.run import RetrievalJob  # pylint: disable=g-import-not-at-top
    job = RetrievalJob(cfg, evaluation=True)
  else:
    job = FinetuningJob(cfg, evaluation=True)
  name = lambda at: _results_name(cfg, at, (overrides or {}).get('beir_dir', ''))
  def out_dir(seed: int, run_dir: str, at: int) -> str | None:  # beside the training results, never over them
    return results and os.path.join(results.seed_dir(seed) if output_dir else run_dir, name(at))
  summary = scaffold.evaluate(job, workdir, step, out_dir, read_only=read_only,
                              on_result=lambda run, seed, result: log_result(run.main_metric, seed, result))
  if results:
    results.write_json(results.file(name(summary['step']) + '.json'), summary)
  return summary


def _evaluate_and_print(workdir: str, step: int | None, overrides: dict[str, Any], options: dict[str, Any]
                        ) -> dict[str, Any]:
  """`evaluate_again` with options['output_dir'], its summary printed (`print_summary`)."""
  result = evaluate_again(workdir, step, overrides, options.get('output_dir'))
  print_summary(result)
  return result


# A fine-tuning workdir evaluated again (`train.run.evaluate_workdir`): each seed at one step.
EVALUATION = scaffold.Evaluation(
    kinds=('finetuning',), name='fine-tuning', fields=facts(FinetuneConfig, 'evaluation'), options=('output_dir',),
    scope='a fine-tuning workdir is evaluated at one step (--step, default the latest) of each seed',
    run=_evaluate_and_print)


def _results_name(cfg: FinetuneConfig, step: int, beir_dir: str = '') -> str:
  """Where an evaluation again puts its results: eval_step<N>, and the eval file's name when one is given (a
  retrieval run's: the BEIR directory given instead of its own)."""
  given = cfg.eval_file or beir_dir.rstrip('/\\')
  stem = os.path.splitext(os.path.basename(given))[0] if given else ''
  return f'eval_step{step}' + (f'_{stem}' if stem else '')


def summarize_seeds(per_seed: list[dict[str, Any]], main_metric: str) -> dict[str, Any]:
  """One seed: its metrics. Several: `<name>_mean`, `<name>_std` (sample std) and the per-seed values."""
  if len(per_seed) == 1:
    return {'main_metric': main_metric, **per_seed[0]}
  out: dict[str, Any] = {'main_metric': f'{main_metric}_mean', 'seeds': [r['seed'] for r in per_seed],
                         'step': per_seed[0]['step']}
  for name, value in per_seed[0].items():
    if (name in ('seed', 'step', 'train_steps', 'train_steps_this_invocation')
        or isinstance(value, (dict, list, str, bool))):
      continue
    values = [float(r[name]) for r in per_seed]
    out[f'{name}_mean'] = float(np.mean(values))
    out[f'{name}_std'] = float(np.std(values, ddof=1))
    out[f'{name}_per_seed'] = values
  out['per_seed'] = per_seed
  return out


def print_summary(result: dict[str, Any]) -> None:
  """The run's main metric in words (a classification task's beside its majority-class baseline and macro F1),
  then the whole result as one JSON line (without per-seed copies).

  Process 0 prints (`reporting.log`); the others, which hold the same result, stay silent.
  """
  main = result['main_metric']
  line = f'{result["task"]}: {main} {result[main]:.4f}'
  mean = '_mean' if main.endswith('_mean') else ''
  if mean:
    std = result[main[:-len('_mean')] + '_std']
    values = ', '.join(f'{v:.4f}' for v in result[main[:-len('_mean')] + '_per_seed'])
    line += f' ± {std:.4f} over seeds {result["seeds"]} ({values})'
  # The main metric's eval set: the longest prefix of its name with a majority baseline ('dev', 'dev_matched').
  parts = main.split('_')
  prefix = next((p for p in ('_'.join(parts[:i]) for i in range(len(parts) - 1, 0, -1))
                 if f'{p}_majority_accuracy{mean}' in result), None)
  if prefix is not None:
    line += f' (majority-class baseline {result[f"{prefix}_majority_accuracy{mean}"]:.4f}'
    if f'{prefix}_macro_f1{mean}' in result and not main.startswith(f'{prefix}_macro_f1'):
      line += f'; macro-F1 {result[f"{prefix}_macro_f1{mean}"]:.4f}'
    line += ')'
  reporting.log(line)
  reporting.log(json.dumps({k: v for k, v in result.items() if k != 'per_seed'}))
