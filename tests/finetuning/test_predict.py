"""Predictions on new text: the dev set gets the predictions evaluation wrote, for every task kind;
input formats, outputs and bad input; the workdir is never written."""

import gzip
import itertools
import json
import os
import re
import shutil
import types

import numpy as np
import pytest

from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning import finetune_run as finetuning, predict
from bert_jax.finetuning.tasks import conll, squad
from bert_jax.interop.pretrained import load_finetuned
from bert_jax.runs import reporting

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import FIXTURES, finetune_config, head_of_task_file, shared_data_or_skip

pytestmark = pytest.mark.slow  # each fixture fine-tunes a tiny model


def _tune(tmp_path_factory, tiny_checkpoint, name, task, **fields):
  workdir = str(tmp_path_factory.mktemp(name) / 'run')
  finetuning.finetune(finetune_config(task=task, init_checkpoint=tiny_checkpoint, learning_rate=1e-3,
                                      eval_batch_size=32, **fields), workdir)
  return workdir


# The dev sets these runs evaluate (and predict then reads again): their first 200 rows or blocks, which show whether
# predict gives what evaluation wrote as well as the whole set does (SST-2 has 872, CoNLL-2003 3,250).
DEV_EXAMPLES = 200


def _dev_head(tmp_path_factory, path):
  return head_of_task_file(path, DEV_EXAMPLES, tmp_path_factory.mktemp('dev'))


@pytest.fixture(scope='module')
def sst2_dev(tmp_path_factory):
  return _dev_head(tmp_path_factory, os.path.join(shared_data_or_skip('sst2'), 'dev.tsv'))


@pytest.fixture(scope='module')
def sst2(tmp_path_factory, tiny_checkpoint, sst2_dev):
  """Read by every test that takes it, never written (each checks its digest)."""
  return _tune(tmp_path_factory, tiny_checkpoint, 'sst2', 'sst2', data_dir=shared_data_or_skip('sst2'),
               eval_file=sst2_dev, max_seq_length=64, batch_size=16, num_train_steps=8, max_train_samples=128)


def _dev_predictions(path):
  with open(path, encoding='utf-8') as f:
    return [line.split('\t')[1] for line in f.read().splitlines()[1:]]


def test_classification_dev_set_gets_the_evaluation_predictions(sst2, sst2_dev):
  before = tree_digest(sst2)
  tuned = load_finetuned(sst2)
  rows = predict.read_rows(sst2_dev, 'classification', 'sst2')
  assert len(rows) == DEV_EXAMPLES
  outputs = predict.predict(tuned, rows, batch_size=48)
  # The predictions file writes GLUE's 0/1, predict the names: negative/positive.
  spelled = dict(zip(['negative', 'positive'], ['0', '1']))
  assert [spelled[o['label']] for o in outputs] == _dev_predictions(os.path.join(sst2, 'seed_0',
                                                                                  'predictions_dev.tsv'))
  for o in outputs:
    assert set(o['probabilities']) == {'negative', 'positive'} and abs(sum(o['probabilities'].values()) - 1) < 1e-6
    assert o['label'] == max(o['probabilities'], key=o['probabilities'].get)
  assert tree_digest(sst2) == before


