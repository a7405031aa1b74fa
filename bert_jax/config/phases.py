"""Phase planning: a `PretrainConfig`'s phases resolved into the run's plan (`phase_list`, which
`PretrainConfig.phase_list` returns): each phase (and each batch size of its batch-size ramp) as a `Phase`, its steps,
the run's config during it and the examples consumed before it; a phase's length in tokens as steps
(`_steps_for_tokens`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from bert_jax.errors import ConfigError

if TYPE_CHECKING:
  from bert_jax.config.pretrain import PhaseConfig, PretrainConfig


@dataclasses.dataclass(frozen=True)
class Phase:
  """A phase (or one batch size of its ramp) resolved: its name, 1-based index of `count`, steps [start, end),
  the run's config during it, the examples the run consumed before it, and the steps its phase's
  mask-rate schedule runs over."""

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

  @property
  def label(self) -> str:
    return f'phase {self.index}/{self.count} {self.name}' + (f' (batch {self.cfg.batch_size})' if self.ramp else '')

  @property
  def tokens(self) -> int:
    """Row tokens it trains: steps x batch x max_seq_length."""
    return (self.end - self.start) * self.cfg.batch_size * self.cfg.data.max_seq_length


def phase_list(run: PretrainConfig) -> list[Phase]:
  """The run's phases, resolved (one phase named 'train' without `phases`).

  Raises:
    ConfigError: a phase's length, learning-rate segment or resulting config is invalid.
  """
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
                       ramp=batch != cfg.batch_size))
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
