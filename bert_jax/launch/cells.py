"""Cells: the commands of a sweep or a ladder, the one judge of whether one is done, and the one flow that runs them.

A cell is done when its workdir holds final metrics (`Workdir.finished`, the runs' last write). The command it is
launched with is recorded beside its workdir (.NAME.command.json; never in it: an entry point sees its workdir as the
cell left it, and a bad cell leaves no directory behind). `state` says pending, done or stale (done, but by another
command than today's, or before the cell it needs last finished: a ladder's rung pretrained again); the local runner
(`execute`), the SLURM array tasks (`python3 -m bert_jax.launch.cells run-task CELL`: `run_task`) and a gather
(`collect`) all go by it. This module reads no flags and imports no jax: an array task starts with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any, Callable, Sequence

from bert_jax import files
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.runs.workdir import FINAL_METRICS_FILE, Workdir

PENDING, DONE, STALE = 'pending', 'done', 'stale'
_CHANGED = 'finished with another command than this one'  # how `state` begins the why of a changed command
STATUS_OK, STATUS_FAILED, STATUS_BAD_METRICS = 'ok', 'failed', 'unreadable metrics'  # `collect`'s row statuses
STATUS_MISSING = 'no result yet'  # a gather: the cell may still be queued or running
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `_comparable` writes it {repo}
Groups = Sequence[tuple[str, Sequence['Cell']]]  # (name, cells): each group runs after the one before


@dataclasses.dataclass
class Cell:
  """One command: `index` (1-based), `name`, `argv`, `workdir` (its --workdir), `values` (what varies: grid values,
  rung/task/seed), `after` (the workdir of a cell that must finish first, or '') and `returncode` (None: not run)."""

  index: int
  name: str
  argv: list[str]
  workdir: str
  values: dict[str, str] = dataclasses.field(default_factory=dict)
  after: str = ''
  returncode: int | None = None

  @property
  def record(self) -> str:
    path = os.path.abspath(self.workdir)
    return os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.command.json')


def workdir_of(argv: Sequence[str]) -> str | None:
  """The value of the last `--workdir=X` / `--workdir X` (or single-dash) argument of a command, or None."""
  workdir = None
  for i, arg in enumerate(argv):
    if arg in ('--workdir', '-workdir'):
      workdir = argv[i + 1] if i + 1 < len(argv) else workdir
    elif arg.startswith(('--workdir=', '-workdir=')):
      workdir = arg.partition('=')[2]
  return workdir


def _comparable(argv: Sequence[str]) -> list[str]:
  """A command as compared across invocations: which Python runs it, and where this checkout is, do not matter."""
  argv = list(argv)
  if argv and re.fullmatch(r'python[0-9.]*', os.path.basename(argv[0])):
    argv[0] = 'python'
  for root in sorted({REPO, os.path.realpath(REPO)}, key=len, reverse=True):
    argv = [a.replace(root + os.sep, '{repo}' + os.sep) for a in argv]
  return argv


def _changed(cell: Cell) -> str | None:
  """How the recorded command of a cell differs from today's; None when it does not, or none is recorded (a cell
  finished before commands were recorded is reused as it is)."""
  try:
    with files.open(cell.record, encoding='utf-8') as f:
      before = json.load(f)['argv']
  except (OSError, ValueError, KeyError, TypeError):
    return None
  now = _comparable(cell.argv)
  if before == now:
    return None
  gone, new = [a for a in before if a not in now], [a for a in now if a not in before]
  return (f'then {shlex.join(gone) or "nothing else"}, now {shlex.join(new) or "nothing else"}' if gone or new
          else 'the order of its arguments')


def state(cell: Cell) -> tuple[str, str]:
  """(PENDING, ''), (DONE, '') or (STALE, why): finished, but by another command than today's or before the cell it
  needs last finished. A stale cell is never reused: its results would be tabulated for a command that never ran."""
  finished = Workdir(cell.workdir).finished()
  if finished is None:
    return PENDING, ''
  diff = _changed(cell)
  if diff is not None:
    return STALE, (f'{_CHANGED} ({diff}): its results would be reused for a command '
                   f'that never ran. Use a new --workdir, delete {cell.workdir} to run it again, or delete '
                   f'{cell.record} to reuse it as it is (e.g. a moved directory)')
  needed = Workdir(cell.after).finished() if cell.after else finished
  if needed is None or needed > finished:
    why = f'{cell.after} has no {FINAL_METRICS_FILE} now' if needed is None else f'{cell.after} finished after it'
    return STALE, (f'was fine-tuned from an earlier pretraining of rung {os.path.basename(cell.after)} ({why}): its '
                   f'results would be tabulated beside the new one. Delete '
                   f'{os.path.dirname(os.path.dirname(cell.workdir))} to fine-tune that rung again')
  return DONE, ''


def check(cells: Sequence[Cell], root: str | None = None) -> None:
  """ConfigError naming the first stale cell (by its workdir under `root`, else its name), why, and the ways out."""
  stale = [(cell, why) for cell, (kind, why) in zip(cells, map(state, cells)) if kind == STALE]
  if stale:
    (cell, why), changed = stale[0], [c for c, w in stale[1:] if w.startswith(_CHANGED)]
    more = f' (and {len(changed)} more)' if changed and why.startswith(_CHANGED) else ''
    raise ConfigError(f'{os.path.relpath(cell.workdir, root) if root else cell.name}{more} {why}')


def collect(cells: Sequence[Cell], missing: str = STATUS_FAILED) -> list[dict[str, Any]]:
  """One row per cell: {'name', 'values', 'status' (ok, `missing` without results, unreadable metrics), 'metrics'
  (the numeric top-level values), 'main_metric' (str or None)}: what a sweep's and a ladder's tables read."""
  rows = []
  for cell in cells:
    row = {'name': cell.name, 'values': dict(cell.values), 'status': missing, 'metrics': {}, 'main_metric': None}
    try:
      data = Workdir(cell.workdir).results()
    except CheckpointError:
      data, row['status'] = None, STATUS_BAD_METRICS
    if data is not None:
      row['metrics'] = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
      row['main_metric'] = data['main_metric'] if isinstance(data.get('main_metric'), str) else None
      row['status'] = STATUS_OK if cell.returncode in (None, 0) else STATUS_FAILED
    rows.append(row)
  return rows


def _skip(cell: Cell) -> tuple[int, str] | None:
  """(exit status, why) for a cell not to run now: 0, it is done; 1, what it needs has not finished. None: run it."""
  kind, why = state(cell)
  if kind == STALE:  # as `check` words it for one cell
    raise ConfigError(f'{cell.name} {why}')
  if kind == DONE:
    return 0, f'done before ({os.path.join(cell.workdir, FINAL_METRICS_FILE)} exists), skipped'
  if cell.after and Workdir(cell.after).finished() is None:
    return 1, (f'not run, its rung\'s pretraining failed or is unfinished ({cell.after} has no '
               f'{FINAL_METRICS_FILE})')
  return None


def _record(cell: Cell) -> None:
  """Records the command a cell is launched with; a place that cannot be written is left to the command to report."""
  try:
    files.write_text_atomic(cell.record, json.dumps({'argv': _comparable(cell.argv)}))
  except OSError:
    pass


def run(groups: Groups, directory: str, launcher: dict[str, Any],
        tabulate: Callable[[bool], tuple[list[str], list[str], Exception | None]], noun: str = 'cells',
        root: str | None = None, kept: str = '') -> None:
  """The flow of sweep.py and ladder.py (`launcher`: the values of cli.define_launcher_flags): refuse stale cells
  (named by workdir under `root`); print the pending commands (--dry_run), or run them here, or write job arrays
  under `directory`/slurm, or gather; then `tabulate(gather)` writes the tables and returns (their paths, markdown
  first; the cells without results; an error to raise once they are printed). A ladder's `kept`: `directory` must be
  writable before any cell starts. BertJaxError at the end when a cell failed."""
  cells = [cell for _, group in groups for cell in group]
  check(cells, root)
  if launcher['dry_run']:
    pending = [cell for cell in cells if state(cell)[0] == PENDING]
    if len(pending) < len(cells):
      print(f'# {len(cells) - len(pending)} of {len(cells)} {noun} already done, not listed', file=sys.stderr)
    print(''.join(shlex.join(cell.argv) + '\n' for cell in pending), end='', flush=True)
    return
  if kept:  # before any cell starts: each would fail on its own, and the table could not be written
    try:
      files.check_output(directory, 'directory', '--workdir')
    except ConfigError as e:
      raise ConfigError(f'{e}; {kept}') from None
  if launcher['launcher'] == 'slurm' and not launcher['gather']:
    submit(os.path.join(directory, 'slurm'), groups, launcher)
    return
  failed = [] if launcher['gather'] else execute(groups)
  paths, missing, error = tabulate(launcher['gather'])
  with files.open(paths[0], encoding='utf-8') as f:
    print(f'\n{f.read()}', flush=True)
  print(f'results: {", ".join(paths[:-1])} and {paths[-1]}', flush=True)
  if error:
    raise error
  if failed:
    raise BertJaxError(f'{len(failed)} of {len(cells)} {noun} failed: {", ".join(c.name for c in failed)}')
  if missing:
    print(f'{len(missing)} of {len(cells)} {noun} have no results yet: {", ".join(missing)}', flush=True)


def execute(groups: Groups) -> list[Cell]:
  """Runs the pending cells here, group after group, their output streaming through; a failed cell is reported and
  the others go on, but not those after it. Returns the cells that failed (`returncode` set) or could not run."""
  failed = []
  for label, group in groups:
    for cell in group:
      prefix = f'[{label.replace("_", " ")} {cell.index}/{len(group)}] {cell.name}:'
      skip = _skip(cell)
      if skip:
        print(f'{prefix} {skip[1]}', flush=True)
        failed += [cell] if skip[0] else []
        continue
      print(f'{prefix} {shlex.join(cell.argv)}', flush=True)
      _record(cell)
      try:
        cell.returncode = subprocess.run(cell.argv, check=False).returncode
      except OSError as e:  # command not found / not executable
        print(f'{prefix} could not start: {e}', flush=True)
        cell.returncode = 127
      if cell.returncode:
        print(f'{prefix} failed with exit code {cell.returncode}', flush=True)
        failed.append(cell)
  return failed


def sbatch_lines(options: str) -> str:
  """`--slurm_sbatch`'s options ("--partition=gpu --gpus=1", or "-p gpu -t 4:00:00") as #SBATCH lines."""
  lines = []
  for word in shlex.split(options):
    if word.startswith('-'):
      lines.append(word)
    elif lines and '=' not in lines[-1] and ' ' not in lines[-1]:
      lines[-1] += ' ' + word  # the value of the option before
    else:
      raise ConfigError(f'--slurm_sbatch takes sbatch options such as "--partition=gpu --time=4:00:00", got '
                        f'{word!r} where an option should be')
  return '\n'.join(f'#SBATCH {line}' for line in lines)


