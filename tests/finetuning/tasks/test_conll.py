"""bert_jax.tasks.conll and the entity metrics: reader counts on the real CoNLL-2003 files,
BIO conversion, conlleval chunking, first-sub-token labels, truncation, evaluate() and errors.

The CoNLL-2003 files are never copied into the repository; tests that need them skip when
../shared/data/conll2003 is absent. Hand-made sentences are written to tmp files instead.
"""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import conll
from bert_jax import metrics
from bert_jax.finetuning.tasks.base import IGNORE, EvalSet

from harness.inputs import SHARED_DATA

CONLL = os.path.join(SHARED_DATA, 'conll2003')

# From the shared data README (the official CoNLL-2003 statistics).
COUNTS = {
    'eng.train': (14_041, 203_621, dict(PER=6_600, LOC=7_140, ORG=6_321, MISC=3_438)),
    'eng.testa': (3_250, 51_362, dict(PER=1_842, LOC=1_837, ORG=1_341, MISC=922)),
    'eng.testb': (3_453, 46_435, dict(PER=1_617, LOC=1_668, ORG=1_661, MISC=702)),
}

# Made-up sentences in the CoNLL format (IOB1 tags), for tmp files.
SMALL = """-DOCSTART- -X- O O

Anna NNP I-NP I-PER
Smith NNP I-NP I-PER
visited VBD I-VP O
Paris NNP I-NP I-LOC
. . O O

Acme NNP I-NP I-ORG
Corp NNP I-NP I-ORG
hired VBD I-VP O
Bob NNP I-NP I-PER
Lee NNP I-NP B-PER
and CC O O
unaffable JJ I-NP I-MISC
Germans NNPS I-NP I-MISC
"""


def _needs_conll():
  if not os.path.isdir(CONLL):
    pytest.skip(f'CoNLL-2003 is absent: {CONLL} not found (it is never copied into the repo)')


def _write(directory, name: str, text: str) -> str:
  path = os.path.join(str(directory), name)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def _gold_logits(features) -> list[np.ndarray]:
  """Per feature [len, 9]: one-hot of the gold label where there is one, zeros elsewhere."""
  out = []
  for f in features:
    logits = np.zeros((len(f), len(conll.LABELS)), np.float32)
    rows = np.flatnonzero(f.token_labels != IGNORE)
    logits[rows, f.token_labels[rows]] = 1.0
    out.append(logits)
  return out


# ----------------------------------------------------------------------------- BIO and chunks

@pytest.mark.parametrize('iob1, bio', [
    (['I-PER', 'I-PER', 'O', 'I-LOC'], ['B-PER', 'I-PER', 'O', 'B-LOC']),
    (['I-PER', 'B-PER', 'I-PER'], ['B-PER', 'B-PER', 'I-PER']),  # adjacent same type
    (['I-PER', 'I-LOC'], ['B-PER', 'B-LOC']),  # type change starts a chunk
    (['O', 'I-MISC', 'O', 'I-MISC'], ['O', 'B-MISC', 'O', 'B-MISC']),
    (['B-ORG', 'I-ORG', 'O'], ['B-ORG', 'I-ORG', 'O']),  # BIO stays as it is
    ([], []),
])
def test_iob1_to_iob2(iob1, bio):
  assert conll.iob1_to_iob2(iob1) == bio
  assert conll.iob1_to_iob2(bio) == bio
  assert metrics.conll_chunks(iob1) == metrics.conll_chunks(bio)


@pytest.mark.parametrize('tags, chunks', [
    (['I-PER', 'I-PER', 'O', 'I-LOC'], {(0, 1, 'PER'), (3, 3, 'LOC')}),  # IOB1
    (['B-PER', 'I-PER', 'O', 'B-LOC'], {(0, 1, 'PER'), (3, 3, 'LOC')}),  # the same in BIO
    (['B-PER', 'B-PER'], {(0, 0, 'PER'), (1, 1, 'PER')}),  # adjacent, split by B-
    (['I-PER', 'B-PER'], {(0, 0, 'PER'), (1, 1, 'PER')}),
    (['B-PER', 'I-LOC', 'I-LOC'], {(0, 0, 'PER'), (1, 2, 'LOC')}),  # I- of another type
    (['O', 'I-ORG'], {(1, 1, 'ORG')}),  # I- after O starts a chunk
    (['B-MISC'], {(0, 0, 'MISC')}),  # chunk at the end
    (['O', 'O'], set()),
])
def test_conll_chunks(tags, chunks):
  assert metrics.conll_chunks(tags) == chunks


