"""fit(): the one training loop of pretraining and fine-tuning.

Each step feeds this process's block of the global batch to the jitted train step. Values come
back to the host only at sync points (log steps, checkpoint steps, the last step, a stop): there
every pending loss is checked for NaN/Inf, the progress line is printed and written, and
processes agree on a preemption. After dispatching each step the host waits for the step before
it: at most two steps are queued (a stop saves within two step times) and the device never idles.
A checkpoint is saved on the manager's cadence, at the last step and on a stop, after checking
that the parameters are sane; a stop saves the step in progress and raises Preempted. Evaluation
is the run's hook, called every `eval_every` steps and at the end; its metrics go to
metrics_eval.jsonl and curves.png.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np

from bert_jax.errors import BertJaxError, Preempted
from bert_jax.runs import reporting
from bert_jax.runs.checkpoints import Checkpointer, state_problem
from bert_jax.train.early_stopping import META_KEY, EarlyStopping
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel


class TrainingDivergedError(BertJaxError, FloatingPointError):
  """The loss became NaN or Inf, or the parameters exploded."""


class Batches(Protocol):
  """This process's block of each global batch, in order.

  Attributes:
    position: batches consumed (saved in checkpoints: where a resume continues).
    last_sizes: the last global batch's 'rows', 'row_tokens', 'real_tokens' and 'examples' (throughput,
      padding): every process knows them exactly, without communication.
  """

  position: int
  last_sizes: dict[str, int]

  def __next__(self) -> dict[str, np.ndarray]:
    ...

  def close(self) -> None:
    ...


def _token_shape(local: dict[str, np.ndarray]) -> tuple[int, ...]:
  """The shape of a batch's token rows: its input_ids (a contrastive batch: its passages')."""
  return tuple(local['input_ids' if 'input_ids' in local else 'passage_input_ids'].shape)


@dataclasses.dataclass(frozen=True)
class Report:
  """What the run's lines say and where its files go.

  Attributes:
    workdir: metrics_{train,eval}.jsonl and tb/ go here.
    label: prefixes every line ('seed 0: ' in fine-tuning).
    progress_keys: train metrics shown in the progress line (all are written to the JSONL).
    eval_keys: held-out metrics shown in the eval line (all numbers are written).
    curves_dir: where curves.png is redrawn: from a progress line or an evaluation once CURVES_EVERY_S have passed
      since the start or the last drawing, and when `fit` ends (done or diverged; not when a signal stops it) if a
      row was written since, or the run resumed (None: not here).
    curves_metrics: the held-out metrics it plots (None: every accuracy).
    divergence_hint: what to change when the loss diverges, as flags.
    fields: added to every train and held-out metrics row (e.g. {'phase': 2}).
    tracker: also gets every train and held-out metrics row (runs.tracking; None: the files only).
  """

  workdir: str
  label: str = ''
  progress_keys: Sequence[str] = ('loss',)
  eval_keys: Sequence[str] | None = None
  curves_dir: str | None = None
  curves_metrics: Sequence[str] | None = None
  divergence_hint: str = 'lower the learning rate'
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)
  tracker: Any = None


@dataclasses.dataclass
class FitResult:
  state: dict[str, Any]
  step: int
  last_eval: dict[str, Any] | None  # the held-out metrics of the last evaluation, if any
  stats: dict[str, float]  # train_steps_this_invocation, train_wall_s, train_padding_fraction (and its row_tokens)
  stopped_early: bool = False  # the early stopping (fit's `early_stopping`) ended it before total_steps


def fit(model: StepModel, state: dict[str, Any], batches: Batches, *,
        total_steps: int, ckpt: Checkpointer, preempt: Preemption, report: Report, log_every: int,
        checkpoint_config: dict[str, Any], checkpoint_extra: dict[str, Any] | None = None,
        evaluate: Callable[[Any, int], dict[str, Any]] | None = None, eval_every: int = 0,
        eval_first: bool = False, eval_last: bool = True, early_stopping: EarlyStopping | None = None) -> FitResult:
  """Trains `state` from its step to `total_steps` on `batches`; see the module docstring.

  Args:
    model: the StepModel (its objective's metrics are logged).
    state: the train state to continue.
    batches: yields this process's block of each global batch; its `position` is saved in the
      checkpoints (the data position a resume starts from).
    total_steps: the last step.
    ckpt: saves on its cadence, at the last step and on a stop.
    preempt: the active Preemption (signals become a save and Preempted).
    report: lines and files.
    log_every: steps between progress lines (and sync points).
    checkpoint_config: the run's config, saved in each checkpoint's meta.
    checkpoint_extra: more meta (e.g. the data fingerprint).
    evaluate: (params, step) -> held-out metrics; called every `eval_every` steps (0: never
      periodically) and at the last step.
    eval_every: see `evaluate`.
    eval_first: evaluate before the first step too (a run continued from other weights).
    eval_last: evaluate at `total_steps` (False: a stage of a run that goes on, e.g. a batch size of a ramp).
    early_stopping: counts each periodic evaluation; when it says stop, the step is saved (its state in the meta)
      and fit returns with `stopped_early`.

  Returns:
    The final state, step, last evaluation and training statistics.

  Raises:
    TrainingDivergedError: a non-finite loss or exploded parameters (never saved).
    Preempted: a signal; the current step was saved.
  """
  start = int(jax.device_get(state['step']))
  step, pending, last_eval, last_good = start, [], None, ckpt.latest_step()
  previous = None  # the metrics of the step before the one just dispatched
  compiled = set()  # the batch shapes whose train step this process has compiled
  progress = reporting.Progress(start, total_steps)
  # A resumed run draws at its end even without new rows: the process before it may have stopped (a signal) with
  # rows not drawn yet, its last evaluation among them.
  writers = _Writers(report, undrawn=start > 0)
  draw = True  # curves.png at the end: not on the way out of a stop (a preemption's grace period is for the save)
  try:
    if eval_first and evaluate is not None and start == 0:
      last_eval = writers.evaluation(0, evaluate(state['params'], 0))
    # train_wall_s: from here, less the evaluations on the way (evaluating is not training: a peer's trainer times
    # its training alone, and the starting weights' evaluation above is not counted either).
    t0, eval_s = time.time(), 0.0
    state_problem(state['params'])  # compiles the check before every save now: a stop is not slowed by it
    if preempt.stop_now(step, synced=False):  # a signal during preparation or compilation
      raise Preempted(report.label + preempt.message(step, saved=False))
    while step < total_steps:
      t_wait = time.perf_counter()
      local = next(batches)
      shape = _token_shape(local)
      progress.add(batches.last_sizes, shape[1], time.perf_counter() - t_wait)
      if shape not in compiled:  # a first step of this shape compiles (tens of seconds on large models): say so
        reporting.log(f'compiling the train step for {shape[0]} x {shape[1]} tokens per process ...')
        t_compile = time.perf_counter()
      state, step_metrics = model.train_step(state, model.global_batch(local), model.rest)
      if shape not in compiled:
        compiled.add(shape)
        reporting.log(f'train step compiled in {time.perf_counter() - t_compile:.1f} s')
      pending.append(step_metrics)
      if previous is not None:  # bounds the steps in flight to two (the one just dispatched runs meanwhile)
        jax.block_until_ready(previous)
      previous = step_metrics
      step += 1
      is_last = step == total_steps
      log_now = step % log_every == 0 or is_last
      save_now = ckpt.manager.should_save(step) or is_last
      stop = preempt.stop_now(step, synced=log_now or save_now)
      if log_now or save_now or stop:  # a sync point: the pending metrics come to the host
        host, pending = jax.device_get(pending), []
        bad = [m['loss'] for m in host if not math.isfinite(m['loss'])]
        if bad:
          raise _diverged(report, f'the loss became {bad[0]}', step, last_good)
        if log_now:
          writers.progress(step, total_steps, host, progress.update(step))
      elif reporting.silent_for() > HEARTBEAT_S:  # slow steps between progress lines: where it is, without a sync
        done = step - start
        reporting.log(f'{report.label}step {step}/{total_steps} | ETA '
                      f'{reporting.format_duration((time.time() - t0) / done * (total_steps - step))}')
      evaluated = None
      if evaluate is not None and ((eval_every and step % eval_every == 0) or (is_last and eval_last)):
        jax.block_until_ready(state)  # the step in flight is training time, not the evaluation's
        t_eval = time.time()
        last_eval = evaluated = writers.evaluation(step, evaluate(state['params'], step))
        eval_s += time.time() - t_eval
        if early_stopping is not None and not is_last and early_stopping.update(step, evaluated):
          reporting.log(f'{report.label}stopping early at step {step}: {early_stopping.reason()}')
          save_now = True
      if save_now or stop:
        # The losses so far are finite; the parameters this step produced must be sane too.
        problem = state_problem(state['params'])
        if problem:
          raise _diverged(report, problem.replace('its parameters', 'the parameters'), step, last_good)
        extra = {**(checkpoint_extra or {}), **({META_KEY: early_stopping.state()} if early_stopping else {})}
        if ckpt.save(step, state, data_position=batches.position, config=checkpoint_config, force=True,
                     extra=extra, metrics=_numbers(evaluated)):
          last_good = step
      if stop:
        ckpt.wait()
        raise Preempted(report.label + preempt.message(step, saved=True))
      if early_stopping is not None and early_stopping.stopped_at == step:
        break
    jax.block_until_ready(state)
  except (Preempted, KeyboardInterrupt):
    draw = False
    raise
  finally:
    preempt.step = None  # a signal from here on is not "finishing a step"
    close = getattr(batches, 'close', None)
    if close:
      close()
    writers.close(draw=draw)
  stats = {'train_steps_this_invocation': step - start, 'train_wall_s': time.time() - t0 - eval_s}
  if progress.row_tokens:
    stats['train_padding_fraction'] = 1 - progress.real_tokens / progress.row_tokens
    stats['row_tokens'] = progress.row_tokens  # what stages' padding fractions are weighted by
  return FitResult(state, step, last_eval, stats, stopped_early=step < total_steps)


# No stretch of training is silent for longer than this: between progress lines (log_every steps apart, which on a
# slow machine or a large model can be minutes), a short line with the step and the ETA.
HEARTBEAT_S = 10.0

# curves.png shows the training curves from the first minute on, not only from the first evaluation; drawing takes
# a third of a second to a second (matplotlib), so progress lines and evaluations redraw it at most this often (a
# short run evaluating every few seconds spent a third of its time drawing), and the end of `fit` draws what is left.
CURVES_EVERY_S = 60.0


class _Writers:
  """The run's train and held-out JSONL/TensorBoard writers and lines (process 0)."""

  def __init__(self, report: Report, undrawn: bool = False):
    self.report = report
    self._drawn = time.perf_counter()  # when curves.png was last drawn (the start: a short run draws at its end)
    self._undrawn = undrawn  # a row was written since (or, resuming, may have been by the process before)
    self.train = reporting.MetricWriter(report.workdir, 'train')
    self.eval = reporting.MetricWriter(report.workdir, 'eval')

  def progress(self, step: int, total: int, host_metrics: list[dict[str, Any]], rate: dict[str, float]) -> None:
    means = {k: float(np.mean([m[k] for m in host_metrics])) for k in host_metrics[0]}
    row = {**means, **{k: v for k, v in rate.items() if k not in ('eta_s', 'packed')}, **self.report.fields}
    self.train.write(step, row)
    if self.report.tracker:
      self.report.tracker.log(step, row, 'train')
    shown = {k: means[k] for k in (*self.report.progress_keys, 'learning_rate', 'grad_norm') if k in means}
    reporting.log(reporting.progress_line(self.report.label, step, total, shown, rate))
    self._written()

  def evaluation(self, step: int, result: dict[str, Any]) -> dict[str, Any]:
    row = {**(_numbers(result) or {}), **self.report.fields}
    self.eval.write(step, row)
    if self.report.tracker:
      self.report.tracker.log(step, row, 'eval')
    keys = self.report.eval_keys if self.report.eval_keys is not None else list(result)
    reporting.log(f'{self.report.label}eval step {step} | ' + reporting.format_metrics(
        {k: result[k] for k in keys if k in result}))
    self._written()
    return result

  def _written(self) -> None:
    self._undrawn = True
    if time.perf_counter() - self._drawn >= CURVES_EVERY_S:
      self._curves()

  def _curves(self) -> None:
    if self.report.curves_dir:
      reporting.write_curves(self.report.curves_dir, metrics=self.report.curves_metrics)
    self._drawn, self._undrawn = time.perf_counter(), False

  def close(self, draw: bool = True) -> None:
    """Closes the metric files, then (`draw`) draws curves.png if a row came since the last drawing (the run's
    last)."""
    self.train.close()
    self.eval.close()
    if draw and self._undrawn:
      self._curves()


def _numbers(metrics: dict[str, Any] | None) -> dict[str, float] | None:
  """The plain numbers of an evaluation (what a checkpoint's meta keeps and ranks by)."""
  if not metrics:
    return None
  return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _diverged(report: Report, what: str, step: int, last_good: int | None) -> TrainingDivergedError:
  kept = f'the last good checkpoint (step {last_good}) is kept' if last_good else 'no checkpoint was written'
  return TrainingDivergedError(f'{report.label}{what} at or before step {step}; stopping, {kept}. '
                               f'{report.divergence_hint}')
