"""Faults: preemption loses no step, corrupt or insane checkpoints fall back, one run per workdir,
no non-finite state is saved, a resume of another run is refused, and bad input is one error line
that leaves the workdir's files unchanged.

Entry points run in this process (harness.entry_points.run_main: their main, output and exit code) unless the check
is about the process: a signal to it, its exit status, or everything it writes to stderr (tensorstore's and Orbax's
own lines, written outside Python's sys.stderr or after main returns)."""

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from bert_jax import config, files
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.finetuning import finetune_run as finetuning
from bert_jax.pretraining import pretrain_run as pretraining
from bert_jax.runs import checkpoints as checkpointing, workdir as workdir_lib
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train import preemption

from harness.digests import restore_pretraining_state, tmpfs, tree_digest
from harness.entry_points import assert_one_line_error, run_experiment, run_main
from harness.faults import signal_at_finetuning_batch, sigterm_at_batch
from harness.inputs import REPO, finetune_config, shared_data_or_skip, write_small_corpus
from harness.processes import pretrain_flags, pretrain_subprocess, xla_flags

pytestmark = pytest.mark.slow  # faults injected into real runs


def _assert_bitwise(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.fixture
def trained(pretrained_run):
  """(config, workdir) of the shared finished 4-step tiny pretraining run (conftest.py: checkpoints of steps 2 and
  4); read-only, its data cache too: _copy it before running anything on it."""
  return pretrained_run.cfg, pretrained_run.workdir


def _copy(trained, tmp_path):
  """(config, workdir) of a copy of the shared run in tmp_path, with its data cache (a run of another seed or
  tokenizer prepares its data there)."""
  cfg, workdir = trained
  target, cache = str(tmp_path / 'run'), str(tmp_path / 'cache')
  shutil.copytree(workdir, target)
  shutil.copytree(cfg.data.cache_dir, cache)
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=cache)), target


# --- preemption ---------------------------------------------------------------------------------

_SIGTERM_AT_STEP_23 = sigterm_at_batch(23)


@pytest.mark.e2e
def test_sigterm_saves_the_current_step_and_the_rerun_is_bitwise(straight_pretraining, tmp_path):
  corpus, cache = write_small_corpus(tmp_path), str(tmp_path / 'cache')
  straight, preempted = straight_pretraining, str(tmp_path / 'preempted')
  # The rerun in this process, as was the uninterrupted run it is compared with (a shared fixture: the same flags and
  # corpus, 40 steps); the preempted one is a process of its own (its signal, its exit status, all of its stderr).
  r = subprocess.run(pretrain_subprocess(corpus, cache, preempted, 40, _SIGTERM_AT_STEP_23), cwd=REPO,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == preemption.EXIT_CODE, r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.startswith('preempted:')]
  assert len(lines) == 1 and 'SIGTERM received: saved step 23' in lines[0], r.stderr[-2000:]
  assert 'Traceback' not in r.stderr
  assert Checkpointer(preempted, read_only=True).latest_step() == 23  # every trained step kept
  assert not os.path.exists(os.path.join(preempted, workdir_lib.LOCK_FILE))
  r = run_main('pretrain.py', *pretrain_flags(corpus, cache, preempted, 40))
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'at step 23' in r.stdout
  cfg = config.PretrainConfig.from_dict(json.load(open(os.path.join(straight, 'config.json'))))
  a, meta_a = restore_pretraining_state(straight, cfg, 40)
  b, meta_b = restore_pretraining_state(preempted, cfg, 40)
  assert meta_a['data_position'] == meta_b['data_position'] == 40
  _assert_bitwise(a, b)  # params, both Adam moments, step, rng


