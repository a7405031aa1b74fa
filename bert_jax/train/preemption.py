"""Preemption: SIGTERM / SIGINT become "save this step and stop" instead of a lost run.

SLURM (with --signal), Kubernetes and a preempted cloud VM send SIGTERM some seconds before
they kill; Ctrl-C sends SIGINT. `Preemption` turns either into a flag that the training loops
read after each step: they finish the save in flight, save the current step, and raise
`Preempted`, which the entry points report in one line with exit code `EXIT_CODE`. The signal is
acknowledged on stderr when it arrives (`SIGTERM received: finishing step N, then saving`); the
loop keeps at most two steps in flight, so that step is at most two step times away. A second
signal falls through to Python's default (Ctrl-C twice interrupts at once).

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
    self._immediate: str | None = None  # what the block of `immediately` is doing
    self._next_agreement = 0  # several processes: the next step that is an agreement point
    self._agreed_at: tuple[int, float] | None = None  # (step, time) of the last agreement

  def __enter__(self) -> 'Preemption':
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
      for sig in _SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    self.signal_name = signal.Signals(signum).name
    signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)
    if self._immediate:
      raise Preempted(self._immediate_message())
    if self.step is not None:
      # os.write, not print: the handler may interrupt a print of the main thread (a reentrant write fails).
      what = (f'finishing step {self.step}, then saving' if jax.process_count() == 1 else
              f'saving at the next step all processes agree on (within ~{AGREE_EVERY_S:g} s of training)')
      os.write(2, f'{self.signal_name} received: {what}\n'.encode())

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
