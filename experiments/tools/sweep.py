"""Hyperparameter sweeps: a grid of flag values, one cell per combination, one results table; reads no flags.

A grid over `config` runs a config file's variants: `config=experiments/configs/pretrain.py:cpu,sop` (a bare value
takes the file of the value before it), its cells named by variant (`config=sop`).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from typing import Any, Sequence

from bert_jax.config.overrides import KEY, shell_words
from bert_jax.errors import ConfigError
from bert_jax.launch import cells, results_tables as tables
from bert_jax.runs.workdir import FINAL_METRICS_FILE

CONFIG_KEY = 'config'  # config_flags' --config=FILE:VARIANT
UNSAFE = re.compile(r'[^A-Za-z0-9._=,-]')  # what a cell's name (its workdir's) may not hold


def parse_grid(text: str) -> list[tuple[str, list[str]]]:
  """(key, values) pairs of `key=v1,v2 key2=v3,...` (shell words: quotes keep a value's spaces), in order."""
  entries = shell_words('--grid', text)
  if not entries:
    raise ConfigError('empty grid: give --grid="key=v1,v2 key2=v3,v4"')
  grid = []
  for entry in entries:
    key, sep, values_text = entry.partition('=')
    values = values_text.split(',')
    if not sep:
      raise ConfigError(f'grid entry {entry!r} has no "=": expected key=v1,v2,...')
    if not KEY.fullmatch(key):
      raise ConfigError(f'grid entry {entry!r}: bad key {key!r} (expected a flag name like '
                        'config.learning_rate, without leading dashes)')
    if key in dict(grid):
      raise ConfigError(f'grid key {key!r} appears twice')
    if not all(values):
      raise ConfigError(f'grid entry {entry!r} has an empty value: expected key=v1,v2,...')
    grid.append((key, _config_variants(entry, values) if key == CONFIG_KEY else values))
  return grid


def _config_variants(entry: str, values: list[str]) -> list[str]:
  """Config values with a bare variant name completed by the file of the value before it."""
  out, file = [], None
  for value in values:
    if ':' in value or '/' in value or value.endswith('.py'):
      file = value.partition(':')[0]
      out.append(value)
    elif file is None:
      raise ConfigError(f'grid entry {entry!r}: variant {value!r} has no config file before it '
                        '(e.g. config=experiments/configs/pretrain.py:cpu,sop)')
    else:
      out.append(f'{file}:{value}')
  return out


def expand(grid: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
  """One {key: value} per cell, keys in grid order, the last key varying fastest."""
  keys = [key for key, _ in grid]
  return [dict(zip(keys, combo)) for combo in itertools.product(*(values for _, values in grid))]


def run_name(values: dict[str, str]) -> str:
  """'learning_rate=1e-4,num_train_epochs=2': keys by their last dotted part unless two would coincide, a config by
  its variant, characters other than [A-Za-z0-9._=,-] as '_'."""
  shorts = [k.rsplit('.', 1)[-1] for k in values]
  keys = shorts if len(set(shorts)) == len(shorts) else list(values)
  shown = [v.rpartition(':')[2] or v if k == CONFIG_KEY else v for k, v in values.items()]
  return UNSAFE.sub('_', ','.join(f'{k}={v}' for k, v in zip(keys, shown)))


def build_command(template: Sequence[str], values: dict[str, str], name: str, index: int) -> list[str]:
  """The command after `--` with `{name}` (required: else every cell would share a workdir) and `{index}` filled in
  and `--key=value` per grid key; a grid's `--config=FILE:VARIANT` goes before the first `--config.FIELD` (config_flags
  reads the file first)."""
  if not any('{name}' in arg for arg in template):
    raise ConfigError('the command has no {name} placeholder: every run would share one workdir '
                      '(use e.g. --workdir=DIR/{name})')
  argv = [arg.replace('{name}', name).replace('{index}', str(index)) for arg in template]
  if CONFIG_KEY in values:
    if any(re.match(r'--?config(=|$)', arg) for arg in argv):
      raise ConfigError('the grid gives config and the command gives --config too: keep one of them')
    at = next((i for i, arg in enumerate(argv) if re.match(r'--?config\.', arg)), len(argv))
    argv[at:at] = [f'--{CONFIG_KEY}={values[CONFIG_KEY]}']
  return argv + [f'--{key}={value}' for key, value in values.items() if key != CONFIG_KEY]


def plan(grid: Sequence[tuple[str, Sequence[str]]], template: Sequence[str]) -> list[cells.Cell]:
  """The cells of a sweep, in order; ConfigError for no command, no `{name}` or `--workdir`, or a shared workdir."""
  if not template:
    raise ConfigError('no command after "--": e.g. sweep.py --grid=... -- python experiments/'
                      'finetune.py --workdir=DIR/{name}')
  runs, seen = [], {}
  for index, values in enumerate(expand(grid), start=1):
    name = run_name(values)
    argv = build_command(template, values, name, index)
    workdir = cells.workdir_of(argv)
    if not workdir:
      raise ConfigError('the command has no --workdir argument: the sweep finds each run\'s '
                        f'{FINAL_METRICS_FILE} there (use e.g. --workdir=DIR/{{name}})')
    if os.path.abspath(workdir) in seen:
      raise ConfigError(f'runs {seen[os.path.abspath(workdir)]} and {name} would share workdir {workdir}')
    seen[os.path.abspath(workdir)] = name
    runs.append(cells.Cell(index, name, argv, workdir, values))
  return runs


def default_output_dir(runs: Sequence[cells.Cell]) -> str:
  """The common parent directory of the cells' workdirs."""
  return os.path.commonpath([os.path.dirname(os.path.abspath(r.workdir)) for r in runs])


def ranking_metric(rows: Sequence[dict[str, Any]], metric: str | None = None) -> str | None:
  """`metric` if given, else the cells' common `main_metric` (None when they name none); ConfigError for several."""
  mains = sorted({r['main_metric'] for r in rows if r['main_metric']})
  if not metric and len(mains) > 1:
    raise ConfigError(f'the runs name different main metrics {mains}: choose one with --metric')
  return metric or (mains[0] if mains else None)


def write_tables(rows: Sequence[dict[str, Any]], output_dir: str, metric: str | None = None,
                 mode: str = 'max') -> tuple[str, str]:
  """Writes sweep_results.csv and .md into `output_dir`: name, grid keys, metrics (sorted union), status, best ('*'
  on the first best row by `metric`, default the cells' common main_metric, and `mode`; NaN ignored). Returns
  (csv_path, md_path)."""
  if mode not in ('max', 'min'):
    raise ConfigError(f'mode must be max or min, not {mode!r}')
  metric = ranking_metric(rows, metric)
  scores = [r['metrics'].get(metric, math.nan) if metric else math.nan for r in rows]
  ranked = [v for v in scores if not math.isnan(v)]
  best = scores.index((max if mode == 'max' else min)(ranked)) if ranked else None
  keys = list(dict.fromkeys(k for r in rows for k in r['values']))
  metric_names = sorted({k for r in rows for k in r['metrics']})
  header = ['name', *keys, *metric_names, 'status', 'best']
  table = [[r['name'], *(r['values'].get(k, '') for k in keys), *(r['metrics'].get(m, '') for m in metric_names),
            r['status'], '*' if i == best else ''] for i, r in enumerate(rows)]
  return tables.write(os.path.join(output_dir, 'sweep_results'), tables.markdown(header, table),
                      tables.csv_text([header, *table]))


def tabulate(runs: Sequence[cells.Cell], output_dir: str, metric: str | None, mode: str,
             gather: bool) -> tuple[list[str], list[str], ConfigError | None]:
  """`cells.run`'s tabulate: writes the tables (`cells.collect`, `write_tables`) and returns their paths, the runs
  without results (a gather's) and, for a --metric in no run's results, the error to raise once the table is
  printed."""
  rows = cells.collect(runs, missing=cells.STATUS_MISSING if gather else cells.STATUS_FAILED)
  metric = ranking_metric(rows, metric)
  csv_path, md_path = write_tables(rows, output_dir, metric, mode)
  have = sorted({m for r in rows for m in r['metrics']})
  error = (ConfigError(f'metric {metric!r} is in no run\'s {FINAL_METRICS_FILE} (have: {", ".join(have)})')
           if metric and have and metric not in have else None)
  return [md_path, csv_path], [r['name'] for r in rows if r['status'] == cells.STATUS_MISSING], error
