"""The one run scaffold of pretraining and fine-tuning: training a workdir, and evaluating it again.

A `Job` is what differs between the kinds of run, and it is narrow: `kind`, `cfg` (as given), `preparing` (for
the preemption message), `validate(mesh, workdir)` (refusals only) and `prepare(mesh, workdir)`, which returns
a frozen `Prepared`: the stages and their models, the tokenizer and config.json, the run directories, the
batches at a data position, the held-out evaluation, the checkpoint check, the lines and the results, and
the init choices as data (`branch`, `weights`). Nothing exists half-initialised.

`train(job, workdir)` runs it in this order:

  1. validate: the config checked itself when it was built (mesh-free checks); here the starting checkpoints
     outside the workdir, the workdir's kind, resume_allow, then `job.validate` (the mesh, the model, what
     the workdir already holds belongs to this run);
  2. claim the workdir (one run at a time) and catch preemption signals; `job.prepare` (a signal then stops
     at once);
  3. for each run directory (the workdir; a fine-tuning seed's seed_<n>/), one checkpointer and the
     init decision, in this order:
       resume   the newest usable checkpoint of the directory (refused when another run wrote it);
       branch   else `Prepared.branch`: another run's checkpoint with its whole state (pretraining's
                branch_from), restored read-only;
       weights  else `Prepared.weights`: init_checkpoint's parameters (those the model has): optimizer, step
                and data position start fresh;
       scratch  else parameters from the seed;
     then `fit()` over the stages (a signal: the step is saved and Preempted raised, exit code 75 at the entry
     points), the held-out evaluation of the final (or the best) step, and `Prepared.run_done`;
  4. final_metrics.json, atomically, last.

Evaluating a workdir again has one entry, `evaluate_workdir(path, evaluations, step, overrides, options)`:
`inspect(path)` says the workdir's kind, and the `Evaluation` of that kind (declared by its package, handed in
by the caller: train/ imports neither pretraining nor fine-tuning) evaluates it. Options and config fields that
only another kind takes are refused first, in one line, before any model work. The kinds' evaluations:

  fine-tuning  `finetuning.finetune_run.evaluate_again` -> `evaluate(job, workdir, step, out_dir)` here: each run
               directory's checkpoint through the same `Prepared` (the workdir claimed unless read-only;
               checkpoints only read: `restore_for_evaluation`), results beside the training ones;
  pretraining  `pretraining.evaluation` -> `pretraining.pretrain_run.evaluate_checkpoints`: one step (a JSON line) or
               every step (a table, a JSONL, a plot; unusable checkpoints named and skipped), the workdir
               only read (no claim), the data prepared after the first restore (a bad checkpoint fails before
               any data work); a merge's parts are read from their own workdirs (`evaluate_in`, `as_step`).
               It does not go through `Prepared` yet: a `Prepared` prepares the data before any restore.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Protocol, Sequence

import jax

from bert_jax import sharding as shd
from bert_jax.config import TrainingConfig, check_resume, check_resume_allow, facts
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.runs import reporting, tracking
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.runs.workdir import Workdir, check_kind, check_outside, inspect
from bert_jax.train.early_stopping import EarlyStopping
from bert_jax.train.loop import Batches, FitResult, Report, fit
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel


@dataclasses.dataclass(frozen=True)
class Stage:
  """A stretch of a run that one StepModel trains: up to step `end`; `label` prefixes its lines ('phase 2/3
  extend: ') and `fields` go into each of its metrics rows ({'phase': 2}). A run without phases is one stage."""

  end: int
  model: StepModel
  label: str = ''
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)
  evaluate_at_end: bool = True  # False: a stage the run's phase goes on after (a batch size of a ramp)


