"""The ablation ladder: pretraining variants (rungs) -> fine-tuning on downstream tasks over seeds -> one table.

The library behind experiments/ladder.py; it reads no flags. A ladder (experiments/configs/ladder.py) is a base
pretraining config, rungs (each a variant of its file and/or FIELD=VALUE overrides), tasks (a fine-tuning variant
and overrides: its budget) and a number of seeds. Its cells are commands, as a sweep's runs are:

  DIR/pretrain/RUNG                 experiments/pretrain.py, one per rung
  DIR/finetune/RUNG/TASK/seedS      experiments/finetune.py from that rung's final (or chosen) checkpoint

A cell whose workdir holds final_metrics.json is done and skipped; an interrupted one resumes (the entry points
resume their workdirs); a failed one is reported in the table and the others go on (a rung's fine-tuning cells
wait for its pretraining). `results` reads what the cells left into one row per rung: held-out MLM accuracy,
per task the median and range over seeds of its main metric and the difference to the first rung, wall time.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import os
import statistics
import sys
from typing import Any, Sequence

from bert_jax.config import RENAMED, FinetuneConfig, PretrainConfig
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.files import write_text_atomic
from bert_jax.runs.workdir import FINAL_METRICS_FILE

from tools import sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_BASENAME = 'ladder_results'
# A ladder's own files are its table; each cell's workdir keeps its checkpoints, and a rerun skips finished cells.
KEPT = ('a ladder keeps no checkpoint of its own and its finished cells are kept: free space or fix permissions (or '
        'give another --workdir), then run the same command to go on')


@dataclasses.dataclass(frozen=True)
class Step:
  """A rung or a task: a variant of a config file and FIELD=VALUE overrides."""

  name: str
  file: str
  variant: str
  overrides: tuple[tuple[str, str], ...]

  def flags(self) -> list[str]:
    return [f'--config={self.file}:{self.variant}' if self.variant else f'--config={self.file}',
            *(f'--config.{k}={v}' for k, v in self.overrides)]


@dataclasses.dataclass(frozen=True)
class Ladder:
  rungs: tuple[Step, ...]
  tasks: tuple[Step, ...]
  seeds: int
  checkpoint_step: int = -1

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'Ladder':
    """A ladder config (experiments/configs/ladder.py) checked: every rung and task builds its config.

    Raises:
      ConfigError: a bad seed count, an unknown variant, field or value, a bad config, no rungs or tasks.
    """
    seeds = d.get('seeds')
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
      raise ConfigError(f'seeds must be a whole number >= 1, got {seeds!r}')
    base_file, _, base_variant = d['pretrain'].partition(':')
    common = _overrides('pretrain_overrides', d.get('pretrain_overrides', ''))
    rungs = tuple(_step(f'rungs.{name}', name, spec, base_file, base_variant, common, PretrainConfig)
                  for name, spec in _ordered('rungs', d.get('rungs')))
    tasks = tuple(_step(f'tasks.{name}', name, spec, d['finetune'], '', (), FinetuneConfig)
                  for name, spec in _ordered('tasks', d.get('tasks')))
    step = d.get('checkpoint_step', -1)
    if not isinstance(step, int) or step < -1:
      raise ConfigError(f'checkpoint_step must be -1 (the final checkpoint) or a step >= 0, got {step!r}')
    return cls(rungs, tasks, seeds, step)


def _ordered(what: str, specs) -> list[tuple[str, dict]]:
  if not specs:
    raise ConfigError(f'the ladder has no {what}')
  for name, spec in specs.items():
    if not sweep._UNSAFE.sub('', name) == name or not name:  # pylint: disable=protected-access
      raise ConfigError(f'{what}.{name}: a name of letters, digits, ".", "_", "=", "," and "-" (it names a workdir)')
    if not isinstance(spec, dict):
      raise ConfigError(f'{what}.{name} must be a dict of order, variant and overrides, got {spec!r}')
  orders = sorted(spec.get('order', 0) for spec in specs.values())
  if orders != list(range(1, len(specs) + 1)):
    listed = ', '.join(f'{n}: {s.get("order")}' for n, s in specs.items())
    raise ConfigError(f'{what}: give each its place, order=1, 2, ... ({listed})')
  return sorted(specs.items(), key=lambda item: item[1]['order'])


def _overrides(where: str, text: str) -> tuple[tuple[str, str], ...]:
  """FIELD=VALUE words, split and quoted as a shell does (a value with spaces: data.train_files='/my data')."""
  out = []
  for word in sweep.shell_words(where, text):
    key, sep, value = word.partition('=')
    if not sep or not sweep._KEY.fullmatch(key):  # pylint: disable=protected-access
      raise ConfigError(f'{where}: {word!r} is not FIELD=VALUE (shell words, e.g. "data.objective=sop '
                        'num_train_steps=150")')
    out.append((key, value))
  return tuple(out)


def load_config_file(path: str, variant: str, where: str):
  """`get_config(variant)` of a config file (an ml_collections ConfigDict); ConfigError for a bad variant."""
  full = path if os.path.isabs(path) else os.path.join(REPO, path)
  if not os.path.isfile(full):
    raise ConfigError(f'{where}: no config file {path}')
  try:  # a config file imports bert_jax and ml_collections only: loaded as --config loads it, by its path
    spec = importlib.util.spec_from_file_location(f'_ladder_cfg_{abs(hash(full))}', full)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)
  except ValueError as e:  # the config files' unknown-variant error
    raise ConfigError(f'{where}: {e}') from None


def _set(cfg, key: str, value: str, where: str) -> None:
  """One FIELD=VALUE into a ConfigDict, converted to the field's type (as the command line would)."""
  node, parts = cfg, key.split('.')
  for i, part in enumerate(parts):
    if part not in node:
      hint = f' (it is now {RENAMED[key]})' if key in RENAMED else ''
      raise ConfigError(f'{where}: the config has no field {".".join(parts[:i + 1])}{hint}')
    if i < len(parts) - 1:
      node = node[part]
  old = node[parts[-1]]
  try:
    if isinstance(old, bool):
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(value)
      new = value.lower() in ('true', '1')
    elif isinstance(old, int):
      new = int(value)
    elif isinstance(old, float):
      new = float(value)
    elif isinstance(old, str):
      new = value
    else:
      raise ConfigError(f'{where}: {key} is not a single value (a {type(old).__name__}): give its fields')
  except ValueError:
    raise ConfigError(f'{where}: {key}={value!r} is not a {type(old).__name__}') from None
  node[parts[-1]] = new


