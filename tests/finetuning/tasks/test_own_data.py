"""bert_jax.finetuning.tasks.own_data: rows by column names, label names, the held-out split, metrics, and one
DataError naming the file and line for each kind of bad row; a gzipped and a remote (gs://) training file train.
The formats themselves (CSV, TSV, JSONL, compressed): tests/data/test_tables.py."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from bert_jax import files
from bert_jax.config import FinetuneConfig
from bert_jax.data import tokenization as tk
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning.tasks import get_task, own_data
from bert_jax import metrics


ROWS = [('A gripping, funny film.', 'positive'), ('Dull and far too long.', 'negative'),
        ('It was fine, I suppose.', 'neutral'), ('An instant classic.', 'positive'),
        ('I want my money back.', 'negative'), ('Some good scenes, some bad.', 'neutral')]


class WhitespaceTokenizer:
  """A stand-in tokenizer: one id per whitespace word."""

  def encode_inputs(self, text_a, text_b=None, *, max_length):
    encode = lambda text: [5 + len(w) for w in text.split()]  # pylint: disable=unnecessary-lambda-assignment
    return tk.assemble_inputs(encode(text_a), None if text_b is None else encode(text_b), max_length=max_length,
                              cls_id=2, sep_id=3)


def _write(tmp_path, name: str, text: str) -> str:
  path = str(tmp_path / name)
  with open(path, 'w', encoding='utf-8', newline='') as f:
    f.write(text)
  return path


def _csv(tmp_path, name='train.csv', rows=ROWS, header='text,label') -> str:
  return _write(tmp_path, name, header + '\n' + ''.join(f'"{t}",{l}\n' for t, l in rows))


def _cfg(train_file, **fields) -> FinetuneConfig:
  return FinetuneConfig(task=fields.pop('task', 'classify'), train_file=train_file, max_seq_length=32, **fields)


def _error(fn, *args) -> str:
  with pytest.raises(DataError) as e:
    fn(*args)
  return str(e.value)


def test_csv_tsv_and_jsonl_read_the_same_rows(tmp_path):
  csv_path = _csv(tmp_path)
  tsv_path = _write(tmp_path, 'train.tsv', 'label\ttext\n' + ''.join(f'{l}\t{t}\n' for t, l in ROWS))
  jsonl_path = _write(tmp_path, 'train.jsonl',
                      ''.join(json.dumps({'text': t, 'label': l}) + '\n' for t, l in ROWS))
  read = [own_data.read_rows(p, own_data.Columns(), 'classification') for p in (csv_path, tsv_path, jsonl_path)]
  assert [(r.text, r.label) for r in read[0]] == ROWS
  assert read[0] == read[1] and [(r.text, r.label) for r in read[2]] == ROWS
  assert [r.line for r in read[0]] == [2, 3, 4, 5, 6, 7] and [r.line for r in read[2]] == [1, 2, 3, 4, 5, 6]


def test_pairs_quoted_newlines_and_the_sentence_column(tmp_path):
  path = _write(tmp_path, 'pairs.csv', 'sentence,hypothesis,label\n"A man,\nwho eats.",Someone eats.,yes\n'
                                       '\n"He said ""no"".",Nobody spoke.,no\n')
  rows = own_data.read_rows(path, own_data.Columns(text_pair='hypothesis'), 'classification')
  assert [(r.text, r.text_pair, r.label, r.line) for r in rows] == [
      ('A man,\nwho eats.', 'Someone eats.', 'yes', 2), ('He said "no".', 'Nobody spoke.', 'no', 5)]


def test_labels_sorted_or_as_given_and_numbers_sorted_as_numbers(tmp_path):
  task = get_task('classify')
  features = task.train_features(_cfg(_csv(tmp_path), eval_fraction=0.0, eval_file=_csv(tmp_path, 'dev.csv')),
                                 WhitespaceTokenizer())
  assert task.label_names == ['negative', 'neutral', 'positive'] and task.num_labels == 3
  assert [f.label for f in features] == [2, 0, 1, 2, 0, 1]
  task = get_task('classify')
  task.train_features(_cfg(_csv(tmp_path), label_names='positive, negative,neutral'), WhitespaceTokenizer())
  assert task.label_names == ['positive', 'negative', 'neutral']
  assert own_data.sorted_labels(['10', '2', '1']) == ['1', '2', '10']
  assert own_data.sorted_labels(['b', '10', '2']) == ['10', '2', 'b']
  # JSON numbers and booleans are spelled as JSON spells them.
  path = _write(tmp_path, 'n.jsonl', '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n')
  assert [r.label for r in own_data.read_rows(path, own_data.Columns(), 'classification')] == ['1', '0']


def test_recorded_labels_win_over_the_files_order(tmp_path):
  task = get_task('classify')
  task.recorded_labels = ['positive', 'neutral', 'negative']
  features = task.train_features(_cfg(_csv(tmp_path)), WhitespaceTokenizer())
  assert task.label_names == ['positive', 'neutral', 'negative']
  assert [task.label_names[f.label] for f in features] == [ROWS[f.example_index - 2][1] for f in features]


def test_held_out_split_is_seeded_disjoint_and_logged(tmp_path, capsys):
  rows = [(f'sentence number {i}', 'ab'[i % 2]) for i in range(40)]
  path = _csv(tmp_path, rows=rows)
  lines = {}
  for seed in (0, 0, 1):
    task = get_task('classify')
    cfg = _cfg(path, eval_fraction=0.25, split_seed=seed)
    train = task.train_features(cfg, WhitespaceTokenizer())
    dev = task.eval_sets(cfg, WhitespaceTokenizer())[0]
    assert len(train) == 30 and len(dev.features) == 10 and dev.name == 'dev'
    assert not {f.example_index for f in train} & set(dev.data.lines.tolist())
    lines.setdefault(seed, []).append(sorted(dev.data.lines.tolist()))
  assert lines[0][0] == lines[0][1] != lines[1][0]
  out = capsys.readouterr()
  assert '10 of the 40 rows of' in out.out + out.err and 'split_seed=1' in out.out + out.err


def test_evaluate_classification_and_regression(tmp_path):
  task = get_task('classify')
  cfg = _cfg(_csv(tmp_path), eval_file=_csv(tmp_path, 'dev.csv'))
  task.train_features(cfg, WhitespaceTokenizer())
  dev = task.eval_sets(cfg, WhitespaceTokenizer())[0]
  logits = [np.eye(3, dtype=np.float32)[l] for l in [2, 0, 1, 2, 0, 0]]  # the last one wrong
  result = task.evaluate(dev, logits, str(tmp_path))
  assert result['accuracy'] == pytest.approx(5 / 6)
  assert result['macro_f1'] == pytest.approx(metrics.f1_macro([2, 0, 1, 2, 0, 0], dev.data.labels))
  with open(tmp_path / 'predictions_dev.tsv', encoding='utf-8') as f:
    assert f.read().splitlines()[:3] == ['line\tprediction', '2\tpositive', '3\tnegative']
  path = _write(tmp_path, 'scores.jsonl', ''.join(json.dumps({'text': f'text {i}', 'score': i / 2}) + '\n'
                                                  for i in range(10)))
  task = get_task('regress')
  cfg = _cfg(path, task='regress', label_column='score', eval_fraction=0.5)
  task.train_features(cfg, WhitespaceTokenizer())
  dev = task.eval_sets(cfg, WhitespaceTokenizer())[0]
  result = task.evaluate(dev, [np.array([v * 2], np.float32) for v in dev.data.labels], None)
  assert result == {'pearson': pytest.approx(1.0), 'spearmanr': pytest.approx(1.0)} and task.num_labels == 1


@pytest.mark.parametrize('name,text,columns,pattern', [
    ('missing.csv', 'review,stars\nok,1\n', own_data.Columns(), "missing.csv:1: no column 'text'; the file has "
                                                            "'review', 'stars'"),
    ('missing_label.csv', 'text,stars\nok,1\n', own_data.Columns(), "no column 'label'; the file has 'text', 'stars'"),
    ('keys.jsonl', '{"text": "a", "label": "x"}\n{"txt": "b", "label": "y"}\n', own_data.Columns(),
     "keys.jsonl:2: no 'text' (this line has 'txt', 'label')"),
    ('mixed.jsonl', '{"text": "a", "label": 1}\n{"text": "b", "label": "pos"}\n', own_data.Columns(),
     'mixed.jsonl:2: labels mix numbers and strings'),
    ('blank.csv', 'text,label\n" ",a\n', own_data.Columns(), "blank.csv:2: 'text' must be a non-empty text"),
])
def test_bad_files_name_the_file_and_line(tmp_path, name, text, columns, pattern):
  assert pattern in _error(own_data.read_rows, _write(tmp_path, name, text), columns, 'classification')


@pytest.mark.parametrize('value', ['nan', 'inf', '-Infinity', 'high'])
def test_regression_targets_must_be_finite_numbers(tmp_path, value):
  path = _write(tmp_path, 't.csv', f'text,label\nfine,0.5\nbad,{value}\n')
  assert 't.csv:3: target' in _error(own_data.read_rows, path, own_data.Columns(), 'regression')


def test_eval_labels_unseen_in_training_and_one_class(tmp_path):
  dev = _csv(tmp_path, 'dev.csv', rows=ROWS[:2] + [('What?', 'confused')])
  cfg = _cfg(_csv(tmp_path), eval_file=dev)
  task = get_task('classify')
  task.train_features(cfg, WhitespaceTokenizer())
  message = _error(task.eval_sets, cfg, WhitespaceTokenizer())
  assert "dev.csv:4: label 'confused' never appears in the training file" in message
  assert 'the labels are negative, neutral, positive' in message
  message = _error(get_task('classify').train_features, _cfg(_csv(tmp_path), label_names='positive,negative'),
                   WhitespaceTokenizer())
  assert "train.csv:4: label 'neutral' is not one of label_names" in message
  one = _csv(tmp_path, 'one.csv', rows=[(t, 'x') for t, _ in ROWS])
  assert "every row has the label 'x'" in _error(get_task('classify').train_features, _cfg(one),
                                                 WhitespaceTokenizer())
  assert 'set --config.train_file' in _error(get_task('classify').train_features, _cfg(''), WhitespaceTokenizer())


def test_config_fields():
  with pytest.raises(ConfigError, match='eval_fraction'):
    FinetuneConfig(eval_fraction=1.0)
  cfg = FinetuneConfig()
  assert (cfg.text_column, cfg.text_pair_column, cfg.label_column, cfg.label_names) == ('text', '', 'label', '')


_REVIEWS = {
    'positive': ['A gripping, funny film.', 'An instant classic, loved it.', 'Wonderful acting and a great story.',
                 'I would watch it again tomorrow.', 'Sharp, warm and beautifully shot.'],
    'negative': ['Dull and far too long.', 'I want my money back.', 'A mess from start to finish.',
                 'The worst film I have seen this year.', 'Flat jokes and wooden acting.'],
    'neutral': ['It was fine, I suppose.', 'Some good scenes, some bad.', 'An average film, neither good nor bad.',
                'It is a film about a family.', 'Watchable once, then forgettable.'],
}


@pytest.mark.slow
@pytest.mark.e2e
def test_own_csv_fine_tunes_predicts_and_exports_label_names(tiny_checkpoint, tmp_path):
  """A CSV with three named classes under its own column names: trained, predicted and exported by name, and the
  transformers pipeline gives predict.py's names and probabilities."""
  transformers = pytest.importorskip('transformers')
  # The entry points run in this process (run_main: flags, stdout, stderr, exit code as a subprocess gives them); a
  # subprocess each would import jax and compile again.
  from harness.entry_points import run_main  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  rows = [(text, label) for label, texts in _REVIEWS.items() for text in texts] * 2
  train = _csv(tmp_path, 'reviews.csv', rows=rows, header='review,sentiment')
  workdir, export = tmp_path / 'work', tmp_path / 'hf'
  trained = run_main(
      'finetune.py', '--config=experiments/configs/finetune.py:classify', f'--workdir={workdir}',
      f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={train}', '--config.text_column=review',
      '--config.label_column=sentiment', '--config.num_train_steps=3', '--config.batch_size=8',
      '--config.max_seq_length=32', '--config.eval_fraction=0.2', '--config.class_weights=neutral=2,positive=0.5',
      '--config.label_smoothing=0.1')
  assert trained.returncode == 0, trained.stderr[-3000:]
  result = json.loads(trained.stdout.strip().splitlines()[-1])
  assert result['main_metric'] == 'dev_accuracy' and 0 <= result['dev_macro_f1'] <= 1
  assert result['class_weights'] == {'negative': 1.0, 'neutral': 2.0, 'positive': 0.5}
  assert re.search(r'class weights: negative 1 \(\d+ in training\), neutral 2 \(\d+ in training\), positive 0.5 ',
                   trained.stdout)
  assert '6 of the 30 rows of' in trained.stdout + trained.stderr
  names = ['negative', 'neutral', 'positive']
  with open(workdir / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task'] == {'name': 'classify', 'kind': 'classification', 'num_labels': 3,
                                    'label_names': names}
  texts = [t for t, _ in rows[::3]]
  to_predict = _csv(tmp_path, 'new.csv', rows=[(t, '') for t in texts], header='review,unused')
  predicted = run_main('predict.py', f'--workdir={workdir}', f'--input={to_predict}')
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  ours = [json.loads(line) for line in predicted.stdout.strip().splitlines()]
  assert [o['text'] for o in ours] == texts and all(set(o['probabilities']) == set(names) for o in ours)
  exported = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={export}')
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert transformers.AutoConfig.from_pretrained(str(export)).id2label == dict(enumerate(names))
  theirs = transformers.pipeline('text-classification', model=str(export), top_k=None)(texts)
  for o, scores in zip(ours, theirs):
    assert scores[0]['label'] == o['label'] in names
    close = tolerance(np.float32, 64, depth=2)  # torch against XLA: the tiny checkpoint's widest sums, 2 layers
    assert all(abs(s['score'] - o['probabilities'][s['label']]) <= close for s in scores), (scores, o)


