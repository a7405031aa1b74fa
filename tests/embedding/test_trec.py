"""TREC run files read as a first stage's ranking of a BEIR set (top k by score, ties in file order) and written back;
one error line per bad input."""

import gzip

import numpy as np
import pytest

from bert_jax.embedding import beir, trec
from bert_jax.errors import DataError

DATA = beir.BeirSet(corpus_ids=['d0', 'd1', 'd2', 'd3'], titles=[''] * 4, texts=['a', 'b', 'c', 'd'],
                    query_ids=['q1', 'q2'], queries=['x', 'y'], qrels=[{0: 1}, {3: 1}],
                    unjudged_query_ids=frozenset({'q0'}))
RUN = """q1 Q0 d2 1 0.9 bm25
q1 Q0 d0 2 0.5 bm25
q0 Q0 d1 1 3.0 bm25
q1 Q0 d1 3 0.5 bm25

q2 0 d3 1 -1.5 bm25
q1 Q0 d3 4 0.95 bm25
"""


def _write(tmp_path, text, name='run.trec'):
  path = tmp_path / name
  if name.endswith('.gz'):
    with gzip.open(path, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    path.write_text(text, encoding='utf-8')
  return str(path)


def test_each_judged_query_gets_its_top_k_by_score_ties_in_file_order(tmp_path):
  ids = trec.read_run(_write(tmp_path, RUN), DATA, k=3)
  # q1: d3 (0.95), d2 (0.9), then d0 and d1 tie at 0.5: file order; q0 is another split's (skipped); q2 has one
  np.testing.assert_array_equal(ids, [[3, 2, 0], [3, trec.EMPTY, trec.EMPTY]])
  np.testing.assert_array_equal(trec.read_run(_write(tmp_path, RUN, 'run.trec.gz'), DATA, k=10),
                                [[3, 2, 0, 1], [3, -1, -1, -1]])  # compressed; k past the candidates: their count


def test_written_runs_read_back(tmp_path):
  ids, scores = np.array([[2, 0], [3, trec.EMPTY]]), np.array([[0.75, 0.25], [1.0, -np.inf]])
  trec.write_run(str(tmp_path / 'out.trec'), DATA, ids, scores, tag='mine')
  assert (tmp_path / 'out.trec').read_text(encoding='utf-8') == ('q1 Q0 d2 1 0.750000 mine\nq1 Q0 d0 2 0.250000 mine\n'
                                                                 'q2 Q0 d3 1 1.000000 mine\n')
  np.testing.assert_array_equal(trec.read_run(str(tmp_path / 'out.trec'), DATA, k=2), ids)
  trec.write_run(str(tmp_path / 'out.trec.gz'), DATA, ids, scores)
  np.testing.assert_array_equal(trec.read_run(str(tmp_path / 'out.trec.gz'), DATA, k=2), ids)


def test_a_judged_query_without_lines_retrieves_nothing_with_a_counted_warning(tmp_path):
  lines = []
  ids = trec.read_run(_write(tmp_path, 'q1 Q0 d0 1 1 t\n'), DATA, k=5, log=lines.append)
  np.testing.assert_array_equal(ids, [[0], [trec.EMPTY]])
  assert len(lines) == 1 and "1 of the 2 judged queries have no line ('q2')" in lines[0], lines


@pytest.mark.parametrize('text, message', [
    ('q1 Q0 d0 1 0.5\n', r'run.trec line 1: 5 whitespace-separated fields; a TREC run line is '
                         r"'qid Q0 docid rank score tag'"),
    ('q1 Q0 d0 1 0.5 t\nq1 Q0 d1 first 0.4 t\n', r"line 2: rank 'first' must be an integer and score '0.4' a finite"),
    ('q1 Q0 d0 1 nan t\n', r"line 1: rank '1' must be an integer and score 'nan' a finite number"),
    ('q1 Q0 d0 1 0.5 t\nq1 Q0 d0 2 0.4 t\n', r"line 2: query 'q1' ranks document 'd0' again \(line 1\)"),
    ('q1 Q0 d0 1 1 t\nq1 Q0 d9 2 1 t\nq7 Q0 d8 1 1 t\nq1 Q0 d9 3 1 t\n',
     r"run.trec: 1 query id that queries.jsonl lacks, on 1 line \('q7' line 3\); 2 document ids that corpus.jsonl "
     r"lacks, on 3 lines \('d9' line 2, 'd8' line 3\): is it a run of this BEIR set\?"),
    ('\n\n', r'run file .*run.trec is empty'),
    ('q0 Q0 d0 1 1 t\n', r"no line names a query that this split's qrels judge \(2 queries, e.g. 'q1'\)"),
])
def test_bad_run_files_are_one_error_each(tmp_path, text, message):
  with pytest.raises(DataError, match=message):
    trec.read_run(_write(tmp_path, text), DATA, k=3)


def test_many_unknown_ids_are_counted_and_the_first_few_named(tmp_path):
  text = ''.join(f'q1 Q0 x{i} {i} 1 t\n' for i in range(1, 6))
  with pytest.raises(DataError, match=r"5 document ids that corpus.jsonl lacks, on 5 lines \('x1' line 1, 'x2' line "
                                      r"2, 'x3' line 3, \.\.\.\)"):
    trec.read_run(_write(tmp_path, text), DATA, k=3)
  with pytest.raises(DataError, match=r'run file .*absent.trec does not exist'):
    trec.read_run(str(tmp_path / 'absent.trec'), DATA, k=3)
  (tmp_path / 'latin1.trec').write_bytes('q1 Q0 d0 1 1 caf\xe9\n'.encode('latin-1'))
  with pytest.raises(DataError, match=r'latin1.trec:1:17: not UTF-8'):
    trec.read_run(str(tmp_path / 'latin1.trec'), DATA, k=3)
