"""bert_jax.embedding.sts: Spearman's correlation of cosine with gold scores (against scipy's definition by hand),
scored pairs by columns, and bad files as one DataError naming the file and line."""

import json
import lzma

import numpy as np
import pytest

from bert_jax.embedding import sts
from bert_jax.errors import DataError


def _write(tmp_path, rows, name='sts.jsonl'):
  path = tmp_path / name
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  return str(path)


VECTORS = {'a': [1.0, 0.0], 'b': [0.0, 1.0], 'c': [1.0, 1.0], 'd': [1.0, 0.2], 'e': [-1.0, 0.1]}


def _embed(texts):
  return np.array([VECTORS[t] for t in texts])


def test_spearman_of_cosine_against_the_gold_scores(tmp_path):
  rows = [{'sentence1': 'a', 'sentence2': x, 'score': s} for x, s in (('d', 4.0), ('c', 3.0), ('b', 1.0), ('e', 0.5))]
  data = sts.read_scored_pairs(_write(tmp_path, rows))
  assert (data.first, data.second, data.scores) == (['a'] * 4, ['d', 'c', 'b', 'e'], [4.0, 3.0, 1.0, 0.5])
  # cos(a, .) = 0.98, 0.71, 0, -0.995: the same order as the scores -> 1; reversed gold -> -1
  assert sts.sts_spearman(data, _embed) == pytest.approx(1.0)
  reversed_gold = sts.ScoredPairs(data.first, data.second, data.scores[::-1])
  assert sts.sts_spearman(reversed_gold, _embed) == pytest.approx(-1.0)
  # ties share their mean rank (scipy's 'average'): ranks of cos 4, 3, 1.5, 1.5 against 1, 2, 3, 4
  tied = sts.ScoredPairs(['a', 'a', 'a', 'a'], ['d', 'c', 'b', 'b'], [1.0, 2.0, 3.0, 4.0])
  ranks_x, ranks_y = np.array([4, 3, 1.5, 1.5]), np.array([1, 2, 3, 4])
  assert sts.sts_spearman(tied, _embed) == pytest.approx(np.corrcoef(ranks_x, ranks_y)[0, 1])


def test_columns_by_name_in_a_csv(tmp_path):
  path = tmp_path / 'pairs.csv'
  path.write_text('left,right,gold\na,b,1\nc,d,2.5\n', encoding='utf-8')
  data = sts.read_scored_pairs(str(path), ('left', 'right', 'gold'))
  assert data.scores == [1.0, 2.5] and data.second == ['b', 'd']
  packed = tmp_path / 'pairs.csv.xz'  # compressed: read as the plain file
  packed.write_bytes(lzma.compress(path.read_bytes()))
  assert sts.read_scored_pairs(str(packed), ('left', 'right', 'gold')) == data


@pytest.mark.parametrize('rows,pattern', [
    ([{'sentence1': 'a', 'sentence2': 'b'}], r"no column 'score'; the file has 'sentence1', 'sentence2'"),
    ([{'sentence1': 'a', 'sentence2': 'b', 'score': 1}, {'sentence1': 'a', 'sentence2': 'b', 'score': 'high'}],
     r"sts\.jsonl:2: score 'high' is not a finite number"),
    ([{'sentence1': 'a', 'sentence2': ' ', 'score': 1}], r"sts\.jsonl:1: 'sentence2' must be a non-empty text"),
    ([{'sentence1': 'a', 'sentence2': 'b', 'score': 1}, {'sentence1': 'c', 'sentence2': 'd', 'score': 1}],
     'at least two pairs with different scores'),
])
def test_bad_files_are_one_error_naming_the_file_and_line(tmp_path, rows, pattern):
  with pytest.raises(DataError, match=pattern):
    sts.read_scored_pairs(_write(tmp_path, rows))
