"""Optimizer: warmup + linear decay, BERT's weight-decay mask, clipping, AdamW constants."""

import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import optim
from bert_jax.config import OptimConfig


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
