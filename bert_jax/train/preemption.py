"""Preemption: SIGTERM / SIGINT become "save this step and stop" instead of a lost run.

SLURM (with --signal), Kubernetes and a preempted cloud VM send SIGTERM some seconds before
they kill; Ctrl-C sends SIGINT. `Preemption` turns either into a flag that the training loops
read after each step: they finish the save in flight, save the current step, and raise
`Preempted`, which the entry points report in one line with exit code `EXIT_CODE`. A second
signal falls through to Python's default (Ctrl-C twice interrupts at once).

With several processes all of them must save the same step. A signal may reach them at
different steps (or only one of them), so the flag is agreed on with a tiny all-gather, only
at steps where the loop synchronises anyway (log and checkpoint steps); on TPU pods jax's own
preemption notice (`multihost_utils.reached_preemption_sync_point`) is checked every step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import jax
from jax.experimental import multihost_utils
import numpy as np

from bert_jax.errors import Preempted  # pylint: disable=unused-import  # raised here, caught by entry points

# EX_TEMPFAIL from sysexits.h: "try again later". Launchers can requeue on it.
EXIT_CODE = 75
_SIGNALS = (signal.SIGTERM, signal.SIGINT)



class Preemption:
  """Catches SIGTERM/SIGINT while active (a context manager); `stop_now(step, synced)` says when to stop."""

  def __init__(self):
    self.signal_name: str | None = None
    self._previous = {}
    self._immediate: str | None = None  # what the block of `immediately` is doing

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
      return self.signal_name is not None
    if _pod_notice(step):
      self.signal_name = self.signal_name or 'a preemption notice'
      return True
    if not synced:
      return False
    flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
    if np.any(flags) and self.signal_name is None:
      self.signal_name = 'a signal to another process'
    return bool(np.any(flags))

  def message(self, step: int, saved: bool) -> str:
    what = f'saved step {step}' if saved else f'stopped at step {step}; nothing newer to save'
    return (f'{self.signal_name or "a signal"} received: {what}. Run the same command again to resume '
            f'(exit code {EXIT_CODE})')


def _pod_notice(step: int) -> bool:
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:  # jax's preemption service is off
    return False
