"""curves.png of a run (matplotlib, headless): loss, metrics, learning rate and throughput over steps.

Figures are built with `matplotlib.figure.Figure` and rendered by the Agg canvas directly:
no pyplot, so nothing here needs a display or changes the backend of a program (or notebook)
that imports this module.
"""

from __future__ import annotations

import io
import json
import math
import os
from typing import Any, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import numpy as np

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.runs.workdir import Workdir

_DPI = 100


def save_png(fig: Figure, path: str) -> str:
  # Rendered to path.tmp, then renamed: a viewer (or a copy) never sees half a picture (an object store
  # publishes the object whole: written once).
  if files.is_remote(path):
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    with files.open(path, 'wb') as f:
      f.write(buffer.getvalue())
    return path
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  try:
    with files.open(tmp, 'wb') as f:
      FigureCanvasAgg(fig).print_png(f)
    os.replace(tmp, path)
  finally:
    if files.exists(tmp):
      os.remove(tmp)
  return path


# ---------------------------------------------------------------------------------------------
# Curves of a run: what pretraining and fine-tuning log in their workdir (train.loop redraws them at most once a
# minute and when training ends).

CURVES_FILE = 'curves.png'
_LOSSES = ('loss', 'mlm_loss', 'nsp_loss', 'sop_loss')
_THROUGHPUT = ('tokens_per_s', 'examples_per_s')  # the first one logged is drawn
_STYLES = ('-', '--', ':', '-.')
_MARKERS = ('o', 's', '^', 'D', 'v', 'P')


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a metrics JSONL file, in order; [] when it is missing, unreadable or empty.

  A line that is not a JSON object with a numeric 'step' is skipped: the truncated last line of
  a run killed mid-write, or a line of something else.
  """
  try:
    with files.open(path, encoding='utf-8', errors='replace') as f:
      lines = f.readlines()
  except OSError:
    return []
  out = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get('step'), (int, float)) and math.isfinite(record['step']):
      out.append(record)
  return out


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of `key`, by increasing step. A step logged twice (a resumed run logs the steps
  after its checkpoint again) keeps its last value; records without a finite number for `key` are skipped."""
  by_step = {}
  for r in records:
    v = r.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
      by_step[int(r['step'])] = float(v)
  steps = sorted(by_step)
  return np.array(steps, np.int64), np.array([by_step[s] for s in steps], np.float64)


def _runs(workdir: str) -> list[tuple[str, list[dict], list[dict]]]:
  """(label, train records, held-out records) of the workdir itself (pretraining) and of each
  seed_<n>/ in it (fine-tuning), those with any record."""
  wd = Workdir(workdir)
  out = []
  for label, d in [('', workdir)] + [(f'seed {n}', wd.seed_dir(n)) for n in wd.seeds()]:
    train = read_jsonl(os.path.join(d, 'metrics_train.jsonl'))
    held_out = read_jsonl(os.path.join(d, 'metrics_eval.jsonl'))
    if train or held_out:
      out.append((label, train, held_out))
  return out


def phase_starts(workdir: str) -> list[tuple[int, str]]:
  """(first step, name) of each phase after the first of a run in phases (its config.json), else []."""
  try:
    phases = (Workdir(workdir).config() or {}).get('phases') or {}
    ordered = sorted(phases.items(), key=lambda item: item[1]['order'])
  except Exception:  # pylint: disable=broad-except  # a picture never stops a run
    return []
  out, step = [], 0
  for name, phase in ordered:
    if step:
      out.append((step, name))
    step += int(phase['steps'])
  return out


def _present(runs, keys: Sequence[str]) -> list[str]:
  """`keys` that have a finite value somewhere in `runs`, in their order."""
  return [k for k in keys if any(len(series(records, k)[0]) for _, train, held in runs for records in (train, held))]


def _accuracies(records) -> list[str]:
  """The keys ending in 'accuracy' of `records`: the model's own first, then the baselines."""
  return sorted({k for r in records for k in r if k.endswith('accuracy')}, key=lambda k: ('baseline' in k, k))


def _draw(ax, runs, keys: Sequence[str], title: str, *, held_out_lines: bool = False) -> None:
  """One panel: each key of each run, train as a line, held-out as markers (joined by a thin line
  when `held_out_lines`). A colour per (run, key)."""
  # At a fixed place (y=1.0): no ticks on top to clear, and matplotlib's search for them is a large part of a
  # drawing (docs/results.md).
  ax.set_title(title, fontsize=10, y=1.0)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: no 4.5
  drawn = False
  for r, (label, train, held) in enumerate(runs):
    for k, key in enumerate(keys):
      color = f'C{(r * len(keys) + k) % 10}'
      name = f'{key} ({label})' if label else key
      steps, values = series(train, key)
      if len(steps):
        ax.plot(steps, values, _STYLES[r % len(_STYLES)], color=color, linewidth=1.2, label=f'{name} train',
                marker='.' if len(steps) == 1 else None)  # a line of one point is invisible
      held_steps, held_values = series(held, key)
      if len(held_steps):
        ax.plot(held_steps, held_values, ('-' if held_out_lines else '') + _MARKERS[k % len(_MARKERS)],
                color=color, markersize=5, linewidth=0.8, label=f'{name} held-out')
      drawn = drawn or bool(len(steps) or len(held_steps))
  if drawn:
    ax.ticklabel_format(axis='y', style='sci', scilimits=(-3, 4))  # short labels: 1e-4, not 0.00010
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='best')
  else:
    ax.text(0.5, 0.5, 'not logged', ha='center', va='center', transform=ax.transAxes, color='grey')
    ax.set_yticks([])


