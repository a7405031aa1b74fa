"""fit() with a toy objective, in the fast tier: it trains, logs, evaluates and saves on its cadence, resumes
bitwise from a checkpoint with its data position, and stops on a NaN loss naming the last good checkpoint."""

import json
import os
import random
import re
import signal
import threading
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.errors import Preempted
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train import loop
from bert_jax.train.loop import Report, TrainingDivergedError, fit
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel

ROWS, WIDTH = 16, 4


class _Regression(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(WIDTH, 1, rngs=rngs)


class _Squares:
  """A toy Objective: the summed squared error of a linear model (one loss term, counted per row); `burn`
  matmuls of 256 x 256 first make each step slow on the device, as a large model would."""

  terms = ('mse',)
  couples_rows = False

  def __init__(self, burn=0):
    self.burn = burn

  def forward(self, module, batch, *, deterministic):
    del deterministic
    x = batch['x']
    if self.burn:
      # A matrix of 1/256 squares to itself exactly (sums of 256 powers of two): each product is a 256 x 256
      # matmul whatever XLA's emitters (a tanh between them ran 2.5x slower under the tests' loop emitters).
      a = jnp.full((256, 256), 1 / 256, jnp.float32) * (1.0 + 0.0 * x[0, 0])
      a = jax.lax.fori_loop(0, self.burn, lambda i, a: a @ a, a)
      x = x + jnp.where(a[0, 0] == 12345.5, 1.0, 0.0)  # zero, but only the burn's result says so
    return module.dense(x)[:, 0]

  def sums(self, outputs, batch):
    return {'mse_loss_sum': jnp.sum((outputs - batch['y']) ** 2), 'mse_count': jnp.float32(batch['y'].shape[0])}

  def counts(self, batch):
    return {'mse': jnp.float32(batch['y'].shape[0])}

  def summarize(self, sums):
    return {'loss': sums['mse_loss_sum'] / jnp.maximum(sums['mse_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux):
    del aux
    return self.sums(outputs, batch)


class _Batches:
  """Batch k is a pure function of k: y = x . w_true (+ NaN from batch `nan_at` on)."""

  def __init__(self, start=0, nan_at=None):
    self.position, self.nan_at = start, nan_at
    self.last_sizes = None

  def __next__(self):
    rng = np.random.default_rng(self.position)
    x = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    y = x @ np.arange(1, WIDTH + 1, dtype=np.float32)
    if self.nan_at is not None and self.position >= self.nan_at:
      y[:] = np.nan
    self.position += 1
    self.last_sizes = {'rows': ROWS, 'row_tokens': ROWS * WIDTH, 'real_tokens': ROWS * WIDTH, 'examples': ROWS}
    return {'x': x, 'y': y, 'input_ids': np.zeros((ROWS, WIDTH), np.int32)}

  def close(self):
    pass


def _model(burn=0, devices=None):
  return StepModel(_Regression, _Squares(burn), optax.sgd(0.2),
                   sharding.make_mesh(config.MeshConfig(data=len(devices or jax.devices())), devices))


def _fit(model, workdir, state, batches, total, save_every=3, log_every=2, **kw):
  ckpt = Checkpointer(str(workdir), save_every=save_every, keep=5)
  try:
    with Preemption() as preempt:
      return fit(model, state, batches, total_steps=total, ckpt=ckpt, preempt=preempt, report=Report(str(workdir)),
                 log_every=log_every, checkpoint_config={'toy': True}, **kw)
  finally:
    ckpt.close()


@pytest.fixture(autouse=True)
def _main_thread():
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers need the main thread')


def test_fit_trains_logs_evaluates_and_saves_on_its_cadence(tmp_path, capsys):
  model = _model()
  evaluated = []
  def evaluate(params, step):
    evaluated.append(step)
    batch = model.global_batch(_Batches(100).__next__())
    sums = jax.device_get(model.eval_step(params, model.rest, batch, None))
    return {'mse': float(sums['mse_loss_sum'] / sums['mse_count'])}
  result = _fit(model, tmp_path, model.init_state(seed=0), _Batches(), 6, evaluate=evaluate, eval_every=4)
  assert result.step == 6 and result.stats['train_steps_this_invocation'] == 6
  assert evaluated == [4, 6] and result.last_eval['mse'] < 1.0  # y = x . (1, 2, 3, 4) is learnt
  with open(tmp_path / 'metrics_train.jsonl', encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f]
  assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]  # steps 2, 4, 6
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [3, 6]
  out = capsys.readouterr().out
  assert 'step 6/6 | loss' in out and 'eval step 4 | mse' in out and 'ETA' in out
  # The first step of a shape compiles: one line before it, one with its time after (no silent minute).
  lines = out.splitlines()
  assert [l for l in lines if l.startswith('compiling the train step for')] == [lines[0]]
  assert re.fullmatch(r'train step compiled in \d+\.\d s', lines[1]), lines[1]


def test_train_wall_s_leaves_out_the_evaluations(tmp_path):
  # A peer's trainer times its training alone: evaluating on the way (here 0.6 s per evaluation) is not training.
  model = _model()
  model.train_step(model.init_state(seed=0), model.global_batch(next(_Batches())), model.rest)  # compiled before
  def evaluate(params, step):
    del params, step
    time.sleep(0.6)
    return {'mse': 0.0}
  t0 = time.time()
  result = _fit(model, tmp_path, model.init_state(seed=0), _Batches(), 4, evaluate=evaluate, eval_every=2)
  wall = time.time() - t0
  assert wall > 1.2 and result.stats['train_wall_s'] < wall - 1.2 + 0.05  # two evaluations left out


def test_fit_resumes_bitwise_from_a_checkpoint(tmp_path):
  model = _model()
  straight = _fit(model, tmp_path / 'straight', model.init_state(seed=0), _Batches(), 6)
  _fit(model, tmp_path / 'stopped', model.init_state(seed=0), _Batches(), 3)
  state, meta = Checkpointer(str(tmp_path / 'stopped'), read_only=True).restore(None, model.abstract_state)
  assert meta['data_position'] == 3
  resumed = _fit(model, tmp_path / 'stopped', state, _Batches(start=meta['data_position']), 6)
  for a, b in zip(jax.tree.leaves(jax.device_get(straight.state)), jax.tree.leaves(jax.device_get(resumed.state))):
    np.testing.assert_array_equal(a, b)


def test_a_nan_loss_stops_the_run_and_names_the_last_good_checkpoint(tmp_path):
  model = _model()
  with pytest.raises(TrainingDivergedError, match=r'the loss became nan at or before step 4; .*step 3\) is kept'):
    _fit(model, tmp_path, model.init_state(seed=0), _Batches(nan_at=3), 6)
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [3]  # nothing non-finite saved
  assert os.path.exists(tmp_path / 'metrics_train.jsonl')


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_a_random_moment_is_acknowledged_and_saves_within_two_steps(tmp_path, capfd, signum, monkeypatch):
  # Slow steps on one device (as the main job: jax's CPU client dispatches computations over several devices
  # synchronously) and no sync point for 30 steps: a host that ran ahead would queue them all before the save.
  model = _model(burn=400, devices=jax.devices()[:1])
  state, batches = model.init_state(seed=0), _Batches()
  times = []
  for _ in range(4):  # compiles, then measures the step time
    t = time.monotonic()
    state, metrics = model.train_step(state, model.global_batch(next(batches)), model.rest)
    jax.block_until_ready(metrics)
    times.append(time.monotonic() - t)
  step_s = max(times[1:])
  # "Within two steps" counted in steps, not timed (a busy machine stretches any time): the handler notes how many
  # of the steps dispatched so far had finished (steps finish in order) when the signal came.
  dispatched, finished_at_signal = [], []
  train_step = model.train_step
  def counted_step(*a):
    out = train_step(*a)
    dispatched.append(out[1])
    return out
  handle = Preemption._handle  # pylint: disable=protected-access
  def noting_handle(self, *a):
    finished_at_signal.append(sum(all(x.is_ready() for x in jax.tree.leaves(m)) for m in dispatched))
    handle(self, *a)
  monkeypatch.setattr(model, 'train_step', counted_step)
  monkeypatch.setattr(Preemption, '_handle', noting_handle)
  delay = random.uniform(3, 6) * step_s  # a random moment, some steps into training
  def send():
    time.sleep(delay)
    os.kill(os.getpid(), signum)
  capfd.readouterr()
  threading.Thread(target=send, daemon=True).start()
  with pytest.raises(Preempted) as stopped:
    _fit(model, tmp_path, model.init_state(seed=0), _Batches(), 30, save_every=100, log_every=100)
  err = capfd.readouterr().err
  name = signal.Signals(signum).name
  ack = re.search(rf'^{name} received: finishing step (\d+), then saving$', err, re.M)
  assert ack and err.lstrip().startswith(ack.group(0)), (delay, err)  # the acknowledgement, before anything else
  saved = int(ack.group(1))
  assert f'{name} received: saved step {saved}.' in str(stopped.value)
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [saved] and saved < 30
  # At most two steps in flight: the step the handler names is at most two past the last finished one.
  assert len(finished_at_signal) == 1 and saved <= finished_at_signal[0] + 2, (saved, finished_at_signal, delay)


def test_curves_are_drawn_at_most_once_a_minute_and_when_the_run_ends(tmp_path, monkeypatch):
  drawn = []
  monkeypatch.setattr(loop.reporting, 'write_curves', lambda directory, metrics=None: drawn.append(directory))
  monkeypatch.setattr(loop.reporting, 'log', lambda line: None)
  rate = {'tokens_per_s': 1.0, 'examples_per_s': 1.0, 'input_wait': 0.0, 'eta_s': 1.0, 'packed': False}
  writers = loop._Writers(loop.Report(str(tmp_path), curves_dir=str(tmp_path)))  # pylint: disable=protected-access
  writers.progress(1, 6, [{'loss': 1.0}], rate)
  writers.evaluation(2, {'loss': 0.95})
  assert drawn == []  # within the first minute: none yet (a short run draws when it ends)
  monkeypatch.setattr(loop, 'CURVES_EVERY_S', 0.0)
  writers.progress(3, 6, [{'loss': 0.9}], rate)
  assert drawn == [str(tmp_path)]  # a minute on: the progress line draws them
  writers.evaluation(4, {'loss': 0.8})
  assert drawn == [str(tmp_path)] * 2  # and so does an evaluation
  monkeypatch.setattr(loop, 'CURVES_EVERY_S', 60.0)
  writers.progress(5, 6, [{'loss': 0.7}], rate)
  assert len(drawn) == 2
  writers.close()
  assert drawn == [str(tmp_path)] * 3  # the end draws the rows written since
  ended = loop._Writers(loop.Report(str(tmp_path / 'b'), curves_dir=str(tmp_path)))  # pylint: disable=protected-access
  ended.close()
  assert len(drawn) == 3  # nothing written: nothing to draw
  stopped = loop._Writers(loop.Report(str(tmp_path / 'c'), curves_dir=str(tmp_path)))  # pylint: disable=protected-access
  stopped.progress(1, 6, [{'loss': 1.0}], rate)
  stopped.close(draw=False)
  assert len(drawn) == 3  # a stop (a signal) leaves at once: the resumed run draws


def test_slow_steps_between_progress_lines_say_where_the_run_is(tmp_path, capsys, monkeypatch):
  """A step taking longer than HEARTBEAT_S since the last line prints the step and the ETA (no metrics, no sync),
  so a run with far-apart progress lines is never silent for long; the metric files are unchanged."""
  model = _model()
  monkeypatch.setattr(loop, 'HEARTBEAT_S', 0.0)  # every step is "a long time" after the last line
  _fit(model, tmp_path, model.init_state(seed=0), _Batches(), 6, log_every=3)
  lines = capsys.readouterr().out.splitlines()
  beats = [l for l in lines if re.fullmatch(r'step \d/6 \| ETA \S+', l)]
  assert [l.split()[1] for l in beats] == ['1/6', '2/6', '4/6', '5/6'], lines
  assert [l.split(' |')[0] for l in lines if '| loss' in l] == ['step 3/6', 'step 6/6']
  with open(tmp_path / 'metrics_train.jsonl', encoding='utf-8') as f:
    assert [json.loads(line)['step'] for line in f] == [3, 6]


def test_a_stopped_fit_does_not_draw_and_its_resume_does_even_when_nothing_is_left(tmp_path, monkeypatch):
  """A signal leaves without drawing curves.png (the grace period is for the save); the resumed run draws, also when
  the stop saved the last step and nothing is left to train."""
  drawn = []
  monkeypatch.setattr(loop.reporting, 'write_curves', lambda directory, metrics=None: drawn.append(directory))
  model = _model()

  def run(state, batches, total):
    ckpt = Checkpointer(str(tmp_path), save_every=100, keep=5)
    try:
      with Preemption() as preempt:
        return fit(model, state, batches, total_steps=total, ckpt=ckpt, preempt=preempt, log_every=1,
                   report=Report(str(tmp_path), curves_dir=str(tmp_path)), checkpoint_config={'toy': True})
    finally:
      ckpt.close()

  with pytest.raises(Preempted, match='saved step'):
    run(model.init_state(seed=0), _SignalAt(3), 4)
  assert drawn == []
  saved = Checkpointer(str(tmp_path), read_only=True)
  step = saved.latest_step()
  state, _ = saved.restore(step, model.abstract_state)
  saved.close()
  run(state, _Batches(start=step), step)  # the stop saved the run's last step: nothing left to train
  assert drawn == [str(tmp_path)]


class _SignalAt(_Batches):
  """_Batches that send this process SIGTERM as batch `at` is drawn."""

  def __init__(self, at):
    super().__init__()
    self.at = at

  def __next__(self):
    if self.position == self.at:
      os.kill(os.getpid(), signal.SIGTERM)
    return super().__next__()
