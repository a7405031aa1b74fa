"""Preemption: SIGTERM / SIGINT become "save this step and stop" instead of a lost run.

SLURM (with --signal), Kubernetes and a preempted cloud VM send SIGTERM some seconds before
they kill; Ctrl-C sends SIGINT. `Preemption` turns either into a flag that the training loops
read after each step: they finish the save in flight, save the current step, and raise
`Preempted`, which the entry points report in one line with exit code `EXIT_CODE`. The signal is
acknowledged on stderr when it arrives (`SIGTERM received: finishing step N, then saving`); the
loop keeps at most two steps in flight, so that step is at most two step times away. A second
signal falls through to Python's default (Ctrl-C twice interrupts at once). Signals that all came
before the handler could run (SLURM sends a job's SIGTERM to the step's tasks and through srun,
moments apart, while a step computes) are one signal: the handler runs once for them.

During a compile (minutes on a busy machine) jax >= 0.10 runs these handlers too, but an
exception raised there abandons the compile, and the process crashes when it exits
(`bert_jax.runs.interrupts`). So in an `immediately` block a signal during a compile is
acknowledged at once and raises when the compile returns; elsewhere the handler sets the flag and
says so at once, as always. A second signal then stops the process at once (SIGTERM by its
default action, SIGINT through `interrupts`), keeping the last complete checkpoint. Where a
handler cannot run (a call into XLA that does not run them), `interrupts.watching` acknowledges
the signal from a thread of its own.

With several processes all of them must save the same step. A signal may reach them at
different steps (or only one of them), so the flag is agreed on with a tiny all-gather at
agreement points: log and checkpoint steps, and steps every process computes alike from the
measured step time so that they are at most `AGREE_EVERY_S` apart; on TPU pods jax's own
preemption notice (`multihost_utils.reached_preemption_sync_point`) is checked every step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

import jax
from jax.experimental import multihost_utils
import numpy as np

from bert_jax.errors import Preempted  # pylint: disable=unused-import  # raised here, caught by entry points
from bert_jax.runs import interrupts

# EX_TEMPFAIL from sysexits.h: "try again later". Launchers can requeue on it.
EXIT_CODE = 75
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# With several processes, the most seconds of training between two agreement points: a stop then waits at most
# this long (plus the step in flight), far inside SLURM's 120 s of warning.
AGREE_EVERY_S = 10.0


class Preemption:
  """Catches SIGTERM/SIGINT while active (a context manager); `stop_now(step, synced)` says when to stop."""

  def __init__(self):
    self.signal_name: str | None = None
    self.step: int | None = None  # the step a stop saves, kept by the training loop (None: not training)
    self._previous = {}
    self._watching = None  # interrupts.watching, while active in the main thread
    self._immediate: str | None = None  # what the block of `immediately` is doing
    self._next_agreement = 0  # several processes: the next step that is an agreement point
    self._agreed_at: tuple[int, float] | None = None  # (step, time) of the last agreement

  def __enter__(self) -> 'Preemption':
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
      self._watching = interrupts.watching(then=self._then)
      self._watching.__enter__()  # pylint: disable=unnecessary-dunder-call
      for sig in _SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    try:  # first: a signal deferred in a compile that has just returned comes to the handlers of this block
      if self._watching is not None:
        watching, self._watching = self._watching, None
        watching.__exit__(None, None, None)
    finally:
      for sig, handler in self._previous.items():  # the watcher has ended: keyboard_interrupt is Python's again
        signal.signal(sig, interrupts.restorable(handler))
      self._previous = {}

  @interrupts.tells_watcher
  def _handle(self, signum, frame) -> None:
    if self._immediate and interrupts.deferred(signum, frame):  # raising inside a compile would abandon it
      return
    self.signal_name = signal.Signals(signum).name
    signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else interrupts.keyboard_interrupt)
    if self._immediate:
      raise Preempted(self._immediate_message())
    if self.step is None:
      what = 'the run stops before it trains again (the work in progress finishes first)'
    elif jax.process_count() == 1:
      after = ' (once the compile in progress returns)' if interrupts.compiling(frame) else ''
      what = f'finishing step {self.step}{after}, then saving'
    else:
      what = f'saving at the next step all processes agree on (within ~{AGREE_EVERY_S:g} s of training)'
    # os.write, not print: the handler may interrupt a print of the main thread (a reentrant write fails).
    os.write(2, f'{self.signal_name} received: {what}\n'.encode())

  def _then(self) -> tuple[str, str]:
    """What a signal whose handler waits for the main thread leads to once it runs, and what a stop at once keeps
    (`interrupts.watching`; called from its thread)."""
    if self._immediate:
      return f'it stops ({self._immediate}, what was finished is kept)', ''
    kept = ', keeping the last complete checkpoint'
    if self.step is None:
      return 'the run stops before it trains again', kept
    if jax.process_count() == 1:
      return f'step {self.step} finishes and is saved', kept
    return 'the step all processes agree on is saved', kept

  def _immediate_message(self) -> str:
    return (f'{self.signal_name} received while {self._immediate}: what was finished is kept. Run the same '
            f'command again to resume (exit code {EXIT_CODE})')

  @contextlib.contextmanager
  def immediately(self, what: str) -> Iterator[None]:
    """While the block runs, a signal raises Preempted at once instead of setting the flag.

    For work that keeps what it finished and has nothing to save, such as data preparation
    (finished units stay; their workers are stopped as the exception unwinds).

    Args:
      what: the work, as the message names it ('preparing the data').
    """
    self._immediate = what
    try:
      if self.signal_name:  # a signal that came just before
        raise Preempted(self._immediate_message())
      yield
      interrupts.bring_back()  # a signal deferred in a compile that returned just before the block's end raises here
    finally:
      self._immediate = None

  def stop_now(self, step: int, synced: bool) -> bool:
    """Whether every process should save `step` and stop.

    Args:
      step: the step just trained.
      synced: whether all processes are at a step where they exchange data anyway (log or
        checkpoint steps); other processes' signals are only learnt there.
    """
    if jax.process_count() == 1:
      if self.signal_name is not None:
        return True
      # No call between the test above and this store, so CPython runs no handler in between: a signal
      # acknowledged as "finishing step N" always stops at step N.
      self.step = step + 1
      return False
    if _pod_notice(step):
      self.signal_name = self.signal_name or 'a preemption notice'
      return True
    if not synced and step < self._next_agreement:
      self.step = step + 1
      return False
    now = time.monotonic()
    # The seconds per step since the last agreement go into the gather too: every process then computes the same
    # next agreement step from the slowest one's rate.
    step_s = (now - self._agreed_at[1]) / max(step - self._agreed_at[0], 1) if self._agreed_at else 0.0
    gathered = np.asarray(multihost_utils.process_allgather(
        np.array([float(self.signal_name is not None), step_s], np.float32)))
    flags, slowest = gathered[..., 0], float(np.max(gathered[..., 1]))
    self._next_agreement = step + next_agreement_in(slowest)
    self._agreed_at = (step, now)
    if np.any(flags) and self.signal_name is None:
      self.signal_name = 'a signal to another process'
    if not np.any(flags):
      self.step = step + 1
    return bool(np.any(flags))

  def message(self, step: int, saved: bool) -> str:
    what = f'saved step {step}' if saved else f'stopped at step {step}; nothing newer to save'
    return (f'{self.signal_name or "a signal"} received: {what}. Run the same command again to resume '
            f'(exit code {EXIT_CODE})')


def next_agreement_in(step_s: float) -> int:
  """Steps to the next agreement point when a step takes `step_s` seconds (0: not measured yet, agree after the
  next step)."""
  if step_s <= 0:
    return 1
  return max(1, int(AGREE_EVERY_S // step_s))


def _pod_notice(step: int) -> bool:
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:  # jax's preemption service is off
    return False
