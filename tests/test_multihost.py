"""Multi-host pretraining through jax.distributed: 2 CPU processes x 4 devices = 1 process x 8 devices.

The processes run experiments/pretrain.py's main (tests/multihost_worker.py, which also records
what each reads) on localhost; gloo carries the cross-process collectives.
"""

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import distributed
from bert_jax.errors import ConfigError
from conftest import REPO, assert_one_line_error, run_experiment, write_small_corpus

WORKER = os.path.join(REPO, 'tests', 'multihost_worker.py')
STEPS, BATCH = 3, 16
TIMEOUT_S = 240  # a process waiting on a dead peer fails the test instead of hanging CI


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _start(args, devices, reads_dir, *extra):
  env = dict(os.environ, JAX_PLATFORMS='cpu', BERT_JAX_READS_DIR=str(reads_dir),
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  return subprocess.Popen([sys.executable, WORKER, *args, *extra], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait(procs) -> list[subprocess.CompletedProcess]:
  """Waits for all; kills whatever still runs when one times out."""
  results = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=TIMEOUT_S)
      results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return results


def _succeed(procs) -> list[str]:
  results = _wait(procs)
  for r in results:
    assert r.returncode == 0, r.stderr[-3000:]
  return [r.stdout for r in results]


def _losses(workdir):
  with open(os.path.join(workdir, 'metrics_train.jsonl'), encoding='utf-8') as f:
    return {r['step']: r['loss'] for r in map(json.loads, f)}


def _reads(reads_dir, process):
  with open(os.path.join(reads_dir, f'reads_{process}.jsonl'), encoding='utf-8') as f:
    return {r['k']: r for r in map(json.loads, f)}


def _pretrain_args(root, workdir):
  return [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
          f'--config.data.train_files={root / "corpus.txt"}', f'--config.data.cache_dir={root / "cache"}',
          '--config.data.eval_fraction=0.1', f'--config.num_train_steps={STEPS}', f'--config.batch_size={BATCH}',
          '--config.log_every=1', f'--config.eval_every={STEPS}', f'--config.checkpoint_every={STEPS}']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """A 2-process run (which builds the data cache), then the 1-process 8-device reference."""
  root = tmp_path_factory.mktemp('multihost')
  write_small_corpus(root)
  multi, single = root / 'multi', root / 'single'
  for d in (multi, single):
    (d / 'reads').mkdir(parents=True)
  address = f'localhost:{_free_port()}'
  outs = _succeed([_start(_pretrain_args(root, multi / 'work'), 4, multi / 'reads',
                          f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}')
                   for i in range(2)])
  _succeed([_start(_pretrain_args(root, single / 'work'), 8, single / 'reads')])
  return dict(multi=multi, single=single, outs=outs)


def test_two_processes_train_like_one(runs):
  multi, single = _losses(runs['multi'] / 'work'), _losses(runs['single'] / 'work')
  steps = list(range(1, STEPS + 1))
  assert sorted(multi) == sorted(single) == steps
  np.testing.assert_allclose([multi[s] for s in steps], [single[s] for s in steps], rtol=1e-5)
  final = [json.loads((runs[k] / 'work' / 'final_metrics.json').read_text()) for k in ('multi', 'single')]
  for name in ('mlm_loss', 'nsp_loss', 'mlm_accuracy', 'num_examples'):
    np.testing.assert_allclose(final[0][name], final[1][name], rtol=1e-5)
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
  assert f'step 1/{STEPS}' in runs['outs'][0] and '"mlm_loss"' in runs['outs'][0]
  # gloo's own connection messages aside, process 1 is silent.
  assert [line for line in runs['outs'][1].splitlines() if not line.startswith('[Gloo]')] == []


def test_bad_input_stops_every_process_with_one_error_line(tmp_path):
  # Process 0 alone builds the data; its DataError must not leave process 1 waiting at the barrier.
  address = f'localhost:{_free_port()}'
  procs = [_start([f'--workdir={tmp_path / "w"}', f'--config.data.train_files={tmp_path / "missing.txt"}',
                   f'--config.data.cache_dir={tmp_path / "cache"}', f'--coordinator_address={address}',
                   '--num_processes=2', f'--process_id={i}'], 4, tmp_path) for i in range(2)]
  results = _wait(procs)
  assert_one_line_error(results[0], 'missing.txt')
  assert_one_line_error(results[1], 'process 0 could not prepare the pretraining data')


def test_bad_flags_give_one_error_line(tmp_path):
  result = run_experiment('pretrain.py', f'--workdir={tmp_path / "w"}', '--num_processes=2', timeout=120)
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