@dataclasses.dataclass(frozen=True)
class Branch:
  """Another run's checkpoint that a run directory without one of its own continues (pretraining's branch_from):
  its whole train state and data position, restored read-only.

  Attributes:
    directory: the other run's workdir.
    step: its checkpoint step (None: the newest usable).
    check_meta: refuses that checkpoint's meta when it is not this run up to there.
  """

  directory: str
  step: int | None
  check_meta: Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A job ready to run: its data prepared and its model built, every member there at once (`Job.prepare`).

  Attributes:
    cfg: the run's config (the starting checkpoint's architecture resolved).
    stages: the run's stages in order (pretraining's phases; else one), the last ending at `total_steps`.
    main_metric: the held-out metric `keep_best` ranks by.
    tokenizer: saved in the workdir when a run directory starts.
    saved_config: the workdir's config.json.
    run_dirs: (seed, directory) of each run it trains: the workdir itself, or one seed_<n>/ per seed.
    batches: (seed, data position, step) -> this process's block of each training batch from there on.
    evaluate: (params, step, output_dir) -> held-out metrics (predictions written to `output_dir` when given).
    check_meta: (meta, run_dir) -> refuses a checkpoint another run wrote (its meta: config, step, ...).
    report: (seed, run_dir) -> the run directory's lines and files.
    results: (each run directory's result, wall seconds) -> the workdir's final metrics.
    run_done: (seed, run_dir, result) after each run directory: its own results and lines (None: none).
    checkpoint_extra: more meta in each checkpoint (a data fingerprint).
    eval_first: evaluate before the first step (a run continued from other weights).
    branch: the init choice after resume: another run's checkpoint to continue (None: none).
    weights: the init choice after that: the starting checkpoint's parameters the model has, read when called
      (None: from scratch).
  """

  cfg: TrainingConfig
  stages: tuple[Stage, ...]
  main_metric: str
  tokenizer: Any
  saved_config: dict[str, Any]
  run_dirs: tuple[tuple[int, str], ...]
  batches: Callable[[int, int, int], Batches]
  evaluate: Callable[[Any, int, str | None], dict[str, Any]]
  check_meta: Callable[[dict[str, Any], str], None]
  report: Callable[[int, str], Report]
  results: Callable[[list[dict[str, Any]], float], dict[str, Any]]
  run_done: Callable[[int, str, dict[str, Any]], None] | None = None
  checkpoint_extra: dict[str, Any] | None = None
  eval_first: bool = False
  branch: Branch | None = None
  weights: Callable[[], dict[str, Any]] | None = None

  @property
  def model(self) -> StepModel:
    """The first stage's model: its state is the run's (init, restore)."""
    return self.stages[0].model

  @property
  def total_steps(self) -> int:
    return self.stages[-1].end


class Job(Protocol):
  """What a kind of run brings to the scaffold: five members; everything else comes with `prepare`.

  Attributes:
    kind: 'pretraining' or 'finetuning' (the workdir's kind).
    cfg: the run's config as given (its mesh, resume_allow and starting checkpoints are read before `prepare`).
    preparing: what `prepare` does, for the preemption message.
  """

  kind: str
  cfg: TrainingConfig
  preparing: str

  def validate(self, mesh, workdir: Workdir) -> None:
    """Refuses what needs the mesh or the model, and a workdir that holds another run; changes nothing."""

  def prepare(self, mesh, workdir: Workdir) -> Prepared:
    """Prepares the data and builds the model."""


def check_sequence_length(cfg: TrainingConfig, name: str, length: int, model) -> None:
  """ConfigError when sequences of `length` (the field `name`) need positions the model does not have."""
  if length > model.max_position_embeddings:
    of = f' of init_checkpoint {cfg.init_checkpoint}' if cfg.init_checkpoint else ''
    raise ConfigError(f'{name}={length} exceeds model.max_position_embeddings={model.max_position_embeddings}{of}: '
                      'the model has no positions beyond that')


def check_batch_sizes(cfg: TrainingConfig, mesh) -> None:
  """ConfigError unless every (micro-)batch divides evenly over the batch shards and the processes."""
  shards, accum = shd.num_batch_shards(mesh), cfg.optim.grad_accum_steps
  for name, size in (('batch_size', cfg.batch_size // accum), ('eval_batch_size', cfg.eval_batch_size)):
    if size % shards or size % jax.process_count():
      raise ConfigError(f'{name} (per micro-batch: {size}) must divide evenly over {shards} batch shards (mesh '
                        f'data x fsdp) and {jax.process_count()} processes: every batch is split over them')


def check_same_run(old: dict[str, Any], new: TrainingConfig, where: str, step: int | None = None,
                   more_free: tuple[str, ...] = (), extra_new: dict[str, Any] | None = None) -> None:
  """Refuses to continue `old` (a saved config) as `new`: fields that differ, except those free on resume
  (the `free` fact), `more_free` and `new.resume_allow`."""
  check_resume(old, {**new.to_dict(), **(extra_new or {})}, facts(type(new), 'free') + more_free,
               new.resume_allow, where, step)


def allows_fresh_optimizer(cfg: TrainingConfig) -> bool:
  """Whether resume_allow lets a resume start a fresh optimizer state ('optim' or an optim.* field)."""
  return any(n.strip() == 'optim' or n.strip().startswith('optim.') for n in cfg.resume_allow.split(','))


def train(job: Job, workdir: str) -> dict[str, Any]:
  """Trains (or resumes) `job` in `workdir`, every run directory of it; returns the final metrics."""
  start = time.monotonic()
  cfg, wd = job.cfg, Workdir(workdir)
  mesh = shd.make_mesh(cfg.mesh)
  for name in ('init_checkpoint', 'branch_from'):
    if getattr(cfg, name, ''):
      check_outside(workdir, getattr(cfg, name), name)
  check_kind(workdir, job.kind)
  tracking.check(cfg.tracking)
  check_resume_allow(cfg.resume_allow, cfg.to_dict(), extra=('data_fingerprint',))
  job.validate(mesh, wd)
  with wd.claim(job.kind, owner=jax.process_index() == 0, log=reporting.log), Preemption() as preempt:
    with preempt.immediately(job.preparing):
      prepared = job.prepare(mesh, wd)

    def started() -> None:  # once a run directory resumed (the same run) or started: nothing is written before
      wd.write_config(prepared.saved_config)
      wd.save_tokenizer(prepared.tokenizer)  # the workdir is used on its own later (predict, export, init_checkpoint)

    per_run, name = [], cfg.run_name or os.path.basename(os.path.abspath(workdir))
    for seed, run_dir in prepared.run_dirs:
      seeds = len(prepared.run_dirs) > 1
      per_run.append(_train_run(prepared, seed, run_dir, preempt, started, f'{name}-seed{seed}' if seeds else name))
      if prepared.run_done:
        prepared.run_done(seed, run_dir, per_run[-1])
  final = prepared.results(per_run, time.monotonic() - start)
  wd.write_results(final)
  return final


def _init_state(run: Prepared, ckpt: Checkpointer, seed: int, run_dir: str, label: str) -> tuple[Any, int, bool]:
  """The init decision of a run directory: (train state, data position, whether it resumed)."""
  model = run.model
  if ckpt.latest_step() is not None:  # 1. resume
    state, meta = ckpt.restore(None, model.abstract_state, log=reporting.log,
                               check_meta=lambda meta: run.check_meta(meta, run_dir),
                               fresh_opt_state=model.init_opt_state if allows_fresh_optimizer(run.cfg) else None)
    position = int(meta['data_position'])
    reporting.log(f'{label}resumed from {ckpt.directory} at step {int(state["step"])} (data position {position})')
    return state, position, True
  if run.branch is not None:  # 2. another run's state, continued (a branch run)
    other = Checkpointer(run.branch.directory, read_only=True)
    try:
      state, meta = other.restore(run.branch.step, model.abstract_state, log=reporting.log,
                                  check_meta=run.branch.check_meta)
    finally:
      other.close()
    position = int(meta['data_position'])
    reporting.log(f'{label}branched from {run.branch.directory} at step {int(state["step"])} '
                  f'(data position {position})')
    return state, position, False
  # 3. from a source's weights, or 4. from scratch
  return model.init_state(run.weights() if run.weights else None, seed=seed), 0, False


def _train_run(run: Prepared, seed: int, run_dir: str, preempt: Preemption, started: Callable[[], None],
               name: str) -> dict[str, Any]:
  """One run directory: checkpointer, the init decision, fit, the final (or best) evaluation; `name`: the
  tracked run's (runs.tracking)."""
  cfg, model = run.cfg, run.model
  report = run.report(seed, run_dir)
  result, tracker = None, None
  ckpt = Checkpointer(run_dir, save_every=cfg.eval_every if cfg.keep_best else cfg.checkpoint_every or run.total_steps,
                      keep=cfg.keep_checkpoints, best_metric=run.main_metric if cfg.keep_best else None)
  try:
    state, position, resumed = _init_state(run, ckpt, seed, run_dir, report.label)
    started()
    tracker = tracking.start(cfg.tracking, project=cfg.tracking_project, run_name=name, config=cfg.to_dict(),
                             run_dir=run_dir)
    report = dataclasses.replace(report, tracker=tracker)
    # Predictions are written at the last step, unless the best step's are wanted.
    final_dir = None if cfg.keep_best else run_dir
    def held_out(params, step: int) -> dict[str, Any]:
      return run.evaluate(params, step, final_dir if step == run.total_steps else None)

    step, stats = int(jax.device_get(state['step'])), {}
    stopper = _early_stopping(cfg, run.main_metric, ckpt.meta(step) if resumed else None)
    stages = run.stages
    if stopper and stopper.stopped_at is not None:  # it stopped early before: finished at that step
      reporting.log(f'{report.label}stopped early at step {stopper.stopped_at} before: {stopper.reason()}')
      stages = []
      fitted = FitResult(state, step, None, {'train_steps_this_invocation': 0, 'train_wall_s': 0.0})
    for stage in [s for s in stages if s.end > step] or stages[-1:]:  # a finished run: the last one, at its end
      batches = run.batches(seed, position, step)
      fitted = fit(stage.model, state, batches, total_steps=stage.end, ckpt=ckpt, preempt=preempt,
                   report=dataclasses.replace(report, label=report.label + stage.label, fields=stage.fields),
                   log_every=cfg.log_every, checkpoint_config=cfg.to_dict(), checkpoint_extra=run.checkpoint_extra,
                   evaluate=held_out, eval_every=cfg.eval_every, eval_first=run.eval_first and not resumed,
                   eval_last=stage.evaluate_at_end or stage is stages[-1], early_stopping=stopper)
      state, step, position = fitted.state, fitted.step, batches.position
      stats = _add_stats(stats, fitted.stats)
      if fitted.stopped_early:
        break
    ckpt.wait()
    stats.pop('row_tokens', None)
    # train_steps: the run's steps (a resumed run's too); this invocation's are train_steps_this_invocation.
    result = {'seed': seed, 'step': fitted.step, 'train_steps': fitted.step, **stats,
              **(stopper.result() if stopper else {})}
    result.update(fitted.last_eval or run.evaluate(fitted.state['params'], fitted.step, final_dir))  # a finished run
    if cfg.keep_best:
      best = ckpt.best_step(run.main_metric)
      state, _ = ckpt.restore(best, model.abstract_state, log=reporting.log, params_only=True)
      result.update({'best_step': best, **run.evaluate(state['params'], best, run_dir)})
  finally:
    ckpt.close()
    if tracker:  # a run stopped by an error or a preemption is closed too, without final metrics
      tracker.finish(result, {'curves': os.path.join(report.curves_dir, 'curves.png')} if report.curves_dir else {})
  return result


def _early_stopping(cfg, main_metric: str, meta: dict[str, Any] | None) -> EarlyStopping | None:
  """The run's early stopping (None without patience), with the count its latest checkpoint kept."""
  if not getattr(cfg, 'early_stopping_patience', 0):
    return None
  stopper = EarlyStopping(cfg.early_stopping_metric or main_metric, cfg.early_stopping_patience,
                          cfg.early_stopping_min_delta)
  stopper.restore(meta)
  return stopper


def _add_stats(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
  """Training statistics of two stages together (padding weighted by the stages' row tokens)."""
  if not a:
    return dict(b)
  steps = 'train_steps_this_invocation'
  out = {steps: a[steps] + b[steps], 'train_wall_s': a['train_wall_s'] + b['train_wall_s']}
  if 'train_padding_fraction' in a or 'train_padding_fraction' in b:
    weighted = [(s['train_padding_fraction'], s['row_tokens']) for s in (a, b) if 'train_padding_fraction' in s]
    out['row_tokens'] = sum(n for _, n in weighted)
    out['train_padding_fraction'] = sum(f * n for f, n in weighted) / max(out['row_tokens'], 1)
  return out


def evaluate(job: Job, workdir: str, step: int | None, out_dir: Callable[[int, str, int], str | None], *,
             read_only: bool = False, on_result: Callable[[Prepared, int, dict[str, Any]], None] | None = None
             ) -> dict[str, Any]:
  """Evaluates each run directory's checkpoint `step` (None: the newest usable) of `workdir` again; returns
  the job's results over them. Checkpoints are only read.

  Args:
    job: the workdir's job, its config the workdir's own (with evaluation settings changed).
    workdir: the workdir.
    step: the checkpoint step of every run directory.
    out_dir: (seed, run_dir, step) -> where that evaluation's predictions and final_metrics.json go (None:
      nowhere).
    read_only: the workdir cannot be written: it is not claimed (else the claim keeps a training run out while
      results are written).
    on_result: called with each run directory's result as soon as it is evaluated.
  """
  wd = Workdir(workdir)
  mesh = shd.make_mesh(job.cfg.mesh)
  job.validate(mesh, wd)
  per_run = []
  claimed = contextlib.nullcontext() if read_only else wd.claim(job.kind, owner=jax.process_index() == 0,
                                                                 log=reporting.log)
  with claimed, Preemption() as preempt, \
      preempt.immediately('evaluating the workdir'):  # a signal: exit 75; the results written so far stay
    run = job.prepare(mesh, wd)
    for seed, run_dir in run.run_dirs:
      params, at = restore_for_evaluation(run_dir, run.model, step)
      where = out_dir(seed, run_dir, at)
      result = {'seed': seed, 'step': at, **run.evaluate(params, at, where)}
      if where:
        wd.write_results(result, where)
      if on_result:
        on_result(run, seed, result)
      per_run.append(result)
  return run.results(per_run, 0.0)


def restore_for_evaluation(run_dir: str, model: StepModel, step: int | None) -> tuple[Any, int]:
  """(params, step) of a run directory's checkpoint `step` (None: the newest usable), read only."""
  ckpt = Checkpointer(run_dir, read_only=True)
  try:
    if ckpt.latest_step() is None:
      raise CheckpointError(f'no checkpoint in {ckpt.directory}; train first')
    state, meta = ckpt.restore(step, model.abstract_params, log=reporting.log, params_only=True)
  finally:
    ckpt.close()
  return state['params'], int(meta['step'])


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """How one kind of workdir is evaluated again: what `evaluate_workdir` asks of a kind, declared by its package
  (`pretraining.evaluation.EVALUATION`, `finetuning.finetune.EVALUATION`) and handed in by the caller.

  Attributes:
    kinds: the `inspect` kinds it evaluates (None: a new, empty or unknown directory, which it refuses).
    name: how messages name its workdirs ('pretraining', 'fine-tuning').
    fields: the config fields an evaluation may change (the `evaluation` fact of its config).
    options: the options it takes beside the step and the fields ('all_steps', 'output_dir', ...).
    scope: what its evaluation is, said after refusing another kind's option.
    run: (path, step, overrides, options) -> its results, printed (process 0) and written as the kind does.
  """

  kinds: tuple[str | None, ...]
  name: str
  fields: tuple[str, ...]
  options: tuple[str, ...]
  scope: str
  run: Callable[[str, int | None, dict[str, Any], dict[str, Any]], Any]


def evaluate_workdir(path: str, evaluations: Sequence[Evaluation], step: int | None = None,
                     overrides: dict[str, Any] | None = None, options: dict[str, Any] | None = None) -> Any:
  """Evaluates the workdir at `path` again with the evaluation of its kind (`inspect(path).kind`); returns its
  results. Options and fields of another kind are refused first, before any model work, in one line.

  Args:
    path: the workdir.
    evaluations: the evaluation of each kind; the first one is that of a kind none declares (it refuses it).
    step: the checkpoint step (None: the newest usable).
    overrides: config fields to change (evaluation settings only).
    options: the evaluation options given, by name (a false value: not given).
  """
  kind = inspect(path).kind
  evaluation = next((e for e in evaluations if kind in e.kinds), evaluations[0])
  overrides, given = overrides or {}, {k: v for k, v in (options or {}).items() if v}
  _check_options(evaluation, evaluations, given)
  _check_fields(evaluation, evaluations, overrides)
  return evaluation.run(path, step, overrides, given)


def _check_options(evaluation: Evaluation, evaluations: Sequence[Evaluation], given: dict[str, Any]) -> None:
  """ConfigError naming the given options of another kind (the kind declaring them; in its order)."""
  for other in evaluations:
    theirs = [f'--{o}' for o in other.options if o in given and o not in evaluation.options]
    if theirs:
      verb = 'applies' if len(other.options) == 1 else 'apply'  # a kind's options are named as a set
      raise ConfigError(f'{" and ".join(theirs)} {verb} to {other.name} workdirs; {evaluation.scope}')


def _check_fields(evaluation: Evaluation, evaluations: Sequence[Evaluation], overrides: dict[str, Any]) -> None:
  """ConfigError naming the given config fields only another kind's evaluation takes."""
  for other in evaluations:
    theirs = sorted(n for n in overrides if n in other.fields and n not in evaluation.fields)
    if theirs:
      raise ConfigError(f'--config.{", --config.".join(theirs)} apply to {other.name} workdirs; a {evaluation.name} '
                        f'workdir takes {", ".join(evaluation.fields)}')
