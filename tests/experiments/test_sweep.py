"""Hyperparameter sweeps: grid parsing, run naming, commands, skipping done runs, results tables."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys

import pytest

from bert_jax.errors import ConfigError
from bert_jax.launch import cells

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import write_small_corpus
from tools import sweep

GRID = 'config.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3'

# Writes final_metrics.json into --workdir; counts its calls; exits 1 for --config.learning_rate=FAIL.
FAKE_SCRIPT = '''
import argparse, json, os, sys
parser = argparse.ArgumentParser()
for flag in ('counter', 'workdir', 'config.learning_rate', 'config.num_train_epochs', 'note'):
  parser.add_argument('--' + flag)
args = vars(parser.parse_args())
with open(args['counter'], 'a') as f:
  f.write(args['workdir'] + '\\n')
print('fake run', args['workdir'])
if args['config.learning_rate'] == 'FAIL':
  print('fake failure', file=sys.stderr)
  sys.exit(1)
lr, epochs = float(args['config.learning_rate']), int(args['config.num_train_epochs'])
os.makedirs(args['workdir'], exist_ok=True)
metrics = {'main_metric': 'dev_accuracy', 'dev_accuracy': lr * 1000, 'dev_loss': epochs / 10,
           'step': epochs * 5, 'breakdown': {'a': 1}, 'per_class': [1, 2]}
with open(os.path.join(args['workdir'], 'final_metrics.json'), 'w') as f:
  json.dump(metrics, f)
'''


def _sweep(*args):
  """experiments/sweep.py in this process (no interpreter start); its runs still run as commands of their own."""
  return run_main('sweep.py', *args, children=True)


def test_parse_grid_and_product_order():
  grid = sweep.parse_grid(f'  {GRID}\n')
  assert grid == [('config.learning_rate', ['1e-4', '5e-5']), ('config.num_train_epochs', ['2', '3'])]
  assert sweep.expand(grid) == [
      {'config.learning_rate': '1e-4', 'config.num_train_epochs': '2'},
      {'config.learning_rate': '1e-4', 'config.num_train_epochs': '3'},
      {'config.learning_rate': '5e-5', 'config.num_train_epochs': '2'},
      {'config.learning_rate': '5e-5', 'config.num_train_epochs': '3'},
  ]
  assert list(sweep.expand(grid)[0]) == ['config.learning_rate', 'config.num_train_epochs']
  assert sweep.expand(sweep.parse_grid('a=1')) == [{'a': '1'}]
  # Entries are shell words: quotes keep a value's spaces (a path), commas still separate values.
  assert sweep.parse_grid("config.data.train_files='/my data/a.txt','/my data/b.txt' b=1") == [
      ('config.data.train_files', ['/my data/a.txt', '/my data/b.txt']), ('b', ['1'])]


@pytest.mark.parametrize('text, pattern', [
    ('', 'empty grid'),
    ('   ', 'empty grid'),
    ('config.learning_rate', 'has no "="'),
    ('a=1 b', 'has no "="'),
    ('a=', 'empty value'),
    ('a=1,,2', 'empty value'),
    ('a=1,', 'empty value'),
    ('=1,2', 'bad key'),
    ('--a=1', 'bad key'),
    ('a=1 a=2', 'appears twice'),
    ("a='/my data", '--grid: No closing quotation'),
])
def test_parse_grid_errors(text, pattern):
  with pytest.raises(ConfigError, match=pattern):
    sweep.parse_grid(text)


def test_run_name():
  assert sweep.run_name({'config.learning_rate': '1e-4', 'config.num_train_epochs': '2'}) == (
      'learning_rate=1e-4,num_train_epochs=2')
  assert sweep.run_name({'x': 'a/b c:d*', 'y': '-1.5'}) == 'x=a_b_c_d_,y=-1.5'
  # Short keys that would coincide stay full.
  assert sweep.run_name({'a.lr': '1', 'b.lr': '2'}) == 'a.lr=1,b.lr=2'


def test_config_variants_take_the_file_before_them():
  grid = sweep.parse_grid('config=experiments/configs/pretrain.py:cpu,sop,span config.seed=0')
  assert grid[0] == ('config', ['experiments/configs/pretrain.py:cpu', 'experiments/configs/pretrain.py:sop',
                                'experiments/configs/pretrain.py:span'])
  runs = sweep.expand(grid)
  assert [sweep.run_name(r) for r in runs] == ['config=cpu,seed=0', 'config=sop,seed=0', 'config=span,seed=0']
  assert sweep.build_command(['p', '--workdir=w/{name}'], runs[1], 'config=sop,seed=0', 2) == [
      'p', '--workdir=w/config=sop,seed=0', '--config=experiments/configs/pretrain.py:sop', '--config.seed=0']
  with pytest.raises(ConfigError, match='no config file before it'):
    sweep.parse_grid('config=sop,span')


def test_the_grids_config_goes_before_the_commands_overrides():
  values = {'config': 'experiments/configs/pretrain.py:sop', 'config.seed': '0'}
  argv = sweep.build_command(['py', 'pretrain.py', '--workdir=w/{name}', '--config.num_train_steps=150'], values,
                             'n', 1)
  assert argv == ['py', 'pretrain.py', '--workdir=w/n', '--config=experiments/configs/pretrain.py:sop',
                  '--config.num_train_steps=150', '--config.seed=0']
  with pytest.raises(ConfigError, match='the grid gives config and the command gives --config too'):
    sweep.build_command(['p', '--workdir=w/{name}', '--config=x.py:a'], values, 'n', 1)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_variant_grid_runs_with_overrides_in_the_command(tmp_path):
  """The README's kind of variant sweep with an override in the command (it failed every cell when the grid's
  --config came after the override)."""
  # Both variants on a few articles: the bundled corpus is not the point, and each cell prepared it (62 s -> 47 s).
  corpus = write_small_corpus(tmp_path)
  result = _sweep('--grid=config=experiments/configs/pretrain.py:tiny,recipe_tiny', '--', sys.executable,
                  'experiments/pretrain.py', f'--workdir={tmp_path}/{{name}}', '--config.seed=3',
                  f'--config.data.train_files={corpus}', '--config.data.eval_fraction=0.4',
                  f'--config.data.cache_dir={tmp_path}/cache')
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = _csv_rows(tmp_path / 'sweep_results.csv')
  assert [(r['name'], r['status']) for r in rows] == [('config=tiny', 'ok'), ('config=recipe_tiny', 'ok')]
  for name in ('config=tiny', 'config=recipe_tiny'):
    assert json.load(open(tmp_path / name / 'config.json'))['seed'] == 3


def test_build_command_substitutes_placeholders():
  template = ['python', 'train.py', '--workdir=out/{name}', '--seed={index}', '--tag', 'r{index}-{name}']
  values = {'config.learning_rate': '1e-4', 'config.num_train_epochs': '2'}
  argv = sweep.build_command(template, values, 'NAME', 3)
  assert argv == ['python', 'train.py', '--workdir=out/NAME', '--seed=3', '--tag', 'r3-NAME',
                  '--config.learning_rate=1e-4', '--config.num_train_epochs=2']
  assert template[2] == '--workdir=out/{name}'  # not modified in place


def test_build_command_requires_name_placeholder():
  with pytest.raises(ConfigError, match='share one workdir'):
    sweep.build_command(['python', 'train.py', '--workdir=out/{index}'], {'a': '1'}, 'a=1', 1)


def test_plan_errors():
  grid = sweep.parse_grid('a=1,2')
  with pytest.raises(ConfigError, match='no command'):
    sweep.plan(grid, [])
  with pytest.raises(ConfigError, match='no --workdir'):
    sweep.plan(grid, ['p', '--out={name}'])
  # Names that sanitize to the same string would share a workdir.
  with pytest.raises(ConfigError, match='share workdir'):
    sweep.plan(sweep.parse_grid('a=x/y,x:y'), ['p', '--workdir=d/{name}'])
  runs = sweep.plan(grid, ['p', '--workdir', 'd/{name}'])
  assert [(r.index, r.name, r.workdir) for r in runs] == [(1, 'a=1', 'd/a=1'), (2, 'a=2', 'd/a=2')]
  assert sweep.default_output_dir(runs) == os.path.abspath('d')


def test_collect_and_write_tables(tmp_path):
  runs = sweep.plan(sweep.parse_grid('lr=1,2,3,4'), ['p', f'--workdir={tmp_path}/{{name}}'])
  for run, metrics in zip(runs, [{'loss': 0.5, 'acc': 0.7, 'main_metric': 'acc', 'note': 'x'},
                                 {'loss': 0.2, 'acc': 0.9, 'main_metric': 'acc', 'nested': {'a': 1}},
                                 None, 'not json']):
    if metrics is not None:
      os.makedirs(run.workdir)
      with open(os.path.join(run.workdir, 'final_metrics.json'), 'w') as f:
        f.write(metrics if isinstance(metrics, str) else json.dumps(metrics))
  rows = cells.collect(runs)
  assert [r['status'] for r in rows] == ['ok', 'ok', 'failed', 'unreadable metrics']
  assert rows[0]['metrics'] == {'loss': 0.5, 'acc': 0.7} and rows[0]['main_metric'] == 'acc'

  csv_path, md_path = sweep.write_tables(rows, str(tmp_path / 'out'))
  with open(csv_path, newline='') as f:
    table = list(csv.reader(f))
  assert table[0] == ['name', 'lr', 'acc', 'loss', 'status', 'best']
  assert [row[-1] for row in table[1:]] == ['', '*', '', '']
  assert table[3] == ['lr=3', '3', '', '', 'failed', '']
  # Ranked by loss, lower is better.
  sweep.write_tables(rows, str(tmp_path / 'out'), metric='loss', mode='min')
  with open(csv_path, newline='') as f:
    assert [row[-1] for row in csv.reader(f)][1:] == ['', '*', '', '']
  sweep.write_tables(rows, str(tmp_path / 'out'), metric='loss', mode='max')
  with open(csv_path, newline='') as f:
    assert [row[-1] for row in csv.reader(f)][1:] == ['*', '', '', '']
  with open(md_path) as f:
    lines = f.read().splitlines()
  assert lines[0] == '| name | lr | acc | loss | status | best |' and lines[1] == '|---|---|---|---|---|---|'
  assert lines[2] == '| lr=1 | 1 | 0.7 | 0.5 | ok | * |'
  with pytest.raises(ConfigError, match='mode'):
    sweep.write_tables(rows, str(tmp_path / 'out'), mode='best')


@pytest.mark.slow
@pytest.mark.e2e
def test_dry_run_prints_one_command_per_line(tmp_path):
  workdir = str(tmp_path / 'runs with space' / '{name}')
  result = _sweep('--dry_run', f'--grid={GRID}', '--', 'python', 'experiments/finetune.py',
                  '--config=experiments/configs/finetune.py:rte', f'--workdir={workdir}',
                  '--config.init_checkpoint=PATH')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert len(lines) == 4
  commands = [shlex.split(line) for line in lines]
  assert commands[1] == ['python', 'experiments/finetune.py', '--config=experiments/configs/finetune.py:rte',
                         f'--workdir={tmp_path}/runs with space/learning_rate=1e-4,num_train_epochs=3',
                         '--config.init_checkpoint=PATH', '--config.learning_rate=1e-4',
                         '--config.num_train_epochs=3']
  assert [c[-2:] for c in commands] == [
      ['--config.learning_rate=1e-4', '--config.num_train_epochs=2'],
      ['--config.learning_rate=1e-4', '--config.num_train_epochs=3'],
      ['--config.learning_rate=5e-5', '--config.num_train_epochs=2'],
      ['--config.learning_rate=5e-5', '--config.num_train_epochs=3']]
  assert not (tmp_path / 'runs with space').exists()  # ran nothing


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize('args, pattern', [
    (['--grid=a=1,2', '--', 'python', 'x.py', '--workdir=out'], 'no {name} placeholder'),
    (['--grid=a=1,2', '--'], 'no command after "--"'),
    (['--grid=a=1,2'], 'no command after "--"'),
    (['--', 'python', 'x.py', '--workdir=out/{name}'], '--grid is required'),
    (['--grid=', '--', 'python', 'x.py', '--workdir=out/{name}'], 'empty grid'),
    (['--grid=a', '--', 'python', 'x.py', '--workdir=out/{name}'], 'has no "="'),
    (['--grid=a=', '--', 'python', 'x.py', '--workdir=out/{name}'], 'empty value'),
    (['--grid=a=1', '--mode=best', '--', 'python', 'x.py', '--workdir=out/{name}'], '--mode must be'),
    (['--grid=a=1', 'python', '--', 'x.py', '--workdir=out/{name}'], 'unexpected arguments'),
    (['--grid=a=1', '--', 'python', 'x.py', '--out=out/{name}'], 'no --workdir'),
])
def test_bad_flags(args, pattern):
  assert_one_line_error(_sweep('--dry_run', *args), pattern)


def _fake_sweep(tmp_path, grid, *extra, command=()):
  script = tmp_path / 'fake_train.py'
  script.write_text(FAKE_SCRIPT)
  return _sweep(f'--grid={grid}', *extra, '--', sys.executable, str(script), f'--counter={tmp_path / "calls.txt"}',
                '--workdir', str(tmp_path / 'runs' / '{name}'), *command)


def _calls(tmp_path):
  path = tmp_path / 'calls.txt'
  return path.read_text().splitlines() if path.exists() else []


def _csv_rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_runs_tabulates_and_resumes(tmp_path):
  result = _fake_sweep(tmp_path, GRID)
  assert result.returncode == 0, result.stdout + result.stderr
  names = ['learning_rate=1e-4,num_train_epochs=2', 'learning_rate=1e-4,num_train_epochs=3',
           'learning_rate=5e-5,num_train_epochs=2', 'learning_rate=5e-5,num_train_epochs=3']
  assert _calls(tmp_path) == [str(tmp_path / 'runs' / n) for n in names]
  headers = [l for l in result.stdout.splitlines() if l.startswith('[sweep ')]
  assert [h.split(':')[0] for h in headers] == [f'[sweep {i}/4] {n}' for i, n in enumerate(names, 1)]
  assert headers[0].endswith('--config.learning_rate=1e-4 --config.num_train_epochs=2')
  assert result.stdout.count('fake run') == 4  # the runs' output streams through

  out = tmp_path / 'runs'  # default: the common parent of the workdirs
  rows = _csv_rows(out / 'sweep_results.csv')
  assert list(rows[0]) == ['name', 'config.learning_rate', 'config.num_train_epochs', 'dev_accuracy', 'dev_loss',
                           'step', 'status', 'best']
  assert [r['name'] for r in rows] == names
  assert [float(r['dev_accuracy']) for r in rows] == pytest.approx([0.1, 0.1, 0.05, 0.05])
  assert [r['status'] for r in rows] == ['ok'] * 4
  assert [r['best'] for r in rows] == ['*', '', '', '']  # first of the tied best
  md = (out / 'sweep_results.md').read_text()
  assert md.splitlines()[2].startswith('| learning_rate=1e-4,num_train_epochs=2 | 1e-4 | 2 | 0.1 | 0.2 | 10 | ok | * |')
  assert md in result.stdout  # printed at the end

  # Re-running skips all four; --metric/--mode/--output_dir re-rank into another directory.
  result = _fake_sweep(tmp_path, GRID, '--metric=dev_loss', '--mode=min', f'--output_dir={tmp_path / "table"}')
  assert result.returncode == 0, result.stdout + result.stderr
  assert len(_calls(tmp_path)) == 4
  assert result.stdout.count('skipped') == 4 and 'fake run' not in result.stdout
  rows = _csv_rows(tmp_path / 'table' / 'sweep_results.csv')
  assert [r['best'] for r in rows] == ['*', '', '', '']
  result = _fake_sweep(tmp_path, GRID, '--metric=step', f'--output_dir={tmp_path / "table"}')
  assert [r['best'] for r in _csv_rows(tmp_path / 'table' / 'sweep_results.csv')] == ['', '*', '', '']

  # An interrupted sweep continues: remove one run's metrics and only that one runs again.
  os.remove(tmp_path / 'runs' / names[2] / 'final_metrics.json')
  result = _fake_sweep(tmp_path, GRID)
  assert result.returncode == 0, result.stdout + result.stderr
  assert _calls(tmp_path)[4:] == [str(tmp_path / 'runs' / names[2])]


@pytest.mark.slow
def test_a_finished_run_is_reused_only_by_the_command_that_ran_it(tmp_path):
  grid = 'config.learning_rate=1e-4,2e-4 config.num_train_epochs=1'
  assert _fake_sweep(tmp_path, grid).returncode == 0
  names = ['learning_rate=1e-4,num_train_epochs=1', 'learning_rate=2e-4,num_train_epochs=1']
  records = [tmp_path / 'runs' / f'.{n}.command.json' for n in names]  # beside the workdirs, never in them
  recorded = json.loads(records[0].read_text())['argv']
  assert recorded[0] == 'python' and recorded[-2:] == ['--config.learning_rate=1e-4', '--config.num_train_epochs=1']
  assert sorted(os.listdir(tmp_path / 'runs' / names[0])) == ['final_metrics.json']
  # The same command under another Python's name is the same command.
  runs = sweep.plan(sweep.parse_grid(grid), ['python3.11', *recorded[1:-3], str(tmp_path / 'runs' / '{name}')])
  cells.check(runs)

  before = tree_digest(str(tmp_path))
  changed = _fake_sweep(tmp_path, grid, command=['--note=longer'])
  assert_one_line_error(changed, f'{names[0]} (and 1 more) finished with another command than this one (then '
                        'nothing else, now --note=longer): its results would be reused for a command that never ran. '
                        f'Use a new --workdir, delete {tmp_path / "runs" / names[0]} to run it again, or delete '
                        f'{records[0]} to reuse it as it is')
  assert_one_line_error(_fake_sweep(tmp_path, grid, '--dry_run', command=['--note=longer']), 'another command')
  assert tree_digest(str(tmp_path)) == before and len(_calls(tmp_path)) == 2

  # An unfinished run goes on with the new command (the entry point judges its own resume) and records it; a run
  # finished before commands were recorded is reused as before.
  os.remove(tmp_path / 'runs' / names[0] / 'final_metrics.json')
  os.remove(records[1])
  again = _fake_sweep(tmp_path, grid, command=['--note=longer'])
  assert again.returncode == 0, again.stderr[-3000:]
  assert _calls(tmp_path)[2:] == [str(tmp_path / 'runs' / names[0])]
  assert json.loads(records[0].read_text())['argv'][-3] == '--note=longer'

  # A run that fails before writing anything leaves no workdir behind (its record only).
  failing = _fake_sweep(tmp_path, 'config.learning_rate=FAIL config.num_train_epochs=1')
  assert failing.returncode == 1
  assert not (tmp_path / 'runs' / 'learning_rate=FAIL,num_train_epochs=1').exists()
  assert (tmp_path / 'runs' / '.learning_rate=FAIL,num_train_epochs=1.command.json').exists()


def test_sweep_failed_run_is_reported_and_tabulated(tmp_path):
  result = _fake_sweep(tmp_path, 'config.learning_rate=FAIL,2e-4 config.num_train_epochs=1')
  assert_one_line_error(result, '1 of 2 runs failed: learning_rate=FAIL,num_train_epochs=1')
  assert len(_calls(tmp_path)) == 2  # went on after the failure
  assert '[sweep 1/2] learning_rate=FAIL,num_train_epochs=1: failed with exit code 1' in result.stdout
  assert 'fake failure' in result.stderr
  rows = _csv_rows(tmp_path / 'runs' / 'sweep_results.csv')
  assert [(r['name'], r['status'], r['dev_accuracy'], r['best']) for r in rows] == [
      ('learning_rate=FAIL,num_train_epochs=1', 'failed', '', ''),
      ('learning_rate=2e-4,num_train_epochs=1', 'ok', '0.2', '*')]
  assert '| learning_rate=FAIL,num_train_epochs=1 | FAIL | 1 |  |  |  | failed |  |' in result.stdout

  # Re-running retries only the failed run.
  result = _fake_sweep(tmp_path, 'config.learning_rate=FAIL,2e-4 config.num_train_epochs=1')
  assert result.returncode == 1
  assert _calls(tmp_path)[2:] == [str(tmp_path / 'runs' / 'learning_rate=FAIL,num_train_epochs=1')]


def test_sweep_unknown_metric_is_an_error_after_writing_tables(tmp_path):
  result = _fake_sweep(tmp_path, 'config.learning_rate=1e-4 config.num_train_epochs=1', '--metric=dev_f1')
  assert_one_line_error(result, "metric 'dev_f1' is in no run's final_metrics.json")
  assert (tmp_path / 'runs' / 'sweep_results.csv').exists()


@pytest.mark.slow
def test_a_slurm_array_run_task_by_task_fills_the_same_table(tmp_path):
  """--launcher=slurm writes one array (a run per task); its tasks, run here one by one with SLURM_ARRAY_TASK_ID
  (no scheduler), then --gather, give the local sweep's table. A gather in between names the missing runs."""
  local = tmp_path / 'local'
  local.mkdir()
  assert _fake_sweep(local, GRID).returncode == 0
  cluster = tmp_path / 'cluster'
  cluster.mkdir()
  written = _fake_sweep(cluster, GRID, '--launcher=slurm', '--slurm_sbatch=--partition=gpu --time=1:00:00')
  assert written.returncode == 0, written.stderr[-3000:]
  assert 'wrote ' in written.stdout and 'submit with: bash' in written.stdout and not _calls(cluster)
  script = cluster / 'runs' / 'slurm' / 'sweep.sbatch'
  text = script.read_text()
  assert '#SBATCH --array=1-4' in text and '#SBATCH --partition=gpu' in text and '#SBATCH --time=1:00:00' in text
  for task in (1, 2, 3):
    done = subprocess.run(['bash', str(script)], env={**os.environ, 'SLURM_ARRAY_TASK_ID': str(task)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
  partial = _fake_sweep(cluster, GRID, '--gather')
  assert partial.returncode == 0 and '1 of 4 runs have no results yet' in partial.stdout
  assert [r['status'] for r in _csv_rows(cluster / 'runs' / 'sweep_results.csv')] == ['ok'] * 3 + ['no result yet']
  for task in (4, 1):  # the last run, then a finished one again: skipped, not run twice
    assert subprocess.run(['bash', str(script)], env={**os.environ, 'SLURM_ARRAY_TASK_ID': str(task)},
                          capture_output=True, timeout=120).returncode == 0
  assert len(_calls(cluster)) == 4
  assert _fake_sweep(cluster, GRID, '--gather').returncode == 0
  assert _csv_rows(cluster / 'runs' / 'sweep_results.csv') == _csv_rows(local / 'runs' / 'sweep_results.csv')
  # Each task recorded the command it ran: a gather for another command is refused.
  assert_one_line_error(_fake_sweep(cluster, GRID, '--gather', command=['--note=x']), 'finished with another command')
  # Bad SLURM flags: one error line, nothing written.
  before = tree_digest(str(cluster))
  for flag, pattern in (('--slurm_sbatch=partition=gpu', 'takes sbatch options'),
                        (f'--slurm_template={tmp_path}/none.sbatch', 'No such file'),
                        ('--launcher=pbs', 'launcher')):
    bad = _fake_sweep(cluster, GRID, '--launcher=slurm', flag) if flag != '--launcher=pbs' else _fake_sweep(
        cluster, GRID, flag)
    assert_one_line_error(bad, pattern)
  assert tree_digest(str(cluster)) == before