# A `pretrain_subprocess` patch: each train step first runs a jitted burn of 0.3 s on the device (dispatched
# asynchronously, as a large model's step): a host callback inside the program that sleeps, so the device is busy
# while the core stays free for the other test worker (1,000 matrix products burnt it: 10-12 s of a core per test).
# The callback says on stderr when step k's burn is done ("burnt k": before step k can finish), and the third
# step's dispatch is announced.
_SLOW_STEPS = """
import sys, time, jax
from bert_jax.train import step as step_lib
burnt = [0]
def sleep(x):
  time.sleep(0.3)
  burnt[0] += 1
  print(f'burnt {burnt[0]}', file=sys.stderr, flush=True)
  return x
@jax.jit
def burn(batch):
  ids = batch['input_ids']  # the step's input passes through the callback: the step waits for it
  return {**batch, 'input_ids': jax.pure_callback(sleep, jax.ShapeDtypeStruct(ids.shape, ids.dtype), ids)}
init = step_lib.StepModel.__init__
def slow_init(self, *a, **k):
  init(self, *a, **k)
  fast, calls = self.train_step, [0]
  def slow(state, batch, rest):
    calls[0] += 1
    if calls[0] == 3:
      print('third step', file=sys.stderr, flush=True)
    return fast(state, burn(batch), rest)
  self.train_step = slow
step_lib.StepModel.__init__ = slow_init
"""


@pytest.mark.e2e
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_a_random_moment_of_slow_steps_exits_75_within_two_steps(tmp_path, signum):
  corpus, cache, workdir = write_small_corpus(tmp_path), str(tmp_path / 'cache'), str(tmp_path / 'run')
  env = dict(os.environ, XLA_FLAGS=xla_flags())  # one device, as the main job: steps are dispatched ahead of the device
  # No log or checkpoint step before the end: a host that ran ahead would queue every step before the save.
  extra = ['--config.log_every=1000', '--config.checkpoint_every=1000']
  cmd = pretrain_subprocess(corpus, cache, workdir, 60, _SLOW_STEPS, extra=extra)
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  early = []
  for line in proc.stderr:  # training runs (compiled)
    early.append(line)
    if line.startswith('third step'):
      break
  time.sleep(np.random.uniform(0.5, 3.0))
  proc.send_signal(signum)
  err = ''.join(early) + proc.stderr.read()
  proc.wait(timeout=60)
  assert proc.returncode == preemption.EXIT_CODE, err[-3000:]
  name = signal.Signals(signum).name
  about = [l for l in err.splitlines() if name in l]
  ack = re.fullmatch(rf'{name} received: finishing step (\d+), then saving', about[0])
  assert ack and len(about) == 2 and about[1].startswith('preempted: '), err[-3000:]  # acknowledged first
  assert f'saved step {ack.group(1)}.' in about[1], err[-3000:]
  # Within two steps, counted in steps rather than timed (a busy machine stretches any time): the loop keeps at most
  # two steps in flight, so the step the acknowledgement names is at most two past the last burn done before it.
  burnt = [int(n) for n in re.findall(r'^burnt (\d+)$', err[:err.index(about[0])], re.M)]
  assert burnt == list(range(1, len(burnt) + 1)) and int(ack.group(1)) <= len(burnt) + 2, err[-3000:]
  assert Checkpointer(workdir, read_only=True).latest_step() == int(ack.group(1))


def test_sigterm_in_finetuning_loses_no_step(tiny_checkpoint, tmp_path, monkeypatch):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers need the main thread')
  cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=shared_data_or_skip('sst2'),
                        max_seq_length=32, batch_size=16, eval_batch_size=64, learning_rate=1e-3,
                        num_train_steps=10, max_train_samples=48, log_every=4)
  finetuning.finetune(cfg, str(tmp_path / 'straight'))
  with signal_at_finetuning_batch(monkeypatch, 5), pytest.raises(preemption.Preempted, match='saved step 6'):
    finetuning.finetune(cfg, str(tmp_path / 'preempted'))
  assert Checkpointer(str(tmp_path / 'preempted' / 'seed_0'), read_only=True).all_steps() == [6]
  finetuning.finetune(cfg, str(tmp_path / 'preempted'))
  ckpts = [Checkpointer(str(tmp_path / d / 'seed_0'), read_only=True) for d in ('straight', 'preempted')]
  assert [c.all_steps()[-1] for c in ckpts] == [10, 10]
  a, b = (c.manager.restore(10, args=checkpointing.ocp.args.Composite(
      state=checkpointing.ocp.args.StandardRestore()))['state'] for c in ckpts)
  _assert_bitwise(a, b)