def _step(where, name, spec, file, base_variant, common, schema) -> Step:
  unknown = set(spec) - {'order', 'variant', 'overrides'}
  if unknown:
    raise ConfigError(f'{where}: unknown key(s) {", ".join(sorted(unknown))}; it takes order, variant, overrides')
  variant = spec.get('variant') or base_variant
  overrides = common + _overrides(f'{where}.overrides', spec.get('overrides', ''))
  cfg = load_config_file(file, variant, where)
  for key, value in overrides:
    _set(cfg, key, value, where)
  try:
    schema.from_dict(cfg.to_dict())
  except ConfigError as e:
    raise ConfigError(f'{where}: {e}') from None
  full = file if os.path.isabs(file) else os.path.join(REPO, file)
  return Step(name, full, variant, overrides)


def cells(ladder: Ladder, directory: str) -> tuple[list[sweep.Run], list[sweep.Run]]:
  """(pretraining runs, fine-tuning runs) of the ladder under `directory`, as sweep.Run commands."""
  python = sys.executable
  pretrain, finetune = [], []
  for rung in ladder.rungs:
    workdir = os.path.join(directory, 'pretrain', rung.name)
    argv = [python, os.path.join(REPO, 'experiments', 'pretrain.py'), f'--workdir={workdir}', *rung.flags()]
    pretrain.append(sweep.Run(len(pretrain) + 1, {'rung': rung.name}, rung.name, argv, workdir))
  for rung in ladder.rungs:
    start = os.path.join(directory, 'pretrain', rung.name)
    for task in ladder.tasks:
      for seed in range(ladder.seeds):
        workdir = os.path.join(directory, 'finetune', rung.name, task.name, f'seed{seed}')
        step = [f'--config.init_checkpoint_step={ladder.checkpoint_step}'] if ladder.checkpoint_step >= 0 else []
        argv = [python, os.path.join(REPO, 'experiments', 'finetune.py'), f'--workdir={workdir}', *task.flags(),
                f'--config.init_checkpoint={start}', *step, f'--config.seed={seed}']
        finetune.append(sweep.Run(len(finetune) + 1, {'rung': rung.name, 'task': task.name, 'seed': str(seed)},
                                  f'{rung.name}/{task.name}/seed{seed}', argv, workdir))
  return pretrain, finetune


