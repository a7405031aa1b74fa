"""gs:// and s3:// paths need an optional install (setup.cfg extras gcs, s3): without it, one error line naming
the install command, before any work; with it, the check lets them through. The package is removed by a
patched import (sys.modules[name] = None), so the tests hold whether or not it is installed here.

With it (tests/requirements.txt installs gcsfs), a pretraining run in a fake bucket: a local GCS emulator that
gcsfs (etils.epath: the workdir's files) and tensorstore (Orbax: the checkpoints' arrays) both reach over HTTP,
as they reach Google Cloud Storage. A store that cannot be reached (a closed local port) or a missing bucket is one
error line within seconds. The emulator's answers are replaced where a test needs credentials with less access: its
answer to testIamPermissions (the bucket's policy: a 401, a 403, or some permissions granted) and its answers to
object requests (403 to reads, to writes, or to both, as the object's own grants decide). Such a bucket refuses no
path by itself: a file to read is asked for, a workdir is written to (a probe object, removed again), and
`files.writable` decides from what the store does whether an evaluation writes its results into the bucket. The
same against moto's S3 server with IAM policies (s3:GetObject under a prefix, no s3:ListBucket), where s3fs and moto
are installed.
"""
import contextlib
import http
import json
import os
import re
import subprocess
import sys
import time
import types

import pytest

from bert_jax import files, object_stores
from bert_jax.data import corpus_files
from bert_jax.errors import ConfigError
from bert_jax.runs.checkpoints import Checkpointer

from harness.digests import tmpfs, tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.faults import sigterm_at_pretraining_batch
from harness.gcs_emulator import probe_afresh
from harness.inputs import REPO, shared_data_or_skip
from harness.processes import free_port


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


def _read_json(path):
  with files.open(path, encoding='utf-8') as f:
    return json.load(f)


def _records(path) -> int:
  """The number of TFRecord records (TensorBoard events) in a file: length (8 bytes), its CRC (4), data, CRC (4)."""
  with files.open(path, 'rb') as f:
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
  train_log = [json.loads(l)['step'] for l in files.open(f'{run}/metrics_train.jsonl', encoding='utf-8')]
  assert train_log[-1] == 6 and 2 in train_log  # the lines of both invocations, appended
  events = [_records(f'{run}/tb/train/{name}') for name in files.listdir(f'{run}/tb/train')]
  assert len(events) == 2 and sum(events) == len(train_log) + 2  # a file per invocation: its version, then a
  # record per logged step, none lost to an overwritten object
  evaluated = run_main('evaluate.py', f'--workdir={run}')
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  assert f'{in_bucket["mlm_accuracy"]:.4f}' in evaluated.stdout
  assert not os.path.exists(os.path.join(REPO, 'gs:'))  # nothing landed in a local ./gs:/ directory


@pytest.mark.slow
def test_fine_tuning_and_its_evaluation_in_a_bucket(fake_bucket, tiny_checkpoint, monkeypatch):
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
  assert 'read-only' not in evaluated.stdout + evaluated.stderr
  assert files.isfile(f'{run}/seed_0/final_metrics.json') and files.isfile(f'{run}/config.json')
  summary = _read_json(f'{run}/eval_step2.json')  # the evaluation's results, beside the training ones
  assert summary['step'] == 2 and files.isfile(f'{run}/seed_0/eval_step2/final_metrics.json')
  assert not files.exists(f'{run}/.lock')
  # Credentials that may only read the bucket: the same evaluation writes nothing there, and says so.
  files.remove(f'{run}/eval_step2.json')
  before = sorted(files.listdir(run))
  _answer_permissions(monkeypatch, permissions=['storage.objects.get', 'storage.objects.list'])
  _refuse_objects(monkeypatch, reads=False)
  again = run_main('evaluate.py', f'--workdir={run}')
  assert again.returncode == 0, again.stderr[-2000:]
  assert [l for l in again.stdout.splitlines() if 'read-only' in l] == [
      f'warning: {run} is read-only: nothing is written there; the results go to stdout (give --output_dir=DIR '
      'to keep them)']
  assert sorted(files.listdir(run)) == before and not files.exists(f'{run}/eval_step2.json')
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