# --- corrupt and insane checkpoints -------------------------------------------------------------

def _corrupt(workdir, step):
  for root, _, names in os.walk(os.path.join(workdir, 'checkpoints', str(step), 'state')):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'r+b') as f:
        size = os.path.getsize(path)
        f.write(b'\x00' * max(size, 1))


def test_corrupt_latest_checkpoint_falls_back_and_is_moved_aside(trained, tmp_path, capsys):
  cfg, workdir = _copy(trained, tmp_path)
  _corrupt(workdir, 4)
  with pytest.raises(CheckpointError, match='checkpoint step 4 .* is unusable'):
    pretraining.evaluate_checkpoint(workdir, step=4)  # an explicit step stays strict
  assert pretraining.evaluate_checkpoint(workdir)['step'] == 2  # read-only: falls back, moves nothing
  assert Checkpointer(workdir, read_only=True).all_steps() == [2, 4]
  result = pretraining.train_and_evaluate(dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps'),
                                        workdir)
  assert result['step'] == 6
  out = capsys.readouterr().out
  assert 'checkpoint step 4 is unusable: it cannot be read' in out and 'resumed from' in out
  moved = os.listdir(os.path.join(workdir, checkpointing.CORRUPT_DIR))
  assert len(moved) == 1 and moved[0].startswith('4-')  # kept for inspection, never deleted
  assert Checkpointer(workdir, read_only=True).all_steps() == [2, 4, 6]  # 4 and 6 newly trained


def test_non_finite_checkpoint_is_never_resumed(trained, tmp_path, capsys):
  cfg, workdir = _copy(trained, tmp_path)
  state, meta = restore_pretraining_state(workdir, cfg, 4)
  state['params'] = jax.tree.map(lambda x: np.full_like(x, np.nan), state['params'])
  ckpt = Checkpointer(workdir)
  ckpt.save(6, state, data_position=6, config=meta['config'], force=True,
            extra={'data_fingerprint': meta['data_fingerprint']})
  ckpt.close()
  result = pretraining.train_and_evaluate(dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps'),
                                        workdir)
  assert 'checkpoint step 6 is unusable: its parameters contain NaN or Inf' in capsys.readouterr().out
  assert result['step'] == 6 and np.isfinite(result['mlm_loss'])


