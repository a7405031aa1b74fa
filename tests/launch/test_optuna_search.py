"""sweep.py --search=optuna (bert_jax.launch.optuna_search): the space, a study of trials that are workdirs, median pruning
on the evaluations they write, and a study that survives kill -9 with every trial run exactly once.

The trials are a stand-in command (a few lines of Python, no jax) that writes what a fine-tuning run writes: eval rows
in seed_0/metrics_eval.jsonl and final_metrics.json, its metric a known function of its learning rate."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError
from bert_jax.launch import optuna_search as search

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import REPO

optuna = pytest.importorskip('optuna', reason='the [hpo] extra (optuna) is not installed: tests/requirements.txt')

# A trial: --workdir, --lr, --index; the metric peaks at lr = 1e-4; a trial whose index is in --bad has poor
# evaluations; --hang=FILE sleeps the first time it runs (FILE absent), to be killed there.
TRIAL = '''
import json, math, os, sys, time
args = dict(a[2:].split('=', 1) for a in sys.argv[1:])
work, lr, index = args['workdir'], float(args['config.optim.learning_rate']), int(args['index'])
if 'hang' in args and not os.path.exists(args['hang']):
  open(args['hang'], 'w').close()
  time.sleep(60)
os.makedirs(os.path.join(work, 'seed_0'), exist_ok=True)
value = 1.0 - 0.1 * (math.log10(lr) + 4) ** 2 - (0.5 if str(index) in args.get('bad', '').split(',') else 0.0)
with open(os.path.join(work, 'seed_0', 'metrics_eval.jsonl'), 'a') as f:
  for step in (10, 20, 30):
    f.write(json.dumps({'step': step, 'dev_accuracy': value - 0.01 * (3 - step // 10)}) + '\\n')
time.sleep(float(args.get('sleep', 0)))
with open(os.path.join(work, 'final_metrics.json'), 'w') as f:
  json.dump({'main_metric': 'dev_accuracy', 'dev_accuracy': value, 'lr': lr}, f)
'''


@pytest.fixture
def trial_script(tmp_path):
  path = tmp_path / 'trial.py'
  path.write_text(TRIAL, encoding='utf-8')
  return str(path)


def _sweep(out, script, *extra, trials=4, space='config.optim.learning_rate=log:1e-6:1e-2', trial_args=()):
  return ['--search=optuna', f'--trials={trials}', f'--output_dir={out}', f'--space={space}', *extra, '--',
          sys.executable, script, f'--workdir={out}/{{name}}', '--index={index}', *trial_args]


def _split(argv):
  at = argv.index('--')
  return argv[:at], argv[at + 1:]


def _run(argv):
  """sweep.py in this process (its trials are processes: their output captured too)."""
  return run_main('sweep.py', *argv, children=True)


def test_the_space_is_parsed_and_bad_entries_are_named():
  space = search.parse_space('config.optim.learning_rate=log:1e-5:1e-3 config.num_train_epochs=int:2:4 '
                             "config.optim.warmup_ratio=float:0:0.2 'config.pooling=choice:mean,cls'")
  assert [(p.key, p.kind) for p in space] == [('config.optim.learning_rate', 'log'), ('config.num_train_epochs', 'int'),
                                              ('config.optim.warmup_ratio', 'float'), ('config.pooling', 'choice')]
  assert space[3].choices == ('mean', 'cls') and space[1].distribution().high == 4
  for bad, message in (('config.x=log:0:1', 'empty range'), ('config.x=float:1:1', 'empty range'),
                       ('config.x=int:a:3', 'must be integers'), ('config.x=normal:0:1', 'kind one of'),
                       ('config.x=choice:a,,b', 'empty choice'), ('', 'empty search space'),
                       ('config.x=log:1e-5:1e-3 config.x=int:1:2', 'appears twice')):
    with pytest.raises(ConfigError, match=message):
      search.parse_space(bad)
  search.check_fields(space[:3], [FinetuneConfig])
  with pytest.raises(ConfigError, match='search space key config.optim.learning_rat: no such config field'):
    search.check_fields(search.parse_space('config.optim.learning_rat=log:1e-5:1e-3'), [FinetuneConfig])


def test_a_study_runs_its_trials_continues_and_refuses_another_search(tmp_path, trial_script, monkeypatch):
  monkeypatch.setattr(search, 'POLL_S', 0.05)
  out = tmp_path / 'study'
  first = _run(_sweep(out, trial_script))
  assert first.returncode == 0, first.stderr[-3000:]
  assert sorted(n for n in os.listdir(out) if n.startswith('trial_')) == [f'trial_00{i}' for i in range(1, 5)]
  table = (out / 'sweep_results.md').read_text(encoding='utf-8')
  # (a trial below the median may be pruned once two have finished: the poller may see its evaluations first)
  done = table.count('| complete |')
  assert done + table.count('| pruned |') == 4 and done >= 2 and (out / 'search.png').stat().st_size > 1000
  for i in range(1, 5):  # each finished trial's metric is its own run's
    if (out / f'trial_00{i}' / 'final_metrics.json').exists():
      with open(out / f'trial_00{i}' / 'final_metrics.json', encoding='utf-8') as f:
        assert f'{json.load(f)["dev_accuracy"]}'[:6] in table
  again = _run(_sweep(out, trial_script, trials=6))  # two more; the four done are skipped
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count('before, skipped') == 4 and again.stdout.count(' started: ') == 2
  study = optuna.load_study(study_name=search.STUDY_NAME, storage=optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(out / search.STUDY_FILE))))
  assert len(study.trials) == 6 and all(t.state.name in ('COMPLETE', 'PRUNED') for t in study.trials)
  assert sorted(t.user_attrs['slot'] for t in study.trials) == list(range(1, 7))
  other = _run(_sweep(out, trial_script, space='config.optim.learning_rate=log:1e-5:1e-3'))
  assert_one_line_error(other, "holds another search's study")
  bad = _run(_sweep(tmp_path / 'bad', trial_script, space='config.optim.learning_rat=log:1e-5:1e-3'))
  assert_one_line_error(bad, 'no such config field')
  assert not (tmp_path / 'bad').exists()


def test_a_trial_below_the_median_is_pruned(tmp_path, trial_script, monkeypatch):
  monkeypatch.setattr(search, 'POLL_S', 0.05)
  out = tmp_path / 'study'
  result = _run(_sweep(out, trial_script, '--metric=dev_accuracy', trials=3,
                       trial_args=['--bad=3', '--sleep=0.5']))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'trial_003 pruned at step' in result.stdout
  assert (out / 'sweep_results.md').read_text(encoding='utf-8').count('| pruned |') == 1
  assert not (out / 'trial_003' / 'final_metrics.json').exists()  # stopped before its end


@pytest.mark.slow
def test_kill_9_mid_trial_and_the_rerun_completes_the_study_once(tmp_path, trial_script):
  """The sweep (a process: it is what is killed) and its trial killed together (a preempted node): the rerun resumes trial 1 with its parameters, as
  the same Optuna trial, and the study ends with exactly the trials asked for."""
  out = tmp_path / 'study'
  argv = _sweep(out, trial_script, trials=3, trial_args=[f'--hang={tmp_path / "hung"}'])
  flags_part, command = _split(argv)
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'sweep.py'), *flags_part, '--', *command]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 60
  while not (tmp_path / 'hung').exists() and time.time() < deadline:  # trial 1 hangs at once: killed there
    time.sleep(0.1)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  rerun = _run(argv)  # the same command again, in this process
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert 'trial_001 resumed' in rerun.stdout
  study = optuna.load_study(study_name=search.STUDY_NAME, storage=optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(out / search.STUDY_FILE))))
  assert [t.user_attrs['slot'] for t in study.trials] == [1, 2, 3] and study.trials[0].state.name == 'COMPLETE'
  assert all(t.state.name in ('COMPLETE', 'PRUNED') for t in study.trials)
  with open(out / 'trial_001' / 'final_metrics.json', encoding='utf-8') as f:
    assert json.load(f)['lr'] == pytest.approx(study.trials[0].params['config.optim.learning_rate'])
