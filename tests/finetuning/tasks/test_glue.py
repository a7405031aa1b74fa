"""bert_jax.tasks.glue and the GLUE metrics: readers on the real SST-2/RTE files, hand-worked
metric values, evaluate() and its predictions file, and one-line errors for bad files."""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.data import tokenization as tk
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import glue
from bert_jax import metrics

from harness.inputs import SHARED_DATA

SST2 = os.path.join(SHARED_DATA, 'sst2')
_NLI_NAMES = ['entailment', 'not_entailment']
RTE = os.path.join(SHARED_DATA, 'rte')


def _needs(directory: str) -> None:
  if not os.path.isdir(directory):
    pytest.skip(f'{directory} is absent (shared GLUE data not staged)')


class WhitespaceTokenizer:
  """A stand-in tokenizer for tmp-file tests: one id per whitespace word."""

  cls_id, sep_id, pad_id = 2, 3, 0

  def encode(self, text: str) -> list[int]:
    return [5 + len(w) for w in text.split()]

  def encode_inputs(self, text_a, text_b=None, *, max_length):
    ids_b = None if text_b is None else self.encode(text_b)
    return tk.assemble_inputs(self.encode(text_a), ids_b, max_length=max_length,
                              cls_id=self.cls_id, sep_id=self.sep_id)


def _write(directory, name: str, text: str) -> str:
  path = os.path.join(str(directory), name)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def _one_hot(labels, num_labels: int) -> list[np.ndarray]:
  return [np.eye(num_labels, dtype=np.float32)[int(l)] for l in labels]


# ----------------------------------------------------------------------------- metrics

# labels 1 1 1 1 1 0 0 0 / preds 1 1 1 0 0 1 0 0: TP=3 FN=2 FP=1 TN=2.
LABELS_8 = [1, 1, 1, 1, 1, 0, 0, 0]
PREDS_8 = [1, 1, 1, 0, 0, 1, 0, 0]


def test_accuracy_and_f1_by_hand():
  assert metrics.accuracy(PREDS_8, LABELS_8) == pytest.approx(5 / 8)
  # F1 = 2TP / (2TP + FP + FN) = 6 / 9
  assert metrics.f1_binary(PREDS_8, LABELS_8) == pytest.approx(6 / 9)
  # Positive class 0: TP=2, FP=2 (gold 1 predicted 0), FN=1 -> 4 / 7.
  assert metrics.f1_binary(PREDS_8, LABELS_8, positive=0) == pytest.approx(4 / 7)
  assert metrics.f1_binary([0, 0], [0, 0]) == 0.0


def test_matthews_by_hand():
  # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (6 - 2) / sqrt(4*5*3*4)
  assert metrics.matthews_corrcoef(PREDS_8, LABELS_8) == pytest.approx(4 / np.sqrt(240))
  assert metrics.matthews_corrcoef(LABELS_8, LABELS_8) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef([1 - l for l in LABELS_8], LABELS_8) == pytest.approx(-1.0)
  assert metrics.matthews_corrcoef([1] * 8, LABELS_8) == 0.0  # constant prediction: undefined -> 0