@pytest.mark.slow
def test_a_gzipped_and_a_remote_training_file_train_as_the_plain_one(tiny_checkpoint, tmp_path, fake_bucket):
  """The rows of a CSV as train.csv.gz (local) and as gs://bucket/own/train.csv (a GCS emulator: conftest's
  fake_bucket) train alike: the same split and the same held-out metrics."""
  from harness.entry_points import run_main  # pylint: disable=g-import-not-at-top
  rows = [(text, label) for label, texts in _REVIEWS.items() for text in texts] * 2
  plain = _csv(tmp_path, 'train.csv', rows=rows)
  packed = tmp_path / 'train.csv.gz'
  with open(plain, 'rb') as f:
    packed.write_bytes(gzip.compress(f.read()))
  remote = f'{fake_bucket}/own/train.csv'
  files.copy_file(plain, remote)
  results = []
  for i, train in enumerate((str(packed), remote)):
    trained = run_main(
        'finetune.py', '--config=experiments/configs/finetune.py:classify', f'--workdir={tmp_path}/work{i}',
        f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={train}', '--config.num_train_steps=2',
        '--config.batch_size=8', '--config.max_seq_length=32', '--config.eval_fraction=0.2')
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f'6 of the 30 rows of {train} held out' in trained.stdout + trained.stderr
    results.append(json.loads(trained.stdout.strip().splitlines()[-1]))
    with open(tmp_path / f'work{i}' / 'config.json', encoding='utf-8') as f:
      assert json.load(f)['task']['label_names'] == ['negative', 'neutral', 'positive']
  assert results[0]['main_metric'] == 'dev_accuracy'
  assert [r['dev_accuracy'] for r in results] == [results[0]['dev_accuracy']] * 2
  assert [r['dev_macro_f1'] for r in results] == [results[0]['dev_macro_f1']] * 2


def test_class_weights_of_unknown_labels_or_on_regression_are_one_error_line(tiny_checkpoint, tmp_path):
  from harness.entry_points import assert_one_line_error, run_main  # pylint: disable=g-import-not-at-top
  rows = [(text, label) for label, texts in _REVIEWS.items() for text in texts]
  train = _csv(tmp_path, 'reviews.csv', rows=rows, header='review,sentiment')
  common = [f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={train}',
            '--config.text_column=review', '--config.label_column=sentiment', '--config.num_train_steps=1']
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:classify', f'--workdir={tmp_path / "a"}',
                    *common, '--config.class_weights=happy=2')
  assert_one_line_error(result, "class_weights entry 'happy=2': give auto or label=weight,... with labels of "
                                'negative, neutral, positive')
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:regress', f'--workdir={tmp_path / "b"}',
                    *common, '--config.class_weights=auto')
  assert_one_line_error(result, '--config.class_weights')
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:classify', f'--workdir={tmp_path / "c"}',
                    *common, '--config.label_smoothing=1.0')
  assert_one_line_error(result, 'label_smoothing=1.0 must be in [0, 1)')
