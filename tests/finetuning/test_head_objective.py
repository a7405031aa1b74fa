"""The fine-tuning objective on the head models: packed rows compute what padded rows compute (logits,
loss, gradients); padding examples count nowhere; training lowers the loss on 8 devices."""

import jax
import numpy as np
import optax
import pytest

from bert_jax import sharding as shd
from bert_jax.config import MeshConfig, OptimConfig, preset
from bert_jax.finetuning import batching
from bert_jax.finetuning.head_objective import task_loss
from bert_jax.finetuning.head_tasks import finetuning_model
from bert_jax.train import optim

from harness.inputs import features as _features
from harness.numerics import tolerance

CFG = preset('tiny', vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
KINDS = ['classification', 'regression', 'token', 'span']


def _model(kind, tx=None, mesh=None):
  return finetuning_model(CFG, kind, 1 if kind == 'regression' else 3, tx or optax.sgd(0.1),
                          mesh or shd.make_mesh(MeshConfig()))


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_packed_equals_padded_logits_loss_and_gradients(kind):
  model = _model(kind)
  params = model.init_state(None, seed=0)['params']
  feats = _features([12, 3, 20, 7, 9, 30], seed=1)
  packed = batching.make_batch(feats, kind, batch_size=8, row_length=48, pack=True, rows_multiple=8)
  padded = batching.make_batch(feats, kind, batch_size=8, row_length=48, pack=False)
  assert packed['input_ids'].size < padded['input_ids'].size * 2
  lp = np.asarray(model.predict_step(params, model.rest, model.global_batch(packed)))
  lu = np.asarray(model.predict_step(params, model.rest, model.global_batch(padded)))
  if kind in ('classification', 'regression'):
    np.testing.assert_allclose(lp[:6], lu[:6], atol=tolerance(np.float32, 256, depth=2))
  else:
    for a, b in zip(batching.rows_of_examples(lp, packed, 6), batching.rows_of_examples(lu, padded, 6)):
      np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 256, depth=2))

  # Jitted: the eager forward and backward passes compiled each op on its own, for each batch shape (most of this
  # test's time); packed and padded rows are compared under the same compilation either way.
  @jax.jit
  def loss_and_grad(batch):
    return jax.value_and_grad(lambda p: task_loss(kind, model.apply(p, model.rest, batch), batch))(params)

  (l1, g1), (l2, g2) = loss_and_grad(packed), loss_and_grad(padded)
  np.testing.assert_allclose(l1, l2, rtol=tolerance(np.float32, 256, depth=2))
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 256, depth=2))


@pytest.mark.slow
def test_padding_examples_do_not_count():
  model = _model('classification')
  params = model.init_state(None, seed=0)['params']
  feats = _features([5, 6, 7])
  b3 = batching.make_batch(feats, 'classification', batch_size=4, row_length=16, pack=True)
  b8 = batching.make_batch(feats, 'classification', batch_size=8, row_length=16, pack=True)
  loss = jax.jit(lambda b: task_loss('classification', model.apply(params, model.rest, b), b))  # jitted: see above
  losses = [float(loss(b)) for b in (b3, b8)]
  assert losses[0] == pytest.approx(losses[1], rel=1e-6)


@pytest.mark.slow
def test_seed_changes_only_the_new_head():
  model = _model('classification')
  encoder = model.init_state(None, seed=5)['params']['bert']
  s0, s1 = model.init_state({'bert': encoder}, seed=0), model.init_state({'bert': encoder}, seed=1)
  for a, b in zip(jax.tree.leaves(s0['params']['bert']), jax.tree.leaves(encoder)):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(s0['params']['classifier']['kernel'], s1['params']['classifier']['kernel'])


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_train_steps_on_8_devices_lower_the_loss(kind):
  assert jax.device_count() == 8
  tx = optim.make_optimizer(OptimConfig(learning_rate=3e-3, warmup_steps=0, eps=1e-8), 30)
  model = _model(kind, tx, shd.make_mesh(MeshConfig(data=-1)))
  state = model.init_state(None, seed=0)
  batch = model.global_batch(batching.make_batch(_features([12, 3, 20, 7, 9, 30, 4, 16], seed=2), kind,
                                                batch_size=8, row_length=48, pack=True, rows_multiple=8))
  losses = []
  for _ in range(15):
    state, m = model.train_step(state, batch, model.rest)
    losses.append(float(m['loss']))
  assert losses[-1] < 0.5 * losses[0], losses
  assert int(state['step']) == 15


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['classification', 'token', 'span'])
def test_gradient_accumulation_steps_as_the_whole_batch(kind):
  """Two interleaved micro-batches (each packed on its own) give the update of the whole batch in one."""
  feats = _features([12, 3, 20, 7, 9, 30, 5, 16, 11, 4, 25, 8, 6, 14, 10, 2], seed=2)
  mesh = shd.make_mesh(MeshConfig())
  states = {}
  for k in (1, 2):
    model = finetuning_model(CFG, kind, 3, optax.sgd(0.5), mesh, grad_accum_steps=k)
    batches = batching.TrainBatches(feats, kind, batch_size=16, row_length=48, pack=True, rows_multiple=8 * k,
                                    seed=0, shuffle=True, start=0, block=(0, 1), micro_batches=k)
    state = model.init_state(None, seed=0)
    states[k], metrics = model.train_step(state, model.global_batch(next(batches)), model.rest)
    states[k] = (jax.device_get(states[k]['params']), float(metrics['loss']))
  assert states[1][1] == pytest.approx(states[2][1], rel=1e-5)
  for a, b in zip(jax.tree.leaves(states[1][0]), jax.tree.leaves(states[2][0])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=tolerance(np.float32, 256, depth=2))


def test_interleaved_micro_batches_are_every_kth_row_and_example():
  parts = [batching.make_batch(_features([5, 9, 3], seed=i), 'token', batch_size=4, row_length=16, pack=True,
                               rows_multiple=4, num_rows=4) for i in range(2)]
  both = batching.interleave(parts)
  for i, part in enumerate(parts):
    for key, value in part.items():
      np.testing.assert_array_equal(both[key][i::2], value)
