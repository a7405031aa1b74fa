"""BEIR's layout read back, and one clear error per bad input."""

import bz2
import gzip
import json
import lzma
import os
import shutil

import numpy as np
import pytest

from bert_jax import files
from bert_jax.embedding import beir, search
from bert_jax.embedding import ranking as metrics
from bert_jax.errors import DataError

from harness.entry_points import run_main

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
    (dict(corpus='{"_id": "d1", "text": "x"}\nnot json\n'), r'corpus.jsonl:2: not JSON'),  # data.tables' words
    (dict(corpus='["d1", "x"]\n'), r'corpus.jsonl:1: a JSONL line must be an object'),
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
    (dict(qrels='query-id\tcorpus-id\tscore\nq9\td1\t1\n'),
     r'none of its 1 judgements names both a query-id of queries.jsonl and a corpus-id of corpus.jsonl \(the first: '
     r'query-id \'q9\', line 2\): nothing to evaluate'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td9\t1\nq9\td1\t1\nq2\td8\t1\n'),
     r'none of its 3 judgements .*\(the first: query-id \'q9\', line 3\)'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n'), r'line 3: query \'q1\' judges document'),
    (dict(qrels='query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t0\n'), r'query \'q2\' has no relevant document'),
])
def test_bad_input_is_one_clear_error(tmp_path, files, message):
  with pytest.raises(DataError, match=message):
    beir.read_beir(_write(tmp_path, **files))


def test_judgements_of_ids_the_set_lacks_are_counted_and_scored_as_beirs_evaluator_does(tmp_path, capsys):
  # A query-id queries.jsonl lacks: skipped. A corpus-id corpus.jsonl lacks: a relevant document no ranking holds
  # (pytrec_eval's reading of ArguAna's qrels); one such id judged twice is one document.
  qrels = QRELS + 'q9\td1\t1\nq1\td9\t1\nq2\td9\t2\nq9\td9\t1\n'
  data = beir.read_beir(_write(tmp_path, qrels=qrels))
  assert data.query_ids == ['q1', 'q2'] and data.qrels == [{0: 2, 2: 0, -2: 1}, {1: 1, -2: 2}]
  assert data.absent == {'queries': 2, 'documents': 2}
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith('warning:')]
  assert warnings == [f'warning: {tmp_path}/qrels/test.tsv: of its judgements, 2 name a query-id that queries.jsonl '
                      "lacks (the first: query-id 'q9', line 5): skipped; 2 name a corpus-id that corpus.jsonl lacks "
                      "(the first: corpus-id 'd9', line 6): relevant documents no model can retrieve, as BEIR's "
                      'evaluator counts them']
  # Both queries rank every document of the corpus, their relevant one first: q1 found 1 of its 2 relevant
  # documents by rank 1 (trec_eval: recall 1/2; nDCG 2 / (2 + 1/log2(3))), q2 1 of 2 (nDCG 1 / (2 + 1/log2(3))).
  got = metrics.ranking_metrics(np.array([[0, 1, 2], [1, 0, 2]]), data.qrels, recall_at=(1, 3), cutoff=3)
  ideal = 2 + 1 / np.log2(3)
  assert got == pytest.approx({'recall@1': 0.5, 'recall@3': 0.5, 'mrr@3': 1.0, 'ndcg@3': (2 / ideal + 1 / ideal) / 2})
  # A top-4 over the 3 documents holds search.StreamingTopK's empty-slot id (-1) last: no absent document is found.
  slots = np.asarray(search.StreamingTopK(np.eye(2, 3, dtype=np.float32), k=4)._ids)  # pylint: disable=protected-access
  assert (slots == -1).all()
  padded = np.concatenate([[[0, 1, 2], [1, 0, 2]], slots[:, :1]], axis=1)
  assert metrics.ranking_metrics(padded, data.qrels, recall_at=(4,), cutoff=4)['recall@4'] == 0.5
  plain = beir.read_beir(_write(tmp_path / 'plain'))
  assert plain.absent == {'queries': 0, 'documents': 0} and 'warning' not in capsys.readouterr().out


def test_a_compressed_or_remote_set_reads_as_the_plain_one(tmp_path, fake_bucket):
  plain = beir.read_beir(_write(tmp_path / 'plain'))
  packed = tmp_path / 'packed'
  _write(packed)
  for name, compress in (('corpus.jsonl', gzip.compress), ('queries.jsonl', bz2.compress),
                         (os.path.join('qrels', 'test.tsv'), lzma.compress)):
    data = (packed / name).read_bytes()
    (packed / name).unlink()  # only the compressed copy is there: read_beir finds it
    suffix = {gzip.compress: '.gz', bz2.compress: '.bz2', lzma.compress: '.xz'}[compress]
    (packed / f'{name}{suffix}').write_bytes(compress(data))
  assert beir.read_beir(str(packed)) == plain
  for root, _, names in os.walk(packed):  # the same set in a bucket (a GCS emulator)
    for name in names:
      with open(os.path.join(root, name), 'rb') as f, files.open(
          f'{fake_bucket}/beir/{os.path.relpath(os.path.join(root, name), packed)}', 'wb', compression='') as out:
        out.write(f.read())
  assert beir.read_beir(f'{fake_bucket}/beir') == plain


def test_missing_directory_and_files(tmp_path):
  with pytest.raises(DataError, match='BEIR directory .* does not exist'):
    beir.read_beir(str(tmp_path / 'nothing'))
  os.remove(os.path.join(_write(tmp_path), 'corpus.jsonl'))
  with pytest.raises(DataError, match=r'corpus file .*corpus.jsonl does not exist'):
    beir.read_beir(str(tmp_path))


@pytest.mark.slow  # the shared retrieval run
def test_a_retrieval_evaluation_reports_the_judgements_of_absent_ids(retrieval_workdir, tmp_path):
  beir_dir = tmp_path / 'beir'
  shutil.copytree(os.path.join(os.path.dirname(retrieval_workdir), 'data', 'beir'), beir_dir)
  with open(beir_dir / 'qrels' / 'test.tsv', 'a', encoding='utf-8') as f:
    f.write('q9\td1\t1\nq0\tgone\t1\n')  # a query and a document that the set lacks
  out = tmp_path / 'results'
  r = run_main('evaluate.py', f'--workdir={retrieval_workdir}', f'--config.beir_dir={beir_dir}', f'--output_dir={out}')
  assert r.returncode == 0, r.stderr[-3000:]
  lines = (r.stdout + r.stderr).splitlines()
  assert len([l for l in lines if l.startswith('warning:') and 'lacks' in l]) == 1, r.stdout[-3000:]
  with open(out / 'eval_step2_beir.json', encoding='utf-8') as f:
    again = json.load(f)
  assert again['qrels_absent'] == {'queries': 1, 'documents': 1}
  # Every one of the 8 passages is in each top 10: q0 finds 1 of its 2 relevant documents, the others all of theirs.
  assert again['eval_recall_at_10'] == pytest.approx((0.5 + 1 + 1 + 1) / 4)
