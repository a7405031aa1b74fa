"""Hyperparameter sweeps: a grid of flag values, one run per combination, one results table.

The library behind experiments/sweep.py; it reads no flags. Typical use through the script:

  python experiments/sweep.py \
      --grid="config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3" \
      -- python experiments/finetune.py --config=experiments/configs/finetune.py:rte \
      --workdir=DIR/{name} --config.init_checkpoint=PATH

Each run is the command after `--` with `{name}` (e.g. `learning_rate=1e-4,num_train_epochs=2`) and
`{index}` (1-based run number) substituted and `--key=value` appended for every grid key. A run whose
workdir already holds `final_metrics.json` is done and skipped, so an interrupted sweep continues where
it stopped; each run's command is recorded beside its workdir (`.NAME.command.json`) when it starts, and a
finished run whose recorded command differs from today's is an error (`check_finished`), never silently reused. The runs'
final metrics are gathered into `sweep_results.csv` and `sweep_results.md`.

Variants of one config file are a grid over `config`: `config=experiments/configs/pretrain.py:cpu,sop,span`
runs `--config=experiments/configs/pretrain.py:cpu`, `...:sop` and `...:span` (a bare value takes the
file of the value before it), and names the runs by variant (`config=sop`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Sequence

from bert_jax.errors import ConfigError
from bert_jax.files import write_text_atomic
from bert_jax.runs.workdir import FINAL_METRICS_FILE  # what the training scripts write last, atomically

RESULTS_BASENAME = 'sweep_results'
CONFIG_KEY = 'config'  # config_flags' --config=FILE:VARIANT
NAME_PLACEHOLDER = '{name}'
INDEX_PLACEHOLDER = '{index}'
STATUS_OK = 'ok'
STATUS_FAILED = 'failed'
STATUS_BAD_METRICS = 'unreadable metrics'
STATUS_MISSING = 'no result yet'  # a gather: the run may still be queued or running

# Beside a cell's workdir, never in it: an entry point sees its workdir as the cell left it (merge.py refuses a
# non-empty one), and a bad cell leaves no directory behind.
COMMAND_SUFFIX = '.command.json'
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_UNSAFE = re.compile(r'[^A-Za-z0-9._=,-]')
_KEY = re.compile(r'[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*')


@dataclasses.dataclass
class Run:
  """One point of the grid.

  Attributes:
    index: 1-based run number.
    values: grid key -> value (a string, passed on as `--key=value`), in grid order.
    name: filesystem-safe run name (see `run_name`).
    argv: the expanded command.
    workdir: the run's `--workdir` argument.
    returncode: the command's exit status; None when it was not run (done before, or dry run).
  """

  index: int
  values: dict[str, str]
  name: str
  argv: list[str]
  workdir: str
  returncode: int | None = None

  @property
  def metrics_path(self) -> str:
    return os.path.join(self.workdir, FINAL_METRICS_FILE)

  def is_done(self) -> bool:
    """Whether the workdir already holds final metrics."""
    return os.path.isfile(self.metrics_path)


def _comparable(argv: Sequence[str]) -> list[str]:
  """A command as compared across invocations: which Python runs it, and where this checkout is, do not matter."""
  argv = list(argv)
  if argv and re.fullmatch(r'python[0-9.]*', os.path.basename(argv[0])):
    argv[0] = 'python'
  roots = sorted({os.path.abspath(_REPO), os.path.realpath(_REPO)}, key=len, reverse=True)
  for root in roots:
    argv = [a.replace(root + os.sep, '{repo}' + os.sep) for a in argv]
  return argv


def command_record(workdir: str) -> str:
  """Where the command a cell was launched with is recorded: `.NAME.command.json` beside its workdir."""
  path = os.path.abspath(workdir)
  return os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}{COMMAND_SUFFIX}')


def record_json(argv: Sequence[str]) -> str:
  """The record of a command (`command_record`'s content)."""
  return json.dumps({'argv': _comparable(argv)})


def record_command(workdir: str, argv: Sequence[str]) -> None:
  """Records the command a cell is launched with (creating the workdir's parent). A place that cannot be written is
  left to the command itself to report."""
  path = command_record(workdir)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text_atomic(path, record_json(argv))
  except OSError:
    pass


def recorded_command(workdir: str) -> list[str] | None:
  """The command recorded for `workdir`, None when there is none (a cell run before records, or by hand)."""
  try:
    with open(command_record(workdir), encoding='utf-8') as f:
      argv = json.load(f).get('argv')
  except (OSError, ValueError, AttributeError):
    return None
  return argv if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None


def check_finished(cells: Sequence[tuple[str, Sequence[str], str]]) -> None:
  """ConfigError when a finished cell (name, argv, workdir) was run with another command than `argv`: its results
  would otherwise be reused for a command that never ran.

  Raises:
    ConfigError: naming the first such cell, what differs, and the ways out.
  """
  changed = []
  for name, argv, workdir in cells:
    before, now = recorded_command(workdir), _comparable(argv)
    if before is not None and before != now and os.path.isfile(os.path.join(workdir, FINAL_METRICS_FILE)):
      changed.append((name, workdir, [a for a in before if a not in now], [a for a in now if a not in before]))
  if changed:
    name, workdir, gone, new = changed[0]
    diff = (f'then {shlex.join(gone) or "nothing else"}, now {shlex.join(new) or "nothing else"}' if gone or new
            else 'the order of its arguments')
    more = f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''
    raise ConfigError(f'{name}{more} finished with another command than this one ({diff}): its results would be '
                      f'reused for a command that never ran. Use a new --workdir, delete {workdir} to run it again, or '
                      f'delete {command_record(workdir)} to reuse it as it is (e.g. a moved directory)')


def shell_words(where: str, text: str) -> list[str]:
  """`text` split as a shell splits words (quotes keep spaces: path='/my data'); ConfigError for open quotes."""
  try:
    return shlex.split(text)
  except ValueError as e:  # shlex: 'No closing quotation' / 'No escaped character'
    raise ConfigError(f'{where}: {e} in {text!r} (quote a value with spaces as a shell would: key=\'a b\')') from None


def parse_grid(text: str) -> list[tuple[str, list[str]]]:
  """Parses `key=v1,v2 key2=v3,...` (entries are shell words: quotes keep a value's spaces).

  Args:
    text: the grid specification.

  Returns:
    (key, values) pairs in the given order.

  Raises:
    ConfigError: the grid is empty, an entry has no '=', a bad key, a repeated key or an empty value.
  """
  entries = shell_words('--grid', text)
  if not entries:
    raise ConfigError('empty grid: give --grid="key=v1,v2 key2=v3,v4"')
  grid, seen = [], set()
  for entry in entries:
    key, sep, values_text = entry.partition('=')
    if not sep:
      raise ConfigError(f'grid entry {entry!r} has no "=": expected key=v1,v2,...')
    if not _KEY.fullmatch(key):
      raise ConfigError(f'grid entry {entry!r}: bad key {key!r} (expected a flag name like '
                        'config.learning_rate, without leading dashes)')
    if key in seen:
      raise ConfigError(f'grid key {key!r} appears twice')
    seen.add(key)
    values = values_text.split(',')
    if not values_text or any(not v for v in values):
      raise ConfigError(f'grid entry {entry!r} has an empty value: expected key=v1,v2,...')
    if key == CONFIG_KEY:
      values = _config_variants(entry, values)
    grid.append((key, values))
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
  """The cartesian product of the grid, last key varying fastest.

  Args:
    grid: (key, values) pairs, as from `parse_grid`.

  Returns:
    One {key: value} dict per run, keys in grid order.
  """
  keys = [key for key, _ in grid]
  return [dict(zip(keys, combo)) for combo in itertools.product(*(values for _, values in grid))]


def short_key(key: str) -> str:
  """The last dotted component of a flag name: 'config.optim.learning_rate' -> 'learning_rate'."""
  return key.rsplit('.', 1)[-1]


def run_name(values: dict[str, str]) -> str:
  """A filesystem-safe run name like 'learning_rate=1e-4,num_train_epochs=2'.

  Keys are shortened to their last dotted component unless two keys would then coincide; characters
  other than [A-Za-z0-9._=,-] become '_'.

  Args:
    values: one run's grid values.

  Returns:
    The name.
  """
  shorts = [short_key(k) for k in values]
  use_short = len(set(shorts)) == len(shorts)
  shown = {k: v.rpartition(':')[2] or v if k == CONFIG_KEY else v for k, v in values.items()}
  name = ','.join(f'{short_key(k) if use_short else k}={v}' for k, v in shown.items())
  return _UNSAFE.sub('_', name)


def build_command(template: Sequence[str], values: dict[str, str], name: str, index: int) -> list[str]:
  """The command of one run.

  Args:
    template: the command after `--`, with `{name}` (required) and `{index}` placeholders.
    values: the run's grid values; `--key=value` is appended for each, but `--config=FILE:VARIANT` goes before
      the command's first `--config.FIELD` override (config_flags needs the file first).
    name: substituted for `{name}`.
    index: substituted for `{index}`.

  Returns:
    The expanded argv.

  Raises:
    ConfigError: the template has no `{name}`, so every run would share a workdir.
  """
  if not any(NAME_PLACEHOLDER in arg for arg in template):
    raise ConfigError('the command has no {name} placeholder: every run would share one workdir '
                      '(use e.g. --workdir=DIR/{name})')
  argv = [arg.replace(NAME_PLACEHOLDER, name).replace(INDEX_PLACEHOLDER, str(index)) for arg in template]
  flags = [f'--{key}={value}' for key, value in values.items()]
  if CONFIG_KEY in values:
    # config_flags reads --config=FILE:VARIANT before any --config.FIELD=... override: the grid's goes in front
    # of the command's own overrides (a --config in the command as well would be two configs).
    if any(re.match(r'--?config(=|$)', arg) for arg in argv):
      raise ConfigError('the grid gives config and the command gives --config too: keep one of them')
    at = next((i for i, arg in enumerate(argv) if re.match(r'--?config\.', arg)), len(argv))
    argv = argv[:at] + [f'--{CONFIG_KEY}={values[CONFIG_KEY]}'] + argv[at:]
    flags = [f'--{key}={value}' for key, value in values.items() if key != CONFIG_KEY]
  return argv + flags


def workdir_of(argv: Sequence[str]) -> str | None:
  """The value of the last `--workdir=X` / `--workdir X` (or single-dash) argument, or None."""
  workdir = None
  for i, arg in enumerate(argv):
    if arg in ('--workdir', '-workdir'):
      if i + 1 < len(argv):
        workdir = argv[i + 1]
    else:
      for prefix in ('--workdir=', '-workdir='):
        if arg.startswith(prefix):
          workdir = arg[len(prefix):]
  return workdir


def plan(grid: Sequence[tuple[str, Sequence[str]]], template: Sequence[str]) -> list[Run]:
  """All runs of a sweep.

  Args:
    grid: (key, values) pairs, as from `parse_grid`.
    template: the command after `--`.

  Returns:
    The runs in order.

  Raises:
    ConfigError: no command, no `{name}`, no `--workdir`, or two runs sharing a workdir.
  """
  if not template:
    raise ConfigError('no command after "--": e.g. sweep.py --grid=... -- python experiments/'
                      'finetune.py --workdir=DIR/{name}')
  runs = []
  for index, values in enumerate(expand(grid), start=1):
    name = run_name(values)
    argv = build_command(template, values, name, index)
    workdir = workdir_of(argv)
    if not workdir:
      raise ConfigError('the command has no --workdir argument: the sweep finds each run\'s '
                        f'{FINAL_METRICS_FILE} there (use e.g. --workdir=DIR/{{name}})')
    runs.append(Run(index=index, values=values, name=name, argv=argv, workdir=workdir))
  seen = {}
  for run in runs:
    key = os.path.abspath(run.workdir)
    if key in seen:
      raise ConfigError(f'runs {seen[key]} and {run.name} would share workdir {run.workdir}')
    seen[key] = run.name
  return runs


def default_output_dir(runs: Sequence[Run]) -> str:
  """The common parent directory of the runs' workdirs."""
  return os.path.commonpath([os.path.dirname(os.path.abspath(r.workdir)) for r in runs])


def execute(runs: Sequence[Run], out=None, label: str = 'sweep') -> list[Run]:
  """Runs the not-yet-done runs one after another; their output streams through unchanged.

  Prints a header line `[sweep i/N] name: command` before each run. A failing run is reported and
  the sweep goes on.

  Args:
    runs: from `plan`; their `returncode` is set (left None for runs done before).
    out: where the sweep's own lines go (default sys.stdout).

  Returns:
    The runs that failed.
  """
  out = out or sys.stdout
  failed = []
  for run in runs:
    prefix = f'[{label} {run.index}/{len(runs)}] {run.name}:'
    if run.is_done():
      print(f'{prefix} done before ({run.metrics_path} exists), skipped', file=out, flush=True)
      continue
    print(f'{prefix} {shlex.join(run.argv)}', file=out, flush=True)
    record_command(run.workdir, run.argv)
    try:
      run.returncode = subprocess.run(run.argv, check=False).returncode
    except OSError as e:  # command not found / not executable
      print(f'{prefix} could not start: {e}', file=out, flush=True)
      run.returncode = 127
    if run.returncode != 0:
      print(f'{prefix} failed with exit code {run.returncode}', file=out, flush=True)
      failed.append(run)
  return failed


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def collect(runs: Sequence[Run], missing: str = STATUS_FAILED) -> list[dict[str, Any]]:
  """Reads each run's final metrics.

  Args:
    runs: from `plan`.
    missing: the status of a run without final metrics ('failed'; a gather: 'no result yet').

  Returns:
    One row per run: {'name', 'values' (grid values), 'status' ('ok', 'failed' when there are no
    final metrics, 'unreadable metrics'), 'metrics' (numeric top-level values), 'main_metric'
    (str or None)}.
  """
  rows = []
  for run in runs:
    row = {'name': run.name, 'values': dict(run.values), 'status': missing, 'metrics': {},
           'main_metric': None}
    if os.path.isfile(run.metrics_path):
      try:
        with open(run.metrics_path, encoding='utf-8') as f:
          data = json.load(f)
      except (OSError, ValueError):
        data = None
      if isinstance(data, dict):
        row['metrics'] = {k: v for k, v in data.items() if _is_number(v)}
        main = data.get('main_metric')
        row['main_metric'] = main if isinstance(main, str) else None
        row['status'] = STATUS_OK if run.returncode in (None, 0) else STATUS_FAILED
      else:
        row['status'] = STATUS_BAD_METRICS
    rows.append(row)
  return rows


def ranking_metric(rows: Sequence[dict[str, Any]], metric: str | None = None) -> str | None:
  """`metric` if given, else the runs' common `main_metric` (None when they name none).

  Raises:
    ConfigError: the runs name different main metrics.
  """
  if metric:
    return metric
  mains = sorted({r['main_metric'] for r in rows if r['main_metric']})
  if len(mains) > 1:
    raise ConfigError(f'the runs name different main metrics {mains}: choose one with --metric')
  return mains[0] if mains else None


def best_index(rows: Sequence[dict[str, Any]], metric: str | None, mode: str = 'max') -> int | None:
  """Index of the best row by `metric` ('max' or 'min'; first on ties, NaN ignored), or None."""
  if mode not in ('max', 'min'):
    raise ConfigError(f'mode must be max or min, not {mode!r}')
  if not metric:
    return None
  candidates = [(r['metrics'][metric], i) for i, r in enumerate(rows)
                if metric in r['metrics'] and not math.isnan(r['metrics'][metric])]
  if not candidates:
    return None
  pick = max if mode == 'max' else min
  best = pick(v for v, _ in candidates)
  return next(i for v, i in candidates if v == best)


def table(rows: Sequence[dict[str, Any]], metric: str | None, mode: str = 'max') -> tuple[list[str], list[list[Any]]]:
  """(header, cells): name, grid keys, metrics (sorted union), status, best ('*' on the best row)."""
  keys = list(dict.fromkeys(k for r in rows for k in r['values']))
  metric_names = sorted({k for r in rows for k in r['metrics']})
  best = best_index(rows, metric, mode)
  header = ['name', *keys, *metric_names, 'status', 'best']
  cells = [[r['name'], *(r['values'].get(k, '') for k in keys), *(r['metrics'].get(m, '') for m in metric_names),
            r['status'], '*' if i == best else ''] for i, r in enumerate(rows)]
  return header, cells


def _md_cell(value: Any) -> str:
  if isinstance(value, float):
    value = f'{value:.6g}'
  return str(value).replace('|', '\\|')


def markdown(header: Sequence[str], cells: Sequence[Sequence[Any]]) -> str:
  """A markdown table (floats to 6 significant digits)."""
  lines = ['| ' + ' | '.join(_md_cell(h) for h in header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  lines += ['| ' + ' | '.join(_md_cell(c) for c in row) + ' |' for row in cells]
  return '\n'.join(lines) + '\n'


def write_tables(rows: Sequence[dict[str, Any]], output_dir: str, metric: str | None = None,
                 mode: str = 'max') -> tuple[str, str]:
  """Writes `sweep_results.csv` and `sweep_results.md` into `output_dir`.

  Args:
    rows: from `collect`.
    output_dir: created if missing.
    metric: the metric to rank by; None: the runs' common `main_metric` (no best row when none).
    mode: 'max' or 'min'.

  Returns:
    (csv_path, md_path).

  Raises:
    ConfigError: bad mode, or the runs name different main metrics and `metric` is None.
  """
  header, cells = table(rows, ranking_metric(rows, metric), mode)
  os.makedirs(output_dir, exist_ok=True)
  csv_path = os.path.join(output_dir, RESULTS_BASENAME + '.csv')
  md_path = os.path.join(output_dir, RESULTS_BASENAME + '.md')
  buffer = io.StringIO(newline='')
  writer = csv.writer(buffer)
  writer.writerow(header)
  writer.writerows(cells)
  write_text_atomic(csv_path, buffer.getvalue())
  write_text_atomic(md_path, markdown(header, cells))
  return csv_path, md_path
