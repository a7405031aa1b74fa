"""Cells: a command's workdir, the rows a gather reads, an array task that waits for what it needs, skips what is
done and runs the rest; --slurm_sbatch's options as #SBATCH lines, the arrays leaving out what is done."""

import json
import os
import subprocess

import pytest

from bert_jax.errors import ConfigError
from bert_jax.launch import cells

from harness.inputs import REPO

TEMPLATE = os.path.join(REPO, 'experiments', 'launch', 'array.sbatch')


def test_workdir_of():
  assert cells.workdir_of(['p', '--workdir=a/b', '--x=1']) == 'a/b'
  assert cells.workdir_of(['p', '--workdir', 'a b', '--x=1']) == 'a b'
  assert cells.workdir_of(['p', '-workdir=c']) == 'c'
  assert cells.workdir_of(['p', '--workdir=a', '--workdir', 'b']) == 'b'  # absl: the last one wins
  assert cells.workdir_of(['p', '--workdirs=a', '--workdir']) is None
  assert cells.workdir_of(['p']) is None



def test_collect_reads_each_cells_results_as_a_row(tmp_path):
  """A row per cell: ok with its numeric top-level metrics, `missing` without results, failed when its command
  failed (whatever it left), unreadable metrics."""
  group = [cells.Cell(i, n, ['true'], str(tmp_path / n), {'n': n}) for i, n in enumerate('abcd', 1)]
  for name, text in (('a', json.dumps({'acc': 0.5, 'main_metric': 'acc', 'done': True, 'per_class': [1]})),
                     ('c', '{"acc": 0.1}'), ('d', 'not json')):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'final_metrics.json').write_text(text)
  group[2].returncode = 1
  rows = cells.collect(group, missing=cells.STATUS_MISSING)
  assert [r['status'] for r in rows] == ['ok', 'no result yet', 'failed', 'unreadable metrics']
  assert rows[0] == {'name': 'a', 'values': {'n': 'a'}, 'status': 'ok', 'metrics': {'acc': 0.5}, 'main_metric': 'acc'}
  assert rows[2]['metrics'] == {'acc': 0.1} and rows[2]['main_metric'] is None


def test_array_cells_wait_for_what_they_need_and_options_become_sbatch_lines(tmp_path):
  assert cells.sbatch_lines('--partition=gpu -t 4:00:00 --gpus 1') == (
      '#SBATCH --partition=gpu\n#SBATCH -t 4:00:00\n#SBATCH --gpus 1')
  with pytest.raises(ConfigError, match="got 'gpu' where an option should be"):
    cells.sbatch_lines('--partition=x gpu')
  need, work = tmp_path / 'rung', tmp_path / 'cell'
  cell = cells.Cell(1, 'cell', ['sh', '-c', f'mkdir -p {work} && echo ran > {work}/final_metrics.json'], str(work),
                    after=str(need))
  line = cells.task_line(cell)  # a line of an array's cells file: the cell through `cells.run_task`
  refused = subprocess.run(['bash', '-c', line], capture_output=True, text=True)
  assert refused.returncode == 1 and 'has no final_metrics.json' in refused.stderr and not work.exists()
  need.mkdir()
  (need / 'final_metrics.json').write_text('{}')
  assert subprocess.run(['bash', '-c', line]).returncode == 0 and (work / 'final_metrics.json').exists()
  again = subprocess.run(['bash', '-c', line], capture_output=True, text=True)
  assert again.returncode == 0 and 'done before' in again.stdout
  template = tmp_path / 'mine.sbatch'
  with open(TEMPLATE, encoding='utf-8') as f:
    template.write_text(f.read().replace('1-@NUM_CELLS@', '1-@NUM_CELLS@%2'))  # a throttled array
  group = [cells.Cell(i, n, ['true'], str(w)) for i, (n, w) in enumerate(
      (('x', tmp_path / 'x'), ('y', tmp_path / 'y'), ('cell', work)), 1)]
  [(script, count)] = cells.write_arrays(str(tmp_path / 'slurm'), [('a', group)], template=str(template))
  assert count == 2 and '#SBATCH --array=1-2%2' in open(script).read()  # done: left out