def test_entity_scores_by_hand():
  golds = [['B-PER', 'I-PER', 'O', 'B-LOC'], ['B-ORG', 'I-ORG', 'O', 'B-MISC']]
  preds = [['B-PER', 'I-PER', 'O', 'B-ORG'],  # LOC predicted as ORG: a miss and a false ORG
           ['B-ORG', 'O', 'O', 'I-MISC']]  # ORG span cut short: a miss; I-MISC after O is a chunk
  s = metrics.entity_scores(golds, preds)
  # gold PER LOC ORG MISC; predicted PER ORG ORG MISC; correct PER MISC.
  assert (s['n_gold'], s['n_pred'], s['n_correct']) == (4, 4, 2)
  assert (s['precision'], s['recall'], s['f1']) == (0.5, 0.5, 0.5)
  assert s['per_type'] == {
      'LOC': dict(precision=0.0, recall=0.0, f1=0.0, n_gold=1),
      'MISC': dict(precision=1.0, recall=1.0, f1=1.0, n_gold=1),
      'ORG': dict(precision=0.0, recall=0.0, f1=0.0, n_gold=1),
      'PER': dict(precision=1.0, recall=1.0, f1=1.0, n_gold=1),
  }


def test_entity_scores_precision_recall_differ():
  golds = [['B-PER', 'O', 'B-LOC', 'I-LOC', 'O', 'B-ORG']]
  preds = [['B-PER', 'B-MISC', 'B-LOC', 'I-LOC', 'O', 'O']]
  s = metrics.entity_scores(golds, preds)
  # gold PER LOC ORG; predicted PER MISC LOC; correct PER LOC (MISC spurious, ORG missed).
  assert (s['n_gold'], s['n_pred'], s['n_correct']) == (3, 3, 2)
  s = metrics.entity_scores(golds, [['B-PER', 'O', 'B-LOC', 'I-LOC', 'O', 'O']])
  assert s['precision'] == 1.0 and s['recall'] == pytest.approx(2 / 3)
  assert s['f1'] == pytest.approx(0.8)  # 2PR / (P + R) = (4/3) / (5/3)
  assert s['per_type']['ORG'] == dict(precision=0.0, recall=0.0, f1=0.0, n_gold=1)
  empty = metrics.entity_scores([['O']], [['O']])
  assert (empty['f1'], empty['n_gold'], empty['per_type']) == (0.0, 0, {})


# ----------------------------------------------------------------------------- real files

@pytest.mark.parametrize('name', sorted(COUNTS))
def test_reader_counts(name):
  _needs_conll()
  sentences = conll.read_conll(os.path.join(CONLL, name))
  n_sentences, n_tokens, entities = COUNTS[name]
  assert len(sentences) == n_sentences
  assert sum(len(words) for words, _ in sentences) == n_tokens
  assert all(len(words) == len(tags) for words, tags in sentences)
  assert not any(w == '-DOCSTART-' for words, _ in sentences for w in words)
  by_type = collections.Counter(c[2] for _, tags in sentences
                                for c in metrics.conll_chunks(conll.iob1_to_iob2(tags)))
  assert by_type == entities


def test_real_dev_perfect_logits(wordpiece, tmp_path):
  _needs_conll()
  task = conll.Conll2003()
  cfg = FinetuneConfig(task='conll2003', data_dir=CONLL, max_seq_length=512)
  dev, test = task.eval_sets(cfg, wordpiece)
  assert (dev.name, test.name) == ('dev', 'test')
  assert (len(dev.features), len(test.features)) == (3_250, 3_453)
  assert dev.data.n_cut_words == 0
  result = task.evaluate(dev, _gold_logits(dev.features), str(tmp_path))
  assert result['f1'] == 1.0 and result['n_gold'] == 1_842 + 1_837 + 1_341 + 922
  assert result['token_accuracy'] == 1.0
  assert result['per_type']['PER']['n_gold'] == 1_842


