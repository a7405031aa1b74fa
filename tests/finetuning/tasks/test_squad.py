"""Tests for bert_jax.tasks.squad on the real SQuAD v1.1 dev set with the MiniLM tokenizer."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning.tasks import squad

from harness.inputs import SHARED_DATA

SQUAD_DIR = os.path.join(SHARED_DATA, 'squad-v1.1')
DEV = os.path.join(SQUAD_DIR, 'dev-v1.1.json')
# Hugging Face's fast tokenizer (truncation='only_second', max_length=384, stride=128) makes
# 9,191 training features from the first 40 articles (the peer's count); we match it id for id.
HF_TRAIN_FEATURES = 9191
EVAL_FEATURES = 1593


@pytest.fixture(scope='module')
def tokenizer(wordpiece):
  return wordpiece


@pytest.fixture(scope='module')
def cfg():
  if not os.path.isfile(DEV):
    pytest.skip(f'{DEV} is not staged')
  return FinetuneConfig(task='squad', data_dir=SQUAD_DIR, max_seq_length=384)


@pytest.fixture(scope='module')
def task():
  return squad.Squad(version_2=False)


@pytest.fixture(scope='module')
def train(cfg, task, tokenizer):
  """(examples, features, offsets) of the 40-article training split."""
  examples = task.examples(cfg)[0]
  features, offsets = squad.featurize(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                      max_query_length=64, train=True)
  return examples, features, offsets


@pytest.fixture(scope='module')
def eval_set(cfg, task, tokenizer):
  return task.eval_sets(cfg, tokenizer)[0]


def test_reader_counts(cfg, task):
  articles = squad.read_articles(DEV)
  examples = squad.articles_to_examples(articles, DEV)
  assert len(articles) == 48 and len(examples) == 10570
  assert sum(len(e.answers) for e in examples) == 34726
  assert all(e.question == e.question.lstrip() and not e.is_impossible for e in examples)
  train, evals = task.examples(cfg)
  assert (len(train), len(evals)) == (8981, 1589)
  assert [e.id for e in train] == [e.id for e in examples[:8981]]
  assert [e.id for e in evals] == [e.id for e in examples[-1589:]]
  few = squad.Squad().examples(dataclasses.replace(cfg, max_train_samples=100))[0]
  assert [e.id for e in few] == [e.id for e in train[:100]]
  with pytest.raises(DataError, match='48 articles'):
    squad.Squad().examples(dataclasses.replace(cfg, train_articles=41))


def test_feature_count_matches_hugging_face(train, eval_set):
  assert len(train[1]) == HF_TRAIN_FEATURES
  assert len(eval_set.features) == EVAL_FEATURES


def test_feature_layout_and_windows(train, tokenizer):
  examples, features, offsets = train
  by_example = {}
  for f, offs in zip(features, offsets):
    ids = f.input_ids.tolist()
    first_sep = ids.index(tokenizer.sep_id)
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id and len(ids) <= 384
    assert f.token_type_ids.tolist() == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert all(o is None for o in offs[:first_sep + 1]) and offs[-1] is None
    assert None not in offs[first_sep + 1:-1]
    by_example.setdefault(f.example_index, []).append(offs[first_sep + 1:-1])
  split, context_offsets = 0, {}  # a paragraph is the context of about five questions: tokenized once
  for i, windows in by_example.items():
    for a, b in zip(windows, windows[1:]):  # consecutive windows overlap by exactly doc_stride
      assert a[-128:] == b[:128] and a[-129] != b[0]
      split += 1
    covered = {o for w in windows for o in w}
    context = examples[i].context
    if context not in context_offsets:
      context_offsets[context] = set(tokenizer.encode_with_offsets(context)[1])
    assert covered == context_offsets[context]
  assert split == HF_TRAIN_FEATURES - len(examples)


def test_windows_unit():
  assert squad.windows(10, 4, 2) == [(0, 4), (2, 6), (4, 8), (6, 10)]
  assert squad.windows(9, 4, 1) == [(0, 4), (3, 7), (6, 9)]
  assert squad.windows(3, 4, 2) == [(0, 3)] and squad.windows(0, 4, 2) == [(0, 0)]
  with pytest.raises(ConfigError, match='doc_stride'):
    squad.windows(10, 4, 4)


def test_training_labels_round_trip(train):
  examples, features, offsets = train
  labelled = [(f, o) for f, o in zip(features, offsets) if f.start]
  assert {f.example_index for f, _ in labelled} == set(range(len(examples)))  # all fit somewhere
  same = [squad.normalize_answer(examples[f.example_index].context[o[f.start][0]:o[f.end][1]]) ==
          squad.normalize_answer(examples[f.example_index].answers[0]['text']) for f, o in labelled]
  # The residue (31 of 9,021) are answers that start or end inside a WordPiece word ('gold' in
  # 'golden', '8' in '18', '20,980' in '£20,980'): the token span is the whole word.
  assert np.mean(same) >= 0.99, np.mean(same)
  assert all(f.start == f.end == 0 for f in features if f.start == 0)


def _oracle_logits(eval_set, max_answer_length=30):
  """Logits peaking (10) at the tokens of one recoverable gold answer of each example."""
  data = eval_set.data
  logits = [np.zeros((len(f), 2), np.float32) for f in eval_set.features]
  done = set()
  for k, f in enumerate(eval_set.features):
    example = data.examples[f.example_index]
    if f.example_index in done or not example.answers:
      continue
    positions = [j for j, o in enumerate(data.offsets[k]) if o is not None]
    spans = [data.offsets[k][j] for j in positions]
    for a in example.answers:
      lo, hi = a['answer_start'], a['answer_start'] + len(a['text'])
      r = squad.char_to_token_span(spans, lo, hi)
      if (r is None or r[1] - r[0] >= max_answer_length or spans[r[0]][0] > lo or spans[r[1]][1] < hi
          or squad.normalize_answer(example.context[spans[r[0]][0]:spans[r[1]][1]]) !=
          squad.normalize_answer(a['text'])):
        continue
      logits[k][positions[r[0]], 0] = logits[k][positions[r[1]], 1] = 10.0
      done.add(f.example_index)
      break
  return logits, done


def test_eval_oracle_gives_full_marks(eval_set, task, tmp_path):
  data = eval_set.data
  assert (data.n_best_size, data.max_answer_length) == (20, 30)
  assert len({f.example_index for f in eval_set.features}) == len(data.examples) == 1589
  logits, done = _oracle_logits(eval_set)
  assert len(done) == 1589
  metrics = task.evaluate(eval_set, logits, str(tmp_path))
  assert metrics == {'exact_match': 1.0, 'f1': 1.0, 'num_examples': 1589}
  with open(tmp_path / 'predictions_eval.json', encoding='utf-8') as f:
    preds = json.load(f)
  assert set(preds) == {e.id for e in data.examples}
  assert not any(p.name.endswith('.tmp') for p in tmp_path.iterdir())


def test_official_v1_metric_by_hand():
  assert squad.normalize_answer('  The Cat,  sat on\ta  mat! ') == 'cat sat on mat'
  assert squad.normalize_answer('Anna and theater') == 'anna and theater'  # articles as words only
  assert squad.normalize_answer("an apple's (core)") == 'apples core'
  assert squad.exact_match_score('the Eiffel tower.', 'Eiffel Tower')
  # pred {big, red, dog} vs gold {red, dog, barked}: 2 shared, P = R = 2/3, F1 = 2/3.
  assert squad.f1_score('the big red dog', 'red dog barked') == pytest.approx(2 / 3)
  assert squad.f1_score('', '') == 0.0  # v1.1: nothing shared -> 0
  examples = [squad.SquadExample('a', 'q', 'c', [{'text': 'red dog barked', 'answer_start': 0},
                                                  {'text': 'big dog', 'answer_start': 0}]),
              squad.SquadExample('b', 'q', 'c', [{'text': 'Paris', 'answer_start': 0}])]
  # a: EM 0; F1 max(2/3, {big, dog} vs {big, red, dog}: P 2/3 R 1 -> 0.8) = 0.8. b: EM = F1 = 1.
  metrics = squad.squad_v1_metrics(examples, {'a': 'the big red dog', 'b': 'paris.'})
  assert metrics['exact_match'] == pytest.approx(0.5)  # fractions: the official script prints x100
  assert metrics['f1'] == pytest.approx((0.8 + 1) / 2)
  assert metrics['num_examples'] == 2


def test_official_v2_threshold_by_hand():
  ex = lambda qid, ans: squad.SquadExample(qid, 'q', 'c', [{'text': a, 'answer_start': 0} for a in ans])
  examples = [ex('q1', ['red dog']), ex('q2', ['big red dog']), ex('q3', [])]
  answers = {'q1': 'red dog', 'q2': 'red cat', 'q3': 'foo'}  # q2: F1 = 2*(1/2*1/3)/(5/6) = 0.4
  na = {'q1': 0.1, 'q2': 0.5, 'q3': 0.9}
  final = {'q1': 'red dog', 'q2': 'red cat', 'q3': ''}  # null above 0.8
  m = squad.squad_v2_metrics(examples, final, na_probs=na, answer_predictions=answers)
  assert m['exact'] == pytest.approx(2 / 3) and m['f1'] == pytest.approx(2.4 / 3)
  assert (m['HasAns_exact'], m['HasAns_f1'], m['HasAns_total']) == (0.5, pytest.approx(0.7), 2)
  assert (m['NoAns_exact'], m['NoAns_f1'], m['NoAns_total'], m['total']) == (1.0, 1.0, 1, 3)
  # Start at 1 (q3 null); q1 +1 -> 2 at 0.1; q2 +0 (EM) / +0.4 (F1) at 0.5; q3 answered -1.
  assert (m['best_exact'], m['best_exact_thresh']) == (pytest.approx(2 / 3), 0.1)
  assert (m['best_f1'], m['best_f1_thresh']) == (pytest.approx(2.4 / 3), 0.5)
  # v2 F1 of two empty answers is 1, and gold answers that normalise to '' count as no answer.
  only_empty = squad.squad_v2_metrics([ex('q', ['the'])], {'q': ''})
  assert (only_empty['exact'], only_empty['f1']) == (1.0, 1.0)


def _write_v2(path):
  c1 = 'The Eiffel Tower is in Paris. It was completed in 1889 for the World Fair.'
  c2 = 'Gustave Eiffel designed it, and his company built the tower of wrought iron.'
  qa = lambda qid, q, text, c: {'id': qid, 'question': q, 'is_impossible': False,
                                'answers': [{'text': text, 'answer_start': c.index(text)}]}
  data = {'version': 'v2.0', 'data': [
      {'title': 'Eiffel', 'paragraphs': [{'context': c1, 'qas': [
          qa('q1', 'Where is the Eiffel Tower?', 'Paris', c1),
          qa('q2', '  When was it completed?', '1889', c1),
          {'id': 'q3', 'question': 'Who painted the tower?', 'is_impossible': True, 'answers': [],
           'plausible_answers': [{'text': 'Eiffel', 'answer_start': 4}]}]}]},
      {'title': 'Iron', 'paragraphs': [{'context': c2, 'qas': [
          qa('q4', 'What was it built of?', 'wrought iron', c2),
          {'id': 'q5', 'question': 'Who sold the tower?', 'is_impossible': True, 'answers': []}]}]}]}
  path.write_text(json.dumps(data), encoding='utf-8')
  return str(path)


def test_v2_no_answer_and_best_threshold(tokenizer, tmp_path):
  path = _write_v2(tmp_path / 'tiny-v2.json')
  cfg = FinetuneConfig(task='squad_v2', train_file=path, eval_file=path, max_seq_length=64)
  task = squad.Squad(version_2=True)
  assert (task.name, task.kind, task.num_labels, task.main_metric) == ('squad_v2', 'span', 2, 'f1')
  train = task.train_features(cfg, tokenizer)
  assert [(f.start == 0, f.example_index) for f in train] == [
      (False, 0), (False, 1), (True, 2), (False, 3), (True, 4)]  # impossible -> 0/0
  eval_set = task.eval_sets(cfg, tokenizer)[0]
  logits, done = _oracle_logits(eval_set)
  assert done == {0, 1, 3}
  for k, f in enumerate(eval_set.features):  # impossible: [CLS] scores 20, 'Eiffel' 10
    if f.example_index not in done:
      word = next(j for j, o in enumerate(eval_set.data.offsets[k]) if o is not None) + 1
      logits[k][0] = 10.0
      logits[k][word] = 5.0
  m = task.evaluate(eval_set, logits, str(tmp_path / 'out'))
  assert (m['exact'], m['f1'], m['HasAns_exact'], m['NoAns_exact'], m['total']) == (1.0, 1.0, 1.0, 1.0, 5)
  assert (m['best_exact'], m['best_exact_thresh'], m['best_f1']) == (1.0, -20.0, 1.0)
  with open(tmp_path / 'out' / 'predictions_eval.json', encoding='utf-8') as f:
    assert json.load(f) == {'q1': 'Paris', 'q2': '1889', 'q3': '', 'q4': 'wrought iron', 'q5': ''}
  with open(tmp_path / 'out' / 'null_odds_eval.json', encoding='utf-8') as f:
    assert json.load(f) == {'q1': -20.0, 'q2': -20.0, 'q3': 10.0, 'q4': -20.0, 'q5': 10.0}
  # Above the threshold every question is answered: the impossible ones become wrong.
  loose = dataclasses.replace(eval_set, data=dataclasses.replace(eval_set.data,
                                                                 null_score_diff_threshold=25.0))
  m = task.evaluate(loose, logits, None)
  assert (m['exact'], m['HasAns_exact'], m['NoAns_exact'], m['best_exact']) == (0.6, 1.0, 0.0, 1.0)


def test_mismatched_answer_is_skipped_with_warning(tokenizer, tmp_path, capsys):
  context = 'Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.'
  qas = [{'id': 'a', 'question': 'When did she win in Physics?',
          'answers': [{'text': '1903', 'answer_start': context.index('1903')}]},
         {'id': 'b', 'question': 'When did she win in Chemistry?',
          'answers': [{'text': '1911', 'answer_start': context.index('1911') + 1}]},  # off by one
         {'id': 'c', 'question': 'Who won?', 'answers': [{'text': 'Marie Curie', 'answer_start': 0}]}]
  path = tmp_path / 'train.json'
  path.write_text(json.dumps({'data': [{'title': 't', 'paragraphs': [{'context': context,
                                                                       'qas': qas}]}]}))
  examples = squad.articles_to_examples(squad.read_articles(str(path)))
  features, offsets = squad.featurize(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                      max_query_length=64, train=True)
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith('warning:')]
  assert len(warnings) == 1 and 'skipped 1 of 3' in warnings[0]
  assert [f.example_index for f in features] == [0, 2]
  got = [context[o[f.start][0]:o[f.end][1]] for f, o in zip(features, offsets)]
  assert got == ['1903', 'Marie Curie']
  with pytest.raises(DataError, match='every SQuAD training question'):
    squad.featurize(examples[1:2], tokenizer, max_seq_length=64, doc_stride=16,
                    max_query_length=64, train=True)


def test_bad_input(tmp_path, tokenizer):
  def examples(text=None, obj=None, **overrides):
    path = tmp_path / 'bad.json'
    if text is not None or obj is not None:
      path.write_text(text if text is not None else json.dumps(obj))
    cfg = FinetuneConfig(task='squad', train_file=str(path), eval_file=str(path), **overrides)
    return squad.Squad().examples(cfg)

  with pytest.raises(DataError, match='does not exist'):
    examples()
  with pytest.raises(DataError, match='not a JSON file'):
    examples(text='{"data": [')
  with pytest.raises(DataError, match="no 'data' list"):
    examples(obj={'version': '1.1'})
  paragraph = {'context': 'c', 'qas': [{'question': 'Who?', 'answers': []}]}
  with pytest.raises(DataError, match='has no id'):
    examples(obj={'data': [{'title': 'T', 'paragraphs': [paragraph]}]})
  with pytest.raises(DataError, match='malformed'):
    examples(obj={'data': [{'title': 'T'}]})
  with pytest.raises(DataError, match='no SQuAD training questions'):
    examples(obj={'data': []})
  v2 = _write_v2(tmp_path / 'v2.json')
  with pytest.raises(DataError, match="use task 'squad_v2'"):
    squad.Squad().eval_sets(FinetuneConfig(train_file=v2, eval_file=v2), tokenizer)


def test_features_take_the_tokenizers_pair_template(roberta_tokenizer):
  """A RoBERTa-style tokenizer's features are its own `<s> q </s></s> ctx </s>` (transformers' ids for the pair), all
  token type 0, with the answer's tokens at the labels and offsets only on the context."""
  from bert_jax.data import tokenization as tk  # pylint: disable=g-import-not-at-top
  transformers = pytest.importorskip('transformers')
  directory = roberta_tokenizer
  tokenizer = tk.load_tokenizer(directory)
  context = 'The game was released in Japan in 2010 by a small studio.'
  example = squad.SquadExample('x', 'Where was it released?', context, [{'text': 'Japan', 'answer_start': 25}])
  (feature,), (offsets,) = squad.featurize([example], tokenizer, max_seq_length=64, doc_stride=16,
                                           max_query_length=32, train=True)
  theirs = transformers.AutoTokenizer.from_pretrained(directory)(example.question, context)
  assert feature.input_ids.tolist() == theirs['input_ids'] and not feature.token_type_ids.any()
  assert feature.input_ids.tolist().count(tokenizer.sep_id) == 3
  assert tokenizer.decode(feature.input_ids[feature.start:feature.end + 1]).strip() == 'Japan'
  spans = [o for o in offsets if o is not None]
  assert ''.join(context[s:e] for s, e in spans).replace(' ', '') == context.replace(' ', '')
  assert offsets[:3] == [None] * 3 and offsets[-1] is None and len(offsets) == len(feature.input_ids)
