"""What a task hands to the fine-tuning loop, and what it gets back.

A task reads its files, tokenizes them into `Feature`s (one model input each: [CLS] ... [SEP],
already truncated to `max_seq_length`), and scores the logits the loop returns for an
`EvalSet`, one array per feature in feature order:

  classification, multilabel: float32 [num_labels]     regression: float32 [1]
  token:          float32 [len, num_labels] (one row per input token)
  span:           float32 [len, 2]          (start logits [:, 0], end logits [:, 1])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import numpy as np

IGNORE = -100  # token label that takes no loss (later sub-tokens, [CLS], [SEP])


@dataclasses.dataclass
class Feature:
  """One model input."""

  input_ids: np.ndarray  # int32 [len]
  token_type_ids: np.ndarray  # int32 [len]
  label: int | float | np.ndarray = 0  # classification (class index) / regression (target) / multilabel (multi-hot)
  token_labels: np.ndarray | None = None  # token kind: int32 [len], IGNORE where no loss
  start: int = 0  # span kind: answer start/end token index in this feature; 0/0 = [CLS] = no answer
  end: int = 0
  example_index: int = 0  # the example (sentence, question) this feature came from

  def __len__(self) -> int:
    return len(self.input_ids)


@dataclasses.dataclass
class EvalSet:
  """Features to predict plus whatever the task needs to score them (examples, gold labels)."""

  name: str  # 'dev', 'test', ...
  features: list[Feature]
  data: Any = None


class Task(Protocol):
  name: str
  kind: str  # model.heads.HEAD_KINDS: 'classification', 'regression', 'multilabel', 'token' or 'span'
  num_labels: int
  main_metric: str  # the metric a sweep ranks runs by

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    ...

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    ...

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray], output_dir: str | None) -> dict[str, Any]:
    """Metrics for `eval_set` (flat name -> number; nested dicts allowed for breakdowns);
    writes predictions under `output_dir` when it is not None."""
    ...
