"""The block every run shares: `TrainingConfig` (optimizer, mesh, seed, batch, length, cadence, checkpoints,
resume rules, the checkpoint to start from) with its optimizer and mesh blocks (`OptimConfig`, `MeshConfig`), and
`from_dict`'s builder (`_from_dict`), which names unknown keys and the new field of a renamed one."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bert_jax.config.fields import _block, _f
from bert_jax.config.migration import REMOVED, RENAMED
from bert_jax.errors import ConfigError


OPTIMIZERS = ('adamw', 'lamb', 'stable_adamw')
SCHEDULES = ('linear', 'wsd')
DECAYS = ('linear', 'cosine', '1-sqrt')


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW (BERT's settings), LAMB or StableAdamW, with a warmup then linear decay or warmup-stable-decay."""

  # 'adamw'; 'lamb' (layer-wise trust ratio, for large-batch pretraining); 'stable_adamw' (AdamW whose update
  # is scaled per tensor by 1 / max(1, RMS(g^2 / v)), as ModernBERT trains).
  name: str = 'adamw'
  learning_rate: float = 1e-4
  warmup_steps: int = 100
  # > 0: the warmup is this fraction of the run's steps (rounded up) instead of warmup_steps.
  warmup_ratio: float = 0.0
  # 'linear': after the warmup, linear decay to 0 at the last step (BERT). 'wsd': warmup, then stable at the peak,
  # then `decay` down to min_lr_ratio x the peak over the decay phase (a phase with lr='decay'), or over the
  # last decay_fraction of the run without phases.
  schedule: str = _f('linear', branch=True)
  decay: str = _f('linear', branch=True)  # the WSD decay's shape: 'linear', 'cosine' or '1-sqrt'
  decay_fraction: float = _f(0.1, branch=True)
  min_lr_ratio: float = _f(0.0, branch=True)
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  clip_norm: float = 1.0
  grad_accum_steps: int = 1

  def __post_init__(self):
    for name, choices in (('name', OPTIMIZERS), ('schedule', SCHEDULES), ('decay', DECAYS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f'optim.{name} must be one of {", ".join(choices)}, got {getattr(self, name)!r}')
    if not (0 < self.decay_fraction <= 1 and 0 <= self.min_lr_ratio < 1):
      raise ConfigError(f'optim.decay_fraction ({self.decay_fraction}) must be in (0, 1] and optim.min_lr_ratio '
                        f'({self.min_lr_ratio}) in [0, 1)')
    # A negative rate is gradient ascent; NaN trains nothing.
    if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate)
            and self.learning_rate > 0):
      raise ConfigError(f'optim.learning_rate must be a positive number, got {self.learning_rate}')
    if self.warmup_steps < 0 or not 0 <= self.warmup_ratio <= 1:
      raise ConfigError(f'optim.warmup_steps ({self.warmup_steps}) must be >= 0 and optim.warmup_ratio '
                        f'({self.warmup_ratio}) in [0, 1]')
    if self.weight_decay < 0 or self.eps <= 0 or self.clip_norm < 0:
      raise ConfigError(f'optim.weight_decay ({self.weight_decay}) and clip_norm ({self.clip_norm}) must be >= 0 '
                        f'and eps ({self.eps}) > 0')
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
      raise ConfigError(f'optim.b1 ({self.b1}) and b2 ({self.b2}) must be in [0, 1)')
    if self.grad_accum_steps < 1:
      raise ConfigError(f'optim.grad_accum_steps must be >= 1, got {self.grad_accum_steps}')

  def warmup(self, total_steps: int) -> int:
    """Warmup steps of a run of `total_steps`."""
    return math.ceil(self.warmup_ratio * total_steps) if self.warmup_ratio > 0 else self.warmup_steps


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh sizes; -1 means 'all remaining devices'. With several slices (TPU pods joined over the data-centre
  network) data/fsdp/tensor are the sizes inside one slice and the data axis spans `slices` x `data`."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  # Data-parallel replicas across slices, outermost on the data axis: -1 = as many as the devices report (their
  # `slice_index`; 1 where they report none). A value > 1 on devices without slices groups them by process.
  slices: int = -1
  # Overrides of sharding.LOGICAL_AXIS_RULES, comma-separated name=axis[+axis] (empty: replicated), e.g.
  # 'activation_length=tensor,activation_mlp=' shards activations over the sequence instead of the MLP features.
  rules: str = ''


TRACKING_SERVICES = ('wandb', 'mlflow')  # what `tracking` may name (runs.tracking sends to them)