def check_fresh(pretrain: Sequence[sweep.Run], finetune: Sequence[sweep.Run]) -> None:
  """ConfigError when a finished fine-tuning cell started from another pretraining of its rung than the one there
  now (the rung unfinished, e.g. deleted to run again, or finished after the cell): its results would be tabulated
  beside the new rung's."""
  rungs = {r.values['rung']: r for r in pretrain}
  for cell in finetune:
    if not cell.is_done():
      continue
    rung = rungs[cell.values['rung']]
    if not rung.is_done():
      why = f'{rung.workdir} has no {FINAL_METRICS_FILE} now'
    elif os.path.getmtime(rung.metrics_path) > os.path.getmtime(cell.metrics_path):
      why = f'{rung.workdir} finished after it'
    else:
      continue
    raise ConfigError(f'{cell.name} was fine-tuned from an earlier pretraining of rung {rung.name} ({why}): its '
                      f'results would be tabulated beside the new one. Delete '
                      f'{os.path.dirname(os.path.dirname(cell.workdir))} to fine-tune that rung again')


def execute(pretrain: Sequence[sweep.Run], finetune: Sequence[sweep.Run], out=None) -> list[sweep.Run]:
  """Runs the cells not done yet, pretraining first; a rung that failed skips its fine-tuning cells (reported).

  Returns:
    The cells that failed or could not run.
  """
  out = out or sys.stdout
  failed = sweep.execute(pretrain, out=out, label='ladder pretrain')
  broken = {r.values['rung'] for r in failed}
  for run in finetune:
    if run.values['rung'] in broken:
      print(f'[ladder] {run.name}: not run, its rung\'s pretraining failed', file=out, flush=True)
  failed += sweep.execute([r for r in finetune if r.values['rung'] not in broken], out=out, label='ladder finetune')
  return failed + [r for r in finetune if r.values['rung'] in broken]


def _metrics(workdir: str) -> dict[str, Any] | None:
  try:
    with open(os.path.join(workdir, FINAL_METRICS_FILE), encoding='utf-8') as f:
      data = json.load(f)
    return data if isinstance(data, dict) else None
  except (OSError, ValueError):
    return None


def _wall(metrics: dict[str, Any]) -> float:
  if 'wall_s' in metrics:
    return float(metrics['wall_s'])
  return float(metrics.get('train_wall_s', 0.0)) + float(metrics.get('eval_wall_s', 0.0))


def results(ladder: Ladder, pretrain: Sequence[sweep.Run], finetune: Sequence[sweep.Run]) -> list[dict[str, Any]]:
  """One row per rung: {'rung', 'mlm_accuracy' (None without results), 'tasks': {task: {'metric', 'values'
  (per seed, None where the cell left no result)}}, 'wall_s', 'missing' (cells without results)}."""
  rows = []
  for rung, run in zip(ladder.rungs, pretrain):
    m = _metrics(run.workdir)
    row = {'rung': rung.name, 'mlm_accuracy': m.get('mlm_accuracy') if m else None, 'tasks': {},
           'wall_s': _wall(m) if m else 0.0, 'missing': [] if m else [run.name]}
    for task in ladder.tasks:
      values, metric = [], None
      for cell in (r for r in finetune if r.values['rung'] == rung.name and r.values['task'] == task.name):
        fm = _metrics(cell.workdir) if m else None  # a rung without its pretraining's results has none
        if fm and isinstance(fm.get('main_metric'), str) and isinstance(fm.get(fm['main_metric']), (int, float)):
          metric = fm['main_metric']
          values.append(float(fm[metric]))
          row['wall_s'] += _wall(fm)
        else:
          values.append(None)
          row['missing'].append(cell.name)
      row['tasks'][task.name] = {'metric': metric, 'values': values}
    rows.append(row)
  return rows


def summary(values: Sequence[float | None]) -> dict[str, Any] | None:
  have = [v for v in values if v is not None]
  if not have:
    return None
  return {'median': statistics.median(have), 'min': min(have), 'max': max(have), 'n': len(have)}


def compare(mine: dict | None, first: dict | None) -> tuple[float | None, str]:
  """(difference of medians to the first rung, a note across seeds): every seed above (or below) the first
  rung's range, or within the spread of seeds."""
  if not mine or not first:
    return None, ''
  delta = mine['median'] - first['median']
  if mine['n'] < 2 or first['n'] < 2:
    return delta, 'one seed: no spread to compare'
  if mine['min'] > first['max']:
    return delta, 'every seed above'
  if mine['max'] < first['min']:
    return delta, 'every seed below'
  return delta, 'within the seeds\' spread'


