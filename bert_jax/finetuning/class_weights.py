"""Class weights for imbalanced labels: `HeadTaskConfig.class_weights` resolved against a task's label names and its
training labels.

'' none; 'auto' inverse frequency; 'name=w,...' per label name (unnamed labels 1). What a weight means by head kind:
- classification and tagging: the loss of an example (a labelled token) of class c is multiplied by w_c, and the mean
  over a batch is the weighted mean (PyTorch's `CrossEntropyLoss(weight=...)`); 'auto' is w_c = N / (C * n_c), N
  training examples (labelled tokens) of C classes, n_c of class c (scikit-learn's 'balanced'), so the weighted
  examples still count N.
- multilabel: w_c multiplies label c's positive term of the sigmoid cross-entropy (PyTorch's
  `BCEWithLogitsLoss(pos_weight=...)`), since each label is its own yes/no; 'auto' is n_negative / n_positive.
A class absent from the training labels gets weight 1 under 'auto' (nothing to weight).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax.errors import ConfigError
from bert_jax.finetuning.tasks.base import IGNORE, Feature

AUTO = 'auto'


def label_counts(features: Sequence[Feature], kind: str, num_labels: int) -> tuple[np.ndarray, int]:
  """(count of each class, count of examples) in the training features: tagging counts labelled tokens; multilabel
  counts each label's positives among the examples."""
  if kind == 'token':
    tags = np.concatenate([f.token_labels for f in features]) if features else np.zeros(0, np.int64)
    tags = tags[tags != IGNORE]
    return np.bincount(tags, minlength=num_labels)[:num_labels], len(tags)
  if kind == 'multilabel':
    hot = np.array([np.asarray(f.label, np.float32) for f in features]).reshape(len(features), num_labels)
    return (hot > 0.5).sum(axis=0), len(features)
  labels = np.array([int(f.label) for f in features], np.int64)
  return np.bincount(labels, minlength=num_labels)[:num_labels], len(labels)


def resolve(spec: str, kind: str, label_names: Sequence[str], counts: np.ndarray, total: int) -> tuple[float, ...]:
  """The weight of each label, in label order; () for none.

  Raises:
    ConfigError: a weight for a label the task does not have, a weight <= 0 or not a number, a task without classes.
  """
  spec = spec.strip()
  if not spec:
    return ()
  if kind not in ('classification', 'multilabel', 'token'):
    raise ConfigError(f'class_weights={spec!r}: a {kind} task has no classes to weight')
  names = [str(n) for n in label_names]
  if spec == AUTO:
    if kind == 'multilabel':
      return tuple(float((total - n) / n) if n else 1.0 for n in counts)
    return tuple(float(total / (len(names) * n)) if n else 1.0 for n in counts)
  weights = dict.fromkeys(names, 1.0)
  for entry in (e.strip() for e in spec.split(',') if e.strip()):
    name, sep, value = entry.rpartition('=')
    if not sep or name not in weights:
      raise ConfigError(f'class_weights entry {entry!r}: give auto or label=weight,... with labels of '
                        f'{", ".join(names)}')
    try:
      weight = float(value)
    except ValueError:
      weight = float('nan')
    if not weight > 0 or not np.isfinite(weight):
      raise ConfigError(f'class_weights entry {entry!r}: a weight must be a number > 0')
    weights[name] = weight
  return tuple(weights[n] for n in names)


def describe(weights: Sequence[float], label_names: Sequence[str], counts: np.ndarray) -> str:
  """One line: each label's weight and training count."""
  return 'class weights: ' + ', '.join(f'{n} {w:.4g} ({int(c)} in training)'
                                       for n, w, c in zip(label_names, weights, counts))