def test_train_features_max_train_samples(wordpiece):
  _needs_conll()
  cfg = FinetuneConfig(task='conll2003', data_dir=CONLL, max_seq_length=128, max_train_samples=50)
  features = conll.Conll2003().train_features(cfg, wordpiece)
  first = conll.read_conll(os.path.join(CONLL, 'eng.train'))[:50]
  assert len(features) == 50 and [f.example_index for f in features] == list(range(50))
  for f, (words, tags) in zip(features, first):
    labels = f.token_labels[f.token_labels != IGNORE]
    assert [conll.LABELS[i] for i in labels] == conll.iob1_to_iob2(tags)


# ----------------------------------------------------------------------------- featuriser

def test_first_sub_token_labels(wordpiece):
  words = ['Peter', 'unaffable', '\u200b', 'Paris']  # 1, 3 and 0 word pieces, then 1
  assert len(wordpiece.encode('unaffable')) == 3 and wordpiece.encode('\u200b') == []
  (feature,), data = conll.featurize([(words, ['I-PER', 'O', 'O', 'I-LOC'])], wordpiece, 64)
  ids = [wordpiece.cls_id] + wordpiece.encode('Peter') + wordpiece.encode('unaffable') + \
      wordpiece.encode('Paris') + [wordpiece.sep_id]
  assert feature.input_ids.tolist() == ids and feature.input_ids.dtype == np.int32
  assert feature.token_type_ids.tolist() == [0] * 7
  B_PER, O, B_LOC = (conll.LABELS.index(t) for t in ('B-PER', 'O', 'B-LOC'))
  assert feature.token_labels.tolist() == [IGNORE, B_PER, O, IGNORE, IGNORE, B_LOC, IGNORE]
  assert data.first_positions[0].tolist() == [1, 2, -1, 5]
  assert data.tags == [['B-PER', 'O', 'O', 'B-LOC']] and data.n_cut_words == 0


def test_truncation_predicts_o_for_cut_words(wordpiece, capsys):
  words, tags = ['Peter', 'unaffable', '\u200b', 'Paris'], ['I-PER', 'O', 'O', 'I-LOC']
  # Room for 2 sub-tokens: 'peter' and the first piece of 'unaffable'; 'Paris' is cut.
  (feature,), data = conll.featurize([(words, tags)], wordpiece, 4, path='small')
  assert len(feature) == 4 and feature.input_ids[-1] == wordpiece.sep_id
  assert feature.token_labels.tolist() == [IGNORE, 1, 0, IGNORE]
  assert data.first_positions[0].tolist() == [1, 2, -1, -1]
  assert data.n_cut_words == 1  # the empty word is not counted as cut
  assert capsys.readouterr().out.splitlines() == [
      'warning: small: 1 of 4 words cut off by max_seq_length=4; they are predicted O']
  eval_set = EvalSet('dev', [feature], data)
  result = conll.Conll2003().evaluate(eval_set, _gold_logits([feature]), None)
  assert (result['n_gold'], result['n_pred'], result['n_correct']) == (2, 1, 1)
  assert result['precision'] == 1.0 and result['recall'] == 0.5
  assert result['token_accuracy'] == 0.75 and result['n_cut_words'] == 1


def test_evaluate_writes_conlleval_file(wordpiece, tmp_path):
  _write(tmp_path, 'eng.testa', SMALL)
  _write(tmp_path, 'eng.testb', SMALL.split('\n\n', 2)[2])  # the second sentence only
  task = conll.Conll2003()
  assert (task.name, task.kind, task.main_metric) == ('conll2003', 'token', 'f1')
  assert task.num_labels == 9
  dev, test = task.eval_sets(FinetuneConfig(task='conll2003', data_dir=str(tmp_path)), wordpiece)
  assert (len(dev.features), len(test.features)) == (2, 1)
  out = tmp_path / 'out'
  result = task.evaluate(dev, _gold_logits(dev.features), str(out))
  assert (result['f1'], result['n_gold'], result['n_correct']) == (1.0, 6, 6)
  assert result['per_type']['PER'] == dict(precision=1.0, recall=1.0, f1=1.0, n_gold=3)
  with open(out / 'predictions_dev.txt', encoding='utf-8') as f:
    blocks = f.read().strip('\n').split('\n\n')
  assert len(blocks) == 2
  assert blocks[0].splitlines() == ['Anna B-PER B-PER', 'Smith I-PER I-PER', 'visited O O',
                                    'Paris B-LOC B-LOC', '. O O']
  assert blocks[1].splitlines()[3:5] == ['Bob B-PER B-PER', 'Lee B-PER B-PER']
  assert not os.path.exists(out / 'predictions_dev.txt.tmp')
  # Every word predicted O: nothing found, nothing right.
  zeros = [np.zeros((len(f), 9), np.float32) for f in dev.features]
  result = task.evaluate(dev, zeros, None)
  assert (result['f1'], result['n_pred'], result['recall']) == (0.0, 0, 0.0)


