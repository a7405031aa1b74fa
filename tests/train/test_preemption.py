"""Preemption with several processes: agreement points come at least every AGREE_EVERY_S seconds of training,
at steps every process computes alike (from the slowest process's step time), not only at log steps. A signal
during a compile: acknowledged at once, acted on when the compile returns."""

import signal
import time

import numpy as np
import pytest

from bert_jax.train import preemption

from helpers import SignalledRun, compiling_entry


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
