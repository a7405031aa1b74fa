"""A fine-tuning workdir's seeds (every task kind's): their run directories, each seed's result line, and the
summary over the seeds (mean, sample std, per-seed values)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bert_jax.config import FinetuneConfig
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir


def run_dirs(cfg: FinetuneConfig, workdir: Workdir) -> tuple[tuple[int, str], ...]:
  """(seed, seed_<n>/) of each seed."""
  return tuple((s, workdir.seed_dir(s)) for s in range(cfg.seed, cfg.seed + cfg.num_seeds))


def log_result(main: str, seed: int, result: dict[str, Any]) -> None:
  """A seed's line: its main metric (and best step), and how long evaluating took."""
  best = f' (best step {result["best_step"]})' if 'best_step' in result else ''
  reporting.log(f'seed {seed} step {result["step"]}: {main} {result[main]:.4f}{best} '
                f'(eval {reporting.format_duration(result["eval_wall_s"])})')


def summarize(per_seed: list[dict[str, Any]], main_metric: str) -> dict[str, Any]:
  """One seed: its metrics. Several: `<name>_mean`, `<name>_std` (sample std) and the per-seed values."""
  if len(per_seed) == 1:
    return {'main_metric': main_metric, **per_seed[0]}
  out: dict[str, Any] = {'main_metric': f'{main_metric}_mean', 'seeds': [r['seed'] for r in per_seed],
                         'step': per_seed[0]['step']}
  for name, value in per_seed[0].items():
    if (name in ('seed', 'step', 'train_steps', 'train_steps_this_invocation')
        or isinstance(value, (dict, list, str, bool))):
      continue
    values = [float(r[name]) for r in per_seed]
    out[f'{name}_mean'] = float(np.mean(values))
    out[f'{name}_std'] = float(np.std(values, ddof=1))
    out[f'{name}_per_seed'] = values
  out['per_seed'] = per_seed
  return out
