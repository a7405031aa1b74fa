"""Evaluation metrics as plain numpy functions: GLUE's and CoNLL's entity-level scores.

Each matches its usual reference: `matthews_corrcoef` sklearn's, `pearson`/`spearman`
scipy's (Spearman = Pearson of average ranks), and `entity_scores` the conlleval script
(exact span and type, chunks read the way conlleval reads IOB1 and BIO).
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np


def accuracy(preds: Sequence[int], labels: Sequence[int]) -> float:
  """Fraction of `preds` equal to `labels`; 0.0 for empty input."""
  preds, labels = _pair(preds, labels)
  return float(np.mean(preds == labels)) if len(labels) else 0.0


def majority_accuracy(labels: Sequence[int]) -> float:
  """The accuracy of always answering the most frequent of `labels` (the floor a classifier must beat)."""
  labels = np.asarray(labels)
  return float(np.unique(labels, return_counts=True)[1].max() / len(labels)) if len(labels) else 0.0


def f1_binary(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
  """F1 of the `positive` class; 0.0 when it is neither predicted nor gold."""
  preds, labels = _pair(preds, labels)
  tp = int(np.sum((preds == positive) & (labels == positive)))
  n_pred, n_gold = int(np.sum(preds == positive)), int(np.sum(labels == positive))
  return _f1(tp, n_pred, n_gold)


def f1_macro(preds: Sequence[int], labels: Sequence[int]) -> float:
  """The mean of each class's F1 over the classes present in `labels` or `preds` (sklearn's
  f1_score(average='macro'): a class neither gold nor predicted is not averaged); 0.0 for empty input."""
  preds, labels = _pair(preds, labels)
  classes = np.union1d(preds, labels)
  return float(np.mean([f1_binary(preds, labels, positive=k) for k in classes])) if len(classes) else 0.0


def multilabel_scores(preds_nl: np.ndarray, golds_nl: np.ndarray) -> dict[str, float]:
  """Multi-label scores of boolean [N, L] predictions against gold sets: micro F1 (over every (row, label)
  decision), macro F1 (the mean of each label's F1; a label neither predicted nor gold scores 0.0, as
  sklearn's zero_division=0) and subset accuracy (rows whose predicted set equals the gold one)."""
  preds_nl, golds_nl = np.asarray(preds_nl, bool), np.asarray(golds_nl, bool)
  tp, n_pred, n_gold = (preds_nl & golds_nl).sum(0), preds_nl.sum(0), golds_nl.sum(0)
  per_label = [_f1(int(t), int(p), int(g)) for t, p, g in zip(tp, n_pred, n_gold)]
  return {'micro_f1': _f1(int(tp.sum()), int(n_pred.sum()), int(n_gold.sum())),
          'macro_f1': float(np.mean(per_label)) if per_label else 0.0,
          'subset_accuracy': float(np.mean(np.all(preds_nl == golds_nl, axis=1))) if len(golds_nl) else 0.0}


# A confusion table is printed for at most this many classes (wider ones do not read as a table).
CONFUSION_MAX_CLASSES = 20


def class_report(preds: Sequence[int], labels: Sequence[int], names: Sequence[str]) -> str:
  """Per class: precision, recall, F1 (as `f1_binary`) and support (gold count); then, for at most
  CONFUSION_MAX_CLASSES classes, the confusion table (rows: gold class, columns: predicted class)."""
  preds, labels = _pair(preds, labels)
  width = max(8, *(len(n) for n in names))
  lines = [f'{"class":<{width}}  precision  recall     f1  support']
  for k, name in enumerate(names):
    tp = int(np.sum((preds == k) & (labels == k)))
    n_pred, n_gold = int(np.sum(preds == k)), int(np.sum(labels == k))
    precision, recall = (tp / n_pred if n_pred else 0.0), (tp / n_gold if n_gold else 0.0)
    lines.append(f'{name:<{width}}  {precision:9.4f}  {recall:6.4f}  {_f1(tp, n_pred, n_gold):.4f}  {n_gold:7d}')
  if len(names) <= CONFUSION_MAX_CLASSES:
    counts = np.zeros((len(names), len(names)), np.int64)
    np.add.at(counts, (labels, preds), 1)
    cell = max(6, *(len(n) for n in names), len(str(int(counts.max(initial=0)))))
    lines.append('confusion (rows: gold, columns: predicted)')
    lines.append(' ' * width + ''.join(f'  {n:>{cell}}' for n in names))
    lines += [f'{name:<{width}}' + ''.join(f'  {c:>{cell}d}' for c in row) for name, row in zip(names, counts)]
  return '\n'.join(lines)


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
  """Matthews correlation coefficient (multi-class form, as sklearn); 0.0 when undefined."""
  preds, labels = _pair(preds, labels)
  classes, both = np.unique(np.concatenate([labels, preds]), return_inverse=True)
  n = len(labels)
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (both[:n], both[n:]), 1)
  t_k, p_k = confusion.sum(axis=1), confusion.sum(axis=0)  # gold / predicted per class
  c, s = np.trace(confusion), float(n)
  cov_yp = c * s - np.dot(t_k, p_k)
  cov_yy, cov_pp = s * s - np.dot(t_k, t_k), s * s - np.dot(p_k, p_k)
  if cov_yy * cov_pp == 0:
    return 0.0
  return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
  """Pearson correlation; nan when either input is constant (as scipy)."""
  x, y = _pair(x, y, np.float64)
  dx, dy = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.dot(dx, dx) * np.dot(dy, dy))
  return float(np.dot(dx, dy) / denom) if denom > 0 else float('nan')


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman rank correlation: Pearson of the ranks, tied values sharing their mean rank."""
  x, y = _pair(x, y, np.float64)
  return pearson(average_ranks(x), average_ranks(y))


def average_ranks(values: Sequence[float]) -> np.ndarray:
  """1-based ranks, ties given the mean of the ranks they span (scipy's rankdata 'average')."""
  values = np.asarray(values, np.float64)
  order = np.argsort(values, kind='stable')
  sorted_values = values[order]
  # Runs of equal values: each gets the mean of its first and last 1-based position.
  starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
  ends = np.r_[starts[1:], len(values)]
  run_ranks = (starts + 1 + ends) / 2.0
  ranks = np.empty(len(values), np.float64)
  ranks[order] = np.repeat(run_ranks, ends - starts)
  return ranks


def conll_chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
  """Entity chunks of a tag sequence, read as conlleval reads them (IOB1 or BIO).

  A chunk starts at B-, or at I- after O or after a chunk of another type; it ends before
  B-, O, or an I- of another type.

  Args:
    tags: 'O', 'B-TYPE' or 'I-TYPE' per token.

  Returns:
    {(start, end_inclusive, type)}.
  """
  chunks, start, ctype = set(), None, ''
  prev_tag, prev_type = 'O', ''
  for i, t in enumerate(list(tags) + ['O']):
    tag, typ = ('O', '') if t == 'O' else (t[0], t[2:])
    ends = prev_tag in ('B', 'I') and (tag in ('B', 'O') or (tag == 'I' and typ != prev_type))
    if ends and start is not None:
      chunks.add((start, i - 1, ctype))
      start = None
    if tag == 'B' or (tag == 'I' and (prev_tag == 'O' or typ != prev_type)):
      start, ctype = i, typ
    prev_tag, prev_type = tag, typ
  return chunks


def entity_scores(golds: Sequence[Sequence[str]], preds: Sequence[Sequence[str]]) -> dict[str, Any]:
  """Entity-level micro precision/recall/F1 (conlleval): a chunk counts only on exact span and type.

  Args:
    golds: gold tags per sentence.
    preds: predicted tags per sentence, the same lengths.

  Returns:
    precision, recall, f1, n_gold, n_pred, n_correct and per_type:
    {type: {precision, recall, f1, n_gold}} for every type gold or predicted.
  """
  if len(golds) != len(preds):
    raise ValueError(f'{len(golds)} gold sentences but {len(preds)} predicted')
  counts = collections.defaultdict(lambda: [0, 0, 0])  # type -> [correct, gold, predicted]
  for gold, pred in zip(golds, preds):
    if len(gold) != len(pred):
      raise ValueError(f'a sentence has {len(gold)} gold tags but {len(pred)} predicted')
    gold_chunks, pred_chunks = conll_chunks(gold), conll_chunks(pred)
    for chunk in gold_chunks & pred_chunks:
      counts[chunk[2]][0] += 1
    for chunk in gold_chunks:
      counts[chunk[2]][1] += 1
    for chunk in pred_chunks:
      counts[chunk[2]][2] += 1
  n_correct, n_gold, n_pred = (sum(c[k] for c in counts.values()) for k in range(3))
  scores = _prf(n_correct, n_gold, n_pred)
  scores.update(n_gold=n_gold, n_pred=n_pred, n_correct=n_correct)
  scores['per_type'] = {typ: dict(_prf(*counts[typ]), n_gold=counts[typ][1])
                        for typ in sorted(counts)}
  return scores


def _prf(n_correct: int, n_gold: int, n_pred: int) -> dict[str, float]:
  precision = n_correct / n_pred if n_pred else 0.0
  recall = n_correct / n_gold if n_gold else 0.0
  return {'precision': precision, 'recall': recall, 'f1': _f1(n_correct, n_pred, n_gold)}


def _f1(n_correct: int, n_pred: int, n_gold: int) -> float:
  return 2.0 * n_correct / (n_pred + n_gold) if n_pred + n_gold else 0.0


def _pair(a, b, dtype=None) -> tuple[np.ndarray, np.ndarray]:
  a, b = np.asarray(a, dtype).reshape(-1), np.asarray(b, dtype).reshape(-1)
  if len(a) != len(b):
    raise ValueError(f'{len(a)} predictions but {len(b)} labels')
  return a, b