def _damage_array_data(workdir, step, how='zeros'):
  # The arrays' bytes only: the manifest and metadata read, the values do not (tensorstore fails mid-read).
  data = os.path.join(workdir, 'checkpoints', str(step), 'state', 'd')
  rng = np.random.default_rng(0)
  for name in os.listdir(data):
    size = os.path.getsize(os.path.join(data, name))
    with open(os.path.join(data, name), 'r+b') as f:
      if how == 'zeros':
        f.write(b'\x00' * size)
      else:  # a few random bytes in the middle
        f.seek(size // 3)
        f.write(rng.integers(0, 256, min(64, size), np.uint8).tobytes())


@pytest.mark.e2e
@pytest.mark.parametrize('how', ['zeros', 'random_bytes'])
def test_reading_a_corrupt_checkpoint_prints_one_warning_and_nothing_else(trained, tmp_path, how):
  _, workdir = _copy(trained, tmp_path)
  _damage_array_data(workdir, 4, how)
  before = tree_digest(workdir)
  for _ in range(2):  # tensorstore's late callbacks (hundreds of tracebacks before) come in most runs
    r = run_experiment('evaluate.py', f'--workdir={workdir}')
    assert r.returncode == 0 and '"step": 2' in r.stdout, r.stderr[-3000:]
    assert [l for l in r.stdout.splitlines() if 'unusable' in l] == [
        l for l in r.stdout.splitlines() if l.startswith('warning: checkpoint step 4 is unusable')]
    assert r.stderr.strip() == '', r.stderr[-3000:]
  assert tree_digest(workdir) == before  # evaluation reads only


@pytest.mark.e2e
def test_evaluate_all_steps_names_an_unusable_checkpoint_and_evaluates_the_others(trained, tmp_path):
  _, workdir = _copy(trained, tmp_path)
  _damage_array_data(workdir, 2)  # the older one: the newer one must still be evaluated
  before = tree_digest(workdir)
  out = tmp_path / 'out'
  out.mkdir()
  r = run_experiment('evaluate.py', f'--workdir={workdir}', '--all_steps', f'--output_jsonl={out}/steps.jsonl',
                     f'--output_plot={out}/steps.png')
  assert r.returncode == 0, r.stderr[-3000:]
  warnings = [l for l in r.stdout.splitlines() if 'unusable' in l]
  assert len(warnings) == 1 and warnings[0].startswith('warning: checkpoint step 2 ') and 'skipped' in warnings[0]
  assert r.stderr.strip() == '', r.stderr[-3000:]
  with open(out / 'steps.jsonl', encoding='utf-8') as f:
    assert [json.loads(l)['step'] for l in f] == [4]
  assert os.path.getsize(out / 'steps.png') > 0
  assert tree_digest(workdir) == before  # evaluation reads only
  _damage_array_data(workdir, 4)
  assert_one_line_error(run_experiment('evaluate.py', f'--workdir={workdir}', '--all_steps', f'--output_jsonl={out}/x'),
                        'no usable checkpoint')


# --- a resume that changes the request, not a corrupt checkpoint ---------------------------------

def test_resume_with_another_optimizer_never_moves_a_checkpoint(trained, tmp_path, capsys):
  cfg, workdir = _copy(trained, tmp_path)
  before = tree_digest(workdir)
  lamb = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, name='lamb'), num_train_steps=6)
  with pytest.raises(CheckpointError, match=r"holds another run \(step 4\): optim.name: 'adamw' -> 'lamb'"):
    pretraining.train_and_evaluate(dataclasses.replace(lamb, resume_allow='num_train_steps'), workdir)
  assert tree_digest(workdir) == before
  saved, _ = restore_pretraining_state(workdir, cfg, 4)
  result = pretraining.train_and_evaluate(dataclasses.replace(lamb, resume_allow='optim,num_train_steps'), workdir)
  out = capsys.readouterr().out
  assert 'restored step 4: parameters, step and RNG' in out and 'starts fresh' in out
  assert 'unusable' not in out and not os.path.exists(os.path.join(workdir, checkpointing.CORRUPT_DIR))
  assert result['step'] == 6 and Checkpointer(workdir, read_only=True).all_steps() == [2, 4, 6]
  state, meta = restore_pretraining_state(workdir, dataclasses.replace(lamb, resume_allow='optim'), 6)
  assert meta['config']['optim']['name'] == 'lamb' and int(state['step']) == 6
  # Evaluating any step reads parameters only, whichever optimizer wrote it.
  assert pretraining.evaluate_checkpoint(workdir, step=4)['step'] == 4
  np.testing.assert_array_equal(restore_pretraining_state(workdir, cfg, 4)[0]['params']['nsp']['kernel'],
                                saved['params']['nsp']['kernel'])