def _answer_permissions(monkeypatch, status=http.HTTPStatus.OK, permissions=(), message=''):
  """The emulator answers testIamPermissions with `status`: the `permissions` granted (OK), else GCS's error body
  (403: the caller may not use the bucket; 401: its credentials are refused). Files' earlier answers are forgotten."""
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  def answer(request, response, storage, *args, **kwargs):  # pylint: disable=unused-argument
    response.status = status
    if status == http.HTTPStatus.OK:
      response.json({'kind': 'storage#testIamPermissionsResponse', 'permissions': list(permissions)})
    else:
      response.json({'error': {'code': status.value, 'message': message}})
  for pattern, methods in server.HANDLERS:
    if pattern.endswith('/iam/testPermissions$'):
      monkeypatch.setitem(methods, server.GET, answer)
  probe_afresh(monkeypatch)


def _entry_points(path, tmp_path):
  """(argv, the flag that names `path`) of entry points given a remote `path` as a workdir, a corpus, a
  checkpoint to start from and a fine-tuning file of one's own."""
  local = str(tmp_path / 'run')
  return (
      (['pretrain.py', f'--workdir={path}', '--config=experiments/configs/pretrain.py:tiny'], '--workdir'),
      (['pretrain.py', f'--workdir={local}', '--config=experiments/configs/pretrain.py:tiny',
        f'--config.data.train_files={tmp_path}/a.txt,{path}/corpus/*.txt'], '--config.data.train_files'),
      (['pretrain.py', f'--workdir={local}', '--config=experiments/configs/pretrain.py:tiny',
        f'--config.init_checkpoint={path}/ckpt'], '--config.init_checkpoint'),
      (['finetune.py', f'--workdir={local}', '--config=experiments/configs/finetune.py:classify',
        f'--config.train_file={path}/own/train.csv'], '--config.train_file'),
      (['evaluate.py', f'--workdir={path}'], '--workdir'),
  )


def _assert_each_is_one_line(path, tmp_path, pattern, seconds):
  before = tree_digest(tmp_path)
  for argv, flag in _entry_points(path, tmp_path):
    started = time.monotonic()
    result = run_main(*argv)
    took = time.monotonic() - started
    assert_one_line_error(result, pattern)
    assert f'error: {flag} {path}' in result.stderr and took < seconds, (argv, took, result.stderr)
  assert tree_digest(tmp_path) == before and os.listdir(tmp_path) == []  # nothing created, not even the workdir
  assert not os.path.exists(os.path.join(REPO, 'gs:'))


def test_an_unreachable_store_is_one_line_at_once(tmp_path, monkeypatch):
  """No store listens (a closed local port, as a host that is not there or a network that is down): one line naming
  the path and what to check, where gcsfs alone retries for a minute and prints six tracebacks."""
  pytest.importorskip('gcsfs', reason='the [gcs] extra (gcsfs) is not installed: tests/requirements.txt')
  port = free_port()
  probe_afresh(monkeypatch)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', f'http://localhost:{port}')
  _assert_each_is_one_line('gs://bucket/run', tmp_path, f'cannot reach localhost:{port}', seconds=3)
  with pytest.raises(ConfigError, match=f'path gs://bucket/x: cannot reach localhost:{port} .*STORAGE_EMULATOR_HOST'):
    files.writable('gs://bucket/x')


def test_a_missing_bucket_is_one_line(fake_bucket, tmp_path):
  _assert_each_is_one_line('gs://no-such-bucket/run', tmp_path, 'bucket no-such-bucket does not exist: check its name',
                           seconds=3)
  assert files.writable(f'{fake_bucket}/run')  # the emulator's own bucket grants everything


def _refuse_objects(monkeypatch, reads=True, writes=True, readable=()):
  """The emulator refuses object requests as GCS does where nothing grants them (403): `reads` (an object's data or
  metadata, a listing) but those of the objects named in `readable` (granted on the object itself: an ACL, a managed
  folder), and `writes` (uploads, deletes, copies). Returns the names of the objects uploaded (or refused) since."""
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  uploads = []
  def refusing(handler, read):
    def answer(request, response, storage, *args, **kwargs):
      uploads.extend([] if read else request.query.get('name', []))
      if (read and request.params.get('object_id') in readable) or not (reads if read else writes):
        return handler(request, response, storage, *args, **kwargs)
      response.status = http.HTTPStatus.FORBIDDEN
      response.json({'error': {'code': 403, 'message': f'caller does not have storage.objects.'
                               f'{"get" if read else "create"} access'}})
    return answer
  for pattern, methods in server.HANDLERS:
    if 'object_id' in pattern or pattern.endswith('/o$') or 'batch' in pattern:
      for method, handler in list(methods.items()):
        monkeypatch.setitem(methods, method, refusing(handler, method == server.GET))
  return uploads