@pytest.mark.e2e
def test_predict_cli_text_input_and_outputs(sst2, tmp_path):
  """experiments/predict.py's inputs, outputs and one-line errors. It runs in this process (run_main: its flags,
  stdout, stderr and exit code as a subprocess gives them): 14 runs, each of which would otherwise import jax and
  compile again."""
  before = tree_digest(sst2)
  r = run_main('predict.py', f'--workdir={sst2}', '--text=A gripping, funny film.')
  assert r.returncode == 0, r.stderr[-3000:]
  one = json.loads(r.stdout.strip().splitlines()[-1])
  assert one['text'] == 'A gripping, funny film.' and one['label'] in ('negative', 'positive')
  texts = tmp_path / 'texts.txt'
  texts.write_text('A gripping, funny film.\nDull and far too long.\n\nAn instant classic.\n', encoding='utf-8')
  r = run_main('predict.py', f'--workdir={sst2}', f'--input={texts}', f'--output={tmp_path}/p.jsonl',
                     '--batch_size=2')
  assert r.returncode == 0, r.stderr[-3000:]
  said = [l for l in r.stderr.splitlines() if l.startswith('predict: ')]  # each phase, as it starts
  assert said[0] == f'predict: loading {sst2} (seed the first, step the latest) ...', r.stderr
  assert said[-1] == f'predict: writing 3 predictions to {tmp_path}/p.jsonl', r.stderr
  assert any(l.startswith('predict: compiling the model for ') for l in said), r.stderr
  lines = [json.loads(l) for l in open(tmp_path / 'p.jsonl', encoding='utf-8')]
  assert [l['text'] for l in lines] == ['A gripping, funny film.', 'Dull and far too long.', 'An instant classic.']
  assert lines[0]['label'] == one['label']  # the same prediction batched with others
  r = run_main('predict.py', f'--workdir={sst2}', f'--input={texts}', f'--output={tmp_path}/p.tsv')
  header = open(tmp_path / 'p.tsv').read().splitlines()[0]
  assert r.returncode == 0 and header == 'text\ttext_pair\tlabel\tp_negative\tp_positive'
  for args, message in (((), 'give one of'), (('--text=a', f'--input={texts}'), 'give one of'),
                        (('--text=a', f'--output={sst2}/p.jsonl'), 'inside the workdir'),
                        (('--text=a', f'--output={tmp_path}/p.csv'), '.jsonl or .tsv'),
                        ((f'--input={tmp_path}/none.txt',), 'does not exist'),
                        (('--text=a', '--seed=7'), 'has no seed 7'),
                        (('--text=a', '--step=999'), 'no checkpoint for step 999'),
                        (('--text=a', '--text_pair=b'), 'sst2 classifies single sentences'),
                        (('--text=caf\udce9',), '--text is not UTF-8 text (byte 0xe9 at character 3)')):
    assert_one_line_error(run_main('predict.py', f'--workdir={sst2}', *args), message)
  (tmp_path / 'pairs.txt').write_text('fine\nA film.\tA film.\n', encoding='utf-8')
  assert_one_line_error(run_main('predict.py', f'--workdir={sst2}', f'--input={tmp_path}/pairs.txt'),
                        'row 2: sst2 classifies single sentences')
  r = run_main('predict.py', f'--workdir={sst2}', '--text=' + 'a long review ' * 40)
  assert r.returncode == 0, r.stderr[-3000:]
  assert [l for l in r.stderr.splitlines() if l.startswith('warning:')] == [
      'warning: 1 of 1 texts were longer than max_seq_length=64 tokens (the run\'s) and were truncated']
  assert tree_digest(sst2) == before