def table(ladder: Ladder, rows: Sequence[dict[str, Any]]) -> tuple[str, str]:
  """(markdown, csv) of the ladder's rows."""
  first = rows[0] if rows else None
  header = ['rung', 'held-out MLM acc']
  for task in ladder.tasks:
    metric = next((r['tasks'][task.name]['metric'] for r in rows if r['tasks'][task.name]['metric']), 'main metric')
    header += [f'{task.name} {metric}: median [min, max] (seeds)', f'{task.name} vs {first["rung"]}']
  header += ['wall', 'cells without results']
  csv_header = ['rung', 'mlm_accuracy'] + [f'{t.name}_{k}' for t in ladder.tasks
                                            for k in ('metric', 'median', 'min', 'max', 'seeds', 'delta', 'note')]
  csv_header += ['wall_s', 'missing']
  md = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  buffer = io.StringIO(newline='')
  writer = csv.writer(buffer)
  writer.writerow(csv_header)
  for i, row in enumerate(rows):
    acc = row['mlm_accuracy']
    cells_md, cells_csv = [row['rung'], f'{acc:.4f}' if acc is not None else '—'], [row['rung'], acc]
    for task in ladder.tasks:
      t = row['tasks'][task.name]
      s = summary(t['values'])
      delta, note = compare(s, summary(first['tasks'][task.name]['values'])) if i else (None, 'the reference')
      cells_md.append(f'{s["median"]:.4f} [{s["min"]:.4f}, {s["max"]:.4f}] ({s["n"]})' if s else '—')
      cells_md.append(f'{delta:+.4f} ({note})' if delta is not None else note or '—')
      cells_csv += [t['metric'], *([s[k] for k in ('median', 'min', 'max', 'n')] if s else [None] * 4), delta, note]
    cells_md += [f'{row["wall_s"] / 60:.1f} min', ', '.join(row['missing']) or '—']
    cells_csv += [round(row['wall_s'], 1), ' '.join(row['missing'])]
    md.append('| ' + ' | '.join(str(c).replace('|', '\\|') for c in cells_md) + ' |')
    writer.writerow(['' if c is None else c for c in cells_csv])
  return '\n'.join(md) + '\n', buffer.getvalue()


def plot(ladder: Ladder, rows: Sequence[dict[str, Any]], path: str) -> None:
  """Held-out MLM accuracy per rung, then each task's metric per seed (dots) and median (bar)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = [r['rung'] for r in rows]
  fig, axes = plt.subplots(1, 1 + len(ladder.tasks), figsize=(3.2 * (1 + len(ladder.tasks)), 3.2), squeeze=False)
  axes = axes[0]
  axes[0].bar(range(len(rows)), [r['mlm_accuracy'] or 0.0 for r in rows], color='#8899aa')
  axes[0].set_title('held-out MLM accuracy', fontsize=9)
  for ax, task in zip(axes[1:], ladder.tasks):
    for x, row in enumerate(rows):
      values = [v for v in row['tasks'][task.name]['values'] if v is not None]
      if values:
        ax.scatter([x] * len(values), values, s=14, color='#335577', zorder=3)
        ax.hlines(statistics.median(values), x - 0.3, x + 0.3, color='#cc5533')
    metric = next((r['tasks'][task.name]['metric'] for r in rows if r['tasks'][task.name]['metric']), '')
    ax.set_title(f'{task.name} {metric}'.strip(), fontsize=9)
  for ax in axes:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha='right', fontsize=8)
    ax.tick_params(axis='y', labelsize=8)
  fig.tight_layout()
  tmp = path + '.tmp.png'
  fig.savefig(tmp, dpi=110)
  plt.close(fig)
  os.replace(tmp, path)


def write_results(ladder: Ladder, rows: Sequence[dict[str, Any]], directory: str) -> str:
  """Writes DIR/ladder_results.{md,csv,png}; the markdown path."""
  md, text = table(ladder, rows)
  os.makedirs(directory, exist_ok=True)
  md_path = os.path.join(directory, RESULTS_BASENAME + '.md')
  write_text_atomic(md_path, md)
  write_text_atomic(os.path.join(directory, RESULTS_BASENAME + '.csv'), text)
  try:
    plot(ladder, rows, os.path.join(directory, RESULTS_BASENAME + '.png'))
  except (ImportError, OSError, ValueError) as e:
    raise BertJaxError(f'the ladder plot could not be drawn: {e}') from None
  return md_path