def write_arrays(directory: str, groups: Groups, *, template: str, sbatch: str = '') -> list[tuple[str, int]]:
  """Under `directory`, per group of cells with pending ones: a cells file (a `task_line` per pending cell), a batch
  script from `template` (experiments/launch/array.sbatch) running one per array task in today's working directory
  (the cells' paths are relative to it); and submit.sh, which submits them in order, each after the one before has
  ended (afterany: a failed cell is reported by the gather, it does not stop the others). Returns (batch script,
  number of cells) in submission order."""
  try:
    with files.open(template, encoding='utf-8') as f:
      text = f.read()
  except OSError as e:
    raise ConfigError(f'--slurm_template={template}: {e.strerror}') from None
  missing = [field for field in ('@CELLS_FILE@', '@NUM_CELLS@') if field not in text]
  if missing:
    raise ConfigError(f'--slurm_template={template} lacks {", ".join(missing)} (see experiments/launch/array.sbatch)')
  directory = os.path.abspath(directory)
  fields = {'@SBATCH_LINES@': sbatch_lines(sbatch), '@LOG_DIR@': os.path.join(directory, 'logs'),
            '@CWD@': shlex.quote(os.getcwd())}
  os.makedirs(fields['@LOG_DIR@'], exist_ok=True)
  scripts, lines = [], ['#!/usr/bin/env bash', '# Submits the arrays in order, each after the one before has ended.',
                        'set -eu', 'after=""']
  for name, group in groups:
    pending = [cell for cell in group if state(cell)[0] == PENDING]
    if pending:
      base = os.path.join(directory, name)
      files.write_text_atomic(base + '.cells', ''.join(task_line(cell) + '\n' for cell in pending))
      fields.update({'@JOB_NAME@': name, '@NUM_CELLS@': str(len(pending)),
                     '@CELLS_FILE@': shlex.quote(base + '.cells')})
      files.write_text_atomic(base + '.sbatch', re.sub('|'.join(fields), lambda m: fields[m.group()], text))
      scripts.append((base + '.sbatch', len(pending)))
      lines += [f'job=$(sbatch --parsable $after {shlex.quote(base + ".sbatch")})',
                f'echo "submitted $job: {name}.sbatch"', 'after="--dependency=afterany:${job%%;*}"']
  files.write_text_atomic(os.path.join(directory, 'submit.sh'), '\n'.join(lines) + '\n')
  os.chmod(os.path.join(directory, 'submit.sh'), 0o755)
  return scripts


