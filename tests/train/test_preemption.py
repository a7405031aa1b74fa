"""Preemption with several processes: agreement points come at least every AGREE_EVERY_S seconds of training,
at steps every process computes alike (from the slowest process's step time), not only at log steps. A signal
during a compile: acknowledged at once, acted on when the compile returns. A SIGTERM delivered twice before its
handler could run: one SIGTERM."""

import os
import signal
import threading
import time

import numpy as np
import pytest

from bert_jax.runs import interrupts
from bert_jax.train import preemption

from harness.faults import SignalledRun, compiling_entry


def test_agreement_points_follow_the_slowest_step_time(monkeypatch):
  clock = [0.0]
  gathers = []
  monkeypatch.setattr(preemption.jax, 'process_count', lambda: 2)
  monkeypatch.setattr(preemption, '_pod_notice', lambda step: False)
  monkeypatch.setattr(preemption.time, 'monotonic', lambda: clock[0])

  def allgather(local):  # the other process: no signal, steps 1.5x as slow as this one
    gathers.append(step)
    return np.stack([local, np.array([0.0, local[1] * 1.5], np.float32)])
  monkeypatch.setattr(preemption.multihost_utils, 'process_allgather', allgather)

  p = preemption.Preemption()
  for step in range(1, 30):
    clock[0] += 0.5  # 0.5 s a step here, 0.75 s on the other process: agree every 10 s // 0.75 s = 13 steps
    assert not p.stop_now(step, synced=False)
  assert gathers == [1, 2, 15, 28]  # after the first step (compilation), then every 13 steps
  p.signal_name = 'SIGTERM'
  assert [p.stop_now(step, synced=False) for step in range(30, 42)] == [False] * 11 + [True]  # at 28 + 13
  assert p.stop_now(42, synced=True)  # a log or checkpoint step agrees too
  assert preemption.next_agreement_in(0.0) == 1 and preemption.next_agreement_in(100.0) == 1


@pytest.mark.slow
@pytest.mark.parametrize('inside, acknowledgement, preempted', [
    ('training', 'SIGTERM received: finishing step 1 (once the compile in progress returns), then saving',
     'preempted: SIGTERM received: stopped at step 1; nothing newer to save.'),
    ('immediately', 'SIGTERM received while jax compiles (XLA cannot be interrupted): it stops (preparing the data, '
     'what was finished is kept) once that returns. Another SIGTERM stops at once',
     'preempted: SIGTERM received while preparing the data: what was finished is kept.'),
])
def test_sigterm_during_a_compile_is_acknowledged_at_once_and_stops_when_it_returns(tmp_path, inside,
                                                                                     acknowledgement, preempted):
  """A scheduler's SIGTERM during a compile (minutes on a busy machine) is acknowledged within a second or two, while
  the compile runs on, and the process stops with exit code 75 once it returns. Where a stop raises at once (data
  preparation, evaluating a workdir), raising inside the compile would abandon it, and the process would be killed
  by a segmentation fault at its exit (-11, not 75) when XLA finished it."""
  run = SignalledRun(compiling_entry(tmp_path, 1500, inside))
  run.started()
  time.sleep(0.5)  # inside the compile
  sent = run.send(signal.SIGTERM)
  acknowledged = run.line(acknowledgement)
  assert run.wait(timeout=300) == preemption.EXIT_CODE, run.stderr
  lines = run.stderr.splitlines()
  assert acknowledged - sent < 2.0 and lines.index('compiled') > lines.index(acknowledgement), (acknowledged - sent,
                                                                                              run.stderr)
  assert lines[-1].startswith(preempted) and lines.index('compiled') == len(lines) - 2, run.stderr


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason='signal handlers: main thread')
def test_a_sigterm_delivered_twice_inside_a_step_finishes_that_step_and_saves(capfd, monkeypatch):
  """SLURM's SIGTERM comes twice (to the step's tasks and through srun), here both while the main thread is inside a
  call that runs no handler (a step's computation): the step finishes and is saved, as for one SIGTERM."""
  stopped = []
  monkeypatch.setattr(interrupts, '_die', stopped.append)
  kill = lambda: os.kill(os.getpid(), signal.SIGTERM)
  try:
    with preemption.Preemption() as preempt:
      assert not preempt.stop_now(0, synced=False)  # step 1 in flight
      threading.Timer(0.1, kill).start()
      threading.Timer(0.15, kill).start()
      signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # other threads take them; the handler waits
      time.sleep(1.5)  # past ACK_AFTER_S of both
      assert preempt.stop_now(1, synced=False)
  finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
  assert stopped == [] and capfd.readouterr().err == 'SIGTERM received: finishing step 1, then saving\n'
  assert preempt.message(1, saved=True).startswith('SIGTERM received: saved step 1.')


def test_the_sigint_handler_found_comes_back_after_a_run():
  """Preemption inside interrupts.watching replaces the watcher's SIGINT handler: once both end, Python's own
  handler is back (a library call left `keyboard_interrupt` installed for the rest of the process)."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers need the main thread')
  before = signal.getsignal(signal.SIGINT)
  with preemption.Preemption():
    assert signal.getsignal(signal.SIGINT) is not before
  assert signal.getsignal(signal.SIGINT) is before
