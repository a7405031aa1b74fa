"""Optax optimizers: clipping, AdamW with BERT's decay mask, LAMB, StableAdamW; warmup + linear decay, or WSD.

Gradient accumulation is done inside the train step (`train.step`), so one optimizer update is
one step and the schedule, checkpoints and data position all count the same steps.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from bert_jax.config import OptimConfig

# The WSD decay's shape: t in [0, 1] of the decay -> the share of (peak - floor) left.
_DECAY_SHAPES = {'linear': lambda t: 1.0 - t, 'cosine': lambda t: 0.5 * (1.0 + jnp.cos(jnp.pi * t)),
                 '1-sqrt': lambda t: 1.0 - jnp.sqrt(t)}


def learning_rate_schedule(cfg: OptimConfig, total_steps: int, decay_start: int | None = None,
                           levels: Sequence[tuple[int, float]] | None = None) -> optax.Schedule:
  """The learning rate at each step: a linear warmup from 0 to the peak over `cfg.warmup(total_steps)` steps, then

  'linear': a linear decay to 0 at `total_steps` (BERT);
  'wsd': the peak until `decay_start` (default: the last cfg.decay_fraction of the run), then cfg.decay's shape
    down to cfg.min_lr_ratio x the peak at `total_steps` (warmup-stable-decay, as ModernBERT and MiniCPM).

  `levels` ((first step, factor) per phase of a run, in order) scales the rate from each phase's first step on: a
  phase with its own peak (ModernBERT's context extension at 3e-4 of 8e-4), a decay then decaying from it.
  """
  if levels:
    base = learning_rate_schedule(cfg, total_steps, decay_start)
    starts = jnp.asarray([start for start, _ in levels[1:]], jnp.int32)
    factors = jnp.asarray([factor for _, factor in levels], jnp.float32)
    return lambda step: base(step) * factors[jnp.searchsorted(starts, step, side='right')]
  warmup = max(0, min(cfg.warmup(total_steps), total_steps))
  peak = cfg.learning_rate
  if cfg.schedule == 'linear':
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup),
                                 optax.linear_schedule(peak, 0.0, max(1, total_steps - warmup))], boundaries=[warmup])
  if decay_start is None:
    decay_start = total_steps - math.ceil(cfg.decay_fraction * total_steps)
  decay_start = min(max(decay_start, warmup), total_steps)
  length, floor, shape = max(1, total_steps - decay_start), peak * cfg.min_lr_ratio, _DECAY_SHAPES[cfg.decay]

  def decay(step):
    return floor + (peak - floor) * shape(jnp.clip(step / length, 0.0, 1.0))

  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak), decay],
                              boundaries=[warmup, decay_start])


def decay_mask(params):
  """True where weight decay applies: not on biases and not on LayerNorm parameters."""
  def keep(path, _):
    last = path[-1].key if hasattr(path[-1], 'key') else str(path[-1])
    return last not in ('bias', 'scale')  # LayerNorm has scale/bias; every Dense has bias
  return jax.tree_util.tree_map_with_path(keep, params)


def lamb(learning_rate, *, b1: float, b2: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
  """LAMB (You et al. 2019) as BERT uses it: Adam direction plus decoupled weight decay, then each
  tensor's step scaled by the trust ratio ||w|| / ||step||; biases and LayerNorm parameters get
  neither decay nor the trust ratio (excluded from layer adaptation, as in the reference code).
  """
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask=decay_mask),
      optax.masked(optax.scale_by_trust_ratio(), decay_mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def scale_by_stable_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's direction with update clipping (Wortsman et al. 2023, ModernBERT's StableAdamW): each tensor's update
  is divided by max(1, RMS(g^2 / v)), g its gradient and v Adam's bias-corrected second moment, so a tensor whose
  gradient jumps far above its running scale takes a step no larger than Adam's usual one."""
  adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def update(grads, state, params=None):
    updates, state = adam.update(grads, state, params)
    adam_state = state  # ScaleByAdamState: count (after this step), mu, nu
    correction = 1.0 - b2 ** adam_state.count.astype(jnp.float32)

    def clip(u, g, v):
      rms = jnp.sqrt(jnp.mean(jnp.square(g) / jnp.maximum(v / correction, eps * eps)))
      return u / jnp.maximum(1.0, rms)

    return jax.tree.map(clip, updates, grads, adam_state.nu), state

  return optax.GradientTransformation(adam.init, update)


def make_optimizer(cfg: OptimConfig, total_steps: int, decay_start: int | None = None,
                   levels: Sequence[tuple[int, float]] | None = None) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (beta 0.9/0.999, eps 1e-6, decay 0.01 off for biases/LayerNorm), LAMB or
  StableAdamW, at `learning_rate_schedule`'s rate."""
  parts = []
  if cfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  schedule = learning_rate_schedule(cfg, total_steps, decay_start, levels)
  if cfg.name == 'adamw':
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             mask=decay_mask))
  elif cfg.name == 'lamb':
    parts.append(lamb(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay))
  else:  # 'stable_adamw' (OptimConfig checked the name)
    parts.append(optax.chain(scale_by_stable_adam(cfg.b1, cfg.b2, cfg.eps),
                             optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
                             optax.scale_by_learning_rate(schedule)))
  return optax.chain(*parts)
