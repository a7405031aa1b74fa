"""gs:// and s3:// paths need an optional install (setup.cfg extras gcs, s3): without it, one error line naming
the install command, before any work; with it, the check lets them through. The package is removed by a
patched import (sys.modules[name] = None), so the tests hold whether or not it is installed here.

With it (tests/requirements.txt installs gcsfs), a pretraining run in a fake bucket: a local GCS emulator that
gcsfs (etils.epath: the workdir's files) and tensorstore (Orbax: the checkpoints' arrays) both reach over HTTP,
as they reach Google Cloud Storage.
"""

import json
import os
import sys
import types

import pytest

from bert_jax import files
from bert_jax.data import corpus_files
from bert_jax.errors import ConfigError
from bert_jax.runs.checkpoints import Checkpointer

from helpers import (
  REPO,
  assert_one_line_error,
  free_port,
  run_main,
  shared_data_or_skip,
  sigterm_at_pretraining_batch,
  tree_digest,
)


@pytest.fixture
def missing(monkeypatch):
  for name in ('gcsfs', 's3fs'):
    monkeypatch.setitem(sys.modules, name, None)  # `import gcsfs` raises ImportError


def test_a_remote_path_without_its_package_is_one_line(missing):
  with pytest.raises(ConfigError, match=r'--workdir gs://b/run is on gs://, which needs the gcsfs package: '
                     r'python3 -m pip install -e "\.\[gcs\]"'):
    files.check_remote('gs://b/run', '--workdir')
  with pytest.raises(ConfigError, match=r'needs the s3fs package: python3 -m pip install -e "\.\[s3\]"'):
    files.check_remote('/local/a.txt,s3://b/corpus/*.txt', 'corpus')
  for local in ('/tmp/run', 'relative/run', 'file:///tmp/run', 'memory://x', 'notgs://x'):
    files.check_remote(local, 'path')  # no package needed
  with pytest.raises(ConfigError, match='gcsfs'):  # the library's own entry points check too
    Checkpointer('gs://b/run', read_only=True)
  with pytest.raises(ConfigError, match='s3fs'):
    corpus_files.resolve_files('s3://b/corpus.txt')


def test_with_the_package_installed_the_check_passes(monkeypatch):
  monkeypatch.setitem(sys.modules, 'gcsfs', types.ModuleType('gcsfs'))
  files.check_remote('gs://b/run', '--workdir')


def test_entry_points_say_it_before_any_work(missing, tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'keep.txt').write_text('a user file')
  before = tree_digest(tmp_path)
  for argv, pattern in (
      (['pretrain.py', '--workdir=gs://bucket/run', '--config=experiments/configs/pretrain.py:tiny'],
       '--workdir gs://bucket/run is on gs://'),
      (['pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
        '--config.data.train_files=s3://bucket/corpus.txt'], '--config.data.train_files s3://bucket/corpus.txt'),
      (['evaluate.py', '--workdir=gs://bucket/run'], 'pip install -e ".[gcs]"'),
      (['merge.py', '--sources=gs://bucket/a,gs://bucket/b', f'--workdir={tmp_path}/m'], 'needs the gcsfs package'),
  ):
    assert_one_line_error(run_main(*argv), pattern)
  assert tree_digest(tmp_path) == before and sorted(os.listdir(tmp_path)) == ['run']


def _with_generation(handler):
  """The emulator's object read, with the generation header GCS sends (x-goog-generation), which tensorstore
  reads to tell object versions apart (without it: 'Malformed StorageGeneration')."""
  def read(request, response, storage, *args, **kwargs):
    handler(request, response, storage, *args, **kwargs)
    try:
      response['x-goog-generation'] = storage.get_file_obj(request.params['bucket_name'],
                                                           request.params['object_id'])['generation']
    except Exception:  # pylint: disable=broad-except  (no such object: the handler's 404 stands)
      pass
  return read


