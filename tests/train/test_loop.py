"""fit() with a toy objective, in the fast tier: it trains, logs, evaluates and saves on its cadence, resumes
bitwise from a checkpoint with its data position, and stops on a NaN loss naming the last good checkpoint."""

import json
import os
import threading

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train.loop import Report, TrainingDivergedError, fit
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel

ROWS, WIDTH = 16, 4


class _Regression(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(WIDTH, 1, rngs=rngs)


class _Squares:
  """A toy Objective: the summed squared error of a linear model (one loss term, counted per row)."""

  terms = ('mse',)

  def forward(self, module, batch, *, deterministic):
    del deterministic
    return module.dense(batch['x'])[:, 0]

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


def _model():
  return StepModel(_Regression, _Squares(), optax.sgd(0.2), sharding.make_mesh(config.MeshConfig()))


def _fit(model, workdir, state, batches, total, **kw):
  ckpt = Checkpointer(str(workdir), save_every=3, keep=5)
  try:
    with Preemption() as preempt:
      return fit(model, state, batches, total_steps=total, ckpt=ckpt, preempt=preempt, report=Report(str(workdir)),
                 log_every=2, checkpoint_config={'toy': True}, **kw)
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
  assert result.step == 6 and result.stats['train_steps'] == 6
  assert evaluated == [4, 6] and result.last_eval['mse'] < 1.0  # y = x . (1, 2, 3, 4) is learnt
  with open(tmp_path / 'metrics_train.jsonl', encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f]
  assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]  # steps 2, 4, 6
  assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [3, 6]
  out = capsys.readouterr().out
  assert 'step 6/6 | loss' in out and 'eval step 4 | mse' in out and 'ETA' in out


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