def _warnings(stdout):
  return [l for l in stdout.splitlines() if l.startswith('warning:')]


@pytest.mark.parametrize('status, pattern', [
    (http.HTTPStatus.FORBIDDEN, 'anonymous access (no Google credentials were found) may not use bucket bucket '
     '(Forbidden'),
    (http.HTTPStatus.UNAUTHORIZED, 'the store refused anonymous access (no Google credentials were found) for bucket '
     'bucket'),
])
def test_a_bucket_that_refuses_the_credentials_refuses_no_path_by_itself(fake_bucket, tmp_path, monkeypatch, capsys,
                                                                         status, pattern):
  """A 401 or 403 to the bucket's permissions (as anonymous access to a public bucket may get) says nothing of grants
  on objects: a file to read is asked for itself and refused only when that is refused too; any other path gets one
  warning line, and a read or write the store then refuses is one error line."""
  files.write_text_atomic(f'{fake_bucket}/own/train.csv', 'text,label\na,0\n')
  _answer_permissions(monkeypatch, status, message='caller does not have storage.buckets.testIamPermissions access')
  _refuse_objects(monkeypatch, readable=('own/train.csv',))
  files.check_reachable(f'{fake_bucket}/own/train.csv', '--config.train_file', reads_files=True)
  assert _warnings(capsys.readouterr().out) == []
  with pytest.raises(ConfigError) as refused:
    files.check_reachable(f'{fake_bucket}/own/dev.csv', '--config.eval_file', reads_files=True)
  assert str(refused.value).startswith(f'--config.eval_file {fake_bucket}/own/dev.csv cannot be read: the object: '
                                       'refused (Forbidden: b/bucket/o/own%2Fdev.csv); the bucket: ' + pattern)
  for _ in range(2):  # one line a path
    files.check_reachable(f'{fake_bucket}/run', '--workdir')
  assert _warnings(capsys.readouterr().out) == [
      f'warning: --workdir {fake_bucket}/run: {str(refused.value).split("the bucket: ")[1]}; going on, as grants on '
      'objects, managed folders or prefixes do not show at bucket level']
  path = f'{fake_bucket}/run'
  (tmp_path / 'a.txt').write_text('a local corpus file beside the remote ones\n')
  before = tree_digest(tmp_path)
  for argv, flag in _entry_points(path, tmp_path):
    probe_afresh(monkeypatch)
    started = time.monotonic()
    result = run_main(*argv)
    took = time.monotonic() - started
    if flag == '--config.train_file':
      assert_one_line_error(result, f'{flag} {path}/own/train.csv cannot be read: the object: refused (Forbidden')
      assert pattern in result.stderr and _warnings(result.stdout) == []
    else:
      assert_one_line_error(result, 'error: the store refused the credentials in use (Forbidden: ')
      assert [w.split(': ', 2)[1] for w in _warnings(result.stdout)] == [f'{flag} {path}' + '/corpus/*.txt' * (
          flag == '--config.data.train_files') + '/ckpt' * (flag == '--config.init_checkpoint')], result.stdout
      assert pattern in result.stdout
    assert took < 3, (argv, took)
  assert tree_digest(tmp_path) == before and sorted(os.listdir(tmp_path)) == ['a.txt']
  assert not os.path.exists(os.path.join(REPO, 'gs:'))


def test_a_bucket_that_grants_no_read_is_asked_for_the_file_itself(fake_bucket, capsys, monkeypatch):
  files.write_text_atomic(f'{fake_bucket}/own/train.csv', 'text,label\na,0\n')
  _answer_permissions(monkeypatch, permissions=['storage.objects.create'])  # the objects' own grants let them read
  files.check_reachable(f'{fake_bucket}/own/train.csv', '--config.train_file', reads_files=True)
  with pytest.raises(ConfigError, match=r'--config.train_file gs://bucket/own/dev.csv cannot be read: the object: no '
                     r'such object; the bucket: the IAM policy of bucket bucket grants anonymous access \(no Google '
                     r'credentials were found\) neither storage.objects.get nor storage.objects.list'):
    files.check_reachable(f'{fake_bucket}/own/train.csv,{fake_bucket}/own/dev.csv', '--config.train_file',
                          reads_files=True)
  files.check_reachable(f'{fake_bucket}/corpus/*.txt', '--config.data.train_files', reads_files=True)  # a pattern
  assert [w.split(': ')[1] for w in _warnings(capsys.readouterr().out)] == [
      '--config.data.train_files gs://bucket/corpus/*.txt']