@pytest.fixture
def fake_bucket(monkeypatch):
  """gs://bucket on a GCS emulator in this process (in memory), for gcsfs and tensorstore alike."""
  gcsfs = pytest.importorskip('gcsfs', reason='the [gcs] extra (gcsfs) is not installed: tests/requirements.txt')
  emulator = pytest.importorskip('gcp_storage_emulator.server',
                                 reason='gcp-storage-emulator is not installed: tests/requirements.txt')
  for _, methods in emulator.HANDLERS:  # restored by monkeypatch after the test
    for method, handler in methods.items():
      if handler.__name__ in ('get', 'download'):
        monkeypatch.setitem(methods, method, _with_generation(handler))
  port = free_port()
  server = emulator.create_server('localhost', port, in_memory=True, default_bucket='bucket')
  server.start()
  url = f'http://localhost:{port}'
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', url)  # gcsfs
  monkeypatch.setenv('TENSORSTORE_GCS_HTTP_URL', url)  # tensorstore's GCS driver
  monkeypatch.setenv('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'fake')  # tensorstore: no credential lookup
  gcsfs.GCSFileSystem.clear_instance_cache()
  try:
    yield 'gs://bucket'
  finally:
    gcsfs.GCSFileSystem.clear_instance_cache()
    server.stop()


def _read_json(path):
  with files.open_file(path, encoding='utf-8') as f:
    return json.load(f)


def _records(path) -> int:
  """The number of TFRecord records (TensorBoard events) in a file: length (8 bytes), its CRC (4), data, CRC (4)."""
  with files.open_file(path, 'rb') as f:
    data = f.read()
  count = position = 0
  while position < len(data):
    position += 16 + int.from_bytes(data[position:position + 8], 'little')
    count += 1
  return count


@pytest.mark.slow
def test_pretraining_stops_resumes_and_evaluates_in_a_bucket(fake_bucket, small_corpus, tmp_path, monkeypatch):
  run, local = f'{fake_bucket}/runs/a', str(tmp_path / 'local')
  common = ['--config=experiments/configs/pretrain.py:tiny', f'--config.data.train_files={small_corpus}',
            f'--config.data.cache_dir={tmp_path}/cache', '--config.num_train_steps=6', '--config.log_every=2',
            '--config.checkpoint_every=2', '--config.eval_every=1000', '--config.data.eval_fraction=0.4']
  with sigterm_at_pretraining_batch(monkeypatch, 4):
    stopped = run_main('pretrain.py', f'--workdir={run}', *common)
  assert stopped.returncode == 75, stopped.stderr[-2000:]
  assert not files.exists(f'{run}/final_metrics.json') and not files.exists(f'{run}/.lock')
  resumed = run_main('pretrain.py', f'--workdir={run}', *common)
  assert resumed.returncode == 0 and 'resumed from' in resumed.stdout, resumed.stderr[-2000:]
  straight = run_main('pretrain.py', f'--workdir={local}', *common)
  assert straight.returncode == 0, straight.stderr[-2000:]
  in_bucket, on_disk = _read_json(f'{run}/final_metrics.json'), _read_json(f'{local}/final_metrics.json')
  for key in ('step', 'train_steps', 'mlm_loss', 'nsp_loss', 'mlm_accuracy', 'nsp_accuracy'):
    assert in_bucket[key] == on_disk[key], key  # a stop and a resume through the bucket change nothing
  assert sorted(files.listdir(run)) == sorted(n for n in os.listdir(local) if n != '.lock')
  assert len(_read_json(f'{run}/config.json')) and files.isfile(f'{run}/tokenizer.model')
  train_log = [json.loads(l)['step'] for l in files.open_file(f'{run}/metrics_train.jsonl', encoding='utf-8')]
  assert train_log[-1] == 6 and 2 in train_log  # the lines of both invocations, appended
  events = [_records(f'{run}/tb/train/{name}') for name in files.listdir(f'{run}/tb/train')]
  assert len(events) == 2 and sum(events) == len(train_log) + 2  # a file per invocation: its version, then a
  # record per logged step, none lost to an overwritten object
  evaluated = run_main('evaluate.py', f'--workdir={run}')
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  assert f'{in_bucket["mlm_accuracy"]:.4f}' in evaluated.stdout
  assert not os.path.exists(os.path.join(REPO, 'gs:'))  # nothing landed in a local ./gs:/ directory


@pytest.mark.slow
def test_fine_tuning_and_its_evaluation_in_a_bucket(fake_bucket, tiny_checkpoint):
  run = f'{fake_bucket}/runs/sst2'
  trained = run_main('finetune.py', '--config=experiments/configs/finetune.py:sst2', f'--workdir={run}',
                     f'--config.init_checkpoint={tiny_checkpoint}', f'--config.data_dir={shared_data_or_skip("sst2")}',
                     '--config.num_train_steps=2', '--config.max_train_samples=32', '--config.num_seeds=1',
                     '--config.log_every=1', '--config.eval_batch_size=64',
                     '--config.max_seq_length=32', '--config.batch_size=16')  # the shapes of conftest's finetuned_workdir
  assert trained.returncode == 0, trained.stderr[-2000:]
  accuracy = _read_json(f'{run}/final_metrics.json')
  evaluated = run_main('evaluate.py', f'--workdir={run}')
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  assert files.isfile(f'{run}/seed_0/final_metrics.json') and files.isfile(f'{run}/config.json')
  assert not os.path.exists(os.path.join(REPO, 'gs:')), accuracy


def test_an_unusable_checkpoint_in_a_bucket_is_moved_aside(fake_bucket):
  import numpy as np  # pylint: disable=g-import-not-at-top
  ckpt = Checkpointer(f'{fake_bucket}/run', keep=3)
  for step in (1, 2):
    ckpt.save(step, {'w': np.full(4, step, np.float32)}, data_position=step, config={}, force=True)
  ckpt.wait()
  moved = ckpt._move_aside(2)  # pylint: disable=protected-access  (what a failed restore of step 2 does)
  assert moved.startswith(f'{fake_bucket}/run/corrupt_checkpoints/2-') and 'state' in files.listdir(moved)
  assert ckpt.all_steps() == [1] and not files.exists(f'{fake_bucket}/run/checkpoints/2')
  ckpt.close()