def test_file_overrides(wordpiece, tmp_path):
  train = _write(tmp_path, 'my.train', SMALL)
  dev = _write(tmp_path, 'my.dev', SMALL)
  cfg = FinetuneConfig(task='conll2003', train_file=train, eval_file=dev, max_train_samples=1)
  task = conll.Conll2003()
  assert len(task.train_features(cfg, wordpiece)) == 1
  (only,) = task.eval_sets(cfg, wordpiece)  # no data_dir: no test file to read
  assert only.name == 'dev' and only.data.path == dev


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize('text, pattern', [
    ('Anna NNP I-NP I-PER\nlonely\n', 'bad.txt:2: 1 field(s)'),
    ('Anna NNP I-NP I-PER\nAcme NNP I-NP B-COMPANY\n',
     "bad.txt:2: tag 'B-COMPANY' is not one of O B-PER I-PER"),
    ('Anna NNP I-NP I-per\n', "bad.txt:1: tag 'I-per'"),
    ('', 'bad.txt holds no sentences'),
    ('-DOCSTART- -X- O O\n\n', 'bad.txt holds no sentences'),
])
def test_bad_file(tmp_path, text, pattern):
  path = _write(tmp_path, 'bad.txt', text)
  with pytest.raises(DataError) as e:
    conll.read_conll(path)
  assert str(e.value).startswith(str(tmp_path)) and pattern in str(e.value), str(e.value)


def test_missing_file(tmp_path):
  cfg = FinetuneConfig(task='conll2003', data_dir=str(tmp_path))
  with pytest.raises(DataError, match=r'eng.train does not exist'):
    conll.Conll2003().train_features(cfg, None)
  _write(tmp_path, 'eng.testa', SMALL)
  with pytest.raises(DataError, match=r'eng.testb does not exist'):
    conll.Conll2003().eval_sets(cfg, None)


def test_features_take_the_tokenizers_template(styled_tokenizer):
  """A RoBERTa- or XLM-R-style tokenizer's sentence is `<s> sub-tokens </s>` with transformers' ids for words
  (`is_split_into_words`, with the prefix space a byte-level BPE needs: 'Ġvisited', not 'visited'); labels on first
  sub-tokens."""
  transformers = pytest.importorskip('transformers')
  from bert_jax.data import tokenization as tk  # pylint: disable=g-import-not-at-top
  style, directory = styled_tokenizer
  tokenizer = tk.load_tokenizer(directory)
  words = ['Obama', 'visited', 'Paris', "'s", 'Café', '東京', '2010']
  tags = ['I-PER', 'O', 'I-LOC', 'O', 'I-ORG', 'I-LOC', 'O']
  (feature,), data = conll.featurize([(words, tags)], tokenizer, 64)
  ids = feature.input_ids.tolist()
  kwargs = {'add_prefix_space': True} if style == 'roberta' else {}
  theirs = transformers.AutoTokenizer.from_pretrained(directory, **kwargs)(words, is_split_into_words=True)
  assert ids == theirs['input_ids']
  assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id and tokenizer.pad_id not in ids
  first = data.first_positions[0]
  if style == 'roberta':  # every word as inside a sentence: 'Ġvisited', not 'visited'
    assert all(tokenizer.id_to_token(ids[p]).startswith('Ġ') for p in first)
  tags = ['B-PER', 'O', 'B-LOC', 'O', 'B-ORG', 'B-LOC', 'O']
  assert [feature.token_labels[p] for p in first] == [conll.LABELS.index(t) for t in tags]
  assert (feature.token_labels != IGNORE).sum() == len(words) and not feature.token_type_ids.any()
  word_ids = theirs.word_ids()
  assert list(first) == [word_ids.index(w) for w in range(len(words))]  # each word's first sub-token
