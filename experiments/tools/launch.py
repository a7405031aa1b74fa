"""Cells of a sweep or ladder as SLURM job arrays: one array per group of independent cells, one cell per task.

The library behind `--launcher=slurm` of experiments/sweep.py and ladder.py; it reads no flags. `write_arrays`
writes, under a directory, each group's cells file (one shell command per line; a cell done before is left out,
and one that finishes before its task runs is skipped then; a task records its cell's command as it starts it), its
batch script from a template (experiments/launch/array.sbatch) and submit.sh, which submits the groups in order,
each after the one before has ended (afterany: a failed cell is reported by the gather, it does not stop the
others). `launch` writes them and runs submit.sh where `sbatch` is on the PATH.
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
from bert_jax.runs.workdir import FINAL_METRICS_FILE

from tools import sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TEMPLATE = os.path.join(REPO, 'experiments', 'launch', 'array.sbatch')
_FIELDS = ('@JOB_NAME@', '@NUM_CELLS@', '@LOG_DIR@', '@SBATCH_LINES@', '@CWD@', '@CELLS_FILE@')


def cell_line(argv: Sequence[str], workdir: str, after: str = '') -> str:
  """The shell line of one cell: its command (recorded as it starts, `sweep.command_record`), unless its workdir
  already holds final metrics; with `after` (a workdir), only once that one has them (a ladder's fine-tuning after
  its rung's pretraining)."""
  done = os.path.join(os.path.abspath(workdir), FINAL_METRICS_FILE)
  record = sweep.command_record(workdir)
  tmp = shlex.quote(record + '.tmp')
  write = (f'{{ mkdir -p {shlex.quote(os.path.dirname(record))} && printf "%s\\n" '
           f'{shlex.quote(sweep.record_json(argv))} > {tmp} && mv -f {tmp} {shlex.quote(record)}; }}')
  line = (f'[ -f {shlex.quote(done)} ] && echo "done before: {FINAL_METRICS_FILE} in {workdir}" || '
          f'{{ {write}; exec {shlex.join(argv)}; }}')
  if after:
    needed = os.path.join(os.path.abspath(after), FINAL_METRICS_FILE)
    line = (f'[ -f {shlex.quote(needed)} ] || {{ echo "not run: {after} has no {FINAL_METRICS_FILE} (its run '
            f'failed or is unfinished)" >&2; exit 1; }}; {line}')
  return line


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


def write_arrays(directory: str, groups: Sequence[tuple[str, Sequence[tuple]]], *, template: str = DEFAULT_TEMPLATE,
                 sbatch: str = '') -> list[str]:
  """Writes one job array per group (name, [(argv, workdir[, the workdir it needs finished]) per cell]) under
  `directory`, and submit.sh; cells done before are left out, the others run in today's working directory (their
  paths are relative to it).

  Returns:
    The batch scripts, in submission order.
  """
  text, extra = read_template(template), sbatch_lines(sbatch)
  directory = os.path.abspath(directory)
  os.makedirs(os.path.join(directory, 'logs'), exist_ok=True)
  scripts = []
  for name, cells in groups:
    cells = [c for c in cells if not os.path.isfile(os.path.join(c[1], FINAL_METRICS_FILE))]
    if not cells:
      continue
    cells_file = os.path.join(directory, f'{name}.cells')
    write_text_atomic(cells_file, ''.join(cell_line(*cell) + '\n' for cell in cells))
    values = dict(zip(_FIELDS, (name, str(len(cells)), os.path.join(directory, 'logs'), extra, shlex.quote(os.getcwd()),
                                shlex.quote(cells_file))))
    script = text
    for field, value in values.items():
      script = script.replace(field, value)
    scripts.append(os.path.join(directory, f'{name}.sbatch'))
    write_text_atomic(scripts[-1], script)
  lines = ['#!/usr/bin/env bash', '# Submits the arrays in order, each after the one before has ended.', 'set -eu',
           'after=""']
  for script in scripts:
    lines.append(f'job=$(sbatch --parsable $after {shlex.quote(script)})')
    lines.append('echo "submitted $job: ' + os.path.basename(script) + '"')
    lines.append('after="--dependency=afterany:${job%%;*}"')
  write_text_atomic(os.path.join(directory, 'submit.sh'), '\n'.join(lines) + '\n')
  os.chmod(os.path.join(directory, 'submit.sh'), 0o755)
  return scripts


def submit_arrays(directory: str) -> str:
  """Runs `directory`/submit.sh; its output (the job ids)."""
  done = subprocess.run(['bash', os.path.join(directory, 'submit.sh')], capture_output=True, text=True, check=False)
  if done.returncode:
    raise BertJaxError(f'submitting failed: {(done.stderr or done.stdout).strip()}')
  return done.stdout


def num_cells(script: str) -> int:
  """The number of array tasks of a written batch script."""
  with open(script, encoding='utf-8') as f:
    found = re.search(r'^#SBATCH --array=1-(\d+)', f.read(), re.MULTILINE)
  return int(found.group(1)) if found else 0


def launch(directory: str, groups, *, template: str | None, sbatch: str, submit: bool) -> None:
  """--launcher=slurm: writes the job arrays under `directory` and submits them (or prints how)."""
  for script in write_arrays(directory, groups, template=template or DEFAULT_TEMPLATE, sbatch=sbatch):
    print(f'wrote {script} ({num_cells(script)} cells)', flush=True)
  if submit and shutil.which('sbatch'):
    print(submit_arrays(directory), end='', flush=True)
  else:
    why = 'sbatch is not on the PATH here; ' if submit else ''
    print(f'{why}submit with: bash {os.path.join(directory, "submit.sh")}', flush=True)
  print('when they have run, the same command with --gather builds the table', flush=True)
