"""Orbax checkpoints: bitwise round trip with data position, mismatched models named clearly."""

import logging
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.errors import CheckpointError
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.runs import checkpoints
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train import optim

from harness.inputs import random_pretraining_batch


def _model(hidden=64, devices=None):
  cfg = config.preset('tiny', vocab_size=100, hidden_size=hidden)
  mesh = sharding.make_mesh(config.MeshConfig(), devices)
  return pretraining_model(cfg, optim.make_optimizer(config.OptimConfig(), 10), mesh)


@pytest.mark.slow
def test_round_trip_is_bitwise_and_keeps_data_position(tmp_path):
  model = _model()
  state = model.init_state()
  state, _ = model.train_step(state, model.global_batch(random_pretraining_batch()), model.rest)
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=2)
  assert ckpt.save(1, state, data_position=7, config={'x': 1})
  ckpt.close()
  # Restore onto a different device layout (1 device): values must be identical.
  other = _model(devices=jax.devices()[:1])
  restored, meta = Checkpointer(str(tmp_path), read_only=True).restore(None, other.abstract_state)
  assert meta['data_position'] == 7 and meta['step'] == 1 and meta['config'] == {'x': 1}
  for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(jax.device_get(restored))):
    np.testing.assert_array_equal(a, b)
  assert restored['params']['bert']['pooler']['kernel'].sharding == \
      other.state_shardings['params']['bert']['pooler']['kernel']


@pytest.mark.parametrize('bad, problem', [
    (np.nan, 'contain NaN or Inf'), (-np.inf, 'contain NaN or Inf'), (np.inf, 'contain NaN or Inf'),
    (-2e6, 'exploded (largest magnitude 2e+06 > 1e+06)'), (-999_999.0, None)])
def test_state_problem_finds_one_bad_value_in_any_leaf(bad, problem):
  """One value among leaves of two dtypes, sharded over the 8 devices, decides."""
  mesh = sharding.make_mesh(config.MeshConfig())
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
  values = np.full((8, 2), 0.5, np.float32)
  values[5, 1] = bad
  params = {'a': jax.device_put(np.ones((8, 4), np.float32), rows),
            'b': {'c': np.zeros(3, jnp.bfloat16), 'd': jax.device_put(values, rows)}}
  found = checkpoints.state_problem(params)
  assert (found is None) if problem is None else (problem in found), found


@pytest.mark.slow
def test_keeps_last_k(tmp_path):
  model = _model()
  state = model.init_state()
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, state, data_position=step, config={})
  ckpt.close()
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [2, 3]


@pytest.mark.slow
def test_restoring_into_another_model_names_the_tensor(tmp_path):
  model = _model(hidden=64)
  ckpt = Checkpointer(str(tmp_path), save_every=1)
  ckpt.save(1, model.init_state(), data_position=0, config={})
  ckpt.close()
  with pytest.raises(CheckpointError, match=r'has shape \(.*64.*\) but the model expects \(.*32.*\)'):
    Checkpointer(str(tmp_path), read_only=True).restore(None, _model(hidden=32).abstract_state)
  with pytest.raises(CheckpointError, match='no checkpoint for step 5'):
    Checkpointer(str(tmp_path), read_only=True).restore(5, model.abstract_state)


@pytest.mark.slow
def test_the_best_left_is_kept_when_the_best_checkpoint_is_moved_aside(tmp_path):
  """keep_best: the best checkpoint turns out unreadable at a resume and is moved aside; the best of those
  left is then the one kept (it was deleted at the next saves while the gone step was still ranked)."""
  state = _model().init_state()
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=2, best_metric='acc')
  for step, acc in ((1, 0.9), (2, 0.5), (3, 0.6), (4, 0.95)):
    ckpt.save(step, state, data_position=step, config={}, metrics={'acc': acc})
  ckpt.close()
  for root, _, names in os.walk(os.path.join(str(tmp_path), 'checkpoints', '4', 'state')):
    for name in names:
      with open(os.path.join(root, name), 'r+b') as f:
        f.write(b'\x00' * max(os.path.getsize(os.path.join(root, name)), 1))
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=2, best_metric='acc')
  _, meta = ckpt.restore(None, _model().abstract_state, log=lambda line: None)
  assert meta['step'] == 3 and ckpt.best_step('acc') == 3
  for step, acc in ((5, 0.55), (6, 0.5)):
    ckpt.save(step, state, data_position=step, config={}, metrics={'acc': acc})
  ckpt.close()
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [3, 5, 6]


def test_late_reports_of_abandoned_reads_are_dropped_and_others_kept():
  """After a failed restore, tensorstore's reads still in flight report themselves one by one (thousands of
  lines); the checkpointer's hooks drop exactly those and pass every other report on."""
  passed_on = []
  before = sys.unraisablehook
  sys.unraisablehook = passed_on.append
  checkpoints._quiet_closed_loop_callbacks()  # pylint: disable=protected-access  # what Checkpointer() installs
  namespace = {}
  exec(compile('async def read_array():\n  pass\n', '/site-packages/orbax/checkpoint/fake.py', 'exec'), namespace)
  orbax_coroutine = namespace['read_array']()
  async def ours():
    pass
  our_coroutine = ours()
  data_loss = ValueError('DATA_LOSS: Error opening "zarr" driver: Error reading "params.x/.zarray" in OCDBT database')
  for exc, origin, dropped in ((RuntimeError('Event loop is closed'), None, True),
                               (RuntimeError('coroutine ignored GeneratorExit'), our_coroutine, True),
                               (ValueError('anything'), orbax_coroutine, True),
                               (data_loss, None, True),
                               (ValueError('a bug of ours'), our_coroutine, False)):
    sys.unraisablehook(types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                             err_msg='Exception ignored in', object=origin))
    assert bool(passed_on and passed_on[-1].exc_value is exc) == (not dropped), exc
  sys.unraisablehook = before
  orbax_coroutine.close()
  our_coroutine.close()
  asyncio_log = logging.getLogger('asyncio')
  def shown(message, *args, exc=None):
    record = asyncio_log.makeRecord('asyncio', logging.ERROR, 'base_events.py', 1, message, args,
                                    (type(exc), exc, None) if exc else None)
    return bool(asyncio_log.filter(record))
  assert not shown('Future exception was never retrieved\nfuture: <Future finished exception=%r>', data_loss)
  assert not shown('Task exception was never retrieved', exc=data_loss)
  assert not shown('Task was destroyed but it is pending!\ntask: <Task pending coro=<read() running at '
                   '/site-packages/orbax/checkpoint/fake.py:1>>')
  assert shown('Task exception was never retrieved', exc=ValueError('a bug of ours'))
  assert shown('Executing <Task> took 0.5 seconds')