def plot_run_curves(workdir: str, path: str | None = None, metrics: Sequence[str] | None = None) -> str | None:
  """Draws a run's curves over steps from its metric files: 2x2 panels of loss, metric(s), learning
  rate and throughput, train values as lines and held-out values as markers; a run in phases gets a
  dotted line where each phase starts.

  Reads workdir/metrics_{train,eval}.jsonl (pretraining) and workdir/seed_<n>/metrics_{train,eval}.jsonl
  (fine-tuning: one curve per seed), tolerating missing or empty files, a truncated last line, steps
  logged again by a resumed run (the last value wins) and metrics absent from some lines.

  Args:
    workdir: the run's directory.
    path: the PNG to write; workdir/curves.png when None. Written atomically.
    metrics: the keys of the metric panel; default every logged key ending in 'accuracy'
      (MLM/NSP accuracy of pretraining and their held-out baselines).

  Returns:
    `path`, or None (nothing written) when the workdir has no metric value to draw.
  """
  runs = _runs(workdir)
  metrics_title = 'metrics' if metrics is not None else 'accuracy'
  if metrics is None:
    metrics = _accuracies(r for _, train, held in runs for r in train + held)
  panels = [(_present(runs, _LOSSES), 'loss'), (_present(runs, metrics), metrics_title),
            (_present(runs, ('learning_rate',)), 'learning rate'), (_present(runs, _THROUGHPUT)[:1], 'throughput')]
  if not any(panel_keys for panel_keys, _ in panels):
    return None
  fig = Figure(figsize=(12, 8), dpi=_DPI)
  # Fixed margins: the constrained layout would double the drawing time, paid at every evaluation.
  fig.subplots_adjust(left=0.06, right=0.98, bottom=0.06, top=0.93, hspace=0.15, wspace=0.15)
  steps = [int(r['step']) for _, train, held in runs for r in train + held]
  fig.suptitle(f'{os.path.basename(os.path.abspath(workdir))} at step {max(steps)}: train lines, held-out markers')
  axes = fig.subplots(2, 2, sharex=True)  # one step axis: a held-out point lines up with the train curves
  if min(steps) == max(steps):  # a single step: a range of whole steps around it
    axes[0, 0].set_xlim(max(steps) - 1, max(steps) + 1)
  for ax, (panel_keys, title) in zip(axes.flat, panels):
    _draw(ax, runs, panel_keys, title)
    for step, name in phase_starts(workdir):  # a run in phases: where each phase starts
      ax.axvline(step, color='grey', linestyle=':', linewidth=0.9)
      if ax is axes[0, 0]:
        ax.text(step, 1.0, f' {name}', transform=ax.get_xaxis_transform(), va='top', fontsize=8, color='grey')
  for ax in axes[1]:
    ax.set_xlabel('step', fontsize=9)
  return save_png(fig, path or os.path.join(workdir, CURVES_FILE))


def plot_eval_steps(results: Sequence[dict[str, Any]], path: str, title: str) -> str:
  """The held-out metrics of several checkpoints (each a dict with 'step') against step: accuracies
  (with their baselines) and losses, written atomically to `path`.

  Raises:
    ConfigError: `results` holds no metric value.
  """
  runs = [('', [], list(results))]
  panels = [(_present(runs, _accuracies(results)), 'held-out accuracy'), (_present(runs, _LOSSES), 'held-out loss')]
  if not any(keys for keys, _ in panels):
    raise ConfigError('plot_eval_steps: no held-out metric to draw')
  fig = Figure(figsize=(12, 4.5), dpi=_DPI, layout='constrained')
  fig.suptitle(title)
  for ax, (keys, panel_title) in zip(fig.subplots(1, 2).flat, panels):
    _draw(ax, runs, keys, panel_title, held_out_lines=True)
    ax.set_xlabel('step', fontsize=9)
  return save_png(fig, path)


def plot_groups(labels: Sequence[str], panels: Sequence[tuple[str, Sequence[Sequence[float]]]], path: str) -> str:
  """Side by side, one panel per (title, values per label): a bar per label where each has one value at most, else
  each label's values (e.g. its seeds') as dots and their median as a bar; written atomically to `path`."""
  fig = Figure(figsize=(3.2 * len(panels), 3.2), dpi=110, layout='tight')
  for ax, (title, groups) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
    if all(len(values) <= 1 for values in groups):
      ax.bar(range(len(labels)), [values[0] if values else 0.0 for values in groups], color='#8899aa')
    else:
      for x, values in enumerate(groups):
        if values:
          ax.scatter([x] * len(values), values, s=14, color='#335577', zorder=3)
          ax.hlines(float(np.median(values)), x - 0.3, x + 0.3, color='#cc5533')
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45, ha='right', fontsize=8)
    ax.tick_params(axis='y', labelsize=8)
  return save_png(fig, path)