def tracking_services(tracking: str) -> tuple[str, ...]:
  """The services a `tracking` field names, in its order."""
  return tuple(s.strip() for s in tracking.split(',') if s.strip())


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """What every run shares: optimizer, mesh, seed, batch, length, cadence, checkpoints, resume rules and
  the checkpoint it starts from. `PretrainConfig` and `FinetuneConfig` extend it."""

  optim: OptimConfig = _f(factory=OptimConfig)
  mesh: MeshConfig = _f(factory=MeshConfig, free=True, evaluation=True)
  seed: int = 0
  batch_size: int = _f(32, layout=True)  # global batch per optimizer step
  eval_batch_size: int = _f(64, free=True, evaluation=True)
  # The run's length: num_train_steps when > 0, else num_train_epochs passes over the training examples.
  num_train_steps: int = _f(1000, branch=True)
  num_train_epochs: float = 0.0
  log_every: int = _f(50, free=True, evaluation=True)
  eval_every: int = _f(500, free=True)  # 0: evaluate at the end only
  checkpoint_every: int = _f(500, free=True)  # 0: save at the end only
  keep_checkpoints: int = _f(3, free=True)
  # Also keep the checkpoint with the best held-out main metric (a checkpoint is saved at each evaluation;
  # needs eval_every > 0); the run's final results are then the best step's.
  keep_best: bool = _f(False, free=True)
  # Early stopping (train.early_stopping): end the run when the held-out metric (early_stopping_metric, '' the main
  # one) has not improved by more than early_stopping_min_delta for this many evaluations (0: never); it keeps the
  # best checkpoint (keep_best) and reports where and why it stopped.
  early_stopping_patience: int = _f(0, free=True)
  early_stopping_min_delta: float = _f(0.0, free=True)
  early_stopping_metric: str = _f('', free=True)
  # Also send the run's config and metrics to Weights & Biases and/or MLflow: 'wandb', 'mlflow' or 'wandb,mlflow'
  # (configured by their own environment: WANDB_MODE/WANDB_DIR, MLFLOW_TRACKING_URI); '' the files only.
  tracking: str = _f('', free=True)
  tracking_project: str = _f('bert_jax', free=True)  # the W&B project / MLflow experiment
  run_name: str = _f('', free=True)  # the tracked run's name; '' the workdir's (and the seed's) name
  # Resuming refuses a checkpoint whose run differs in data, batch, seed, steps or optimizer;
  # comma-separated fields (or sections, e.g. 'optim') listed here may change deliberately
  # (checked when a run starts, so a saved config naming a field renamed since still loads).
  resume_allow: str = _f('', free=True)
  # The weights a run starts from: a Hugging Face directory or a bert_jax workdir (pretraining or
  # fine-tuning), only ever read. Its architecture, vocabulary and tokenizer replace the config's; the
  # encoder (and the heads it has that the run uses) start the run, while the optimizer, step and data
  # position start fresh. Not resuming: that is re-running in one workdir.
  init_checkpoint: str = _f('', path=True)
  init_checkpoint_step: int = -1  # for a bert_jax workdir: -1 = latest

  def __post_init__(self):
    """The checks that need neither the mesh nor the model (those are the runs' `check`)."""
    for name in ('batch_size', 'eval_batch_size', 'log_every', 'keep_checkpoints'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'{name} must be positive, got {getattr(self, name)}')
    for name in ('eval_every', 'checkpoint_every', 'num_train_steps', 'num_train_epochs'):
      if getattr(self, name) < 0:
        raise ConfigError(f'{name} must be >= 0, got {getattr(self, name)}')
    if self.num_train_steps <= 0 and self.num_train_epochs <= 0:
      raise ConfigError('set num_train_steps > 0 or num_train_epochs > 0' + (' (or phases)' if hasattr(self, 'phases')
                                                                             else ''))
    if self.early_stopping_patience < 0 or self.early_stopping_min_delta < 0:
      raise ConfigError(f'early_stopping_patience ({self.early_stopping_patience}) and early_stopping_min_delta '
                        f'({self.early_stopping_min_delta}) must be >= 0')
    if self.early_stopping_patience:
      if self.eval_every <= 0:
        raise ConfigError(f'eval_every={self.eval_every}: early stopping counts evaluations; give a positive number '
                          'of steps between them')
      object.__setattr__(self, 'keep_best', True)  # the run's results are its best evaluation's
    if self.keep_best and self.eval_every <= 0:
      raise ConfigError(f'eval_every={self.eval_every}: give a positive number of steps between evaluations '
                        '(keep_best ranks the checkpoints saved at each evaluation)')
    unknown = [s for s in tracking_services(self.tracking) if s not in TRACKING_SERVICES]
    if unknown:
      raise ConfigError(f'tracking={self.tracking!r}: {", ".join(unknown)} is not one of '
                        f'{", ".join(TRACKING_SERVICES)} (comma-separated; empty for none)')
    if self.batch_size % self.optim.grad_accum_steps:
      raise ConfigError(f'batch_size={self.batch_size} must be a multiple of optim.grad_accum_steps='
                        f'{self.optim.grad_accum_steps}')

  def total_steps(self, num_train_examples: int) -> int:
    """The run's optimizer steps: num_train_steps, or num_train_epochs over `num_train_examples`."""
    if self.num_train_steps > 0:
      return self.num_train_steps
    return max(1, math.ceil(self.num_train_epochs * math.ceil(num_train_examples / self.batch_size)))

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]):
    """Builds a config from a (nested) dict, naming any unknown key (and the new name of a renamed one)."""
    return _from_dict(cls, dict(d), prefix='')


def _from_dict(cls, d: dict[str, Any], prefix: str):
  fields = {f.name: f for f in dataclasses.fields(cls)}
  old = sorted(set(d) - set(fields)) if not prefix else []  # the old flat names were top-level fields
  moved = [f'{k} is now {RENAMED[k]}' for k in old if k in RENAMED]
  gone = [f'{k} is gone: {REMOVED[k]}' for k in old if k in REMOVED]
  if moved or gone:
    raise ConfigError('; '.join(moved + gone))
  unknown = sorted(set(d) - set(fields))
  if unknown:
    raise ConfigError(f'unknown config key(s): {", ".join(prefix + k for k in unknown)}; '
                      f'valid keys under {prefix or "the top level"}: {", ".join(fields)}')
  kwargs = {}
  for name, value in d.items():
    sub = _block(fields[name])
    kwargs[name] = _from_dict(sub, dict(value), prefix + name + '.') if sub and isinstance(value, dict) else value
  try:
    return cls(**kwargs)
  except TypeError as e:
    raise ConfigError(f'bad config under {prefix or "the top level"}: {e}') from None
