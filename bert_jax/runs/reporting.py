"""Process-0 metric writers: a progress line on stdout, JSONL and TensorBoard event files, and
the curves picture redrawn from those files.

TensorBoard events are written with the `tensorboard` package's own event writer, so no
TensorFlow is needed. On processes other than 0 every writer is a no-op.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Sequence

import jax

from bert_jax import files


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
    files.makedirs(workdir)
    self._jsonl = files.open(os.path.join(workdir, f'metrics_{name}.jsonl'), 'a', encoding='utf-8')
    from tensorboard.summary.writer.event_file_writer import EventFileWriter  # pylint: disable=g-import-not-at-top
    self._tb_dir = os.path.join(workdir, 'tb', name)
    self._staging, self._uploaded = None, float('-inf')
    if files.is_remote(workdir):  # TensorBoard appends to its event file, which an object store cannot: the
      self._staging = tempfile.mkdtemp(prefix='bert_jax-tb-')  # file is written here, the object rewritten
    self._tb = EventFileWriter(self._staging or self._tb_dir)

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
    self._upload()

  def _upload(self, force: bool = False) -> None:
    """Copies the staged event files of a remote workdir to it, whole (at most every files.REMOTE_FLUSH_S seconds,
    and on close)."""
    if self._staging is None or not force and time.monotonic() - self._uploaded < files.REMOTE_FLUSH_S:
      return
    self._uploaded = time.monotonic()
    files.makedirs(self._tb_dir)
    for name in files.listdir(self._staging):
      files.copy_file(os.path.join(self._staging, name), os.path.join(self._tb_dir, name))

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
    if self._tb:
      self._tb.close()
      self._upload(force=True)
      if self._staging:
        shutil.rmtree(self._staging, ignore_errors=True)


class Progress:
  """Throughput, packing and ETA for the progress line, over the window since the last `update`.

  Counts steps, rows, rows' tokens (padding included: what the step computes on), real tokens,
  examples and the time spent waiting for input; totals of real and row tokens are kept for the
  run's padding fraction.
  """

  _KEYS = ('steps', 'rows', 'row_tokens', 'real_tokens', 'examples', 'example_tokens', 'waited')

  def __init__(self, start_step: int, total_steps: int):
    self.total_steps = total_steps
    self._last_step, self._last_time = start_step, time.perf_counter()
    self._window = dict.fromkeys(self._KEYS, 0)
    self.real_tokens = self.row_tokens = 0

  def add(self, sizes: dict[str, int], row_width: int, waited_s: float) -> None:
    """One step's global batch `sizes` (rows, row_tokens, real_tokens, examples; optionally
    unpacked_tokens, what its examples take unpacked where that is not one row of `row_width` each),
    the width of its rows, and the seconds waited for it."""
    w = self._window
    for k in ('rows', 'row_tokens', 'real_tokens', 'examples'):
      w[k] += sizes[k]
    w['steps'] += 1
    # As if every example had a row (or as the batch's own unpacked layout would pad them).
    w['example_tokens'] += sizes.get('unpacked_tokens', sizes['examples'] * row_width)
    w['waited'] += waited_s
    self.real_tokens += sizes['real_tokens']
    self.row_tokens += sizes['row_tokens']

  def update(self, step: int) -> dict[str, float]:
    """The window's rates and packing, then a new window.

    Returns:
      steps_per_s, tokens_per_s, examples_per_s, input_wait (share of the window), eta_s,
      rows_per_step, fill (real / row tokens), unpacked_fill (real / one-row-per-example tokens)
      and packed (fewer rows than examples).
    """
    now, w = time.perf_counter(), self._window
    dt = max(now - self._last_time, 1e-9)
    steps_per_s = (step - self._last_step) / dt
    out = {'steps_per_s': steps_per_s, 'tokens_per_s': w['row_tokens'] / dt, 'examples_per_s': w['examples'] / dt,
           'input_wait': w['waited'] / dt,
           'eta_s': (self.total_steps - step) / steps_per_s if steps_per_s > 0 else float('inf'),
           'rows_per_step': w['rows'] / max(w['steps'], 1), 'fill': w['real_tokens'] / max(w['row_tokens'], 1),
           'unpacked_fill': w['real_tokens'] / max(w['example_tokens'], 1), 'packed': w['rows'] < w['examples']}
    self._last_step, self._last_time = step, now
    self._window = dict.fromkeys(self._KEYS, 0)
    return out


class Ticker:
  """Progress of a long loop outside training (an evaluation, a prediction): '<label>: i/n <unit> | elapsed | ETA'
  when `every_s` seconds have passed since the start or the last line, so no stretch is silent for longer; a loop
  that ends sooner prints nothing, one that printed gets a last line at its end."""

  def __init__(self, label: str, total: int, unit: str = 'batches', every_s: float = 10.0):
    self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
    self._start = self._last = time.perf_counter()
    self.lines = 0

  def tick(self, done: int) -> None:
    """`done` of `total` are finished."""
    now = time.perf_counter()
    if now - self._last < self.every_s and not (self.lines and done >= self.total):
      return
    elapsed = now - self._start
    eta = elapsed / max(done, 1) * (self.total - done)
    log(f'{self.label}: {done}/{self.total} {self.unit} | elapsed {format_duration(elapsed)} | '
        f'ETA {format_duration(eta)}')
    self._last, self.lines = now, self.lines + 1


def progress_line(label: str, step: int, total: int, shown: dict[str, float], rate: dict[str, float]) -> str:
  """'step N/T | metrics | tok/s | ex/s | input wait | ETA' (+ packing when rows hold several examples)."""
  line = (f'{label}step {step}/{total} | {format_metrics(shown)} | {rate["tokens_per_s"]:,.0f} tok/s | '
          f'{rate["examples_per_s"]:,.1f} ex/s | input wait {rate["input_wait"]:.1%} | '
          f'ETA {format_duration(rate["eta_s"])}')
  if rate['packed']:
    line += (f' | packed {rate["rows_per_step"]:.1f} rows/step, {rate["fill"]:.1%} real tokens '
             f'(unpacked {rate["unpacked_fill"]:.1%})')
  return line


def write_curves(workdir: str, metrics: Sequence[str] | None = None) -> None:
  """Redraws workdir/curves.png from the workdir's metric files (process 0; `curves.plot_run_curves`).

  A picture that cannot be drawn or written is a warning line: it must never stop a run.
  """
  if jax.process_index() != 0:
    return
  from bert_jax.runs import curves  # pylint: disable=g-import-not-at-top  # matplotlib: only where curves are drawn
  try:
    curves.plot_run_curves(workdir, metrics=metrics)
  except Exception as e:  # pylint: disable=broad-except
    log(f'warning: {os.path.join(workdir, curves.CURVES_FILE)} not written ({type(e).__name__}: {e})')


_stream = None  # None: sys.stdout (as it is when a line is printed)
_last_line = time.perf_counter()  # when `log` last printed: a loop that has said nothing for long says where it is


def log(message: str) -> None:
  """The library's one log channel: a line on process 0, flushed (progress must show even in a pipe).

  Lines go to stdout (or where `log_to` sends them), printed as MaxText's max_logging does: absl
  logging stays at WARNING in the entry points, as jax and Orbax are chatty at INFO, and a line of
  ours must show whatever its level. Warnings are lines that start with 'warning: '.
  """
  global _last_line  # pylint: disable=global-statement
  if jax.process_index() == 0:
    print(message, file=_stream or sys.stdout, flush=True)
  _last_line = time.perf_counter()


def silent_for() -> float:
  """Seconds since the last line of `log`."""
  return time.perf_counter() - _last_line


def log_to(stream) -> None:
  """Sends the library's lines to `stream` (a tool whose stdout carries its results sends them to stderr)."""
  global _stream  # pylint: disable=global-statement
  _stream = stream
