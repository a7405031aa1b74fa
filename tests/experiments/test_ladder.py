"""The ablation ladder: a ladder config checked before anything runs, the tiny ladder's table, skipped finished
cells, a failed rung reported while the others go on, and SLURM job arrays run task by task filling the same
table as a local run."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
import shlex
import shutil
import subprocess

import pytest

from bert_jax.errors import ConfigError

from configs import ladder as ladder_configs
from harness.digests import tmpfs, tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import REPO
from tools import ladder

SST2 = os.path.join(os.path.dirname(REPO), 'shared', 'data', 'sst2')
needs_sst2 = pytest.mark.skipif(not os.path.isdir(SST2), reason=f'SST-2 is read from {SST2} (../shared/data)')
TINY = '--config=experiments/configs/ladder.py:tiny'


def _ladder(*args):
  """experiments/ladder.py in this process (no interpreter start); its cells still run as commands of their own."""
  return run_main('ladder.py', *args, children=True)


def _tiny(**changes):
  d = ladder_configs.get_config('tiny').to_dict()
  for key, value in changes.items():
    node = d
    *path, last = key.split('.')
    for part in path:
      node = node[part]
    node[last] = value
  return d


def test_every_variant_builds_each_rung_and_task():
  for variant in ('tiny', 'cpu', 'accelerator'):
    spec = ladder.Ladder.from_dict(ladder_configs.get_config(variant).to_dict())
    assert spec.rungs[0].name == 'bert' and spec.seeds >= 2
  spec = ladder.Ladder.from_dict(_tiny())
  pretrain, finetune = ladder.plan(spec, '/w')
  assert [r.workdir for r in pretrain] == ['/w/pretrain/bert', '/w/pretrain/mlm_only']
  assert [r.name for r in finetune] == ['bert/sst2/seed0', 'bert/sst2/seed1', 'mlm_only/sst2/seed0',
                                        'mlm_only/sst2/seed1']
  argv = finetune[3].argv
  assert '--config.init_checkpoint=/w/pretrain/mlm_only' in argv and argv[-1] == '--config.seed=1'
  assert pretrain[1].argv[3:] == [f'--config={REPO}/experiments/configs/pretrain.py:tiny', '--config.data.objective=none']
  with pytest.raises(ValueError, match='unknown ladder config variant'):
    ladder_configs.get_config('huge')


@pytest.mark.parametrize('changes,pattern', [
    ({'rungs.mlm_only.variant': 'nope'}, "rungs.mlm_only: unknown pretrain config variant 'nope'"),
    ({'rungs.mlm_only.overrides': 'data.objectiv=none'}, 'rungs.mlm_only: the config has no field data.objectiv'),
    ({'rungs.mlm_only.overrides': 'learning_rate=1e-3'}, 'no field learning_rate (it is now optim.learning_rate)'),
    ({'rungs.mlm_only.overrides': 'data.masked_lm_prob=2'}, 'rungs.mlm_only: data.masked_lm_prob must lie in'),
    ({'rungs.mlm_only.overrides': 'objective'}, "'objective' is not FIELD=VALUE"),
    ({'rungs.mlm_only.order': 5}, 'rungs: give each its place, order=1, 2, ...'),
    ({'tasks.sst2.variant': 'nope'}, "tasks.sst2: unknown finetune config variant 'nope'"),
    ({'tasks.sst2.overrides': 'num_train_steps=many'}, "tasks.sst2: num_train_steps='many' is not a int"),
    ({'seeds': 0}, 'seeds must be a whole number >= 1, got 0'),
    ({'checkpoint_step': -5}, 'checkpoint_step must be -1'),
    ({'rungs': {}}, 'the ladder has no rungs'),
    ({'rungs.mlm_only.overrides': "data.train_files='/my data"}, 'rungs.mlm_only.overrides: No closing quotation'),
])
def test_a_bad_ladder_is_refused_before_anything_runs(changes, pattern):
  with pytest.raises(ConfigError, match=pattern.replace('(', r'\(').replace(')', r'\)').replace('.', r'\.')):
    ladder.Ladder.from_dict(_tiny(**changes))


def test_an_override_is_shell_words_so_a_path_may_hold_spaces(tmp_path):
  """A quoted override value keeps its spaces: the cell's command gets it as one argument (--dry_run prints it
  shell-quoted)."""
  corpus = '/my data/corpus.txt'
  overrides = f"data.objective=none data.train_files='{corpus}'"
  spec = ladder.Ladder.from_dict(_tiny(**{'rungs.mlm_only.overrides': overrides}))
  assert spec.rungs[1].overrides == (('data.objective', 'none'), ('data.train_files', corpus))
  pretrain, _ = ladder.plan(spec, '/w')
  assert pretrain[1].argv[-1] == f'--config.data.train_files={corpus}'
  result = run_main('ladder.py', TINY, f'--workdir={tmp_path}/l', '--dry_run',
                    f'--config.rungs.mlm_only.overrides=data.objective=none data.train_files="{corpus}"')
  assert result.returncode == 0, result.stderr[-3000:]
  commands = [shlex.split(line) for line in result.stdout.splitlines()]
  assert [c[-1] for c in commands if c[1].endswith('pretrain.py')] == [
      f'--config={REPO}/experiments/configs/pretrain.py:tiny', f'--config.data.train_files={corpus}']
  assert not os.path.exists(tmp_path / 'l')


def test_a_read_only_ladder_directory_is_one_line_that_fits_a_ladder(tmp_path):
  """A ladder directory that cannot be written is one line before any cell starts, saying what a ladder keeps
  (no checkpoint of its own; its finished cells) rather than the checkpoint-save message."""
  with tmpfs(tmp_path / 'rofs', '4M') as fs:
    os.makedirs(os.path.join(fs, 'l'))
    with open(os.path.join(fs, 'l', 'notes.txt'), 'w') as f:
      f.write('a user file')
    subprocess.run(['mount', '-o', 'remount,ro', fs], check=True)
    before = tree_digest(fs)
    result = run_main('ladder.py', TINY, f'--workdir={fs}/l')
    assert_one_line_error(result, 'a ladder keeps no checkpoint of its own and its finished cells are kept')
    assert f'--workdir {fs}/l cannot be written' in result.stderr and 'checkpoint is kept' not in result.stderr
    assert '[ladder' not in result.stdout  # no cell was started
    assert tree_digest(fs) == before


def test_the_table_compares_each_rung_with_the_first_over_seeds():
  spec = ladder.Ladder.from_dict(_tiny())
  task = {'metric': 'dev_accuracy', 'majority': 0.5092}
  rows = [{'rung': 'bert', 'mlm_accuracy': 0.2, 'mlm_baseline': 0.05,
           'tasks': {'sst2': {**task, 'values': [0.80, 0.82]}}, 'wall_s': 60.0, 'missing': []},
          {'rung': 'mlm_only', 'mlm_accuracy': 0.21, 'mlm_baseline': 0.05,
           'tasks': {'sst2': {**task, 'values': [0.85, 0.86]}}, 'wall_s': 90.0, 'missing': []},
          {'rung': 'span', 'mlm_accuracy': None, 'mlm_baseline': None,
           'tasks': {'sst2': {**task, 'values': [0.81, None]}}, 'wall_s': 0.0, 'missing': ['span', 'span/sst2/seed1']},
          {'rung': 'sop', 'mlm_accuracy': 0.19, 'mlm_baseline': 0.05,
           'tasks': {'sst2': {**task, 'values': [0.5092, 0.5092]}}, 'wall_s': 60.0, 'missing': []}]
  md, text = ladder.table(spec, rows)
  lines = md.splitlines()
  assert lines[0].startswith('| rung | held-out MLM acc (baseline) | sst2 dev_accuracy: median [min, max] (seeds); '
                             'majority class 0.5092 |')
  assert lines[2] == '| bert | 0.2000 (0.0500) | 0.8100 [0.8000, 0.8200] (2) | the reference | 1.0 min | — |'
  assert lines[3] == ('| mlm_only | 0.2100 (0.0500) | 0.8550 [0.8500, 0.8600] (2) | +0.0450 (every seed above) | '
                      '1.5 min | — |')
  assert lines[4] == ('| span | — | 0.8100 [0.8100, 0.8100] (1) | +0.0000 (one seed: no spread to compare) | 0.0 min | '
                      'span, span/sst2/seed1 |')
  # A rung at the majority class learnt nothing the table can rank: it says so, not "within the seeds' spread".
  assert lines[5] == ('| sop | 0.1900 (0.0500) | 0.5092 [0.5092, 0.5092] (2) | -0.3008 (no seed above the majority '
                      'class) | 1.0 min | — |')
  assert ladder.compare({'median': 0.8, 'min': 0.7, 'max': 0.9, 'n': 3}, {'median': 0.8, 'min': 0.75, 'max': 0.85,
                                                                            'n': 3})[1] == 'within the seeds\' spread'
  assert ladder.compare({'median': 0.6, 'min': 0.5, 'max': 0.7, 'n': 2}, {'median': 0.8, 'min': 0.75, 'max': 0.85,
                                                                            'n': 2})[1] == 'every seed below'
  header = list(csv.reader(text.splitlines()))[0]
  assert header[:5] == ['rung', 'mlm_accuracy', 'mlm_baseline_accuracy', 'sst2_metric', 'sst2_median']
  assert 'sst2_majority' in header and header[-2:] == ['wall_s', 'missing']


def _csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _numbers(rows):
  """The rows without wall time (it differs from run to run)."""
  return [{k: v for k, v in r.items() if k != 'wall_s'} for r in rows]


@pytest.fixture(scope='module')
def tiny_ladder(readme_ladder):
  """The README's tiny ladder, run once per test run (conftest.readme_ladder; the README's test checks it too): the
  command these tests rerun, TINY to its --workdir. Shared: a test writing there asks for readme_ladder_alone."""
  assert readme_ladder.argv[2:] == [TINY, f'--workdir={readme_ladder.flag("workdir")}'], readme_ladder.argv
  return Path(readme_ladder.flag('workdir')), readme_ladder.result


@needs_sst2
@pytest.mark.slow
@pytest.mark.e2e
# readme_ladder_alone: the rerun rewrites the same tables in the shared workdir (its cells' commands name it).
def test_the_tiny_ladder_tabulates_and_a_rerun_skips_every_finished_cell(tiny_ladder, readme_ladder_alone):
  workdir, result = tiny_ladder
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = _csv(workdir / 'ladder_results.csv')
  assert [r['rung'] for r in rows] == ['bert', 'mlm_only'] and all(r['missing'] == '' for r in rows)
  assert all(0 < float(r['mlm_accuracy']) < 1 and r['sst2_metric'] == 'dev_accuracy' and r['sst2_seeds'] == '2'
             for r in rows)
  # SST-2's dev set: 444 of 872 sentences positive; and the MLM baseline beside each rung's accuracy
  assert all(float(r['sst2_majority']) == pytest.approx(444 / 872) and 0 < float(r['mlm_baseline_accuracy']) < 1
             for r in rows)
  assert (workdir / 'ladder_results.md').read_text() in result.stdout
  assert (workdir / 'ladder_results.png').read_bytes()[:4] == b'\x89PNG'
  again = _ladder(TINY, f'--workdir={workdir}')
  assert again.returncode == 0 and again.stdout.count('done before') == 6, again.stdout[-3000:]
  assert _numbers(_csv(workdir / 'ladder_results.csv')) == _numbers(rows)
  # A changed budget never reuses the cells run with the old one: one error line, nothing touched.
  before = tree_digest(str(workdir))
  changed = _ladder(TINY, f'--workdir={workdir}',
                    '--config.tasks.sst2.overrides=num_train_epochs=0 num_train_steps=80 max_train_samples=1280')
  assert_one_line_error(changed, 'finetune/bert/sst2/seed0 (and 3 more) finished with another command than this '
                        'one (then --config.num_train_steps=40, now --config.num_train_steps=80)')
  assert tree_digest(str(workdir)) == before
  # A rung pretrained again after its cells were fine-tuned: those cells are stale, named, nothing touched.
  rung_metrics = workdir / 'pretrain' / 'bert' / 'final_metrics.json'
  stat = os.stat(rung_metrics)
  os.utime(rung_metrics, (stat.st_atime, stat.st_mtime + 3600))
  try:
    stale = _ladder(TINY, f'--workdir={workdir}')
    assert_one_line_error(stale, f'bert/sst2/seed0 was fine-tuned from an earlier pretraining of rung bert '
                          f'({workdir / "pretrain" / "bert"} finished after it)')
    assert f'Delete {workdir / "finetune" / "bert"} to fine-tune' in stale.stderr
  finally:
    os.utime(rung_metrics, (stat.st_atime, stat.st_mtime))
  assert tree_digest(str(workdir)) == before


@needs_sst2
@pytest.mark.slow
@pytest.mark.e2e
def test_a_failed_rung_is_reported_and_the_others_go_on(tiny_ladder, tmp_path):
  workdir = tmp_path / 'ladder'
  # Rung bert's pretraining is the local ladder's (done: skipped); its fine-tuning runs after mlm_only's pretraining
  # failed.
  shutil.copytree(tiny_ladder[0] / 'pretrain' / 'bert', workdir / 'pretrain' / 'bert')
  result = _ladder(TINY, f'--workdir={workdir}', '--config.seeds=1',
                   f'--config.rungs.mlm_only.overrides=data.objective=none data.train_files={tmp_path}/none')
  assert result.returncode == 1
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert errors[-1] == 'error: 2 of 4 cells failed: mlm_only, mlm_only/sst2/seed0', result.stderr[-3000:]
  assert "mlm_only/sst2/seed0: not run, its rung's pretraining failed" in result.stdout
  assert (workdir / 'finetune' / 'bert' / 'sst2' / 'seed0' / 'final_metrics.json').is_file()
  rows = _csv(workdir / 'ladder_results.csv')
  assert rows[0]['missing'] == '' and float(rows[0]['sst2_median']) > 0
  assert rows[1]['missing'] == 'mlm_only mlm_only/sst2/seed0' and rows[1]['mlm_accuracy'] == ''


@needs_sst2
@pytest.mark.slow
@pytest.mark.e2e
def test_slurm_arrays_run_task_by_task_fill_the_local_table(tiny_ladder, tmp_path):
  local, result = tiny_ladder
  assert result.returncode == 0
  workdir = tmp_path / 'cluster'
  # One seed (4 cells, not 6): each cell's results equal the local ladder's same cell, and the gathered table is that
  # seed's.
  written = _ladder(TINY, f'--workdir={workdir}', '--config.seeds=1', '--launcher=slurm', '--noslurm_submit')
  assert written.returncode == 0, written.stderr[-3000:]
  slurm = workdir / 'slurm'
  assert 'ladder_pretrain.sbatch (2 cells)' in written.stdout and 'ladder_finetune.sbatch (2 cells)' in written.stdout
  submit = (slurm / 'submit.sh').read_text()
  assert submit.index('ladder_pretrain.sbatch') < submit.index('--dependency=afterany') < submit.index(
      'ladder_finetune.sbatch')
  # The second task of each array (rung mlm_only: its pretraining, then its fine-tuning) runs as SLURM would start
  # it; the first rung's cells are the local ladder's, copied (each task is a Python process of its own).
  for cell in (Path('pretrain', 'bert'), Path('finetune', 'bert', 'sst2', 'seed0')):
    shutil.copytree(local / cell, workdir / cell)
  for group in ('ladder_pretrain', 'ladder_finetune'):
    done = subprocess.run(['bash', str(slurm / f'{group}.sbatch')], env={**os.environ, 'SLURM_ARRAY_TASK_ID': '2'},
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
  gathered = _ladder(TINY, f'--workdir={workdir}', '--config.seeds=1', '--gather')
  assert gathered.returncode == 0, gathered.stderr[-3000:]
  cells = [Path('pretrain', rung) for rung in ('bert', 'mlm_only')] + [
      Path('finetune', rung, 'sst2', 'seed0') for rung in ('bert', 'mlm_only')]
  local_cells = {cell: _cell_numbers(local / cell) for cell in cells}
  for cell in cells:
    assert _cell_numbers(workdir / cell) == local_cells[cell], cell
  rows, local_rows = _csv(workdir / 'ladder_results.csv'), _csv(local / 'ladder_results.csv')
  for row, local_row, rung in zip(rows, local_rows, ('bert', 'mlm_only'), strict=True):
    assert row['rung'] == rung and row['missing'] == '' and row['sst2_seeds'] == '1'
    assert [row[k] for k in ('mlm_accuracy', 'mlm_baseline_accuracy', 'sst2_majority')] == [
        local_row[k] for k in ('mlm_accuracy', 'mlm_baseline_accuracy', 'sst2_majority')]
    seed0 = local_cells[Path('finetune', rung, 'sst2', 'seed0')]
    assert float(row['sst2_median']) == pytest.approx(seed0['dev_accuracy'], abs=1e-6)


def _cell_numbers(workdir):
  """A cell's final metrics: its numbers but the wall times (they differ from run to run)."""
  metrics = json.loads((workdir / 'final_metrics.json').read_text())
  return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and 'wall' not in k}


@pytest.mark.slow
@pytest.mark.e2e
def test_bad_rungs_tasks_and_seeds_are_one_error_line_and_touch_nothing(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  for flag, pattern in (('--config.rungs.mlm_only.variant=nope', "unknown pretrain config variant 'nope'"),
                        ('--config.tasks.sst2.overrides=num_train_steps=many', "num_train_steps='many' is not a int"),
                        ('--config.seeds=0', 'seeds must be a whole number >= 1'),
                        ('--config.rungs.bert.overrides=learning_rate=1', 'it is now optim.learning_rate')):
    assert_one_line_error(_ladder(TINY, f'--workdir={workdir}', flag), pattern)
  assert_one_line_error(_ladder(TINY), '--workdir is required')
  assert tree_digest(str(workdir)) == before
