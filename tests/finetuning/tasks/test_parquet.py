"""Parquet files (pyarrow, tests/requirements.txt) by column names for every task kind: the same rows as the JSONL
file of the same records, and bad Parquet input as one DataError naming the file and row."""

from __future__ import annotations

import json
import sys

import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import answering, own_data, tagging

pa = pytest.importorskip('pyarrow', reason='pyarrow is not installed (tests/requirements.txt installs it)')
pq = pytest.importorskip('pyarrow.parquet')

CONTEXT = 'Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.'
RECORDS = {
    'classification': [{'text': 'A gripping, funny film.', 'label': 'positive'},
                       {'text': 'Dull and far too long.', 'label': 'negative'}],
    'pairs': [{'sentence1': 'A man plays.', 'sentence2': 'Someone plays.', 'label': 'entailment'},
              {'sentence1': 'A cat sleeps.', 'sentence2': 'A dog runs.', 'label': 'contradiction'}],
    'regression': [{'text': 'close', 'score': 4.5}, {'text': 'far', 'score': 0.25}],
    'multilabel': [{'text': 'tense and funny', 'label': ['comedy', 'thriller']}, {'text': 'scary', 'label': []}],
    'tags': [{'tokens': ['Marie', 'Curie', 'won'], 'tags': ['B-PER', 'I-PER', 'O']},
             {'tokens': ['Paris'], 'tags': ['B-LOC']}],
    'qa': [{'id': 'a', 'question': 'When in Physics?', 'context': CONTEXT,
            'answers': {'text': ['1903'], 'answer_start': [CONTEXT.index('1903')]}},
           {'id': 'b', 'question': 'Which prize?', 'context': CONTEXT, 'answers': {'text': [], 'answer_start': []}}],
}


def _write(tmp_path, name: str, records: list[dict]) -> tuple[str, str]:
  """(the JSONL path, the Parquet path) of the same records."""
  jsonl, parquet = str(tmp_path / f'{name}.jsonl'), str(tmp_path / f'{name}.parquet')
  with open(jsonl, 'w', encoding='utf-8') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  pq.write_table(pa.Table.from_pylist(records), parquet)
  return jsonl, parquet


@pytest.mark.parametrize('name,kind,columns', [
    ('classification', 'classification', own_data.Columns()),
    ('pairs', 'classification', own_data.Columns(text='sentence1', text_pair='sentence2')),
    ('regression', 'regression', own_data.Columns(label='score')),
    ('multilabel', 'multilabel', own_data.Columns()),
])
def test_parquet_gives_the_rows_of_the_same_jsonl(tmp_path, name, kind, columns):
  read = [own_data.read_rows(p, columns, kind) for p in _write(tmp_path, name, RECORDS[name])]
  assert read[0] == read[1] and len(read[1]) == 2 and [r.line for r in read[1]] == [1, 2]


def test_a_compressed_or_remote_parquet_file_reads_as_the_local_one(tmp_path, fake_bucket):
  from bert_jax import files  # pylint: disable=g-import-not-at-top
  from bert_jax.data import tables  # pylint: disable=g-import-not-at-top
  _, parquet = _write(tmp_path, 'classification', RECORDS['classification'])
  with open(parquet, 'rb') as f:
    data = f.read()
  for copy in (f'{parquet}.gz', f'{fake_bucket}/own/train.parquet', f'{fake_bucket}/own/train.parquet.xz'):
    with files.open(copy, 'wb') as out:  # compressed as its name says
      out.write(data)
    assert tables.records(copy) == tables.records(parquet), copy
    assert tables.column_names(copy) == ['text', 'label'], copy


def test_parquet_tags_and_questions_as_their_jsonl(tmp_path):
  tags = [tagging.read_sentences(p, 'text', 'label') for p in _write(tmp_path, 'tags', RECORDS['tags'])]
  assert tags[0] == tags[1] and tags[1][0].label == ['B-PER', 'I-PER', 'O']
  cfg = FinetuneConfig(task='qa', max_seq_length=64)
  qa = [answering.read_examples(p, cfg) for p in _write(tmp_path, 'qa', RECORDS['qa'])]
  assert qa[0] == qa[1] and qa[1][0].answers == [{'text': '1903', 'answer_start': CONTEXT.index('1903')}]
  assert qa[1][1].is_impossible


def _error(fn, *args) -> str:
  with pytest.raises(DataError) as e:
    fn(*args)
  return str(e.value)


def test_bad_parquet_is_one_error_naming_the_file_and_row(tmp_path):
  _, wrong_type = _write(tmp_path, 'numbers', [{'text': 3, 'label': 'a'}, {'text': 7, 'label': 'b'}])  # int64
  assert "numbers.parquet:1: 'text' must be a non-empty text" in _error(
      own_data.read_rows, wrong_type, own_data.Columns(), 'classification')
  _, regression = _write(tmp_path, 'words', [{'text': 'a', 'label': 'high'}])
  assert 'words.parquet:1: target' in _error(own_data.read_rows, regression, own_data.Columns(), 'regression')
  _, missing = _write(tmp_path, 'other', [{'txt': 'a', 'label': 'x'}])
  assert "other.parquet" in _error(own_data.read_rows, missing, own_data.Columns(), 'classification')
  cut = tmp_path / 'cut.parquet'
  cut.write_bytes((tmp_path / 'other.parquet').read_bytes()[:40])
  assert 'cut.parquet: unreadable Parquet' in _error(own_data.read_rows, str(cut), own_data.Columns(), 'classification')
  empty = str(tmp_path / 'empty.parquet')
  pq.write_table(pa.table({'text': pa.array([], pa.string()), 'label': pa.array([], pa.string())}), empty)
  assert 'empty.parquet has columns but no rows' in _error(own_data.read_rows, empty, own_data.Columns(),
                                                           'classification')


def test_parquet_without_pyarrow_is_one_clear_error(tmp_path, monkeypatch):
  _, path = _write(tmp_path, 'train', RECORDS['classification'])
  monkeypatch.setitem(sys.modules, 'pyarrow.parquet', None)  # what a machine without pyarrow imports
  assert 'reading Parquet needs pyarrow' in _error(own_data.read_rows, path, own_data.Columns(), 'classification')
