"""Cells as SLURM job arrays (`--launcher=slurm` of experiments/sweep.py and ladder.py); reads no flags.

`write_arrays` writes, under a directory, per group of cells its cells file (a shell line per pending cell, each a
`cells.run_task`: it skips a cell finished by then and waits for none: a cell whose `after` has not finished fails),
its batch script from a template (experiments/launch/array.sbatch) and submit.sh, which submits the groups in order,
each after the one before has ended (afterany: a failed cell is reported by the gather, it does not stop the others).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from typing import Sequence

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.files import write_text_atomic

from tools import cells

DEFAULT_TEMPLATE = os.path.join(cells.REPO, 'experiments', 'launch', 'array.sbatch')
_FIELDS = ('@JOB_NAME@', '@NUM_CELLS@', '@LOG_DIR@', '@SBATCH_LINES@', '@CWD@', '@CELLS_FILE@')


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


def read_template(path: str) -> str:
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except OSError as e:
    raise ConfigError(f'--slurm_template={path}: {e.strerror}') from None
  missing = [f for f in ('@CELLS_FILE@', '@NUM_CELLS@') if f not in text]
  if missing:
    raise ConfigError(f'--slurm_template={path} lacks {", ".join(missing)} (see experiments/launch/array.sbatch)')
  return text


def write_arrays(directory: str, groups: Sequence[tuple[str, Sequence[cells.Cell]]], *,
                 template: str = DEFAULT_TEMPLATE, sbatch: str = '') -> list[str]:
  """One job array per group (name, cells) of pending cells under `directory`, and submit.sh; the tasks run in
  today's working directory (the cells' paths are relative to it). Returns the batch scripts in submission order."""
  text, extra = read_template(template), sbatch_lines(sbatch)
  directory = os.path.abspath(directory)
  os.makedirs(os.path.join(directory, 'logs'), exist_ok=True)
  scripts = []
  for name, group in groups:
    pending = [c for c in group if cells.state(c) == cells.PENDING]
    if not pending:
      continue
    cells_file = os.path.join(directory, f'{name}.cells')
    write_text_atomic(cells_file, ''.join(cells.task_line(c) + '\n' for c in pending))
    script = text
    for field, value in zip(_FIELDS, (name, str(len(pending)), os.path.join(directory, 'logs'), extra,
                                      shlex.quote(os.getcwd()), shlex.quote(cells_file))):
      script = script.replace(field, value)
    scripts.append(os.path.join(directory, f'{name}.sbatch'))
    write_text_atomic(scripts[-1], script)
  lines = ['#!/usr/bin/env bash', '# Submits the arrays in order, each after the one before has ended.', 'set -eu',
           'after=""']
  for script in scripts:
    lines += [f'job=$(sbatch --parsable $after {shlex.quote(script)})',
              f'echo "submitted $job: {os.path.basename(script)}"', 'after="--dependency=afterany:${job%%;*}"']
  write_text_atomic(os.path.join(directory, 'submit.sh'), '\n'.join(lines) + '\n')
  os.chmod(os.path.join(directory, 'submit.sh'), 0o755)
  return scripts


def num_cells(script: str) -> int:
  """The number of array tasks of a written batch script."""
  with open(script, encoding='utf-8') as f:
    found = re.search(r'^#SBATCH --array=1-(\d+)', f.read(), re.MULTILINE)
  return int(found.group(1)) if found else 0


def dispatch(directory: str, groups, execute, launcher: dict) -> list[cells.Cell] | None:
  """The cells' run as the launcher flags (`cli.define_launcher_flags`, as values) say: [] for --gather; the failed
  cells of `execute()`; or None after writing the job arrays under `directory`/slurm and running submit.sh where
  `sbatch` is on the PATH (else printing how)."""
  if launcher['gather']:
    return []
  if launcher['launcher'] != 'slurm':
    return execute()
  directory = os.path.join(directory, 'slurm')
  for script in write_arrays(directory, groups, template=launcher['template'] or DEFAULT_TEMPLATE,
                             sbatch=launcher['sbatch']):
    print(f'wrote {script} ({num_cells(script)} cells)', flush=True)
  if launcher['submit'] and shutil.which('sbatch'):
    done = subprocess.run(['bash', os.path.join(directory, 'submit.sh')], capture_output=True, text=True,
                          check=False)
    if done.returncode:
      raise BertJaxError(f'submitting failed: {(done.stderr or done.stdout).strip()}')
    print(done.stdout, end='', flush=True)
  else:
    why = 'sbatch is not on the PATH here; ' if launcher['submit'] else ''
    print(f'{why}submit with: bash {os.path.join(directory, "submit.sh")}', flush=True)
  print('when they have run, the same command with --gather builds the table', flush=True)
  return None
