"""The contrastive objective in the one train step: accumulation by GradCache equals the plain step's batch."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.model import biencoder, pooling
from bert_jax.embedding.contrastive import Contrastive
from bert_jax.model.biencoder import BiEncoder, ContrastiveSpec
from bert_jax.errors import ConfigError
from bert_jax.model.dropout import Dropout
from bert_jax.train.step import StepModel

from harness.numerics import tolerance

FEATURES, WIDTH = 6, 8


class ToyBiEncoder(nnx.Module):
  """BiEncoder's interface (embed, temperature_value) over feature vectors: dense + tanh, dropout, a learned
  temperature; compiles in a fraction of BERT's time."""

  def __init__(self, spec: ContrastiveSpec, rate: float, *, rngs: nnx.Rngs):
    self.spec = spec
    self.dense = nnx.Linear(FEATURES, WIDTH, rngs=rngs)
    self.dropout = Dropout(rate, rngs=rngs)
    self.temperature = nnx.Param(jnp.asarray(biencoder.temperature_parameter(spec.temperature)))

  def embed(self, batch, *, deterministic):
    return {side: pooling.l2_normalize(self.dropout(jnp.tanh(self.dense(batch[side])), deterministic=deterministic))
            for side in ('query', 'passage')}

  def temperature_value(self):
    return biencoder.bounded_temperature(self.temperature[...])


def _batch(b=32, seed=0):
  rng = np.random.default_rng(seed)
  weights = np.ones(b, np.float32)
  weights[-3:] = 0  # padding rows
  return {'query': rng.normal(size=(b, FEATURES)).astype(np.float32),
          'passage': rng.normal(size=(b, FEATURES)).astype(np.float32),
          'passage_ids': rng.integers(0, b // 2, b).astype(np.int32), 'weights': weights}


def _one_step(new_module, spec, k, batch, mesh, **objective):
  model = StepModel(new_module, Contrastive(spec, **objective), optax.sgd(0.5), mesh, grad_accum_steps=k)
  state, metrics = model.train_step(model.init_state(seed=0), model.global_batch(batch), model.rest)
  return jax.device_get(state['params']), jax.device_get(metrics)


def test_accumulated_step_reports_the_loss_and_gradient_of_the_whole_batch():
  spec = ContrastiveSpec(learn_temperature=True, symmetric=True)
  objective = Contrastive(spec)
  model = StepModel(lambda rngs: ToyBiEncoder(spec, 0.0, rngs=rngs), objective, optax.sgd(0.5),
                    sharding.make_mesh(config.MeshConfig(data=8)), grad_accum_steps=4)
  state, batch = model.init_state(seed=0), _batch()
  params = jax.device_get(state['params'])  # the step donates the state

  def whole_batch_loss(p):  # one device, no micro-batches
    sums = objective.sums(objective.forward(model.merge(p, model.rest), batch, deterministic=True), batch)
    return sums['contrastive_loss_sum'] / sums['contrastive_count']

  value, grads = jax.jit(jax.value_and_grad(whole_batch_loss))(params)
  _, metrics = model.train_step(state, model.global_batch(batch), model.rest)
  np.testing.assert_allclose(metrics['loss'], value, rtol=tolerance(np.float32, 32, depth=3))  # 32 candidates
  np.testing.assert_allclose(metrics['grad_norm'], optax.tree.norm(grads), rtol=tolerance(np.float32, 32, depth=3))


@pytest.mark.slow
def test_accumulation_is_gradcache_over_the_whole_batch():
  # Without dropout, 4 micro-batches by GradCache are the plain step over the whole batch (and not 4 losses
  # with their micro-batch's negatives only): same loss, same update, on 8 devices.
  spec = ContrastiveSpec(learn_temperature=True, symmetric=True)
  mesh = sharding.make_mesh(config.MeshConfig(data=4, fsdp=2))
  new = lambda rngs: ToyBiEncoder(spec, 0.0, rngs=rngs)
  batch = _batch()
  plain_params, plain = _one_step(new, spec, 1, batch, mesh)
  cached_params, cached = _one_step(new, spec, 4, batch, mesh)
  for name in ('loss', 'accuracy', 'temperature', 'grad_norm'):
    np.testing.assert_allclose(cached[name], plain[name], rtol=tolerance(np.float32, 32, depth=3), err_msg=name)
  for a, b in zip(jax.tree.leaves(cached_params), jax.tree.leaves(plain_params)):
    np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 32, depth=3))
  # Summing the 4 micro-batches' own losses (plain accumulation) trains another loss: 8 candidates a query, not 32.
  _, summed = _one_step(new, spec, 4, batch, mesh, couples_rows=False)
  assert summed['loss'] < plain['loss'] - 0.1


def test_spec_is_checked_against_the_model():
  cfg = config.preset('tiny', vocab_size=32, hidden_size=16, num_heads=2, intermediate_size=32, num_layers=1)
  for spec, message in [(ContrastiveSpec(pooling='max'), 'pooling must be one of'),
                        (ContrastiveSpec(temperature=0.0), 'temperature must be a finite number > 0'),
                        (ContrastiveSpec(learn_temperature=True, temperature=2.0), 'outside its bounds'),
                        (ContrastiveSpec(matryoshka_dims=(32, 8)), 'exceeds the model\'s hidden size 16'),
                        (ContrastiveSpec(matryoshka_dims=(8, 16)), 'strictly decreasing'),
                        (ContrastiveSpec(matryoshka_dims=(16, 8), matryoshka_weights=(1.0,)), '1 matryoshka weights'),
                        (ContrastiveSpec(matryoshka_weights=(1.0,)), 'without matryoshka dims')]:
    with pytest.raises(ConfigError, match=message):
      BiEncoder(cfg, spec, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_tiny_bert_bi_encoder_steps_alike_with_and_without_gradcache():
  cfg = config.preset('tiny', vocab_size=64, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
                      hidden_dropout=0.0, attention_dropout=0.0)
  spec = ContrastiveSpec(learn_temperature=True, matryoshka_dims=(32, 16))
  rng = np.random.default_rng(0)
  batch = {'weights': np.ones(16, np.float32), 'passage_ids': np.arange(16, dtype=np.int32)}
  for side in ('query', 'passage'):
    batch[f'{side}_input_ids'] = rng.integers(1, 64, (16, 8)).astype(np.int32)
    batch[f'{side}_attention_mask'] = (np.arange(8) < rng.integers(3, 9, (16, 1))).astype(np.int32)
  mesh = sharding.make_mesh(config.MeshConfig(data=8))
  new = lambda rngs: BiEncoder(cfg, spec, rngs=rngs)
  plain_params, plain = _one_step(new, spec, 1, batch, mesh)
  cached_params, cached = _one_step(new, spec, 2, batch, mesh)
  for name in ('loss', 'loss_16', 'temperature', 'grad_norm'):
    np.testing.assert_allclose(cached[name], plain[name], rtol=tolerance(np.float32, 64, depth=3), err_msg=name)
  for a, b in zip(jax.tree.leaves(cached_params), jax.tree.leaves(plain_params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=tolerance(np.float32, 64, depth=3))