def test_a_readable_checkpoint_is_never_moved_aside(trained, tmp_path, monkeypatch):
  cfg, workdir = _copy(trained, tmp_path)
  before = tree_digest(workdir)

  def refuse(self, step, target, partial):  # a request the checkpoint cannot serve (e.g. an unloadable layout)
    raise ValueError('cannot place these arrays')

  monkeypatch.setattr(Checkpointer, '_read_state', refuse)
  with pytest.raises(CheckpointError, match=r'checkpoint step 4 .* reads, but not into this run\'s state'):
    pretraining.train_and_evaluate(dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps'), workdir)
  assert tree_digest(workdir) == before


def test_unknown_resume_allow_names_are_refused(trained, tmp_path):
  cfg, workdir = _copy(trained, tmp_path)
  before = tree_digest(workdir)
  with pytest.raises(ConfigError, match='resume_allow names no config field: num_steps, optimizer'):
    pretraining.train_and_evaluate(dataclasses.replace(cfg, resume_allow='num_steps,optim.name,optimizer'), workdir)
  assert tree_digest(workdir) == before


# --- one run per workdir ------------------------------------------------------------------------

@pytest.mark.e2e
def test_second_run_on_a_workdir_is_refused_and_a_stale_lock_taken_over(trained, tmp_path):
  cfg, workdir = _copy(trained, tmp_path)
  other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
  try:
    lock = os.path.join(workdir, workdir_lib.LOCK_FILE)
    with open(lock, 'w', encoding='utf-8') as f:
      json.dump({'host': os.uname().nodename, 'pid': other.pid, 'start': files._start_time(other.pid)}, f)
    before = tree_digest(workdir)
    with pytest.raises(ConfigError, match=f'in use by pid {other.pid}'):
      pretraining.train_and_evaluate(cfg, workdir)
    assert tree_digest(workdir) == before
  finally:
    other.kill()
    other.wait()
  warnings = []
  with workdir_lib.claim(workdir, 'pretraining', log=warnings.append):  # the holder is gone
    assert json.load(open(lock))['pid'] == os.getpid()
  assert 'taking over the lock' in warnings[0] and not os.path.exists(lock)


# --- finite state -------------------------------------------------------------------------------

def test_finetuning_never_saves_an_exploded_state(tiny_checkpoint, tmp_path):
  cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=shared_data_or_skip('sst2'),
                        max_seq_length=32, batch_size=16, eval_batch_size=64, learning_rate=1e8,
                        warmup_ratio=0.0, num_train_steps=6, max_train_samples=32, log_every=100,
                        checkpoint_every=2)
  with pytest.raises(BertJaxError, match='seed 0: the (parameters exploded|loss became)'):
    finetuning.finetune(cfg, str(tmp_path))
  assert Checkpointer(str(tmp_path / 'seed_0'), read_only=True).all_steps() == []


# --- safe resume --------------------------------------------------------------------------------

@pytest.mark.parametrize('change,field', [(dict(batch_size=32), 'batch_size: 16 -> 32'),
                                          (dict(num_train_steps=8), 'num_train_steps: 4 -> 8'),
                                          (dict(seed=1), 'seed: 0 -> 1')])
def test_resume_of_another_run_is_refused_untouched(trained, tmp_path, change, field):
  cfg, workdir = _copy(trained, tmp_path)
  before = tree_digest(workdir)
  with pytest.raises(CheckpointError, match=f'holds another run .*{field}.*resume_allow='):
    pretraining.train_and_evaluate(dataclasses.replace(cfg, **change), workdir)
  assert tree_digest(workdir) == before


def test_a_named_change_resumes_and_the_config_history_keeps_the_old_one(trained, tmp_path):
  cfg, workdir = _copy(trained, tmp_path)
  result = pretraining.train_and_evaluate(dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps'),
                                        workdir)
  assert result['step'] == 6
  with open(os.path.join(workdir, workdir_lib.HISTORY_FILE), encoding='utf-8') as f:
    history = [json.loads(line) for line in f]
  assert [h['config']['num_train_steps'] for h in history] == [4]
  assert json.load(open(os.path.join(workdir, 'config.json')))['num_train_steps'] == 6


