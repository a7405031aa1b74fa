"""Early stopping: a run ends when its held-out metric has not improved for `patience` evaluations.

Keras's semantics: an evaluation improves when it beats the best so far by more than `min_delta` (higher is better;
lower for a metric named like a loss or a perplexity); each other evaluation adds one to `wait`, and the run stops
at the evaluation where `wait` reaches `patience`. The state rides in every checkpoint's meta (`state`), so a run
killed mid-way resumes with the count it had, and a run that stopped early finds itself finished when started again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bert_jax.errors import BertJaxError

META_KEY = 'early_stopping'


def lower_is_better(metric: str) -> bool:
  return 'loss' in metric or 'perplexity' in metric


@dataclasses.dataclass
class EarlyStopping:
  """The patience count of one run (see the module docstring)."""

  metric: str
  patience: int
  min_delta: float = 0.0
  best: float | None = None  # the value the last improvement reached
  best_step: int | None = None
  wait: int = 0  # evaluations since that improvement
  stopped_at: int | None = None  # the step the run stopped at, once it has

  def update(self, step: int, metrics: dict[str, Any]) -> bool:
    """Counts the evaluation of `step`; whether the run stops here.

    Raises:
      BertJaxError: the evaluation has no `metric` (a name of another task's metrics).
    """
    if self.metric not in metrics:
      numbers = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
      raise BertJaxError(f'early_stopping_metric={self.metric!r} is not among the evaluation\'s metrics: '
                         f'{", ".join(numbers)}')
    value = float(metrics[self.metric])
    sign = -1.0 if lower_is_better(self.metric) else 1.0
    if not math.isnan(value) and (self.best is None or sign * (value - self.best) > self.min_delta):
      self.best, self.best_step, self.wait = value, step, 0
    else:
      self.wait += 1
    if self.wait >= self.patience:
      self.stopped_at = step
    return self.stopped_at is not None

  def reason(self) -> str:
    return (f'{self.metric} did not improve by more than {self.min_delta:g} for {self.patience} evaluations '
            f'(best {self.best:.4f} at step {self.best_step})' if self.best is not None else
            f'{self.metric} had no value for {self.patience} evaluations')

  def state(self) -> dict[str, Any]:
    """What a checkpoint's meta keeps (`restore` reads it back)."""
    return {'metric': self.metric, 'best': self.best, 'best_step': self.best_step, 'wait': self.wait,
            'stopped_at': self.stopped_at}

  def restore(self, meta: dict[str, Any] | None) -> None:
    """The count a checkpoint's meta kept (of the same metric; a checkpoint without one starts it afresh)."""
    saved = (meta or {}).get(META_KEY)
    if saved and saved.get('metric') == self.metric:
      self.best, self.best_step = saved['best'], saved['best_step']
      self.wait, self.stopped_at = int(saved['wait']), saved['stopped_at']

  def result(self) -> dict[str, Any]:
    """What the run's final metrics say: whether, where and why it stopped early."""
    out: dict[str, Any] = {'stopped_early': self.stopped_at is not None}
    if self.stopped_at is not None:
      out.update(stop_step=self.stopped_at, stop_reason=self.reason())
    return out