def test_a_long_prediction_says_where_it_is_and_when_it_compiles(sst2, sst2_dev, monkeypatch):
  """The fine-tuning evaluation's progress lines (reporting.Ticker: every 10 s, with an ETA, and at the end), here
  on a stand-in clock at 6 s a batch; a line before and after each compile."""
  tuned = load_finetuned(sst2)
  rows = predict.read_rows(sst2_dev, 'classification', 'sst2')
  clock, progress, said = itertools.count(0.0, 6.0), [], []
  monkeypatch.setattr(reporting, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
  monkeypatch.setattr(reporting, 'log', progress.append)
  outputs = predict.predict(tuned, rows, batch_size=48, log=said.append)  # 200 rows: 5 batches
  assert len(outputs) == DEV_EXAMPLES
  assert progress == ['predicting: 2/5 batches | elapsed 12s | ETA 18s',
                      'predicting: 4/5 batches | elapsed 24s | ETA 6s',
                      'predicting: 5/5 batches | elapsed 30s | ETA 0s']
  compiling = [l for l in said if re.fullmatch(r'predict: compiling the model for \d+ x \d+ tokens \.\.\.', l)]
  compiled = [l for l in said if re.fullmatch(r'predict: compiled \(and ran that batch\) in [\d.]+ s', l)]
  assert 1 <= len(compiling) == len(compiled) <= 5, said


def test_a_workdir_keeps_its_tokenizer_when_the_starting_checkpoint_changes(tiny_checkpoint, tmp_path):
  start, workdir = tmp_path / 'start', str(tmp_path / 'sst2')
  shutil.copytree(tiny_checkpoint, start)
  cfg = finetune_config(task='sst2', init_checkpoint=str(start), data_dir=shared_data_or_skip('sst2'),
                        max_seq_length=32, batch_size=16, num_train_steps=2, max_train_samples=32)
  finetuning.finetune(cfg, workdir)
  assert {'tokenizer.json', 'vocab.txt', 'tokenizer_config.json'} <= set(os.listdir(workdir))
  rows = [predict.text_row('classification', t) for t in ('A gripping, funny film.', 'Dull and far too long.')]
  before_outputs = predict.predict(load_finetuned(workdir), rows)
  # The starting path now holds another model (another run, a newer download): the workdir does not care.
  shutil.rmtree(start)
  shutil.copytree(os.path.join(FIXTURES, 'legacy', 'pretrain'), start)  # SentencePiece, 300 pieces
  before = tree_digest(workdir)
  assert predict.predict(load_finetuned(workdir), rows) == before_outputs
  r = run_main('predict.py', f'--workdir={workdir}', '--text=A gripping, funny film.')
  assert r.returncode == 0 and 'warning' not in r.stderr, r.stderr[-3000:]
  assert json.loads(r.stdout.strip().splitlines()[-1])['probabilities'] == before_outputs[0]['probabilities']
  with pytest.raises(ConfigError, match='is not the one this run was fine-tuned with'):
    finetuning.finetune(cfg, workdir)  # resuming on other weights would mix two models
  assert tree_digest(workdir) == before


def test_token_classification_dev_set_gets_the_evaluation_tags(tmp_path_factory, tiny_checkpoint):
  data = shared_data_or_skip('conll2003')
  dev = _dev_head(tmp_path_factory, os.path.join(data, conll.DEV_FILE))
  workdir = _tune(tmp_path_factory, tiny_checkpoint, 'conll', 'conll2003', data_dir=data, eval_file=dev,
                  max_seq_length=64, batch_size=16, num_train_steps=8, max_train_samples=128)
  before = tree_digest(workdir)
  rows = predict.read_rows(dev, 'token', 'conll2003')
  assert len(rows) == 189  # 200 blank lines, after 11 of which a -DOCSTART- line
  outputs = predict.predict(load_finetuned(workdir), rows)
  with open(os.path.join(workdir, 'seed_0', 'predictions_dev.txt'), encoding='utf-8') as f:
    written = [line.split()[2] for line in f if line.strip()]
  assert [t for o in outputs for t in o['tags']] == written
  for o in outputs[:50]:
    assert len(o['tags']) == len(o['words']) == len(o['scores'])
    for e in o['entities']:
      assert o['tags'][e['start']] in (f'B-{e["type"]}', f'I-{e["type"]}')
  raw = predict.predict(load_finetuned(workdir), [predict.text_row('token', 'John Smith flew to Paris.')])[0]
  assert raw['words'] == ['John', 'Smith', 'flew', 'to', 'Paris', '.']
  assert tree_digest(workdir) == before


def test_question_answering_dev_set_gets_the_evaluation_answers(tmp_path_factory, tiny_checkpoint):
  data = shared_data_or_skip('squad-v1.1')
  workdir = _tune(tmp_path_factory, tiny_checkpoint, 'squad', 'squad', data_dir=data, max_seq_length=128,
                  doc_stride=32, batch_size=16, num_train_steps=4, train_articles=2, eval_articles=1)
  with open(os.path.join(workdir, 'seed_0', 'predictions_eval.json'), encoding='utf-8') as f:
    written = json.load(f)
  rows = predict.read_rows(os.path.join(data, 'dev-v1.1.json'), 'span', 'squad')
  rows = [r for r in rows if r['id'] in written]
  outputs = predict.predict(load_finetuned(workdir), rows, n_best=3)
  assert len(rows) == len(written) > 10
  assert {r['id']: o['answer'] for r, o in zip(rows, outputs)} == written
  for r, o in zip(rows, outputs):
    assert r['context'][o['start']:o['end']] == o['answer'] and 0 < o['probability'] <= 1
    assert len(o['n_best']) <= 2 and all(n['score'] <= o['score'] for n in o['n_best'])


def test_rows_from_every_format(tmp_path):
  (tmp_path / 'pairs.txt').write_text('a man eats\tsomeone eats\n\nit rains\n', encoding='utf-8')
  assert predict.read_rows(str(tmp_path / 'pairs.txt'), 'classification', 'rte') == [
      {'text': 'a man eats', 'text_pair': 'someone eats'}, {'text': 'it rains', 'text_pair': None}]
  (tmp_path / 'qa.jsonl').write_text(json.dumps({'id': 'q1', 'question': 'Who?', 'context': 'Ann did.'}) + '\n')
  assert predict.read_rows(str(tmp_path / 'qa.jsonl'), 'span', 'squad') == [
      {'id': 'q1', 'question': 'Who?', 'context': 'Ann did.'}]
  (tmp_path / 'ner.jsonl').write_text(json.dumps({'tokens': ['EU', 'rejects']}) + '\n' + json.dumps(
      {'text': "Ann's dog, Rex."}) + '\n')
  assert [r['words'] for r in predict.read_rows(str(tmp_path / 'ner.jsonl'), 'token', 'conll2003')] == [
      ['EU', 'rejects'], ['Ann', "'", 's', 'dog', ',', 'Rex', '.']]
  # Compressed inputs read as the plain ones (bert_jax.files: by the suffix after the file's own extension).
  for name in ('pairs.txt', 'qa.jsonl', 'ner.jsonl'):
    (tmp_path / f'{name}.gz').write_bytes(gzip.compress((tmp_path / name).read_bytes()))
    kind, task = {'pairs.txt': ('classification', 'rte'), 'qa.jsonl': ('span', 'squad'),
                  'ner.jsonl': ('token', 'conll2003')}[name]
    assert predict.read_rows(str(tmp_path / f'{name}.gz'), kind, task) == predict.read_rows(
        str(tmp_path / name), kind, task), name
  for name, text, kind, message in (('bad.jsonl', '[1]\n', 'classification', 'bad.jsonl:1: a JSONL line must be an'),
                                    ('three.txt', 'a\tb\tc\n', 'classification', '3 tab-separated fields'),
                                    ('empty.txt', '\n\n', 'classification', 'has no text'),
                                    ('noctx.txt', 'who?\n', 'span', 'needs a question and a context')):
    (tmp_path / name).write_text(text, encoding='utf-8')
    with pytest.raises(DataError, match=message):
      predict.read_rows(str(tmp_path / name), kind, 'sst2')
  with pytest.raises(DataError, match='for question answering'):
    predict.read_rows(str(tmp_path / 'qa.jsonl'), 'classification', 'sst2', 'squad')


def test_regression_and_span_outputs():
  assert predict._sequence_output('regression', [], np.array([3.25])) == {'score': 3.25}  # pylint: disable=protected-access
  assert predict._span_output([])['answer'] == ''  # pylint: disable=protected-access
  answer = squad.Answer('Paris', 7.5, 0.6, 18, 23)
  out = predict._span_output([answer, squad.Answer('to Paris', 6.0, 0.2, 15, 23)])  # pylint: disable=protected-access
  assert out['answer'] == 'Paris' and out['n_best'][0]['answer'] == 'to Paris'