def test_a_run_resumes_after_its_corpus_and_cache_move_and_old_fingerprints_are_accepted(pretrained_run, tmp_path,
                                                                                            monkeypatch, capsys):
  # The data is named by its contents: moved (another checkout, mount point), the run and its cache are found.
  # The shared run (conftest.py) with its corpus and cache, copied away from where it was trained, then moved.
  old, new = tmp_path / 'old', tmp_path / 'new'
  old.mkdir()
  shutil.copy(pretrained_run.corpus, old / 'corpus.txt')
  shutil.copytree(pretrained_run.cache, old / 'cache')
  shutil.copytree(pretrained_run.workdir, old / 'run')
  cfg = pretrained_run.cfg
  shutil.move(str(old), str(new))
  moved = dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps',
                              data=dataclasses.replace(cfg.data, train_files=str(new / 'corpus.txt'),
                                                       cache_dir=str(new / 'cache')))
  capsys.readouterr()
  resumed = pretraining.train_and_evaluate(moved, str(new / 'run'))
  # The final JSON states the run's steps; the steps of this invocation have their own name.
  assert (resumed['step'], resumed['train_steps'], resumed['train_steps_this_invocation']) == (6, 6, 2)
  out = capsys.readouterr().out
  assert 'prepared data: reusing' in out and 'at step 4 ' in out, out
  # A run of an earlier version: its checkpoints name the data by the path-keyed fingerprint; same files, resumed.
  from bert_jax.data import cache_identity  # pylint: disable=g-import-not-at-top
  fingerprints = cache_identity.fingerprints
  with monkeypatch.context() as m:
    m.setattr(cache_identity, 'fingerprints', lambda *a: (fingerprints(*a)[1],) * 2)
    pretraining.train_and_evaluate(dataclasses.replace(moved, num_train_steps=4), str(tmp_path / 'earlier'))
  assert pretraining.train_and_evaluate(moved, str(tmp_path / 'earlier'))['step'] == 6
  assert 'at step 4 ' in capsys.readouterr().out
  # An earlier version's cache (named by the files' paths) serves the new name through a link, not a rebuild.
  cache = new / 'cache'
  content, legacy = fingerprints(moved.data, [str(new / 'corpus.txt')], [], None, moved.model.vocab_size, moved.seed)
  shutil.rmtree(cache / legacy)  # the earlier-version run's above: one cache of each name to start from
  os.rename(cache / content, cache / legacy)
  capsys.readouterr()
  assert pretraining.train_and_evaluate(dataclasses.replace(moved, num_train_steps=7), str(new / 'run'))['step'] == 7
  out = capsys.readouterr().out
  assert 'an earlier version prepared' in out and 'prepared data written' not in out, out
  assert os.readlink(cache / content) == legacy
  # Other contents are still another run's data.
  with open(new / 'corpus.txt', 'a', encoding='utf-8') as f:
    f.write('One more line of text .\n')
  with pytest.raises(CheckpointError, match='data_fingerprint'):
    pretraining.train_and_evaluate(dataclasses.replace(moved, num_train_steps=9), str(new / 'run'))


# --- one error line, files unchanged ------------------------------------------------------------

