"""Optimizer: warmup + linear decay, BERT's weight-decay mask, clipping, AdamW constants."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.config import OptimConfig
from bert_jax.train import optim


def test_schedule_warms_up_then_decays_linearly_to_zero():
  sched = optim.learning_rate_schedule(OptimConfig(learning_rate=1e-3, warmup_steps=10), 110)
  np.testing.assert_allclose([sched(0), sched(5), sched(10), sched(60), sched(110)],
                             [0.0, 5e-4, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_decay_mask_excludes_biases_and_layernorm():
  params = {'layer': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)},
            'norm': {'scale': jnp.ones(2), 'bias': jnp.ones(2)}, 'emb': {'embedding': jnp.ones((3, 2))}}
  mask = optim.decay_mask(params)
  assert mask == {'layer': {'kernel': True, 'bias': False}, 'norm': {'scale': False, 'bias': False},
                  'emb': {'embedding': True}}


def test_adamw_applies_decay_only_where_masked_and_clips():
  cfg = OptimConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5, clip_norm=1.0)
  tx = optim.make_optimizer(cfg, 100)
  params = {'w': {'kernel': jnp.ones((2,))}, 'n': {'scale': jnp.ones((2,))}}
  zero = {'w': {'kernel': jnp.zeros((2,))}, 'n': {'scale': jnp.zeros((2,))}}
  updates, _ = tx.update(zero, tx.init(params), params)
  # Zero gradient: only decoupled weight decay moves the kernel; the LayerNorm scale stays.
  np.testing.assert_allclose(updates['w']['kernel'], -0.1 * 0.5 * np.ones(2), rtol=1e-6)
  np.testing.assert_allclose(updates['n']['scale'], 0.0)
  clip = optax.clip_by_global_norm(1.0)
  big = {'g': jnp.array([30.0, 40.0])}
  clipped, _ = clip.update(big, clip.init(big))
  np.testing.assert_allclose(optax.tree.norm(clipped), 1.0, rtol=1e-6)


def test_bert_adam_constants():
  cfg = OptimConfig()
  assert (cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, cfg.clip_norm) == (0.9, 0.999, 1e-6, 0.01, 1.0)


def test_lamb_scales_each_tensor_by_its_trust_ratio_except_bias_and_layernorm():
  cfg = OptimConfig(name='lamb', learning_rate=0.1, warmup_steps=0, weight_decay=0.01, clip_norm=0.0, eps=1e-6)
  tx = optim.make_optimizer(cfg, 100)
  rng = np.random.default_rng(0)
  params = {'w': {'kernel': jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
                  'bias': jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  for name, decayed in (('kernel', True), ('bias', False)):
    w, g = np.asarray(params['w'][name], np.float64), np.asarray(grads['w'][name], np.float64)
    m, v = 0.1 * g / (1 - 0.9), 0.001 * g * g / (1 - 0.999)  # first Adam step, bias-corrected
    step = m / (np.sqrt(v) + 1e-6)
    if decayed:
      step = step + 0.01 * w
      step = step * np.linalg.norm(w) / np.linalg.norm(step)  # trust ratio
    np.testing.assert_allclose(updates['w'][name], -0.1 * step, rtol=1e-4)  # lr at step 0 is the peak


def test_unknown_optimizer_is_a_config_error():
  import pytest  # pylint: disable=g-import-not-at-top

  from bert_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match='adamw'):
    optim.make_optimizer(OptimConfig(name='sgd'), 10)
