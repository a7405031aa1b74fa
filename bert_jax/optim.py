"""Optax optimizer for BERT: clipping, AdamW with BERT's decay mask, warmup + linear decay.

Gradient accumulation is done inside the train step (`train_lib`), so one optimizer update is
one step and the schedule, checkpoints and data position all count the same steps.
"""

from __future__ import annotations

import jax
import optax

from bert_jax.config import OptimConfig


def learning_rate_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over `warmup_steps`, then linear decay to 0 at `total_steps`."""
  warmup = max(0, min(cfg.warmup_steps, total_steps))
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


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW (beta 0.9/0.999, eps 1e-6, decay 0.01 off for biases/LayerNorm)."""
  parts = []
  if cfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts)