def test_credentials_that_may_only_read_cannot_train_there(fake_bucket, tmp_path, monkeypatch):
  _answer_permissions(monkeypatch, permissions=['storage.objects.get', 'storage.objects.list'])
  uploads = _refuse_objects(monkeypatch, reads=False)
  assert not files.writable(f'{fake_bucket}/run') and files.writable(str(tmp_path))
  assert len(uploads) == 1 and uploads[0].startswith('run/.write-probe-')  # the write that says so
  before = tree_digest(tmp_path)
  probe_afresh(monkeypatch)
  result = run_main('pretrain.py', f'--workdir={fake_bucket}/run', '--config=experiments/configs/pretrain.py:tiny')
  assert_one_line_error(result, f'workdir {fake_bucket}/run cannot be written: anonymous access (no Google '
                        'credentials were found) may not create and replace objects in gs://bucket (writing an object '
                        'was refused (Forbidden: ')
  assert files.listdir(fake_bucket) == [] and tree_digest(tmp_path) == before


def test_a_write_the_bucket_policy_does_not_grant_is_tried(fake_bucket, monkeypatch):
  """A grant the bucket's policy does not show (a managed folder's): a probe object, written where the output goes
  (beside a file, not below it) and removed again."""
  _answer_permissions(monkeypatch, permissions=['storage.objects.get', 'storage.objects.list'])
  uploads = _refuse_objects(monkeypatch, reads=False, writes=False)  # every request answered: the names recorded
  files.check_output(f'{fake_bucket}/out/preds.jsonl', 'file', '--output')
  files.check_output(f'{fake_bucket}/out/preds.jsonl', 'file', '--output')  # asked once
  assert len(uploads) == 1 and uploads[0].startswith('out/.write-probe-'), uploads
  assert not files.exists(f'{fake_bucket}/{uploads[0]}') and not files.exists(f'{fake_bucket}/out')


@pytest.mark.parametrize('answer, pattern', [
    ('unavailable', r'writing the probe object gs://bucket/run/\.write-probe-\S+ failed: the store answered HttpError: '
     r'backend unavailable'),
    ('slow', r'writing the probe object .* failed: no answer from the store within 0.3 s: check the network'),
])
def test_a_write_that_fails_otherwise_than_refused_is_one_line(fake_bucket, tmp_path, monkeypatch, answer, pattern):
  """An upload answered with a 503 (or a 400: an Object Lock or encryption key the store cannot apply) or not at all:
  one error line naming the path, where the workdir is claimed, instead of a traceback."""
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  def upload(request, response, storage, *args, **kwargs):  # pylint: disable=unused-argument
    if answer == 'slow':
      time.sleep(0.6)  # the emulator answers one request at a time: the next waits for this one
    response.status = http.HTTPStatus.SERVICE_UNAVAILABLE
    response.json({'error': {'code': 503, 'message': 'backend unavailable'}})
  for pattern_, methods in server.HANDLERS:
    if pattern_.endswith('/o$') and server.POST in methods:
      monkeypatch.setitem(methods, server.POST, upload)
  monkeypatch.setattr(object_stores, 'PROBE_TIMEOUT_S', 0.3)
  _answer_permissions(monkeypatch, permissions=['storage.objects.get', 'storage.objects.list'])
  with pytest.raises(ConfigError, match=f'^path gs://bucket/run cannot be written: {pattern}'):
    files.writable(f'{fake_bucket}/run')
  time.sleep(0.6 if answer == 'slow' else 0)
  probe_afresh(monkeypatch)
  before = tree_digest(tmp_path)
  result = run_main('pretrain.py', f'--workdir={fake_bucket}/run', '--config=experiments/configs/pretrain.py:tiny')
  assert_one_line_error(result, 'error: workdir gs://bucket/run cannot be written: writing the probe object')
  assert tree_digest(tmp_path) == before


