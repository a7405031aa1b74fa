"""Optax optimizer for BERT: clipping, AdamW with BERT's decay mask, warmup + linear decay.

Gradient accumulation is done inside the train step (`train.step`), so one optimizer update is
one step and the schedule, checkpoints and data position all count the same steps.
"""

from __future__ import annotations

import jax
import optax

from bert_jax.config import OptimConfig


def learning_rate_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over `cfg.warmup(total_steps)` steps, then linear decay to 0 at the end."""
  warmup = max(0, min(cfg.warmup(total_steps), total_steps))
  return optax.join_schedules(
      [optax.linear_schedule(0.0, cfg.learning_rate, warmup),
       optax.linear_schedule(cfg.learning_rate, 0.0, max(1, total_steps - warmup))],
      boundaries=[warmup])


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


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW (beta 0.9/0.999, eps 1e-6, decay 0.01 off for biases/LayerNorm) or LAMB."""
  parts = []
  if cfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  schedule = learning_rate_schedule(cfg, total_steps)
  if cfg.name == 'adamw':
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             mask=decay_mask))
  else:  # 'lamb' (OptimConfig checked the name)
    parts.append(lamb(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay))
  return optax.chain(*parts)
