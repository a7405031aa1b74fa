"""metrics.class_report: evaluate.py's per-class table of a classification eval set (precision, recall, F1 and
support per class, and the confusion table up to CONFUSION_MAX_CLASSES classes), checked by hand; macro F1 by hand
and against sklearn's."""

import numpy as np
import pytest

from bert_jax import metrics


def test_class_report_by_hand():
  # gold:      neg neg neg pos pos pos   (no 'neutral' gold)
  # predicted: neg neg pos pos pos neu
  report = metrics.class_report([0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1], ['negative', 'positive', 'neutral'])
  assert report.splitlines() == [
      'class     precision  recall     f1  support',
      'negative     1.0000  0.6667  0.8000        3',
      'positive     0.6667  0.6667  0.6667        3',
      'neutral      0.0000  0.0000  0.0000        0',
      'confusion (rows: gold, columns: predicted)',
      '          negative  positive   neutral',
      'negative         2         1         0',
      'positive         0         2         1',
      'neutral          0         0         0']


def test_many_classes_get_no_confusion_table():
  names = [f'c{k}' for k in range(metrics.CONFUSION_MAX_CLASSES + 1)]
  report = metrics.class_report(list(range(len(names))), list(range(len(names))), names)
  assert len(report.splitlines()) == 1 + len(names) and 'confusion' not in report
  assert all(line.endswith('1.0000  1.0000  1.0000        1') for line in report.splitlines()[1:])


def test_multilabel_scores_by_hand():
  gold = [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
  pred = [[1, 0, 0], [0, 1, 1], [0, 0, 0]]
  scores = metrics.multilabel_scores(pred, gold)
  # micro: tp 2, predicted 3, gold 3 -> F1 2/3; per label: 1.0, 1.0, 0.0 (1 gold, 1 predicted, none right)
  assert scores == {'micro_f1': 2 / 3, 'macro_f1': 2 / 3, 'subset_accuracy': 1 / 3}


def test_majority_accuracy_is_the_most_frequent_class_share():
  assert metrics.majority_accuracy([1, 0, 1, 1, 2]) == 0.6 and metrics.majority_accuracy([]) == 0.0


def test_f1_macro_averages_the_classes_gold_or_predicted_by_hand():
  # class 0: tp 1, 1 predicted, 2 gold -> 2/3; class 1: tp 1, 2 predicted, 1 gold -> 2/3. Class 2 is neither gold
  # nor predicted: not averaged (sklearn's average='macro' over the labels present), not a 0 pulling the mean down.
  assert metrics.f1_macro([0, 1, 1], [0, 0, 1]) == pytest.approx(2 / 3)
  # A class predicted but never gold counts (F1 0): gold 0 0 1, predicted 0 2 1 -> (2/3 + 1 + 0) / 3.
  assert metrics.f1_macro([0, 2, 1], [0, 0, 1]) == pytest.approx((2 / 3 + 1 + 0) / 3)
  assert metrics.f1_macro([], []) == 0.0


def test_f1_macro_is_sklearns():
  f1_score = pytest.importorskip('sklearn.metrics').f1_score
  rng = np.random.default_rng(0)
  for n, k in ((50, 2), (200, 5), (30, 7), (1, 3)):
    gold, pred = rng.integers(0, k, n), rng.integers(0, k, n)
    pred[pred == k - 1] = 0  # a class that is gold but never predicted
    assert metrics.f1_macro(pred, gold) == pytest.approx(f1_score(gold, pred, average='macro', zero_division=0),
                                                         abs=1e-12)