def test_keep_best_ranks_an_earlier_versions_squad_percents_as_fractions(tmp_path, monkeypatch):
  """A SQuAD run saved by an earlier version (F1 in percents, no scale mark) and resumed now (fractions): the
  best is the highest F1 in one scale, not every old checkpoint above every new one."""
  state = {'w': np.zeros(4, np.float32)}
  squad = {'task': 'squad'}
  monkeypatch.setattr(checkpoints, 'METRIC_SCALE', {})  # what the earlier version wrote
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=1, best_metric='eval_f1')
  for step, f1 in ((1, 40.0), (2, 55.0)):
    ckpt.save(step, state, data_position=step, config=squad, metrics={'eval_f1': f1})
  ckpt.close()
  monkeypatch.undo()
  ckpt = Checkpointer(str(tmp_path), save_every=1, keep=1, best_metric='eval_f1')
  assert ckpt.best_step('eval_f1') == 2
  ckpt.save(3, state, data_position=3, config=squad, metrics={'eval_f1': 0.6})
  ckpt.save(4, state, data_position=4, config=squad, metrics={'eval_f1': 0.5})
  ckpt.close()
  again = Checkpointer(str(tmp_path), read_only=True, best_metric='eval_f1')
  assert again.best_step('eval_f1') == 3 and again.all_steps() == [3, 4]
  # GLUE's F1 was a fraction already: the same numbers of an MRPC run are taken as written.
  assert checkpoints.upgrade_metrics({'eval_f1': 0.55}, 'mrpc') == {'eval_f1': 0.55}



@pytest.mark.slow
def test_cpu_saves_copy_whole_arrays_and_read_what_replica_parallel_saves_wrote(tmp_path, monkeypatch):
  """On CPU devices a save copies each replicated array to the host whole (replica-parallel slices were 2-3x a
  save's time there); the values are the same, and a checkpoint an earlier version saved in slices reads back."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from orbax.checkpoint._src.serialization import replica_slices  # pylint: disable=g-import-not-at-top
  model = _model(hidden=32)  # data parallel over the 8 devices: every parameter replicated 8 times
  state = model.init_state()
  seen, transfer = [], replica_slices.transfer_arrays_to_host

  def spy(arrays, replica_id, use_replica_parallel, *args, **kwargs):
    seen.append(use_replica_parallel)
    return transfer(arrays, replica_id, use_replica_parallel, *args, **kwargs)

  monkeypatch.setattr(replica_slices, 'transfer_arrays_to_host', spy)
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  monkeypatch.setattr(handler, '_use_replica_parallel', True)  # as Orbax sets it for CPU devices
  ckpt = Checkpointer(str(tmp_path / 'whole'), save_every=1)
  assert ckpt.save(1, state, data_position=0, config={})
  ckpt.close()
  assert seen and not any(seen)
  # An earlier version's save, in replica-parallel slices (Orbax's default on CPU): the same values back.
  sliced = Checkpointer(str(tmp_path / 'sliced'), save_every=1)
  monkeypatch.setattr(handler, '_use_replica_parallel', True)
  seen.clear()
  assert sliced.save(1, state, data_position=0, config={})
  sliced.close()
  assert seen and all(seen)
  for name in ('whole', 'sliced'):
    restored, _ = Checkpointer(str(tmp_path / name), read_only=True).restore(None, model.abstract_state)
    for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(jax.device_get(restored))):
      np.testing.assert_array_equal(a, b)


def test_close_waits_for_the_clean_up_of_killed_saves(tmp_path, monkeypatch):
  # The manager cleans up killed saves' temporary directories in a thread of its own; a close that returned before it
  # ended left it to fail at interpreter shutdown ("cannot schedule new futures after interpreter shutdown", a
  # 42-line traceback after a run's error line). Here the clean-up is slow, as on a bucket's listing.
  import asyncio  # pylint: disable=g-import-not-at-top

  from orbax.checkpoint._src.path import temporary_paths  # pylint: disable=g-import-not-at-top
  cleanup = temporary_paths.cleanup_temporary_paths

  async def slow_cleanup(*args, **kwargs):
    await asyncio.sleep(1)
    return await cleanup(*args, **kwargs)

  monkeypatch.setattr(temporary_paths, 'cleanup_temporary_paths', slow_cleanup)
  (tmp_path / 'run' / 'checkpoints' / '3.orbax-checkpoint-tmp-1').mkdir(parents=True)  # a save killed mid-way
  Checkpointer(str(tmp_path / 'run')).close()
  assert os.listdir(tmp_path / 'run' / 'checkpoints') == []  # the clean-up ran to its end before close returned
