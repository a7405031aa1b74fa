"""The pure train step: data parallel == 1 device, accumulation == big batch, it learns, no re-tracing."""

import jax
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

from harness.inputs import random_pretraining_batch
from harness.numerics import tolerance

OPT = config.OptimConfig(learning_rate=1e-3, warmup_steps=1)


def _model(devices, accum=1, dropout=0.1, opt=OPT, total_steps=10):
  cfg = config.preset('tiny', vocab_size=100, hidden_dropout=dropout, attention_dropout=dropout)
  mesh = sharding.make_mesh(config.MeshConfig(data=len(devices)), devices)
  return pretraining_model(cfg, optim.make_optimizer(opt, total_steps), mesh,
                          grad_accum_steps=accum, schedule=optim.learning_rate_schedule(opt, total_steps))


def _run(model, steps=3, batch=None):
  state = model.init_state()
  batch = model.global_batch(batch or random_pretraining_batch())
  history = []
  for _ in range(steps):
    state, metrics = model.train_step(state, batch, model.rest)
    history.append(jax.device_get(metrics))
  return jax.device_get(state), history


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
             zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
def test_data_parallel_step_equals_single_device():
  assert jax.device_count() == 8
  state8, hist8 = _run(_model(jax.devices()))
  state1, hist1 = _run(_model(jax.devices()[:1]))
  close = tolerance(np.float32, 256, depth=2)  # the tiny model's widest sums, in each of its 2 layers
  for m8, m1 in zip(hist8, hist1):
    np.testing.assert_allclose(m8['loss'], m1['loss'], rtol=close)
    np.testing.assert_allclose(m8['grad_norm'], m1['grad_norm'], rtol=close)
  assert _max_diff(state8['params'], state1['params']) < 1e-6


@pytest.mark.slow
def test_params_are_replicated_and_batch_is_split_over_data_axis():
  model = _model(jax.devices())
  state = model.init_state()
  emb = state['params']['bert']['embeddings']['word_embeddings']['embedding']
  assert emb.sharding.is_fully_replicated
  batch = model.global_batch(random_pretraining_batch())
  assert batch['input_ids'].addressable_shards[0].data.shape == (2, 16)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
  # Without dropout the accumulated micro-batches must give the big batch's update.
  s1, h1 = _run(_model(jax.devices(), accum=1, dropout=0.0), steps=2)
  s2, h2 = _run(_model(jax.devices(), accum=2, dropout=0.0), steps=2)
  np.testing.assert_allclose(h1[-1]['loss'], h2[-1]['loss'], rtol=tolerance(np.float32, 256, depth=2))
  assert _max_diff(s1['params'], s2['params']) < 1e-5


@pytest.mark.slow
def test_loss_falls_when_overfitting_one_batch_and_step_is_not_retraced():
  model = _model(jax.devices(), dropout=0.0, opt=config.OptimConfig(learning_rate=3e-3, warmup_steps=1),
                 total_steps=1000)
  _, history = _run(model, steps=30)
  losses = [h['loss'] for h in history]
  assert losses[-1] < 0.5 * losses[0], losses
  assert history[-1]['mlm_accuracy'] > 0.5
  assert model.train_step._cache_size() == 1  # pylint: disable=protected-access


@pytest.mark.slow
def test_dropout_masks_differ_by_step_but_replay_exactly():
  model = _model(jax.devices()[:1])
  state = model.init_state()
  batch = model.global_batch(random_pretraining_batch())
  a, ma = model.train_step(state, batch, model.rest)
  b, mb = model.train_step(model.init_state(), batch, model.rest)
  assert float(ma['loss']) == float(mb['loss'])  # same (rng, step) -> same dropout
  _, mc = model.train_step(a, batch, model.rest)
  assert float(mc['loss']) != float(ma['loss'])


@pytest.mark.slow
def test_the_dropout_streams_values_never_matter():
  """A step with the module's own dropout streams (built under jit, as before they were made from their shapes) and
  with the model's `rest` (key(0)s and zeros) is bitwise the same: every step reseeds them."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax.train import step  # pylint: disable=g-import-not-at-top
  model = _model(jax.devices())
  new_rngs = step._new_rngs  # pylint: disable=protected-access
  built = jax.jit(lambda: nnx.to_pure_dict(nnx.split(model.new_module(new_rngs(5)), nnx.Param, ...)[2]))()
  assert jax.tree.map(lambda a: (a.shape, a.dtype), built) == jax.tree.map(lambda a: (a.shape, a.dtype), model.rest)
  batch = model.global_batch(random_pretraining_batch())
  a, ma = jax.device_get(model.train_step(model.init_state(), batch, model.rest))
  b, mb = jax.device_get(model.train_step(model.init_state(), batch, built))
  assert ma == mb
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize('sizes', [(-1, 1, 1), (2, 2, 2), (1, 8, 1)])
def test_mesh_layouts_build(sizes):
  mesh = sharding.make_mesh(config.MeshConfig(*sizes))
  assert mesh.devices.size == 8