@pytest.mark.e2e
def test_bad_inputs_are_one_error_line_and_change_nothing(trained, tmp_path):
  cfg, workdir = _copy(trained, tmp_path)
  finetune_dir = str(tmp_path / 'ft')
  os.makedirs(finetune_dir)
  with open(os.path.join(finetune_dir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({'finetune': {'task': 'sst2'}, 'model': {}, 'task': {'name': 'sst2'}}, f)
  before = {d: tree_digest(d) for d in (workdir, finetune_dir)}
  pretrain = ('pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny')
  cases = [
      (pretrain + ('--config.optim.lr=1',), 'unknown field optim.lr in --config.optim.lr'),
      (pretrain + ('--config=experiments/configs/pretrain.py:nosuch',), "unknown pretrain config variant 'nosuch'"),
      (pretrain + ('--config.optim.learning_rate=-1e-4',), 'learning_rate must be a positive number'),
      (('pretrain.py', f'--workdir={finetune_dir}'), 'is a finetuning directory, not a pretraining one'),
      (('finetune.py', f'--workdir={workdir}', f'--config.init_checkpoint={tmp_path}/none'),
       'is a pretraining directory, not a finetuning one'),
      (('evaluate.py', f'--workdir={finetune_dir}', '--all_steps'), '--all_steps apply to pretraining workdirs'),
      (('evaluate.py', f'--workdir={finetune_dir}', '--config.max_eval_batches=2'),
       '--config.max_eval_batches apply to pretraining workdirs'),
      (('export_hf.py', f'--checkpoint={workdir}', f'--output={workdir}', '--overwrite'),
       'is (or holds, or is inside) the checkpoint being exported'),
      (('fill_mask.py', f'--checkpoint={workdir}', '--text=' + 'word ' * 600 + '[MASK].'),
       "lie beyond the model's 512 positions"),
      (('attention.py', f'--checkpoint={workdir}', '--text=a', f'--output={workdir}/config.json'), 'is a file'),
  ]
  for args, message in cases:
    assert_one_line_error(run_main(*args), message)
  assert {d: tree_digest(d) for d in (workdir, finetune_dir)} == before


# --- inputs that are not regular files ----------------------------------------------------------

@contextlib.contextmanager
def _within(seconds):
  """Fails the block if it takes longer (a read of a FIFO would block forever)."""
  def expire(signum, frame):
    raise TimeoutError(f'still blocked after {seconds} s')
  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.e2e
def test_pipes_and_devices_are_refused_before_any_read(trained, tiny_checkpoint, tmp_path):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('the timeout needs the main thread')
  from bert_jax import inference  # pylint: disable=g-import-not-at-top
  from bert_jax.data import corpus_files, records, tokenization  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import pretrained
  cfg, workdir = trained
  fifo = str(tmp_path / 'fifo')
  os.mkfifo(fifo)
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  write_small_corpus(corpus)
  os.mkfifo(corpus / 'pipe.txt')  # beside a good file
  hf_dir = str(tmp_path / 'hf')
  shutil.copytree(tiny_checkpoint, hf_dir)
  os.remove(os.path.join(hf_dir, 'config.json'))
  os.mkfifo(os.path.join(hf_dir, 'config.json'))
  cache = str(tmp_path / 'cache')
  shutil.copytree(json.load(open(os.path.join(workdir, 'config.json')))['data']['cache_dir'], cache)
  data_dir = glob.glob(os.path.join(cache, '*', 'meta.json'))[0][:-len('/meta.json')]
  os.remove(os.path.join(data_dir, 'train.index.npy'))
  os.mkfifo(os.path.join(data_dir, 'train.index.npy'))
  cases = [(lambda: corpus_files.resolve_files(fifo), 'is a FIFO (named pipe), not a regular file'),
           (lambda: corpus_files.resolve_files('/dev/zero'), 'is a character device'),
           (lambda: corpus_files.resolve_files(str(corpus)), 'pipe.txt is a FIFO'),
           (lambda: corpus_files.resolve_files(str(corpus / '*.txt')), 'pipe.txt is a FIFO'),
           (lambda: tokenization.load_tokenizer(fifo), 'tokenizer'),
           (lambda: inference.read_texts(fifo), 'input file'),
           (lambda: inference.read_texts('/dev/zero'), 'is a character device'),
           (lambda: pretrained.load_pretrained(hf_dir), 'config.json is a FIFO'),
           (lambda: records.load_prepared_data(data_dir), 'train.index.npy is a FIFO')]
  for call, message in cases:
    with _within(20), pytest.raises(BertJaxError, match=re.escape(message)):
      call()
  corpus_flag = f'--config.data.train_files={corpus}'
  for args, message in ((('pretrain.py', f'--workdir={tmp_path}/run', corpus_flag), 'pipe.txt is a FIFO'),
                        (('embed.py', f'--checkpoint={tiny_checkpoint}', f'--input={fifo}',
                          f'--output={tmp_path}/e.npz'), 'is a FIFO'),
                        (('benchmark_data.py', f'--corpus={tmp_path}/empty.txt', '--synthesize_mb=1',
                          f'--scratch={tmp_path}/bench'), 'are all empty')):
    if 'benchmark_data.py' in args:
      open(tmp_path / 'empty.txt', 'w').close()
    with _within(120):  # in this process: a blocked read fails the test instead of hanging it
      assert_one_line_error(run_main(*args), message)
  assert not os.path.exists(tmp_path / 'run') and not os.path.exists(tmp_path / 'bench')


# --- non-finite weights given to inference or to continued pretraining ---------------------------

@pytest.mark.e2e
def test_a_checkpoint_with_nan_weights_is_one_line(trained, tiny_checkpoint, tmp_path):
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  nan_dir = str(tmp_path / 'nan')
  shutil.copytree(tiny_checkpoint, nan_dir)
  weights = os.path.join(nan_dir, 'model.safetensors')
  st_numpy.save_file({k: np.full_like(v, np.nan) for k, v in st_numpy.load_file(weights).items()}, weights)
  before = tree_digest(nan_dir)
  (tmp_path / 'texts.txt').write_text('A sentence.\n')
  assert_one_line_error(run_main('embed.py', f'--checkpoint={nan_dir}', f'--input={tmp_path}/texts.txt',
                                 f'--output={tmp_path}/e.npz'), 'contain NaN or Inf')
  cfg, _ = _copy(trained, tmp_path)  # its own cache: the checkpoint's tokenizer would prepare data there
  with pytest.raises(CheckpointError, match='contain NaN or Inf'):
    pretraining.train_and_evaluate(dataclasses.replace(cfg, init_checkpoint=nan_dir), str(tmp_path / 'continued'))
  assert tree_digest(nan_dir) == before and not os.path.exists(tmp_path / 'e.npz')


@pytest.mark.e2e
def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(small_corpus, tmp_path):
  # A 4 MB filesystem: the tiny model's first checkpoint (2.3 MB) fits, the second not.
  # The failing run is a process of its own: the check is all of its stderr (Orbax's writes log outside sys.stderr).
  with tmpfs(tmp_path / 'smallfs', '4M') as fs:
    workdir, cache = os.path.join(fs, 'run'), str(tmp_path / 'cache')
    cmd = pretrain_subprocess(small_corpus, cache, workdir, 12, extra=('--config.checkpoint_every=4',))
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    errors = [l for l in r.stderr.splitlines() if l.startswith('error:')]
    assert r.returncode == 1 and len(errors) == 1, r.stderr[-3000:]
    assert 'No space left on device; the last complete checkpoint (step 4) is kept' in errors[0]
    # Nothing but that line: the free-space check refuses the save before Orbax starts writing.
    assert [l for l in r.stderr.splitlines() if l.strip()] == errors, r.stderr[-3000:]
    subprocess.run(['mount', '-o', 'remount,size=64M', fs], check=True)
    r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, workdir, 12, ('--config.checkpoint_every=4',)))
    assert r.returncode == 0 and 'resumed from' in r.stdout and 'at step 4 ' in r.stdout, r.stderr[-3000:]


