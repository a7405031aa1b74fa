"""Preemption with several processes: agreement points come at least every AGREE_EVERY_S seconds of training,
at steps every process computes alike (from the slowest process's step time), not only at log steps."""

import numpy as np

from bert_jax.train import preemption


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
