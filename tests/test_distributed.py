"""Multi-host pretraining and fine-tuning through jax.distributed: 2 CPU processes x 4 devices = 1 process x 8 devices.

The pretraining processes run experiments/pretrain.py's main (tests/multihost_worker.py, which also
records what each reads), the fine-tuning ones experiments/finetune.py (GLUE and SQuAD configs)
themselves, on localhost; gloo carries the cross-process collectives.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest

from bert_jax import distributed
from bert_jax.errors import ConfigError

import multihost_worker

from harness.entry_points import assert_one_line_error, run_main
from harness.faults import sigterm_at_batch
from harness.inputs import REPO, shared_data_or_skip, write_small_corpus
from harness.numerics import tolerance
from harness.processes import free_port, launch_process, prints_nothing, script_code, start_two, succeed, wait_all

pytestmark = pytest.mark.slow  # multi-process runs on localhost

WORKER = os.path.join(REPO, 'tests', 'multihost_worker.py')
STEPS, BATCH, LOG_EVERY = 12, 16, 2  # steps at which a preemption notice is agreed on: the log steps


def _start(args, devices, reads_dir, *extra):
  return launch_process(WORKER, [*args, *extra], devices, BERT_JAX_READS_DIR=str(reads_dir))


def _losses(workdir):
  with open(os.path.join(workdir, 'metrics_train.jsonl'), encoding='utf-8') as f:
    return {r['step']: r['loss'] for r in map(json.loads, f)}


def _reads(reads_dir, process):
  with open(os.path.join(reads_dir, f'reads_{process}.jsonl'), encoding='utf-8') as f:
    return {r['k']: r for r in map(json.loads, f)}


def _pretrain_args(root, workdir):
  return [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
          f'--config.data.train_files={root / "corpus.txt"}', f'--config.data.cache_dir={root / "cache"}',
          '--config.data.eval_fraction=0.4', f'--config.num_train_steps={STEPS}', f'--config.batch_size={BATCH}',
          f'--config.log_every={LOG_EVERY}', f'--config.eval_every={STEPS}', f'--config.checkpoint_every={STEPS}']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """A 2-process run (which builds the data cache), then the 1-process 8-device reference; the 2-process run is
  also the uninterrupted run the preemption test compares with. The reference runs in this process (8 devices, the
  same XLA flags), recording its reads as tests/multihost_worker.py does: a Python start and jax import fewer."""
  root = tmp_path_factory.mktemp('multihost')
  write_small_corpus(root)
  multi, single = root / 'multi', root / 'single'
  for d in (multi, single):
    (d / 'reads').mkdir(parents=True)
  address = f'localhost:{free_port()}'
  outs = succeed([_start(_pretrain_args(root, multi / 'work'), 4, multi / 'reads',
                          f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}')
                   for i in range(2)])
  with pytest.MonkeyPatch.context() as m:
    m.setenv('BERT_JAX_READS_DIR', str(single / 'reads'))
    multihost_worker.record_reads(m.setattr)
    reference = run_main('pretrain.py', *_pretrain_args(root, single / 'work'))
  assert reference.returncode == 0, reference.stderr[-3000:]
  return dict(root=root, multi=multi, single=single, outs=outs)


def test_two_processes_train_like_one(runs):
  multi, single = _losses(runs['multi'] / 'work'), _losses(runs['single'] / 'work')
  steps = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
  assert sorted(multi) == sorted(single) == steps
  # Sums split over two processes: float32 rounding of the tiny model's widest sums (256), carried from step to step.
  close = tolerance(np.float32, 256, depth=STEPS)
  np.testing.assert_allclose([multi[s] for s in steps], [single[s] for s in steps], rtol=close)
  final = [json.loads((runs[k] / 'work' / 'final_metrics.json').read_text()) for k in ('multi', 'single')]
  for name in ('mlm_loss', 'nsp_loss', 'mlm_accuracy', 'num_examples'):
    np.testing.assert_allclose(final[0][name], final[1][name], rtol=close)
  assert (runs['multi'] / 'work' / 'checkpoints' / str(STEPS)).is_dir()


def test_each_process_reads_its_own_half_of_every_batch(runs):
  p0, p1 = _reads(runs['multi'] / 'reads', 0), _reads(runs['multi'] / 'reads', 1)
  ref = _reads(runs['single'] / 'reads', 0)
  for k in range(STEPS):
    assert len(p0[k]['indices']) == len(p1[k]['indices']) == BATCH // 2
    assert not set(p0[k]['indices']) & set(p1[k]['indices'])
    # Process order = row order of the global batch: together they are the 1-process batch.
    assert p0[k]['indices'] + p1[k]['indices'] == ref[k]['indices']
    assert p0[k]['input_ids'] + p1[k]['input_ids'] == ref[k]['input_ids']


def test_only_process_0_prints(runs):
  assert f'step {LOG_EVERY}/{STEPS}' in runs['outs'][0] and '"mlm_loss"' in runs['outs'][0]
  assert prints_nothing(runs['outs'][1])


def test_bad_input_stops_every_process_with_one_error_line(tmp_path):
  # Every process checks the inputs and they agree before any barrier: no process is left waiting.
  address = f'localhost:{free_port()}'
  procs = [_start([f'--workdir={tmp_path / "w"}', f'--config.data.train_files={tmp_path / "missing.txt"}',
                   f'--config.data.cache_dir={tmp_path / "cache"}', f'--coordinator_address={address}',
                   '--num_processes=2', f'--process_id={i}'], 4, tmp_path) for i in range(2)]
  results = wait_all(procs)
  assert_one_line_error(results[0], 'missing.txt')
  assert_one_line_error(results[1], 'missing.txt')


def _pretrain_two(root, workdir, patch_process_1=''):
  """experiments/pretrain.py as 2 processes x 4 devices with `runs`' flags (`_pretrain_args`); process 1 first runs
  `patch_process_1`."""
  address = f'localhost:{free_port()}'
  procs = []
  for i in range(2):
    argv = ['pretrain.py', *_pretrain_args(root, workdir), f'--coordinator_address={address}', '--num_processes=2',
            f'--process_id={i}']
    procs.append(launch_process('-c', [script_code(argv, patch_process_1 if i else '')], 4))
  return wait_all(procs)


@pytest.mark.e2e
def test_sigterm_to_one_process_saves_the_same_step_on_both_and_loses_none(runs, tmp_path):
  """A preemption notice reaching one host only: both processes agree at the next log step, save that step
  together and exit 75; the rerun resumes there and ends where the uninterrupted 2-process run (`runs`) did."""
  straight, stopped = runs['multi'] / 'work', tmp_path / 'stopped'
  first = _pretrain_two(runs['root'], stopped, patch_process_1=sigterm_at_batch(5))
  assert [r.returncode for r in first] == [75, 75], first[1].stderr[-3000:]
  saved = re.search(r'saved step (\d+)', first[0].stderr)
  assert saved and 'a signal to another process received' in first[0].stderr, first[0].stderr[-3000:]
  step = int(saved.group(1))
  assert 4 <= step < STEPS and (stopped / 'checkpoints' / str(step)).is_dir()
  again = _pretrain_two(runs['root'], stopped)
  assert [r.returncode for r in again] == [0, 0], again[0].stderr[-3000:]
  assert f'at step {step} ' in again[0].stdout
  # Every logged loss and the final held-out metrics are those of the uninterrupted run.
  assert _losses(stopped) == _losses(straight)
  held_out = lambda final: {k: v for k, v in final.items() if not k.startswith('train_') and k != 'wall_s'}  # pylint: disable=unnecessary-lambda-assignment
  assert held_out(_final(stopped)) == held_out(_final(straight))  # the run stats are the last invocation's


GLUE = os.path.join(REPO, 'experiments', 'finetune.py')
EVALUATE = os.path.join(REPO, 'experiments', 'evaluate.py')
FT_STEPS = 4


def _glue_args(checkpoint, workdir):
  return ['--config=experiments/configs/finetune.py:sst2', f'--workdir={workdir}',
          f'--config.init_checkpoint={checkpoint}', f'--config.data_dir={shared_data_or_skip("sst2")}',
          f'--config.num_train_steps={FT_STEPS}', '--config.max_train_samples=64', '--config.batch_size=16',
          '--config.eval_batch_size=64', '--config.optim.learning_rate=1e-3', '--config.log_every=1']


def _squad_args(checkpoint, workdir):
  return ['--config=experiments/configs/finetune.py:squad', f'--workdir={workdir}',
          f'--config.init_checkpoint={checkpoint}', f'--config.data_dir={shared_data_or_skip("squad-v1.1")}',
          '--config.max_seq_length=128', '--config.doc_stride=32', '--config.train_articles=1',
          '--config.eval_articles=1', '--config.max_train_samples=16', '--config.num_train_steps=2',
          '--config.batch_size=8', '--config.eval_batch_size=32', '--config.log_every=1']


@pytest.fixture(scope='module')
def finetune_runs(tiny_checkpoint, tmp_path_factory):
  """SST-2 trained by 2 processes and by 1; SQuAD trained by 1 process, then evaluated again by 2.

  The 1-process runs train in this process (8 devices, the same XLA flags) while the 2 processes train: two Python
  starts and jax imports fewer. The 2-process SQuAD evaluation (evaluate.py) restores the 1-process checkpoint onto
  its mesh and gathers span logits over packed rows.
  """
  root = tmp_path_factory.mktemp('finetune')
  multi = start_two(GLUE, _glue_args(tiny_checkpoint, root / 'glue_multi'))
  try:
    singles = [run_main('finetune.py', *args) for args in (_glue_args(tiny_checkpoint, root / 'glue_single'),
                                                            _squad_args(tiny_checkpoint, root / 'squad_single'))]
  finally:
    results = wait_all(multi)
  for r in [*results, *singles]:
    assert r.returncode == 0, r.stderr[-3000:]
  glue_outs = [r.stdout for r in results]
  shutil.copytree(root / 'squad_single', root / 'squad_multi')
  # The 2-process evaluation writes beside the training results (eval_step2*), never over them.
  squad_outs = succeed(start_two(EVALUATE, [f'--workdir={root / "squad_multi"}']))
  return dict(root=root, glue_outs=glue_outs, squad_outs=squad_outs)


def _final(workdir):
  return json.loads((workdir / 'final_metrics.json').read_text())


def test_two_processes_finetune_like_one(finetune_runs):
  root = finetune_runs['root']
  logs = []
  for name in ('glue_multi', 'glue_single'):
    with open(root / name / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
      logs.append(list(map(json.loads, f)))
  multi, single = logs
  assert [r['step'] for r in multi] == [r['step'] for r in single] == list(range(1, FT_STEPS + 1))
  for name in ('loss', 'grad_norm'):  # the tiny checkpoint's widest sums (64), carried from step to step
    np.testing.assert_allclose([r[name] for r in multi], [r[name] for r in single],
                               rtol=tolerance(np.float32, 64, depth=FT_STEPS))
  final = [_final(root / name) for name in ('glue_multi', 'glue_single')]
  assert final[0]['step'] == final[1]['step'] == FT_STEPS
  for name in ('dev_accuracy', 'train_padding_fraction'):
    np.testing.assert_allclose(final[0][name], final[1][name], rtol=1e-5)
  assert (root / 'glue_multi' / 'seed_0' / 'checkpoints' / str(FT_STEPS)).is_dir()
  for name in ('config.json', 'seed_0/predictions_dev.tsv', 'seed_0/final_metrics.json'):
    assert (root / 'glue_multi' / name).is_file(), name


def test_two_processes_restore_and_evaluate_spans_like_one(finetune_runs):
  root = finetune_runs['root']
  multi = json.loads((root / 'squad_multi' / 'eval_step2.json').read_text())
  single = _final(root / 'squad_single')
  assert multi['step'] == single['step'] == 2
  for name in ('eval_exact_match', 'eval_f1', 'eval_num_examples'):
    np.testing.assert_allclose(multi[name], single[name], rtol=1e-5)
  predictions = [json.loads(path.read_text()) for path in
                 (root / 'squad_multi' / 'seed_0' / 'eval_step2' / 'predictions_eval.json',
                  root / 'squad_single' / 'seed_0' / 'predictions_eval.json')]
  assert predictions[0] == predictions[1]
  assert _final(root / 'squad_multi') == single  # the training results stay as they were


def test_only_process_0_prints_when_fine_tuning(finetune_runs):
  glue, squad = finetune_runs['glue_outs'], finetune_runs['squad_outs']
  assert f'step 1/{FT_STEPS}' in glue[0] and '"dev_accuracy"' in glue[0] and '"eval_f1"' in squad[0]
  assert prints_nothing(glue[1]) and prints_nothing(squad[1])


@pytest.mark.e2e
def test_bad_fine_tuning_input_stops_every_process_with_one_error_line(tiny_checkpoint, tmp_path):
  # Every process validates the same config: each stops with the same error, none waits for the other.
  results = wait_all(start_two(GLUE, [*_glue_args(tiny_checkpoint, tmp_path / 'w'), '--config.batch_size=12']))
  for result in results:
    assert_one_line_error(result, 'batch_size (per micro-batch: 12) must divide evenly over 8 batch shards (mesh '
                          'data x fsdp) and 2 processes')
  assert not (tmp_path / 'w').exists()


@pytest.mark.e2e
@pytest.mark.parametrize('script', ['pretrain.py', 'finetune.py'])
def test_bad_flags_give_one_error_line(script, tmp_path):
  result = run_main(script, f'--workdir={tmp_path / "w"}', '--num_processes=2')  # refused before any process starts
  assert_one_line_error(result, 'needs all of --coordinator_address')
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_processes=2, process_id=0), 'needs all of --coordinator_address'),
    (dict(coordinator_address='localhost:1234', num_processes=2, process_id=2), 'must be in [0, '),
    (dict(coordinator_address='localhost:1234', num_processes=0, process_id=0), 'must be positive'),
    (dict(coordinator_address='localhost', num_processes=2, process_id=0), 'must be HOST:PORT'),
    (dict(process_id=0, mode='off'), 'contradicts --process_id'),
    (dict(mode='yes'), 'must be one of auto, on, off'),
])
def test_initialize_rejects_bad_combinations(kwargs, message, monkeypatch):
  for name in ('JAX_COORDINATOR_ADDRESS', 'SLURM_STEP_NODELIST', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(ConfigError, match=re.escape(message)):
    distributed.initialize(**kwargs)


def test_single_process_needs_no_initialization(monkeypatch):
  for name in ('JAX_COORDINATOR_ADDRESS', 'SLURM_STEP_NODELIST', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(name, raising=False)
  assert distributed.detect_cluster() is None
  assert not distributed.initialize()
  assert not distributed.initialize(mode='off')
  import jax  # pylint: disable=g-import-not-at-top

  from bert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from bert_jax.config import MeshConfig  # pylint: disable=g-import-not-at-top
  assert distributed.process_batch_block(shd.make_mesh(MeshConfig())) == (0, 1)
  assert jax.process_count() == 1


def test_detect_cluster(monkeypatch):
  for name in ('JAX_COORDINATOR_ADDRESS', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('SLURM_STEP_NODELIST', 'node[001-002]')
  monkeypatch.setenv('SLURM_PROCID', '0')
  monkeypatch.setenv('SLURM_NTASKS', '2')
  assert distributed.detect_cluster() == 'slurm'
  monkeypatch.setenv('SLURM_NTASKS', '1')  # one task: a plain single-process run
  assert distributed.detect_cluster() is None
  monkeypatch.setenv('TPU_WORKER_HOSTNAMES', 'w-0,w-1')
  assert distributed.detect_cluster() == 'tpu'
