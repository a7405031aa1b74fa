"""The ablation ladder: two sweeps, pretraining rungs and then fine-tuning cells that need them; reads no flags.

A ladder (experiments/configs/ladder.py) is a base pretraining config, rungs (each a variant of its file and/or
FIELD=VALUE overrides), tasks (a fine-tuning variant and overrides: its budget) and a number of seeds. Its cells:

  DIR/pretrain/RUNG                 experiments/pretrain.py, one per rung
  DIR/finetune/RUNG/TASK/seedS      experiments/finetune.py from that rung's final (or chosen) checkpoint, after it

`results` reads what the cells left into one row per rung: held-out MLM accuracy, per task the median and range
over seeds of its main metric and the difference to the first rung, wall time.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from typing import Any, Sequence

from bert_jax.config import FinetuneConfig, PretrainConfig, apply_overrides, parse_overrides
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.launch import cells, results_tables as tables

from tools import config_help, sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout of experiments/
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

  @property
  def config(self) -> str:
    return f'{self.file}:{self.variant}' if self.variant else self.file

  def flags(self) -> list[str]:
    return [f'--config={self.config}', *(f'--config.{k}={v}' for k, v in self.overrides)]


@dataclasses.dataclass(frozen=True)
class Ladder:
  rungs: tuple[Step, ...]
  tasks: tuple[Step, ...]
  seeds: int
  checkpoint_step: int = -1

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'Ladder':
    """A ladder config checked: ConfigError for a bad seed count or checkpoint step, no rungs or tasks, or a rung or
    task whose config does not build (an unknown variant, field or value)."""
    seeds, step = d.get('seeds'), d.get('checkpoint_step', -1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
      raise ConfigError(f'seeds must be a whole number >= 1, got {seeds!r}')
    base_file, _, base_variant = d['pretrain'].partition(':')
    common = parse_overrides('pretrain_overrides', d.get('pretrain_overrides', ''))
    rungs = _steps('rungs', d.get('rungs'), Step('', base_file, base_variant, common), PretrainConfig)
    tasks = _steps('tasks', d.get('tasks'), Step('', d['finetune'], '', ()), FinetuneConfig)
    if not isinstance(step, int) or step < -1:
      raise ConfigError(f'checkpoint_step must be -1 (the final checkpoint) or a step >= 0, got {step!r}')
    return cls(rungs, tasks, seeds, step)


def _steps(what: str, specs, base: Step, schema) -> tuple[Step, ...]:
  """The rungs or tasks in their order, each a `base` changed by its spec."""
  if not specs:
    raise ConfigError(f'the ladder has no {what}')
  for name, spec in specs.items():
    if not name or sweep.UNSAFE.search(name):
      raise ConfigError(f'{what}.{name}: a name of letters, digits, ".", "_", "=", "," and "-" (it names a workdir)')
    if not isinstance(spec, dict):
      raise ConfigError(f'{what}.{name} must be a dict of order, variant and overrides, got {spec!r}')
  if sorted(spec.get('order', 0) for spec in specs.values()) != list(range(1, len(specs) + 1)):
    listed = ', '.join(f'{n}: {s.get("order")}' for n, s in specs.items())
    raise ConfigError(f'{what}: give each its place, order=1, 2, ... ({listed})')
  return tuple(_step(f'{what}.{name}', name, spec, base, schema)
               for name, spec in sorted(specs.items(), key=lambda item: item[1]['order']))


def _step(where: str, name: str, spec: dict, base: Step, schema) -> Step:
  """A rung or task whose config builds: loaded, overrides set, checked."""
  unknown = set(spec) - {'order', 'variant', 'overrides'}
  if unknown:
    raise ConfigError(f'{where}: unknown key(s) {", ".join(sorted(unknown))}; it takes order, variant, overrides')
  step = Step(name, os.path.join(REPO, base.file), spec.get('variant') or base.variant,
              base.overrides + parse_overrides(f'{where}.overrides', spec.get('overrides', '')))
  if not os.path.isfile(step.file):
    raise ConfigError(f'{where}: no config file {base.file}')
  module, variant = config_help.load_config_module(step.config)  # as --config loads it
  try:
    cfg = module.get_config(variant)
  except ValueError as e:  # the config files' unknown-variant error
    raise ConfigError(f'{where}: {e}') from None
  apply_overrides(cfg, step.overrides, schema, where)
  return step


def plan(ladder: Ladder, directory: str) -> tuple[list[cells.Cell], list[cells.Cell]]:
  """(pretraining cells, fine-tuning cells) of the ladder under `directory`; each fine-tuning cell after its rung."""
  pretrain, finetune = [], []
  step = [f'--config.init_checkpoint_step={ladder.checkpoint_step}'] if ladder.checkpoint_step >= 0 else []
  for rung in ladder.rungs:
    start = os.path.join(directory, 'pretrain', rung.name)
    pretrain.append(cells.Cell(len(pretrain) + 1, rung.name, [sys.executable, os.path.join(
        REPO, 'experiments', 'pretrain.py'), f'--workdir={start}', *rung.flags()], start, {'rung': rung.name}))
    for task in ladder.tasks:
      for seed in range(ladder.seeds):
        workdir = os.path.join(directory, 'finetune', rung.name, task.name, f'seed{seed}')
        argv = [sys.executable, os.path.join(REPO, 'experiments', 'finetune.py'), f'--workdir={workdir}',
                *task.flags(), f'--config.init_checkpoint={start}', *step, f'--config.seed={seed}']
        finetune.append(cells.Cell(len(finetune) + 1, f'{rung.name}/{task.name}/seed{seed}', argv, workdir,
                                   {'rung': rung.name, 'task': task.name, 'seed': str(seed)}, after=start))
  return pretrain, finetune


def _wall(metrics: dict[str, Any]) -> float:
  return float(metrics['wall_s'] if 'wall_s' in metrics else
               float(metrics.get('train_wall_s', 0.0)) + float(metrics.get('eval_wall_s', 0.0)))


def results(ladder: Ladder, pretrain: Sequence[cells.Cell], finetune: Sequence[cells.Cell]) -> list[dict[str, Any]]:
  """One row per rung: {'rung', 'mlm_accuracy' and 'mlm_baseline' (None without results), 'tasks': {task:
  {'metric', 'values' (per seed, None where the cell left no result), 'majority' (the eval set's majority-class
  accuracy when the metric is an accuracy, else None)}}, 'wall_s', 'missing' (cells without results)}."""
  rows, finetuned = [], cells.collect(finetune)
  for rung, pretrained in zip(ladder.rungs, cells.collect(pretrain)):
    m = pretrained['metrics']
    row = {'rung': rung.name, 'mlm_accuracy': m.get('mlm_accuracy') if m else None,
           'mlm_baseline': m.get('mlm_baseline_accuracy') if m else None, 'tasks': {},
           'wall_s': _wall(m) if m else 0.0, 'missing': [] if m else [pretrained['name']]}
    for task in ladder.tasks:
      values, metric, majority = [], None, None
      for cell in (c for c in finetuned if c['values']['rung'] == rung.name and c['values']['task'] == task.name):
        fm = cell['metrics'] if m else {}  # a rung without its pretraining's results has none
        if cell['main_metric'] in fm:
          metric = cell['main_metric']
          values.append(float(fm[metric]))
          if metric.endswith('_accuracy'):
            majority = fm.get(metric[:-len('accuracy')] + 'majority_accuracy', majority)
          row['wall_s'] += _wall(fm)
        else:
          values.append(None)
          row['missing'].append(cell['name'])
      row['tasks'][task.name] = {'metric': metric, 'values': values, 'majority': majority}
    rows.append(row)
  return rows


def summary(values: Sequence[float | None]) -> dict[str, Any] | None:
  have = [v for v in values if v is not None]
  return {'median': statistics.median(have), 'min': min(have), 'max': max(have), 'n': len(have)} if have else None


def compare(mine: dict | None, first: dict | None, majority: float | None = None) -> tuple[float | None, str]:
  """(difference of medians to the first rung, a note across seeds): no seed above the majority class (such a
  rung learnt nothing the table can rank), every seed above (or below) the first rung's range, or within the
  spread of seeds."""
  if not mine or not first:
    return None, ''
  delta = mine['median'] - first['median']
  if _at_majority(mine, majority):
    return delta, 'no seed above the majority class'
  if mine['n'] < 2 or first['n'] < 2:
    return delta, 'one seed: no spread to compare'
  if mine['min'] > first['max']:
    return delta, 'every seed above'
  return delta, 'every seed below' if mine['max'] < first['min'] else 'within the seeds\' spread'


def _at_majority(summarized: dict | None, majority: float | None) -> bool:
  return bool(summarized) and majority is not None and summarized['max'] <= majority + 1e-9


def _task(rows, task, key: str, default=None):
  """A task's `key` ('metric', 'majority') as the first rung that has one gives it."""
  return next((r['tasks'][task.name][key] for r in rows if r['tasks'][task.name][key] is not None), default)


