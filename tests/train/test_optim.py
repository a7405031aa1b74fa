"""Optimizer: warmup + linear decay, BERT's weight-decay mask, clipping, AdamW constants."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.config import OptimConfig
from bert_jax.train import optim

from harness.numerics import tolerance


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


def test_warmup_stable_decay_in_every_shape():
  points = (0, 5, 10, 50, 90, 95, 100)
  for decay, mid in (('linear', 0.5), ('cosine', 0.5), ('1-sqrt', 1 - np.sqrt(0.5))):
    sched = optim.learning_rate_schedule(OptimConfig(learning_rate=1.0, warmup_steps=10, schedule='wsd', decay=decay,
                                                     decay_fraction=0.1), 100)
    np.testing.assert_allclose([sched(s) for s in points], [0.0, 0.5, 1.0, 1.0, 1.0, mid, 0.0], atol=1e-6)
  floor = optim.learning_rate_schedule(OptimConfig(learning_rate=2.0, warmup_steps=0, schedule='wsd', min_lr_ratio=0.1),
                                       100, decay_start=40)  # a decay phase that starts at step 40
  np.testing.assert_allclose([floor(s) for s in (0, 39, 40, 70, 100)], [2.0, 2.0, 2.0, 1.1, 0.2], atol=1e-6)


def test_stable_adamw_clips_an_update_that_jumps_above_its_running_scale():
  b1, b2, eps = 0.9, 0.999, 1e-8
  stable, adam = optim.scale_by_stable_adam(b1, b2, eps), optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
  params = {'w': jnp.zeros(4)}
  s_state, a_state = stable.init(params), adam.init(params)
  for g in (jnp.full(4, 0.01), jnp.full(4, 0.01), jnp.array([10.0, 0.01, 0.01, 0.01])):
    s_up, s_state = stable.update({'w': g}, s_state, params)
    a_up, a_state = adam.update({'w': g}, a_state, params)
  # Steady gradients: Adam's update exactly. A jump: the same direction, scaled by 1 / RMS(g^2 / v_hat).
  v_hat = a_state.nu['w'] / (1 - b2 ** 3)
  rms = float(jnp.sqrt(jnp.mean(jnp.square(g) / v_hat)))
  assert rms > 1
  # Both sides bias-correct v in float32: 1 - b2^3 = 0.003 magnifies the rounding of b2^3 about 334 times.
  np.testing.assert_allclose(s_up['w'], a_up['w'] / rms, rtol=tolerance(np.float32, magnitude=1 / (1 - b2**3),
                                                                       worst_case=True))
  quiet = stable.update({'w': jnp.full(4, 0.01)}, stable.init(params), params)[0]
  np.testing.assert_allclose(quiet['w'], adam.update({'w': jnp.full(4, 0.01)}, adam.init(params), params)[0]['w'])
  tx = optim.make_optimizer(OptimConfig(name='stable_adamw', learning_rate=0.1, warmup_steps=0), 10)
  assert jax.tree.leaves(tx.update(params, tx.init(params), params)[0])  # it runs as one of the run's optimizers
