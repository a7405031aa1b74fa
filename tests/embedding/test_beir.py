"""BEIR's layout read back, and one clear error per bad input."""

import json
import os

import pytest

from bert_jax.embedding import beir
from bert_jax.errors import DataError

CORPUS = [{'_id': 'd1', 'title': 'Paris', 'text': 'Paris is the capital of France.'},
          {'_id': 'd2', 'text': 'Berlin is in Germany.'},
          {'_id': 3, 'title': '', 'text': 'A number as an id.'}]
QUERIES = [{'_id': 'q0', 'text': 'unjudged in this split'},
           {'_id': 'q1', 'text': 'capital of France?'},
           {'_id': 'q2', 'text': 'where is Berlin'}]
QRELS = 'query-id\tcorpus-id\tscore\nq2\td2\t1\nq1\td1\t2\nq1\t3\t0\n'


def _write(directory, corpus=None, queries=None, qrels=QRELS, split='test'):
  os.makedirs(os.path.join(directory, 'qrels'), exist_ok=True)
  for name, rows in (('corpus.jsonl', corpus or CORPUS), ('queries.jsonl', queries or QUERIES)):
    with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
      f.write(rows if isinstance(rows, str) else ''.join(json.dumps(r) + '\n' for r in rows))
  if qrels is not None:
    with open(os.path.join(directory, 'qrels', f'{split}.tsv'), 'w', encoding='utf-8') as f:
      f.write(qrels)
  return str(directory)


def test_reads_the_judged_queries_in_file_order(tmp_path):
  data = beir.read_beir(_write(tmp_path))
  assert data.corpus_ids == ['d1', 'd2', '3']
  assert data.query_ids == ['q1', 'q2'] and data.queries == ['capital of France?', 'where is Berlin']
  assert data.qrels == [{0: 2, 2: 0}, {1: 1}]
  assert data.passages() == ['Paris Paris is the capital of France.', 'Berlin is in Germany.', 'A number as an id.']
  assert beir.read_beir(_write(tmp_path / 'dev', split='dev'), split='dev').query_ids == ['q1', 'q2']


@pytest.mark.parametrize('files, message', [
    (dict(qrels=None), r'qrels file .*qrels/test.tsv does not exist'),
    (dict(corpus='{"_id": "d1", "text": "x"}\nnot json\n'), r'corpus.jsonl line 2 is not valid JSON'),
    (dict(corpus='["d1", "x"]\n'), r'corpus.jsonl line 1 is not a JSON object'),
    (dict(corpus='{"text": "x"}\n'), r'corpus.jsonl line 1 has no "_id"'),
    (dict(corpus='{"_id": "d1"}\n'), r'corpus.jsonl line 1 has no "text"'),
    (dict(corpus='{"_id": "d1", "text": 5}\n'), r'"text" must be a string, got int'),
    (dict(corpus='{"_id": "d1", "text": "a"}\n\n{"_id": "d1", "text": "b"}\n'),
     r'corpus.jsonl line 3: "_id" \'d1\' repeats line 1'),
    (dict(queries='\n\n'), r'queries file .*queries.jsonl is empty'),
    (dict(qrels='q1\td1\t1\n'), r'line 1 must be the header'),
    (dict(qrels='query-id\tcorpus-id\tscore\n'), r'has a header but no judgements'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\n'), r'line 2 has 2 tab-separated fields'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1 d1 1\n'), r'line 2 has 1 tab-separated fields'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\thigh\n'), r'line 2: the score \'high\' is not an integer'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq9\td1\t1\n'), r'line 2: query-id \'q9\' is not in queries.jsonl'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td9\t1\n'), r'line 2: corpus-id \'d9\' is not in corpus.jsonl'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n'), r'line 3: query \'q1\' judges document'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t0\n'), r'query \'q2\' has no relevant document'),
])
def test_bad_input_is_one_clear_error(tmp_path, files, message):
  with pytest.raises(DataError, match=message):
    beir.read_beir(_write(tmp_path, **files))


def test_missing_directory_and_files(tmp_path):
  with pytest.raises(DataError, match='BEIR directory .* does not exist'):
    beir.read_beir(str(tmp_path / 'nothing'))
  os.remove(os.path.join(_write(tmp_path), 'corpus.jsonl'))
  with pytest.raises(DataError, match=r'corpus file .*corpus.jsonl does not exist'):
    beir.read_beir(str(tmp_path))
