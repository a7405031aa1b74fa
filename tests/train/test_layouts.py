"""Parallel layouts on 8 fake devices: every (data, fsdp, tensor) mesh computes the 1-device step,
shards parameters as the rules table says (golden PartitionSpecs), and checkpoints move between layouts."""

import json
import os

import jax
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.finetuning import batching
from bert_jax.finetuning.head_tasks import finetuning_model
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.runs.checkpoints import Checkpointer

from harness.inputs import FIXTURES, features, random_pretraining_batch
from harness.numerics import largest, tolerance

LAYOUTS = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (4, 1, 2)]
CFG = config.preset('tiny', vocab_size=96, hidden_dropout=0.0, attention_dropout=0.0)
GOLDEN = os.path.join(FIXTURES, 'partition_specs_2x2x2.json')


def _model(sizes, devices=None):
  devices = devices or jax.devices()
  mesh = sharding.make_mesh(config.MeshConfig(*sizes), devices)
  return pretraining_model(CFG, optax.sgd(1.0), mesh)  # lr 1: the update is minus the gradient


def _step(model):
  state = model.init_state()
  before = jax.device_get(state['params'])
  state, metrics = model.train_step(state, model.global_batch(random_pretraining_batch(vocab_size=96)),
                                    model.rest)
  grads = jax.tree.map(lambda b, a: b - a, before, jax.device_get(state['params']))
  return float(metrics['loss']), grads, state


@pytest.fixture(scope='module')
def reference():
  loss, grads, _ = _step(_model((1, 1, 1), jax.devices()[:1]))
  return loss, grads


@pytest.mark.slow
@pytest.mark.parametrize('sizes', LAYOUTS)
def test_layout_computes_the_single_device_loss_and_gradients(sizes, reference):
  loss, grads, state = _step(_model(sizes))
  # Sharded sums in other orders: the widest (256), in each of the 2 layers; the gradients sum over the batch's
  # 16 x 16 tokens too.
  np.testing.assert_allclose(loss, reference[0], rtol=tolerance(np.float32, 256, depth=2))
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(reference[1])):
    np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 16 * 16, magnitude=largest(reference[1]), depth=2))
  data, fsdp, tensor = sizes
  emb = state['params']['bert']['embeddings']['word_embeddings']['embedding']
  assert emb.addressable_shards[0].data.shape == (96 // tensor, 64 // fsdp)  # vocab/tensor, embed/fsdp
  mlp = state['params']['bert']['layers'][0]['intermediate']['kernel']
  assert mlp.addressable_shards[0].data.shape == (64 // fsdp, 256 // tensor)  # embed/fsdp, mlp/tensor
  del data


def _specs(model):
  flat = jax.tree_util.tree_flatten_with_path(model.param_shardings)[0]
  return {jax.tree_util.keystr(p): str(s.spec) for p, s in flat}


def test_every_parameter_partition_spec_matches_the_golden_table():
  specs = _specs(_model((2, 2, 2)))
  if os.environ.get('BERT_JAX_UPDATE_GOLDEN'):
    with open(GOLDEN, 'w', encoding='utf-8') as f:
      json.dump(specs, f, indent=1, sort_keys=True)
  with open(GOLDEN, encoding='utf-8') as f:
    golden = json.load(f)
  assert specs == golden  # regenerate deliberately with BERT_JAX_UPDATE_GOLDEN=1


@pytest.mark.slow
def test_checkpoint_saved_under_one_layout_restores_under_another(tmp_path):
  _, _, state = _step(_model((2, 2, 2)))
  ckpt = Checkpointer(str(tmp_path), save_every=1)
  ckpt.save(1, state, data_position=1, config={}, force=True)
  ckpt.close()
  other = _model((1, 8, 1))
  reader = Checkpointer(str(tmp_path), read_only=True)
  restored, meta = reader.restore(None, other.abstract_state)
  reader.close()
  assert meta['step'] == 1
  emb = restored['params']['bert']['embeddings']['word_embeddings']['embedding']
  assert emb.sharding == other.param_shardings['bert']['embeddings']['word_embeddings']['embedding']
  for a, b in zip(jax.tree.leaves(jax.device_get(restored)), jax.tree.leaves(jax.device_get(state))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['classification', 'span'])
def test_finetuning_heads_compute_the_single_device_gradients_under_2x2x2(kind):
  batch = batching.make_batch(features([12, 3, 20, 7, 9, 30, 4, 16], seed=2), kind, batch_size=8,
                              row_length=48, pack=True, rows_multiple=8)
  out = []
  for sizes, devices in (((1, 1, 1), jax.devices()[:1]), ((2, 2, 2), jax.devices())):
    model = finetuning_model(config.preset('tiny', vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0),
                             kind, 3, optax.sgd(1.0), sharding.make_mesh(config.MeshConfig(*sizes), devices))
    state = model.init_state(None, seed=0)
    before = jax.device_get(state['params'])
    state, metrics = model.train_step(state, model.global_batch(batch), model.rest)
    out.append((float(metrics['loss']), jax.tree.map(lambda b, a: b - a, before, jax.device_get(state['params']))))
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=tolerance(np.float32, 256, depth=2))
  for a, b in zip(jax.tree.leaves(out[1][1]), jax.tree.leaves(out[0][1])):  # 8 rows of 48 tokens
    np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 8 * 48, magnitude=largest(out[0][1]), depth=2))