def test_a_local_refusal_is_not_the_stores():
  """Only gcsfs's and s3fs's refusals (raised in their code, without an errno) are named as the store's."""
  try:
    raise PermissionError('Access Denied')
  except PermissionError as e:
    assert files.refusal(e) is None
  assert files.refusal(PermissionError(13, 'Permission denied')) is None


def test_a_connection_error_without_a_port_names_its_host():
  error = type('ClientConnectorError', (OSError,), {'host': 'storage.example'})('Connection refused')
  assert object_stores._unreachable(error, 'gs').startswith(  # pylint: disable=protected-access
      'cannot reach storage.example (Connection refused): check the network connection')


def test_writable_local_paths(tmp_path):
  """A local path is writable when it, or its nearest existing ancestor, is a directory this process may write;
  a read-only filesystem is not (root may write anywhere else)."""
  (tmp_path / 'file').write_text('x')
  assert files.writable(str(tmp_path)) and files.writable(str(tmp_path / 'new' / 'deeper'))
  assert files.writable(str(tmp_path / 'file')) and not files.writable(str(tmp_path / 'file' / 'below'))
  with tmpfs(tmp_path / 'ro', '1M') as mounted:
    os.mkdir(os.path.join(mounted, 'sub'))
    subprocess.run(['mount', '-o', 'remount,ro', mounted], check=True)
    assert not files.writable(mounted) and not files.writable(os.path.join(mounted, 'sub', 'new'))


def _aws(monkeypatch, tmp_path, key='test', secret='test'):
  """Credentials `key`/`secret` and nothing else of the machine's (no profile, no instance metadata)."""
  for name, value in (('AWS_ACCESS_KEY_ID', key), ('AWS_SECRET_ACCESS_KEY', secret),
                      ('AWS_DEFAULT_REGION', 'us-east-1'), ('AWS_SHARED_CREDENTIALS_FILE', str(tmp_path / 'none')),
                      ('AWS_CONFIG_FILE', str(tmp_path / 'none')), ('AWS_EC2_METADATA_DISABLED', 'true')):
    monkeypatch.setenv(name, value)


@contextlib.contextmanager
def _moto_s3(monkeypatch):
  """moto's S3 and IAM server in this process at AWS_ENDPOINT_URL (the credentials in the environment are its
  administrator's while it authorises no request); yields a boto3 session's client maker for it."""
  moto_server = pytest.importorskip('moto.server', reason='moto (an S3 server in this process) is not installed')
  import boto3  # pylint: disable=g-import-not-at-top
  port = free_port()
  server = moto_server.ThreadedMotoServer(port=port, verbose=False)
  server.start()
  monkeypatch.setenv('AWS_ENDPOINT_URL', f'http://localhost:{port}')
  probe_afresh(monkeypatch)
  try:
    yield lambda service: boto3.client(service, endpoint_url=f'http://localhost:{port}', region_name='us-east-1')
  finally:
    server.stop()


def test_s3_buckets_are_probed_alike(tmp_path, monkeypatch):
  """The same through s3fs against moto's S3 server, where both are installed (the [s3] extra is not in
  tests/requirements.txt): a closed endpoint, a missing bucket and missing credentials are one line; a bucket the
  credentials may write is writable, and the probe object is removed again."""
  s3fs = pytest.importorskip('s3fs', reason='the [s3] extra (s3fs) is not installed')
  pytest.importorskip('moto.server', reason='moto (an S3 server in this process) is not installed')
  probe_afresh(monkeypatch)
  _aws(monkeypatch, tmp_path)
  closed = free_port()
  monkeypatch.setenv('AWS_ENDPOINT_URL', f'http://localhost:{closed}')
  with pytest.raises(ConfigError, match=rf'--workdir s3://bkt/run: cannot reach the store .*localhost:{closed}'):
    files.check_reachable('s3://bkt/run', '--workdir')
  with _moto_s3(monkeypatch):
    s3 = s3fs.S3FileSystem(skip_instance_cache=True)
    s3.mkdir('bkt')
    with pytest.raises(ConfigError, match='--config.data.train_files s3://nob/a.txt: bucket nob does not exist'):
      files.check_reachable('/local/b.txt,s3://nob/a.txt', '--config.data.train_files')
    files.check_reachable('s3://bkt/run', '--workdir')
    assert files.writable('s3://bkt/run') and s3.ls('bkt') == []
    for name in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY'):
      monkeypatch.delenv(name)
    probe_afresh(monkeypatch)
    with pytest.raises(ConfigError, match='--workdir s3://bkt/run: no AWS credentials were found'):
      files.check_reachable('s3://bkt/run', '--workdir')