@pytest.mark.e2e
def test_read_only_filesystem_is_one_line_and_changes_nothing(small_corpus, tmp_path):
  # The refused runs are processes of their own (no traceback anywhere in their stderr, Orbax's included); the run
  # that writes the workdir first and the evaluation that reads it run in this process.
  with tmpfs(tmp_path / 'rofs', '64M') as fs:
    workdir, cache = os.path.join(fs, 'run'), str(tmp_path / 'cache')
    r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, workdir, 4))
    assert r.returncode == 0, r.stderr[-3000:]
    subprocess.run(['mount', '-o', 'remount,ro', fs], check=True)
    before = tree_digest(fs)
    more = pretrain_subprocess(small_corpus, cache, workdir, 8, extra=('--config.resume_allow=num_train_steps',))
    assert_one_line_error(subprocess.run(more, cwd=REPO, capture_output=True, text=True, timeout=600),
                          'Read-only file system')
    fresh = pretrain_subprocess(small_corpus, cache, os.path.join(fs, 'new'), 4)
    assert_one_line_error(subprocess.run(fresh, cwd=REPO, capture_output=True, text=True, timeout=600),
                          'Read-only file system')
    r = run_main('evaluate.py', f'--workdir={workdir}')  # reading still works
    assert r.returncode == 0 and 'mlm_accuracy' in r.stdout, r.stderr[-3000:]
    assert tree_digest(fs) == before
