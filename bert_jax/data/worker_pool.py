"""The preparation's worker processes: a function mapped over work units, with progress lines.

Workers are spawned (they never inherit a started jax runtime), each pinned to its own core; they
die with the process that started them and are stopped together on an error, a signal or
Ctrl-C (their units have no marker yet: a resumed build makes them again).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
import threading
import time
from typing import Sequence

from bert_jax.data import work_units

_PROGRESS_EVERY_S = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def map_units(fn, job: work_units.Job, units: Sequence[work_units.Unit], arg, what: str, *, workers: int,
              first_core: int, log):
  """Yields fn(job, unit, arg) for every unit (any order), in `workers` worker processes, with progress.

  Each worker (or this thread, when one worker does all) is pinned to its own core, counting
  on from first_core (process_index * workers, so that processes sharing a host spread out).
  """
  progress = _Progress(what, units, log)
  if workers == 1 or len(units) <= 1:
    before = _pin(first_core)
    try:
      for unit in units:
        result = fn(job, unit, arg)
        progress.done(unit)
        yield result
    finally:
      if before is not None:
        os.sched_setaffinity(0, before)
  else:
    ctx = multiprocessing.get_context('spawn')  # never fork a process that may run jax
    started = ctx.Value('i', 0)
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(units)), mp_context=ctx,
                                                initializer=_init_worker,
                                                initargs=(started, first_core, os.getpid())) as pool:
      futures = {pool.submit(fn, job, u, arg): u for u in units}
      try:
        for future in concurrent.futures.as_completed(futures):
          result = future.result()
          progress.done(futures[future])
          yield result
      except BaseException:  # an error, a signal (Preempted) or Ctrl-C: stop the units in progress too
        for f in futures:
          f.cancel()
        _stop_workers(pool)
        raise
  progress.finish()


class _Progress:
  """Process-0 progress lines: units done, MB read, MB/s, ETA."""

  def __init__(self, what: str, units: Sequence[work_units.Unit], log):
    self.what, self.log = what, log
    self.total_units, self.total_bytes = len(units), sum(u.nbytes for u in units)
    self.units = self.bytes = self.printed = 0
    self.t0 = self.last = time.time()

  def done(self, unit: work_units.Unit) -> None:
    self.units += 1
    self.bytes += unit.nbytes
    if time.time() - self.last >= _PROGRESS_EVERY_S:
      self._print()

  def finish(self) -> None:
    if self.total_units and self.printed < self.units:  # the last line, unless already printed
      self._print()

  def _print(self) -> None:
    self.last = now = time.time()
    self.printed = self.units
    rate = self.bytes / max(now - self.t0, 1e-9)
    eta = (self.total_bytes - self.bytes) / rate if rate > 0 else float('inf')
    eta_s = f'{eta:.0f}s' if eta != float('inf') else '?'
    self.log(f'prepare {self.what}: {self.units}/{self.total_units} units | {self.bytes / 1e6:,.1f}/'
             f'{self.total_bytes / 1e6:,.1f} MB | {rate / 1e6:.2f} MB/s | ETA {eta_s}')


def allowed_cores() -> list[int]:
  """The cores this process may run on."""
  return sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else list(range(os.cpu_count() or 1))


def _pin(k: int) -> set[int] | None:
  """Pins the calling thread to the k-th allowed core (mod their count); returns the old set.

  A worker left to the scheduler migrates between cores, which slows pure-Python work
  (docs/results.md has the figure).
  """
  if not hasattr(os, 'sched_setaffinity'):
    return None
  before = os.sched_getaffinity(0)
  cores = sorted(before)
  os.sched_setaffinity(0, {cores[k % len(cores)]})
  return before


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Kills the pool's worker processes at once (their units are unfinished: no marker, rebuilt on resume)."""
  terminate = getattr(pool, 'terminate_workers', None)  # Python >= 3.14
  if terminate is not None:
    terminate()
    return
  for process in list((getattr(pool, '_processes', None) or {}).values()):
    process.terminate()
  for process in list((getattr(pool, '_processes', None) or {}).values()):
    process.join(5)


def _die_with_parent(parent: int) -> None:
  """Makes this worker exit when the process that started it dies (kill -9 included)."""
  try:  # Linux: the kernel sends SIGKILL when the parent goes
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent:  # it died before prctl took effect
    os._exit(1)  # pylint: disable=protected-access

  def watch():  # elsewhere (and as a second guard): reparented means orphaned
    while os.getppid() == parent:
      time.sleep(1.0)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, daemon=True, name='parent-watch').start()


def _init_worker(started, first_core: int, parent: int) -> None:
  _die_with_parent(parent)
  # The parent turns SIGTERM/SIGINT into stopping the whole pool; a worker must not die on its own
  # (a Ctrl-C reaches every process of the terminal's group) and leave the pool broken.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # One core per worker: the libraries' own thread pools would oversubscribe the machine
  # (`work_units._tokenize` also asks for one thread).
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  with started.get_lock():
    k = started.value
    started.value += 1
  _pin(first_core + k)
