"""The phase plan: a `PretrainConfig`'s phases resolved once into an immutable `Plan` (`PretrainConfig.plan`).

A plan is the run's stages in order: each phase, or each batch size of a phase's batch-size ramp, as a `Phase`
with its steps [start, end), the run's config during it (sequence length, batch size, masking, RoPE theta, data,
peak learning rate) and the examples consumed before it. The job, the learning-rate schedule (decay start and
per-phase peaks) and the branch check all read the one plan. `_steps_for_tokens` turns a phase's length in
tokens into steps.

The plan lives in `bert_jax.config` (not `bert_jax.pretraining`): a `PretrainConfig` resolves it when it is
built, to refuse a bad phase at once, and the config package imports nothing of the runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

from bert_jax.config.fields import facts
from bert_jax.errors import ConfigError

if TYPE_CHECKING:
  from bert_jax.config.pretrain import PhaseConfig, PretrainConfig


@dataclasses.dataclass(frozen=True)
class Phase:
  """A stage of the plan: a phase (or one batch size of its ramp) resolved: its name, 1-based index of `count`,
  steps [start, end), the run's config during it, the examples the run consumed before it, the steps its phase's
  mask-rate schedule runs over, and its phase's learning-rate setting."""

  name: str
  index: int
  count: int
  start: int
  end: int
  cfg: 'PretrainConfig'
  first_example: int = 0
  schedule_start: int = 0
  schedule_steps: int = 0
  ramp: bool = False  # a batch size of the phase's ramp
  decay: bool = False  # its phase has lr='decay': the WSD decay runs from the first such phase's start

  @property
  def label(self) -> str:
    return f'phase {self.index}/{self.count} {self.name}' + (f' (batch {self.cfg.batch_size})' if self.ramp else '')

  @property
  def tokens(self) -> int:
    """Row tokens it trains: steps x batch x max_seq_length."""
    return (self.end - self.start) * self.cfg.batch_size * self.cfg.data.max_seq_length

  def layout(self, step: int) -> tuple:
    """What the stage trains on before `step`: its steps, data stream position, batch, sequence length, files,
    masking (its schedule's length when it ramps) and the config fields marked `layout` (batch, length, files,
    masking rates, RoPE theta). A branch must share these up to its branch point: the data stream and the
    schedules continue."""
    fields = tuple(functools.reduce(getattr, name.split('.'), self.cfg) for name in facts(type(self.cfg), 'layout'))
    return (self.start, min(self.end, step), self.first_example,
            self.schedule_steps if self.cfg.data.masked_lm_prob_end else None) + fields


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's stages, resolved once from its config (`resolve`); one stage named 'train' without phases.

  Attributes:
    stages: the phases (and batch sizes of their ramps) in order, each starting where the one before ends.
    phased: the config has `phases` (labels, per-phase evaluation and logging apply).
    decay_start: the step the WSD decay starts at (the first lr='decay' phase's), None: the schedule's default.
    lr_levels: (first step, peak / the run's peak) per stage when a phase sets its own learning_rate, else None.
  """

  stages: tuple[Phase, ...]
  phased: bool = False
  decay_start: int | None = None
  lr_levels: tuple[tuple[int, float], ...] | None = None

  @property
  def total_steps(self) -> int:
    """The run's optimizer steps as planned (0: a run in epochs, its length known from its data)."""
    return self.stages[-1].end

  def at(self, step: int) -> Phase:
    """The stage that trains step `step` + 1 (the last stage from its end on)."""
    return next((p for p in self.stages if p.start <= step < p.end), self.stages[-1])

  def before(self, step: int) -> Phase:
    """The stage whose training produced the state at `step` (the first stage at step 0)."""
    return self.at(max(step - 1, 0))

  def prefix(self, step: int) -> tuple[tuple, ...]:
    """Each stage's `layout` before `step`: what a run continued at `step` must share."""
    return tuple(p.layout(step) for p in self.stages if p.start < step)

  def same_prefix(self, other: Plan, step: int) -> bool:
    """Whether `other` trains as this plan up to `step` (a branch from `other` at `step`)."""
    return self.prefix(step) == other.prefix(step)

  def describe(self) -> str:
    """One line per stage: its steps, batch size (and ramp), sequence length and row tokens."""
    return '\n'.join(f'{p.label}: steps {p.start}-{p.end}, {p.cfg.batch_size} x {p.cfg.data.max_seq_length} '
                     f'tokens, {p.tokens:,} row tokens' for p in self.stages)


def resolve(run: PretrainConfig) -> Plan:
  """The run's plan: its stages (`_stages`), where the decay starts and each stage's learning-rate level.

  Raises:
    ConfigError: a phase's length, learning-rate segment or resulting config is invalid.
  """
  stages = tuple(_stages(run))
  decay_start = next((p.start for p in stages if p.decay), None)
  levels = None
  if any(p.learning_rate for p in run.phases.values()):
    levels = tuple((p.start, p.cfg.optim.learning_rate / run.optim.learning_rate) for p in stages)
  return Plan(stages, bool(run.phases), decay_start, levels)


def _stages(run: PretrainConfig) -> list[Phase]:
  """The run's stages: each phase, or each batch size of its ramp, with the run's config during it (one stage
  named 'train' without `phases`)."""
  if not run.phases:
    return [Phase('train', 1, 1, 0, run.num_train_steps, run, schedule_steps=run.num_train_steps)]
  total = sum(p.steps for p in run.phases.values())
  if run.num_train_epochs or run.num_train_steps != total:
    raise ConfigError(f'with phases the run\'s length is the sum of their steps ({total}); set num_train_steps=0 '
                      f'(or {total}) and num_train_epochs=0, got {run.num_train_steps} and {run.num_train_epochs}')
  decay = [name for name, p in run.phases.items() if p.lr == 'decay']
  out, start, examples, cfg = [], 0, 0, dataclasses.replace(run, phases={})
  for i, (name, p) in enumerate(run.phases.items()):
    where = f'phases.{name}'
    if p.lr not in ('', 'decay'):
      raise ConfigError(f"{where}.lr must be '' or 'decay', got {p.lr!r}")
    if decay and i > list(run.phases).index(decay[0]) and p.lr != 'decay':
      raise ConfigError(f"{where}.lr: the phases after the first decay phase ({decay[0]}) decay too: set lr='decay'")
    if p.lr == 'decay' and run.optim.schedule != 'wsd':
      raise ConfigError(f"{where}.lr='decay' needs optim.schedule='wsd' (got {run.optim.schedule!r})")
    data = cfg.data
    prob = p.masked_lm_prob if p.masked_lm_prob >= 0 else (data.masked_lm_prob if i == 0 else data.eval_masked_lm_prob)
    end = p.masked_lm_prob_end if p.masked_lm_prob_end >= 0 else (data.masked_lm_prob_end if i == 0 else 0.0)
    changes = dict(max_seq_length=p.max_seq_length or data.max_seq_length, masked_lm_prob=prob,
                   masked_lm_prob_end=end, train_files=p.train_files or data.train_files,
                   train_weights=p.train_weights or ('' if p.train_files else data.train_weights))
    if any(changes[k] != getattr(data, k) for k in changes):
      changes['max_predictions_per_seq'] = 0  # derived again from the phase's length and rates
      try:
        data = dataclasses.replace(data, **changes)
      except ConfigError as e:
        raise ConfigError(f'{where}: {e}') from None
    if p.learning_rate < 0:
      raise ConfigError(f'{where}.learning_rate must be > 0 (0: the phase before\'s), got {p.learning_rate}')
    try:
      model = dataclasses.replace(cfg.model, rope_theta=p.rope_theta or cfg.model.rope_theta,
                                  local_rope_theta=p.local_rope_theta or cfg.model.local_rope_theta)
      optim = dataclasses.replace(cfg.optim, learning_rate=p.learning_rate or cfg.optim.learning_rate)
      cfg = dataclasses.replace(cfg, data=data, model=model, optim=optim, batch_size=p.batch_size or cfg.batch_size,
                                num_train_steps=p.steps)
    except ConfigError as e:
      raise ConfigError(f'{where}: {e}') from None
    parts = [(s, cfg.batch_size) for s in [p.steps]]
    if p.ramp_batch_size or p.ramp_tokens:
      parts = _ramp(where, p, cfg.batch_size, data.max_seq_length)
    at = start
    for steps, batch in parts:
      try:
        part = dataclasses.replace(cfg, batch_size=batch)
      except ConfigError as e:
        raise ConfigError(f'{where} (its ramp at batch {batch}): {e}') from None
      out.append(Phase(name, i + 1, len(run.phases), at, at + steps, part, examples, start, p.steps,
                       ramp=batch != cfg.batch_size, decay=p.lr == 'decay'))
      at, examples = at + steps, examples + steps * batch
    start += p.steps
  return out


def _ramp_parts(where: str, p: PhaseConfig, batch_size: int, seq: int) -> list[tuple[int, int]]:
  """(steps, batch size) of a batch-size ramp: doubling sizes from p.ramp_batch_size, each an equal share of
  p.ramp_tokens ([] without a ramp)."""
  if not (p.ramp_batch_size or p.ramp_tokens):
    return []
  if not 0 < p.ramp_batch_size < batch_size or p.ramp_tokens <= 0:
    raise ConfigError(f'{where}: a batch-size ramp needs 0 < ramp_batch_size ({p.ramp_batch_size}) < batch_size '
                      f'({batch_size}) and ramp_tokens > 0 ({p.ramp_tokens})')
  sizes = [p.ramp_batch_size]
  while sizes[-1] * 2 < batch_size:
    sizes.append(sizes[-1] * 2)
  share = p.ramp_tokens / len(sizes)
  return [(math.ceil(share / (b * seq)), b) for b in sizes]


def _steps_for_tokens(where: str, p: PhaseConfig, batch_size: int, seq: int) -> int:
  """The fewest steps whose rows (its ramp's, then `batch_size` x `seq`) hold at least p.tokens tokens."""
  ramp = _ramp_parts(where, p, batch_size, seq)
  left = p.tokens - sum(n * b * seq for n, b in ramp)
  if ramp and left <= 0:
    raise ConfigError(f'{where}: its batch-size ramp alone trains {sum(n * b * seq for n, b in ramp):,} of its '
                      f'{p.tokens:,} tokens; lower ramp_tokens or give the phase more tokens')
  return sum(n for n, _ in ramp) + math.ceil(left / (batch_size * seq))


def _ramp(where: str, p: PhaseConfig, batch_size: int, seq: int) -> list[tuple[int, int]]:
  """(steps, batch size) of a phase with a batch-size ramp: `_ramp_parts`, then the rest of the phase at
  `batch_size`."""
  parts = _ramp_parts(where, p, batch_size, seq)
  left = p.steps - sum(n for n, _ in parts)
  if left <= 0:
    raise ConfigError(f'{where}: its batch-size ramp takes {sum(n for n, _ in parts)} steps of its {p.steps}; '
                      'lower ramp_tokens or give the phase more steps')
  return parts + [(left, batch_size)]