def test_pearson_and_spearman_by_hand():
  # x - mean = -1.5 -.5 .5 1.5; y - mean = -3 -1 0 4: r = 11 / sqrt(5 * 26)
  assert metrics.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / np.sqrt(130))
  # Ties share their mean rank: x ranks 1 2.5 2.5 4, y ranks 1 3 2 4 -> r = 4.5 / sqrt(4.5 * 5)
  np.testing.assert_allclose(metrics.average_ranks([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(22.5))
  assert metrics.spearman([1, 5, 30, 400], [0.1, 0.2, 0.3, 9.0]) == pytest.approx(1.0)
  assert np.isnan(metrics.pearson([1, 1, 1], [1, 2, 3]))


def test_metrics_match_scipy_and_sklearn():
  stats = pytest.importorskip('scipy.stats')
  sk_metrics = pytest.importorskip('sklearn.metrics')
  rng = np.random.default_rng(0)
  x, y = rng.integers(0, 6, 200).astype(float), rng.normal(size=200)  # x has many ties
  assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
  assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
  p, l = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
  assert metrics.matthews_corrcoef(p, l) == pytest.approx(sk_metrics.matthews_corrcoef(l, p))
  assert metrics.f1_binary(p, l) == pytest.approx(sk_metrics.f1_score(l, p))


# ----------------------------------------------------------------------------- registry

def test_registry():
  assert set(glue.TASKS) == {'sst2', 'cola', 'rte', 'mrpc', 'mnli', 'qnli', 'qqp', 'wnli', 'stsb'}
  expected_main = dict(sst2='accuracy', rte='accuracy', mnli='accuracy', qnli='accuracy',
                       wnli='accuracy', mrpc='f1', qqp='f1', cola='matthews_corrcoef',
                       stsb='pearson')
  for name, task in glue.TASKS.items():
    assert task.name == name and task.main_metric == expected_main[name]
  assert glue.TASKS['rte'].label_names == ['entailment', 'not_entailment']
  assert glue.TASKS['qnli'].label_names == ['entailment', 'not_entailment']
  assert glue.TASKS['mnli'].label_names == ['contradiction', 'entailment', 'neutral']
  assert glue.TASKS['sst2'].label_names == ['negative', 'positive'] and glue.TASKS['sst2'].num_labels == 2
  # GLUE's names; the files (and the prediction files, GLUE's submission format) write 0/1.
  assert {n: glue.TASKS[n].label_names for n in ('cola', 'mrpc', 'qqp', 'wnli')} == {
      'cola': ['unacceptable', 'acceptable'], 'mrpc': ['not_equivalent', 'equivalent'],
      'qqp': ['not_duplicate', 'duplicate'], 'wnli': ['not_entailment', 'entailment']}
  assert glue.TASKS['sst2'].file_labels == ['0', '1'] and glue.TASKS['rte'].file_labels == _NLI_NAMES
  stsb = glue.TASKS['stsb']
  assert (stsb.kind, stsb.num_labels) == ('regression', 1)
  assert glue.TASKS['mnli'].kind == 'classification' and glue.TASKS['mnli'].num_labels == 3


# ----------------------------------------------------------------------------- real files

def test_sst2_reader_counts():
  _needs(SST2)
  task = glue.TASKS['sst2']
  train = task.read_examples(os.path.join(SST2, 'train.tsv'))
  assert len(train) == 67_349
  assert collections.Counter(e.label for e in train) == {0: 29_780, 1: 37_569}
  assert all(e.text_b is None for e in train[:100])
  dev = task.read_examples(os.path.join(SST2, 'dev.tsv'))
  assert len(dev) == 872 and collections.Counter(e.label for e in dev) == {0: 428, 1: 444}


def test_rte_reader_counts():
  _needs(RTE)
  task = glue.TASKS['rte']
  train = task.read_examples(os.path.join(RTE, 'train.tsv'))
  dev = task.read_examples(os.path.join(RTE, 'dev.tsv'))
  assert len(train) == 2_490 and collections.Counter(e.label for e in train) == {0: 1_249, 1: 1_241}
  assert len(dev) == 277 and collections.Counter(e.label for e in dev) == {0: 146, 1: 131}


def test_sst2_features_match_tokenizer(wordpiece):
  _needs(SST2)
  cfg = FinetuneConfig(task='sst2', data_dir=SST2, max_seq_length=64, max_train_samples=7)
  features = glue.TASKS['sst2'].train_features(cfg, wordpiece)
  with open(os.path.join(SST2, 'train.tsv'), encoding='utf-8') as f:
    rows = [line.rstrip('\n').split('\t') for line in f][1:8]
  assert len(features) == 7
  assert [f.example_index for f in features] == list(range(7))
  assert [f.label for f in features] == [int(r[1]) for r in rows]
  ids, type_ids, _ = wordpiece.encode_inputs(rows[0][0], max_length=64)
  assert features[0].input_ids.dtype == np.int32 and features[0].token_type_ids.dtype == np.int32
  assert features[0].input_ids.tolist() == ids and features[0].token_type_ids.tolist() == type_ids
  assert features[0].input_ids[[0, -1]].tolist() == [wordpiece.cls_id, wordpiece.sep_id]


def test_rte_features_are_pairs(wordpiece):
  _needs(RTE)
  cfg = FinetuneConfig(task='rte', data_dir=RTE, max_seq_length=128, max_train_samples=20)
  features = glue.TASKS['rte'].train_features(cfg, wordpiece)
  assert len(features) == 20
  assert all(1 in f.token_type_ids and len(f) <= 128 for f in features)
  first = glue.TASKS['rte'].read_examples(os.path.join(RTE, 'train.tsv'))[0]
  ids, type_ids, _ = wordpiece.encode_inputs(first.text_a, first.text_b, max_length=128)
  assert features[0].input_ids.tolist() == ids and features[0].token_type_ids.tolist() == type_ids


def test_sst2_evaluate_one_hot(wordpiece, tmp_path):
  _needs(SST2)
  task = glue.TASKS['sst2']
  (dev,) = task.eval_sets(FinetuneConfig(task='sst2', data_dir=SST2, max_seq_length=64), wordpiece)
  assert dev.name == 'dev' and len(dev.features) == 872
  result = task.evaluate(dev, _one_hot(dev.data.labels, 2), str(tmp_path))
  assert result == {'accuracy': 1.0, 'macro_f1': 1.0}
  with open(tmp_path / 'predictions_dev.tsv', encoding='utf-8') as f:
    lines = f.read().splitlines()
  assert lines[0] == 'index\tprediction' and len(lines) == 873
  assert lines[1] == f'0\t{dev.data.labels[0]}'
  assert not os.path.exists(tmp_path / 'predictions_dev.tsv.tmp')


# ----------------------------------------------------------------------------- tmp files

def test_max_train_samples_keeps_file_order_and_reads_no_further(tmp_path):
  rows = ''.join(f'sentence number {i}\t{i % 2}\n' for i in range(10))
  _write(tmp_path, 'train.tsv', 'sentence\tlabel\n' + rows)
  cfg = FinetuneConfig(task='sst2', data_dir=str(tmp_path), max_train_samples=4)
  features = glue.TASKS['sst2'].train_features(cfg, WhitespaceTokenizer())
  assert [f.example_index for f in features] == [0, 1, 2, 3]
  assert [f.label for f in features] == [0, 1, 0, 1]
  cfg = FinetuneConfig(task='sst2', data_dir=str(tmp_path), max_train_samples=0)
  assert len(glue.TASKS['sst2'].train_features(cfg, WhitespaceTokenizer())) == 10
  # A row past the ones asked for is not parsed: only the whole file's run meets it.
  _write(tmp_path, 'train.tsv', 'sentence\tlabel\n' + rows + 'a row without its label\n')
  assert len(glue.TASKS['sst2'].train_features(dataclasses.replace(cfg, max_train_samples=10),
                                               WhitespaceTokenizer())) == 10
  with pytest.raises(DataError, match=r'train.tsv:12: 1 tab-separated column'):
    glue.TASKS['sst2'].train_features(cfg, WhitespaceTokenizer())


def test_mnli_two_eval_sets(tmp_path):
  header = 'index\tpromptID\tsentence1\tsentence2\tlabel1\tgold_label\n'
  for name, labels in (('dev_matched.tsv', ['neutral', 'entailment', 'contradiction']),
                       ('dev_mismatched.tsv', ['entailment', 'entailment'])):
    _write(tmp_path, name, header + ''.join(f'{i}\t7\tthe "premise {i}\ta hypothesis\t{l}\t{l}\n'
                                             for i, l in enumerate(labels)))
  task = glue.TASKS['mnli']
  sets = task.eval_sets(FinetuneConfig(task='mnli', data_dir=str(tmp_path)), WhitespaceTokenizer())
  assert [s.name for s in sets] == ['dev_matched', 'dev_mismatched']
  assert sets[0].data.labels.tolist() == [2, 1, 0] and len(sets[1].features) == 2
  logits = _one_hot([2, 1, 1], 3)  # last one wrong
  # per class F1: contradiction 0 (missed), entailment 2/3 (1 right of 2 predicted, 1 gold), neutral 1
  assert task.evaluate(sets[0], logits, str(tmp_path)) == {'accuracy': pytest.approx(2 / 3),
                                                           'macro_f1': pytest.approx((0 + 2 / 3 + 1) / 3)}
  with open(tmp_path / 'predictions_dev_matched.tsv', encoding='utf-8') as f:
    assert f.read() == 'index\tprediction\n0\tneutral\n1\tentailment\n2\tentailment\n'


def test_cola_headerless_and_mcc(tmp_path):
  rows = ['gj04\t1\t\tThe sailors rode the breeze clear of the rocks.',
          'gj04\t0\t*\tThe more we study verbs, the crazier they get get.',
          'gj04\t1\t\tDay by day the facts are getting murkier.',
          'gj04\t0\t*\tThey drank the pub.']
  _write(tmp_path, 'dev.tsv', '\n'.join(rows) + '\n')
  task = glue.TASKS['cola']
  cfg = FinetuneConfig(task='cola', data_dir=str(tmp_path))
  (dev,) = task.eval_sets(cfg, WhitespaceTokenizer())
  assert dev.data.labels.tolist() == [1, 0, 1, 0]
  result = task.evaluate(dev, _one_hot([1, 0, 1, 0], 2), None)
  assert result == {'accuracy': 1.0, 'matthews_corrcoef': pytest.approx(1.0), 'macro_f1': 1.0}
  assert not os.path.exists(tmp_path / 'predictions_dev.tsv')  # output_dir None: no file


def test_mrpc_reports_f1(tmp_path):
  header = '\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n'  # with the BOM some copies have
  _write(tmp_path, 'dev.tsv', header + '1\t1\t2\tA b.\tA b c.\n0\t3\t4\tC d.\tE f.\n'
                                       '1\t5\t6\tG.\tG h.\n')
  task = glue.TASKS['mrpc']
  cfg = FinetuneConfig(task='mrpc', data_dir=str(tmp_path))
  (dev,) = task.eval_sets(cfg, WhitespaceTokenizer())
  assert dev.features[0].token_type_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
  result = task.evaluate(dev, _one_hot([1, 1, 0], 2), None)
  # gold 1 0 1, pred 1 1 0: TP=1 FP=1 FN=1 -> F1 = 2 / 4; class 0's F1 is 0 (its one gold and one prediction differ)
  assert result == {'accuracy': pytest.approx(1 / 3), 'f1': pytest.approx(0.5), 'macro_f1': pytest.approx(0.25)}


def test_stsb_regression(tmp_path):
  header = '\t'.join(['index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2',
                      'sentence1', 'sentence2', 'score']) + '\n'
  scores = [5.0, 3.8, 0.0, 3.8, 1.25]
  _write(tmp_path, 'dev.tsv', header + ''.join(
      f'{i}\tmain-news\tx\t2012\t{i}\tnone\tnone\tA man is {i}.\tA woman is {i}.\t{s:.3f}\n'
      for i, s in enumerate(scores)))
  task = glue.TASKS['stsb']
  cfg = FinetuneConfig(task='stsb', data_dir=str(tmp_path))
  (dev,) = task.eval_sets(cfg, WhitespaceTokenizer())
  assert [f.label for f in dev.features] == scores
  assert isinstance(dev.features[0].label, float)
  logits = [np.array([s * 2 + 1], np.float32) for s in scores]
  result = task.evaluate(dev, logits, str(tmp_path))
  assert result == {'pearson': pytest.approx(1.0), 'spearmanr': pytest.approx(1.0)}
  with open(tmp_path / 'predictions_dev.tsv', encoding='utf-8') as f:
    lines = f.read().splitlines()
  assert lines[:3] == ['index\tprediction', '0\t11', '1\t8.6']


def test_eval_file_overrides(tmp_path):
  path = _write(tmp_path, 'mine.tsv', 'sentence\tlabel\nfine .\t1\n')
  (dev,) = glue.TASKS['sst2'].eval_sets(FinetuneConfig(eval_file=path), WhitespaceTokenizer())
  assert dev.name == 'dev' and dev.data.path == path and len(dev.features) == 1


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize('text, pattern', [
    ('text\tlabel\nsome words\t1\n', 'train.tsv: the header lacks column(s) sentence'),
    ('sentence\tlabel\nsome words\t2\n',
     "train.tsv:2: label '2' is not a sst2 label; valid labels are 0, 1"),
    ('sentence\tlabel\nsome words\t1\nno label here\n', 'train.tsv:3: 1 tab-separated column(s)'),
    ('sentence\tlabel\n \t1\n', 'train.tsv:2: empty sentence'),
    ('', 'train.tsv is empty'),
    ('sentence\tlabel\n', 'train.tsv has no data rows'),
])
def test_bad_sst2_file(tmp_path, text, pattern):
  path = _write(tmp_path, 'train.tsv', text)
  with pytest.raises(DataError) as e:
    glue.TASKS['sst2'].read_examples(path)
  assert str(e.value).startswith(str(tmp_path)) and pattern in str(e.value), str(e.value)


def test_missing_column_names_header(tmp_path):
  path = _write(tmp_path, 'dev.tsv', 'index\tsentence1\tsentence\tlabel\n0\ta\tb\tentailment\n')
  with pytest.raises(DataError, match=r'needs sentence1, sentence2, label but the header has '
                                      r'index, sentence1, sentence, label'):
    glue.TASKS['rte'].read_examples(path)


def test_unknown_rte_label_and_bad_score(tmp_path):
  path = _write(tmp_path, 'dev.tsv', 'index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n'
                                     '1\tc\td\tcontradiction\n')
  with pytest.raises(DataError, match=r"dev.tsv:3: label 'contradiction' is not a rte label; "
                                      r'valid labels are entailment, not_entailment'):
    glue.TASKS['rte'].read_examples(path)
  path = _write(tmp_path, 'sts.tsv', 'sentence1\tsentence2\tscore\na\tb\thigh\n')
  with pytest.raises(DataError, match=r"sts.tsv:2: label 'high' is not a number"):
    glue.TASKS['stsb'].read_examples(path)


def test_missing_file(tmp_path):
  cfg = FinetuneConfig(task='sst2', data_dir=str(tmp_path / 'nowhere'))
  with pytest.raises(DataError, match=r'nowhere/train.tsv does not exist'):
    glue.TASKS['sst2'].train_features(cfg, WhitespaceTokenizer())
  with pytest.raises(DataError, match=r'nowhere/dev_matched.tsv does not exist'):
    glue.TASKS['mnli'].eval_sets(cfg, WhitespaceTokenizer())