def _user(client, name, statements) -> tuple[str, str]:
  """(key, secret) of a new IAM user whose one policy is `statements` (moto authorises by it once told to)."""
  client('iam').create_user(UserName=name)
  client('iam').put_user_policy(UserName=name, PolicyName='p', PolicyDocument=json.dumps(
      {'Version': '2012-10-17', 'Statement': statements}))
  key = client('iam').create_access_key(UserName=name)['AccessKey']
  return key['AccessKeyId'], key['SecretAccessKey']


def test_s3_credentials_that_may_read_a_prefix_only(tmp_path, monkeypatch, capsys):
  """s3:GetObject on bkt/shared/* without s3:ListBucket (a shared data bucket's usual grant): HeadBucket is refused,
  the files under the prefix still read; a file they may not read is one line, a workdir is written to before it
  is refused. A writer's probe object goes beside the file it will write (a policy refusing writes below that file
  would refuse a probe there) and is removed."""
  pytest.importorskip('s3fs', reason='the [s3] extra (s3fs) is not installed')
  from moto import settings  # pylint: disable=g-import-not-at-top  (after importorskip: moto is there)
  _aws(monkeypatch, tmp_path)
  with _moto_s3(monkeypatch) as client:
    client('s3').create_bucket(Bucket='bkt')
    client('s3').put_object(Bucket='bkt', Key='shared/pairs.jsonl', Body=b'{"query": "q", "positive": "p"}\n')
    reader = _user(client, 'reader', [{'Effect': 'Allow', 'Action': 's3:GetObject',
                                       'Resource': 'arn:aws:s3:::bkt/shared/*'}])
    writer = _user(client, 'writer', [
        {'Effect': 'Allow', 'Action': ['s3:PutObject', 's3:DeleteObject'], 'Resource': 'arn:aws:s3:::bkt/out/*'},
        {'Effect': 'Deny', 'Action': 's3:PutObject', 'Resource': 'arn:aws:s3:::bkt/out/preds.jsonl/*'}])
    monkeypatch.setattr(settings, 'INITIAL_NO_AUTH_ACTION_COUNT', 0)  # from here on every request is authorised
    _aws(monkeypatch, tmp_path, *reader)
    files.check_reachable('s3://bkt/shared/pairs.jsonl', '--config.train_file', reads_files=True)
    bucket = (r'the bucket: the AWS credentials in use may not use bucket bkt \(HeadBucket, which needs s3:ListBucket: '
              r'Forbidden\)')
    with pytest.raises(ConfigError, match=r'^--config.eval_file s3://bkt/shared/dev.jsonl cannot be read: the object: '
                       r'(no such object|refused \(Forbidden\)); ' + bucket):  # moto: 404; S3: 403 to who may not list
      files.check_reachable('s3://bkt/shared/dev.jsonl', '--config.eval_file', reads_files=True)
    files.check_reachable('s3://bkt/run', '--workdir')
    assert re.fullmatch(r'warning: --workdir s3://bkt/run: ' + bucket[len('the bucket: '):] + '.*; going on, as '
                        'grants on objects, managed folders or prefixes do not show at bucket level\n',
                        capsys.readouterr().out)
    with pytest.raises(ConfigError, match=r'^workdir s3://bkt/run cannot be written: the AWS credentials in use may '
                       r'not write objects under it \(writing an object was refused \(Access Denied\); that needs '
                       r's3:PutObject and s3:DeleteObject\)'):
      files.check_output('s3://bkt/run', 'directory', 'workdir')
    _aws(monkeypatch, tmp_path, *writer)
    probe_afresh(monkeypatch)
    files.check_output('s3://bkt/out/preds.jsonl', 'file', '--output')
    monkeypatch.setattr(settings, 'INITIAL_NO_AUTH_ACTION_COUNT', float('inf'))
    assert [o['Key'] for o in client('s3').list_objects_v2(Bucket='bkt')['Contents']] == ['shared/pairs.jsonl']