def table(ladder: Ladder, rows: Sequence[dict[str, Any]]) -> tuple[str, str]:
  """(markdown, csv) of the ladder's rows."""
  first = rows[0] if rows else None
  header, csv_header = ['rung', 'held-out MLM acc (baseline)'], ['rung', 'mlm_accuracy', 'mlm_baseline_accuracy']
  for task in ladder.tasks:
    majority = _task(rows, task, 'majority')
    header += [f'{task.name} {_task(rows, task, "metric", "main metric")}: median [min, max] (seeds)'
               + (f'; majority class {majority:.4f}' if majority is not None else ''),
               f'{task.name} vs {first["rung"]}']
    csv_header += [f'{task.name}_{k}' for k in ('metric', 'median', 'min', 'max', 'seeds', 'majority', 'delta',
                                                'note')]
  md, out = [], [csv_header + ['wall_s', 'missing']]
  for i, row in enumerate(rows):
    acc, base = row['mlm_accuracy'], row['mlm_baseline']
    shown = '—' if acc is None else f'{acc:.4f}' + (f' ({base:.4f})' if base is not None else '')
    cells_md, cells_csv = [row['rung'], shown], [row['rung'], acc, base]
    for task in ladder.tasks:
      t, majority = row['tasks'][task.name], _task(rows, task, 'majority')
      s = summary(t['values'])
      if i:
        delta, note = compare(s, summary(first['tasks'][task.name]['values']), majority)
      else:
        delta, note = None, 'the reference' + ('; no seed above the majority class' if _at_majority(s, majority)
                                               else '')
      cells_md.append(f'{s["median"]:.4f} [{s["min"]:.4f}, {s["max"]:.4f}] ({s["n"]})' if s else '—')
      cells_md.append(f'{delta:+.4f} ({note})' if delta is not None else note or '—')
      cells_csv += [t['metric'], *([s[k] for k in ('median', 'min', 'max', 'n')] if s else [None] * 4), majority,
                    delta, note]
    md.append(cells_md + [f'{row["wall_s"] / 60:.1f} min', ', '.join(row['missing']) or '—'])
    out.append(['' if c is None else c for c in cells_csv + [round(row['wall_s'], 1), ' '.join(row['missing'])]])
  return tables.markdown(header + ['wall', 'cells without results'], md), tables.csv_text(out)


def tabulate(ladder: Ladder, pretrain: Sequence[cells.Cell], finetune: Sequence[cells.Cell],
             directory: str) -> tuple[list[str], list[str], None]:
  """`cells.run`'s tabulate: writes DIR/ladder_results.{md,csv,png}; returns their paths and the cells without
  results."""
  rows = results(ladder, pretrain, finetune)
  base = os.path.join(directory, 'ladder_results')
  tables.write(base, *table(ladder, rows))
  panels = [('held-out MLM accuracy', [[r['mlm_accuracy'] or 0.0] for r in rows])]
  panels += [(f'{task.name} {_task(rows, task, "metric", "")}'.strip(),
              [[v for v in r['tasks'][task.name]['values'] if v is not None] for r in rows]) for task in ladder.tasks]
  try:
    from bert_jax.runs import curves  # pylint: disable=g-import-not-at-top  # matplotlib: only to draw
    curves.plot_groups([r['rung'] for r in rows], panels, base + '.png')
  except (ImportError, OSError, ValueError) as e:
    raise BertJaxError(f'the ladder plot could not be drawn: {e}') from None
  return [base + '.md', base + '.csv', base + '.png'], [name for row in rows for name in row['missing']], None
