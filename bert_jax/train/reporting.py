"""Process-0 metric writers: a progress line on stdout, JSONL and TensorBoard event files, and
the curves picture redrawn from those files.

TensorBoard events are written with the `tensorboard` package's own event writer, so no
TensorFlow is needed. On processes other than 0 every writer is a no-op.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Sequence

import jax


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else f'{m}m{s:02d}s' if m else f'{s}s'


def format_metrics(values: dict[str, Any]) -> str:
  parts = []
  for k, v in values.items():
    if isinstance(v, float):
      v = f'{v:.3e}' if k in ('learning_rate',) or (v != 0 and abs(v) < 1e-3) else f'{v:.4f}'
    parts.append(f'{k} {v}')
  return ' | '.join(parts)


class MetricWriter:
  """Writes scalars to `workdir/metrics.jsonl` and TensorBoard events under `workdir/tb/<name>`."""

  def __init__(self, workdir: str, name: str = 'train'):
    self.enabled = jax.process_index() == 0
    self._jsonl = None
    self._tb = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, f'metrics_{name}.jsonl'), 'a', encoding='utf-8')
    from tensorboard.summary.writer.event_file_writer import EventFileWriter  # pylint: disable=g-import-not-at-top
    self._tb = EventFileWriter(os.path.join(workdir, 'tb', name))

  def write(self, step: int, values: dict[str, float]) -> None:
    if not self.enabled:
      return
    from tensorboard.compat.proto.event_pb2 import Event  # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto.summary_pb2 import Summary  # pylint: disable=g-import-not-at-top
    clean = {k: float(v) for k, v in values.items()}
    self._jsonl.write(json.dumps({'step': int(step), 'time': time.time(), **clean}) + '\n')
    self._jsonl.flush()
    summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in clean.items()
                             if math.isfinite(v)])
    self._tb.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))
    self._tb.flush()

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
    if self._tb:
      self._tb.close()


class Progress:
  """Throughput and ETA for the progress line, over the window since the last `update`.

  Counts steps, rows' tokens (padding included: what the step computes on), examples and the
  time spent waiting for input batches.
  """

  def __init__(self, start_step: int, total_steps: int):
    self.total_steps = total_steps
    self._last_step, self._last_time = start_step, time.perf_counter()
    self._tokens = self._examples = 0
    self._waited = 0.0

  def add(self, tokens: int, examples: int, waited_s: float) -> None:
    """One step's global row tokens, examples and seconds waited for its batch."""
    self._tokens += tokens
    self._examples += examples
    self._waited += waited_s

  def update(self, step: int) -> dict[str, float]:
    """steps_per_s, tokens_per_s, examples_per_s, input_wait (share of the window) and eta_s; starts a new window."""
    now = time.perf_counter()
    dt = max(now - self._last_time, 1e-9)
    steps_per_s = (step - self._last_step) / dt
    out = {'steps_per_s': steps_per_s, 'tokens_per_s': self._tokens / dt, 'examples_per_s': self._examples / dt,
           'input_wait': self._waited / dt,
           'eta_s': (self.total_steps - step) / steps_per_s if steps_per_s > 0 else float('inf')}
    self._last_step, self._last_time = step, now
    self._tokens = self._examples = 0
    self._waited = 0.0
    return out


def write_curves(workdir: str, metrics: Sequence[str] | None = None) -> None:
  """Redraws workdir/curves.png from the workdir's metric files (process 0; `curves.plot_run_curves`).

  A picture that cannot be drawn or written is a warning line: it must never stop a run.
  """
  if jax.process_index() != 0:
    return
  from bert_jax.train import curves  # pylint: disable=g-import-not-at-top  # matplotlib: only where curves are drawn
  try:
    curves.plot_run_curves(workdir, metrics=metrics)
  except Exception as e:  # pylint: disable=broad-except
    log(f'warning: {os.path.join(workdir, curves.CURVES_FILE)} not written ({type(e).__name__}: {e})')


def log(message: str) -> None:
  """Prints on process 0 only, flushed (progress must show even when stdout is a pipe)."""
  if jax.process_index() == 0:
    print(message, file=sys.stdout, flush=True)
