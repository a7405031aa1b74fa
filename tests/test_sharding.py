"""Mesh and logical-axis rules: one table decides placement; FSDP/tensor sharding by configuration."""

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from bert_jax import config, distributed, sharding
from bert_jax.errors import ConfigError
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

from harness.inputs import random_pretraining_batch
from harness.numerics import tolerance


def test_rules_table_maps_logical_axes():
  assert sharding.logical_to_spec(('vocab', 'embed')) == P('tensor', 'fsdp')
  assert sharding.logical_to_spec(('embed', 'heads', 'kv')) == P('fsdp', 'tensor', None)
  assert sharding.logical_to_spec(('activation_batch',)) == P(('data', 'fsdp'))
  assert sharding.logical_to_spec(('activation_length', 'activation_mlp')) == P(None, 'tensor')


def test_rules_from_config_override_the_table():
  table = dict(sharding.rules('activation_length=tensor, embed=, mlp=fsdp+tensor'))
  assert table['activation_length'] == 'tensor' and table['embed'] is None and table['mlp'] == ('fsdp', 'tensor')
  assert table['vocab'] == 'tensor'  # the rest as in LOGICAL_AXIS_RULES
  for bad in ('nosuch=tensor', 'embed=pipeline', 'embed', 'activation_batch=data'):
    with pytest.raises(ConfigError, match='mesh.rules entry'):
      sharding.rules(bad)


@pytest.mark.slow
def test_sequence_sharded_activations_give_the_same_loss_and_gradients():
  cfg = config.preset('tiny', vocab_size=96, hidden_dropout=0.0, attention_dropout=0.0)
  batch = random_pretraining_batch(seq_len=16, vocab_size=96)
  out = []
  for table in (sharding.LOGICAL_AXIS_RULES, sharding.rules('activation_length=tensor,activation_mlp=')):
    mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
    model = pretraining_model(cfg, optax.sgd(1.0), mesh, rules=table)
    _, metrics = model.train_step(model.init_state(), model.global_batch(batch), model.rest)
    out.append(jax.device_get(metrics))
  # Sums sharded another way: float32 rounding of each layer's widest sums.
  close = tolerance(np.float32, cfg.intermediate_size, depth=cfg.num_layers)
  np.testing.assert_allclose(out[0]['loss'], out[1]['loss'], rtol=close)
  np.testing.assert_allclose(out[0]['grad_norm'], out[1]['grad_norm'], rtol=close)


def test_mesh_sizes_resolve_and_bad_sizes_are_named():
  assert dict(sharding.make_mesh(config.MeshConfig(data=-1, fsdp=2, tensor=1)).shape) == \
      {'data': 4, 'fsdp': 2, 'tensor': 1}
  with pytest.raises(ConfigError, match='needs 16 devices'):
    sharding.make_mesh(config.MeshConfig(data=4, fsdp=4, tensor=1))
  with pytest.raises(ConfigError, match='at most one'):
    sharding.make_mesh(config.MeshConfig(data=-1, fsdp=-1))


class _InSlice:
  """A CPU device that reports a TPU slice (`slice_index`), as multi-slice TPU devices do."""

  def __init__(self, device, slice_index):
    self.device, self.slice_index = device, slice_index

  def __getattr__(self, name):
    return getattr(self.device, name)


def test_slices_split_the_data_axis_outermost():
  """Two slices of 4 devices, mesh fsdp=2 inside each: the data axis is slice-major (its first half one slice), so
  only the data-parallel reduction crosses slices; a batch feeds and a step runs on that mesh as on the plain one."""
  devices = jax.devices()
  sliced = [_InSlice(d, i // 4) for i, d in enumerate(devices)]
  cfg = config.MeshConfig(data=-1, fsdp=2, tensor=1)
  grid = sharding.device_grid(cfg, sliced)
  assert grid.shape == (4, 2, 1)
  assert [{d.slice_index for d in grid[i].flat} for i in range(4)] == [{0}, {0}, {1}, {1}]
  assert sharding.device_grid(cfg, devices) is None  # one slice: jax.make_mesh's layout, as before
  with pytest.raises(ConfigError, match='mesh.slices=4, but the 8 devices are in 2 slices'):
    sharding.device_grid(config.MeshConfig(slices=4), sliced)
  with pytest.raises(ConfigError, match='in 1 processes'):
    sharding.make_mesh(config.MeshConfig(slices=2))
  with pytest.raises(ConfigError, match='in each slice'):
    sharding.device_grid(config.MeshConfig(data=-1, fsdp=3), sliced)
  mesh = jax.sharding.Mesh(np.vectorize(lambda d: d.device, otypes=[object])(grid), sharding.MESH_AXES)
  batch = sharding.global_batch({'x': np.arange(16, dtype=np.int32).reshape(8, 2)}, mesh)['x']
  slice0 = {d.device for d in sliced[:4]}
  rows = {int(s.data[0, 0]) // 2 for s in batch.addressable_shards if s.device in slice0}
  assert rows == {0, 1, 2, 3}  # the first half of the batch (one row per data x fsdp shard) is on slice 0
  # One controller owning both slices' devices (Pathways-style) supplies the whole global batch itself.
  assert distributed.process_batch_block(mesh) == (0, 1)


@pytest.mark.slow
def test_fsdp_and_tensor_layouts_shard_parameters_by_configuration():
  cfg = config.preset('tiny', vocab_size=96)
  mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
  model = pretraining_model(cfg, optim.make_optimizer(config.OptimConfig(), 10), mesh)
  state = model.init_state()
  emb = state['params']['bert']['embeddings']['word_embeddings']['embedding']
  assert emb.addressable_shards[0].data.shape == (96 // 2, 64 // 2)  # vocab/tensor, embed/fsdp
  query = state['params']['bert']['layers'][0]['attention']['query']['kernel']
  assert query.addressable_shards[0].data.shape == (64 // 2, 2 // 2, 32)  # embed/fsdp, heads/tensor
  mu = state['opt_state'][1][0].mu['bert']['embeddings']['word_embeddings']['embedding']
  assert mu.sharding == emb.sharding  # Adam moments follow their parameters
  assert jax.device_count() == 8
  # ELECTRA's narrower tables (model.embedding_size) and their projection to hidden_size shard by the same rules.
  model = pretraining_model(config.preset('tiny', vocab_size=96, embedding_size=32),
                            optim.make_optimizer(config.OptimConfig(), 10), mesh)
  embeddings = model.init_state()['params']['bert']['embeddings']
  assert embeddings['word_embeddings']['embedding'].addressable_shards[0].data.shape == (96 // 2, 32 // 2)
  assert embeddings['project']['kernel'].addressable_shards[0].data.shape == (32, 64 // 2)  # embed/fsdp


def test_constrain_pins_activations_only_under_a_mesh():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jnp.ones((8, 4))
  assert sharding.constrain(x, ('activation_batch', None)) is x  # no mesh in context: a no-op
  mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
  f = jax.jit(sharding.under_mesh(mesh, lambda x: sharding.constrain(x * 2, ('activation_batch', 'activation_mlp'))))
  y = f(jax.device_put(x, sharding.replicated(mesh)))
  assert y.sharding.spec == P(('data', 'fsdp'), 'tensor')