def submit(directory: str, groups: Groups, launcher: dict[str, Any]) -> None:
  """Writes the job arrays under `directory` and runs its submit.sh where `sbatch` is on the PATH (else says how)."""
  for script, count in write_arrays(directory, groups, template=launcher['template'],
                                    sbatch=launcher['sbatch']):
    print(f'wrote {script} ({count} cells)', flush=True)
  script = os.path.join(directory, 'submit.sh')
  if launcher['submit'] and shutil.which('sbatch'):
    done = subprocess.run(['bash', script], capture_output=True, text=True, check=False)
    if done.returncode:
      raise BertJaxError(f'submitting failed: {(done.stderr or done.stdout).strip()}')
    print(done.stdout, end='', flush=True)
  else:
    print(f'{"sbatch is not on the PATH here; " if launcher["submit"] else ""}submit with: bash {script}', flush=True)
  print('when they have run, the same command with --gather builds the table', flush=True)


def task_line(cell: Cell) -> str:
  """The shell line of a SLURM array task running `cell` through `run_task`."""
  spec = json.dumps({'name': cell.name, 'argv': cell.argv, 'workdir': cell.workdir, 'after': cell.after})
  return shlex.join([sys.executable, '-m', 'bert_jax.launch.cells', 'run-task', spec])


def run_task(cell: Cell) -> int:
  """An array task: the cell's command in place of this process (SIGTERM reaches it), unless `_skip` says not to;
  then its exit status."""
  skip = _skip(cell)
  if skip:
    print(skip[1], file=sys.stderr if skip[0] else sys.stdout, flush=True)
    return skip[0]
  _record(cell)
  sys.stdout.flush()
  try:
    os.execvp(cell.argv[0], cell.argv)
  except OSError as e:
    raise BertJaxError(f'{cell.name} could not start: {e}') from None


def main(argv: Sequence[str]) -> int:
  try:
    if len(argv) != 2 or argv[0] != 'run-task':
      raise ConfigError('usage: python3 -m bert_jax.launch.cells run-task CELL (a JSON object, as `task_line` writes '
                        'it)')
    try:
      cell = Cell(0, **json.loads(argv[1]))  # the fields `task_line` writes
    except (ValueError, TypeError) as e:
      raise ConfigError(f'a bad cell {argv[1]!r}: {type(e).__name__}: {e}') from None
    return run_task(cell)
  except BertJaxError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
