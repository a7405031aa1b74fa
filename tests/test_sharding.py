"""Mesh and logical-axis rules: one table decides placement; FSDP/tensor sharding by configuration."""

import jax
from jax.sharding import PartitionSpec as P
import pytest

from bert_jax import config, sharding
from bert_jax.errors import ConfigError
from bert_jax.pretraining.run import pretraining_model
from bert_jax.train import optim


def test_rules_table_maps_logical_axes():
  assert sharding.logical_to_spec(('vocab', 'embed')) == P('tensor', 'fsdp')
  assert sharding.logical_to_spec(('embed', 'heads', 'kv')) == P('fsdp', 'tensor', None)
  assert sharding.logical_to_spec(('batch',)) == P(('data', 'fsdp'))


def test_mesh_sizes_resolve_and_bad_sizes_are_named():
  assert dict(sharding.make_mesh(config.MeshConfig(data=-1, fsdp=2, tensor=1)).shape) == \
      {'data': 4, 'fsdp': 2, 'tensor': 1}
  with pytest.raises(ConfigError, match='needs 16 devices'):
    sharding.make_mesh(config.MeshConfig(data=4, fsdp=4, tensor=1))
  with pytest.raises(ConfigError, match='at most one'):
    sharding.make_mesh(config.MeshConfig(data=-1, fsdp=-1))


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


def test_constrain_pins_activations_only_under_a_mesh():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jnp.ones((8, 4))
  assert sharding.constrain(x, ('batch', None)) is x  # no mesh in context: a no-op
  mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
  f = jax.jit(sharding.under_mesh(mesh, lambda x: sharding.constrain(x * 2, ('batch', 'mlp'))))
  y = f(jax.device_put(x, sharding.replicated(mesh)))
  assert y.sharding.spec == P(('data', 'fsdp'), 'tensor')
