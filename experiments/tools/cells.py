"""Cells: the commands of a sweep or a ladder, each with its workdir, and the one judge of whether one is done.

A cell is done when its workdir holds final metrics (`Workdir.finished`, the runs' last write). The command it is
launched with is recorded beside its workdir (.NAME.command.json; never in it: an entry point sees its workdir as the
cell left it, and a bad cell leaves no directory behind). `state` says pending, done or stale (done, but by another
command than today's, or before the cell it needs last finished: a ladder's rung pretrained again); the local runner
(`execute`), a SLURM array task (`run_task`: `python3 experiments/tools/cells.py run-task CELL`) and a gather all go
by it. This module reads no flags and imports nothing of experiments/: an array task runs it as a script.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Sequence

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.files import write_text_atomic
from bert_jax.runs.workdir import FINAL_METRICS_FILE, Workdir

PENDING, DONE, STALE = 'pending', 'done', 'stale'
SCRIPT = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))


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

  def results(self) -> dict | None:
    """Its final metrics (None before it finished); CheckpointError when unreadable."""
    return Workdir(self.workdir).results()


def _comparable(argv: Sequence[str]) -> list[str]:
  """A command as compared across invocations: which Python runs it, and where this checkout is, do not matter."""
  argv = list(argv)
  if argv and re.fullmatch(r'python[0-9.]*', os.path.basename(argv[0])):
    argv[0] = 'python'
  for root in sorted({REPO, os.path.realpath(REPO)}, key=len, reverse=True):
    argv = [a.replace(root + os.sep, '{repo}' + os.sep) for a in argv]
  return argv


def record_command(cell: Cell) -> None:
  """Records the command a cell is launched with; a place that cannot be written is left to the command to report."""
  try:
    os.makedirs(os.path.dirname(cell.record), exist_ok=True)
    write_text_atomic(cell.record, json.dumps({'argv': _comparable(cell.argv)}))
  except OSError:
    pass


def changed(cell: Cell) -> str | None:
  """How a finished cell's recorded command differs from today's; None when it does not, or none is recorded."""
  try:
    with open(cell.record, encoding='utf-8') as f:
      before = json.load(f)['argv']
  except (OSError, ValueError, KeyError, TypeError):
    return None
  now = _comparable(cell.argv)
  if before == now or Workdir(cell.workdir).finished() is None:
    return None
  gone, new = [a for a in before if a not in now], [a for a in now if a not in before]
  return (f'then {shlex.join(gone) or "nothing else"}, now {shlex.join(new) or "nothing else"}' if gone or new
          else 'the order of its arguments')


def outdated(cell: Cell) -> str | None:
  """Why a finished cell predates what the cell it needs has now (that one unfinished, or finished after it)."""
  finished = Workdir(cell.workdir).finished()
  if not cell.after or finished is None:
    return None
  needed = Workdir(cell.after).finished()
  if needed is None:
    return f'{cell.after} has no {FINAL_METRICS_FILE} now'
  return f'{cell.after} finished after it' if needed > finished else None


def state(cell: Cell) -> str:
  """PENDING (not finished), DONE, or STALE (finished, but `changed` or `outdated`: never reused)."""
  if Workdir(cell.workdir).finished() is None:
    return PENDING
  return STALE if changed(cell) is not None or outdated(cell) is not None else DONE


def check(cells: Sequence[Cell], root: str | None = None) -> None:
  """ConfigError naming the first stale cell (by its workdir under `root`, else its name), what differs and the
  ways out: its results would otherwise be tabulated for a command that never ran."""
  diffs = [(c, d) for c in cells if (d := changed(c)) is not None]
  if diffs:
    cell, diff = diffs[0]
    more = f' (and {len(diffs) - 1} more)' if len(diffs) > 1 else ''
    raise ConfigError(f'{os.path.relpath(cell.workdir, root) if root else cell.name}{more} finished with another '
                      f'command than this one ({diff}): its results would be reused for a command that never ran. '
                      f'Use a new --workdir, delete {cell.workdir} to run it again, or delete {cell.record} to reuse '
                      'it as it is (e.g. a moved directory)')
  for cell in cells:
    why = outdated(cell)
    if why:
      raise ConfigError(f'{cell.name} was fine-tuned from an earlier pretraining of rung '
                        f'{os.path.basename(cell.after)} ({why}): its results would be tabulated beside the new one. '
                        f'Delete {os.path.dirname(os.path.dirname(cell.workdir))} to fine-tune that rung again')


def print_pending(cells: Sequence[Cell]) -> None:
  """--dry_run: one shell-quoted command per cell still to run."""
  for cell in cells:
    if state(cell) == PENDING:
      print(shlex.join(cell.argv), flush=True)


def execute(cells: Sequence[Cell], label: str) -> list[Cell]:
  """Runs the pending cells here, one after another, their output streaming through; a failed one is reported and
  the others go on. Returns the failed cells (their `returncode` set)."""
  failed = []
  for cell in cells:
    prefix = f'[{label} {cell.index}/{len(cells)}] {cell.name}:'
    if state(cell) != PENDING:
      print(f'{prefix} done before ({os.path.join(cell.workdir, FINAL_METRICS_FILE)} exists), skipped', flush=True)
      continue
    print(f'{prefix} {shlex.join(cell.argv)}', flush=True)
    record_command(cell)
    try:
      cell.returncode = subprocess.run(cell.argv, check=False).returncode
    except OSError as e:  # command not found / not executable
      print(f'{prefix} could not start: {e}', flush=True)
      cell.returncode = 127
    if cell.returncode:
      print(f'{prefix} failed with exit code {cell.returncode}', flush=True)
      failed.append(cell)
  return failed


def task_line(cell: Cell) -> str:
  """The shell line of a SLURM array task running `cell` through `run_task`."""
  spec = json.dumps({'name': cell.name, 'argv': cell.argv, 'workdir': cell.workdir, 'after': cell.after})
  return shlex.join([sys.executable, SCRIPT, 'run-task', spec])


def run_task(cell: Cell) -> int:
  """An array task: nothing for a done cell; the cell's command in place of this process (SIGTERM reaches it) once
  what it needs has finished. Returns an exit status when it does not run the command."""
  cell_state = state(cell)
  if cell_state == DONE:
    print(f'done before: {FINAL_METRICS_FILE} in {cell.workdir}', flush=True)
    return 0
  if cell_state == STALE:
    check([cell])
  if cell.after and Workdir(cell.after).finished() is None:
    print(f'not run: {cell.after} has no {FINAL_METRICS_FILE} (its run failed or is unfinished)', file=sys.stderr)
    return 1
  record_command(cell)
  sys.stdout.flush()
  try:
    os.execvp(cell.argv[0], cell.argv)
  except OSError as e:
    raise BertJaxError(f'{cell.name} could not start: {e}') from None


def main(argv: Sequence[str]) -> int:
  try:
    if len(argv) != 2 or argv[0] != 'run-task':
      raise ConfigError(f'usage: {os.path.basename(SCRIPT)} run-task CELL (a JSON object, as `task_line` writes it)')
    try:
      spec = json.loads(argv[1])
      cell = Cell(0, spec['name'], list(spec['argv']), spec['workdir'], after=spec.get('after', ''))
    except (ValueError, KeyError, TypeError) as e:
      raise ConfigError(f'a bad cell {argv[1]!r}: {type(e).__name__}: {e}') from None
    return run_task(cell)
  except BertJaxError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
