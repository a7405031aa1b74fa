"""Pairs and triplets from files by column names; exact passage ids; the padded batch; one error per bad input."""

import gzip
import json

import numpy as np
import pytest

from bert_jax.embedding import pairs
from bert_jax.errors import DataError


class CharTokenizer:
  """[CLS]=1 + one id per character + [SEP]=2, cut at max_length; [PAD]=0."""

  pad_id = 0

  def encode_inputs(self, text, text_b, max_length):
    assert text_b is None
    ids = [1] + [3 + ord(c) % 50 for c in text][:max_length - 2] + [2]
    return ids, [0] * len(ids), len(text) > max_length - 2


def _write(path, text):
  path.write_text(text, encoding='utf-8')
  return str(path)


def test_tsv_triplets_and_jsonl_lists_of_negatives(tmp_path):
  tsv = _write(tmp_path / 'train.tsv', 'query\tpositive\tneg\nwho\tParis\tBerlin\nwhat\tBerlin\tRome\n')
  got = pairs.read_pairs(tsv, pairs.PairColumns(negatives=('neg',)))
  assert got == [pairs.Pair('who', 'Paris', ('Berlin',), 2), pairs.Pair('what', 'Berlin', ('Rome',), 3)]
  jsonl = _write(tmp_path / 'train.jsonl', '\n'.join(json.dumps(r) for r in [
      {'q': 'a', 'p': 'x', 'n': ['y', 'z']}, {'q': 'b', 'p': 'y', 'n': ['x', 'w']}]) + '\n')
  got = pairs.read_pairs(jsonl, pairs.PairColumns('q', 'p', ('n',)))
  assert [p.negatives for p in got] == [('y', 'z'), ('x', 'w')]
  positive_n, negative_nk = pairs.passage_ids(got)
  np.testing.assert_array_equal(positive_n, [0, 1])  # x, y
  np.testing.assert_array_equal(negative_nk, [[1, 2], [0, 3]])  # y is b's positive: the same id


def test_a_compressed_pairs_file_reads_as_the_plain_one(tmp_path):
  text = 'query\tpositive\tneg\nwho\tParis\tBerlin\nwhat\tBerlin\tRome\n'
  (tmp_path / 'train.tsv.gz').write_bytes(gzip.compress(text.encode()))
  columns = pairs.PairColumns(negatives=('neg',))
  assert pairs.read_pairs(str(tmp_path / 'train.tsv.gz'), columns) == pairs.read_pairs(
      _write(tmp_path / 'train.tsv', text), columns)
  (tmp_path / 'bad.tsv.gz').write_bytes(gzip.compress(text.replace('\tRome', '\t').encode()))
  with pytest.raises(DataError, match=r'bad\.tsv\.gz:3: \'neg\' must hold non-empty texts'):
    pairs.read_pairs(str(tmp_path / 'bad.tsv.gz'), columns)


def test_the_batch_pads_rows_and_sides(tmp_path):
  path = _write(tmp_path / 'train.csv', 'query,positive,neg\nab,cde,f\nabcd,e,ghi\nx,cde,y\n')
  rows = pairs.read_pairs(path, pairs.PairColumns(negatives=('neg',)))
  batch = pairs.make_batch(CharTokenizer(), rows, pairs.passage_ids(rows), [2, 0], max_query_length=8,
                           max_passage_length=4, batch_size=4)
  assert batch['query_input_ids'].shape == (4, 4)  # 'x', 'ab' with [CLS] and [SEP]: the longest is 4
  np.testing.assert_array_equal(batch['weights'], [1, 1, 0, 0])
  np.testing.assert_array_equal(batch['passage_ids'][:2], [0, 0])  # rows 2 and 0 share 'cde': a false negative
  assert np.all(batch['passage_ids'][2:] < 0)
  assert batch['negative_input_ids'].shape == (4, 1, 3)
  np.testing.assert_array_equal(batch['passage_attention_mask'][0], [1, 1, 1, 1])  # 'cde' cut to 4 tokens
  np.testing.assert_array_equal(batch['query_attention_mask'][:, 0], 1)  # padding rows keep one real position


@pytest.mark.parametrize('longest, limit, width', [
    (1, 128, 32), (16, 128, 32), (32, 128, 32), (33, 128, 64), (100, 128, 128), (129, 512, 192), (257, 512, 384),
    (500, 512, 512), (20, 8, 8), (200, 150, 150)])
def test_a_side_is_padded_to_its_bucket_not_to_its_limit(longest, limit, width):
  assert pairs.bucket_width(longest, limit) == width


def test_widths_over_any_lengths_are_few():
  # The train step compiles once per width: lengths 1..512 meet 8 widths.
  assert sorted({pairs.bucket_width(n, 512) for n in range(1, 513)}) == [32, 64, 96, 128, 192, 256, 384, 512]


@pytest.mark.parametrize('name, text, columns, message', [
    ('empty.tsv', '', pairs.PairColumns(), r'empty.tsv is empty'),
    ('header.tsv', 'query\tpositive\n', pairs.PairColumns(), r'has a header but no data rows'),
    ('headerless.tsv', 'who\tParis\nwhat\tBerlin\n', pairs.PairColumns(), r"no column 'query'.*a header line naming"),
    ('cols.tsv', 'question\tpositive\nwho\tParis\n', pairs.PairColumns(), r"no column 'query'; the file has "
     r"'question', 'positive'"),
    ('nopos.tsv', 'query\tpositive\nwho\t \n', pairs.PairColumns(), r'nopos.tsv:2: the query has no positive'),
    ('noquery.tsv', 'query\tpositive\n\tParis\n', pairs.PairColumns(), r"noquery.tsv:2: 'query' must be a non-empty"),
    ('ragged.jsonl', '{"query": "a", "positive": "b", "n": ["c"]}\n{"query": "d", "positive": "e", "n": []}\n',
     pairs.PairColumns(negatives=('n',)), r'ragged.jsonl:2: 0 hard negatives, but line 1 has 1'),
    ('badneg.jsonl', '{"query": "a", "positive": "b", "n": [3]}\n', pairs.PairColumns(negatives=('n',)),
     r"'n' must hold non-empty texts, got 3"),
    ('fields.tsv', 'query\tpositive\nwho\tParis\textra\n', pairs.PairColumns(), r'fields.tsv:2: 3 field'),
])
def test_bad_files_are_one_clear_error(tmp_path, name, text, columns, message):
  with pytest.raises(DataError, match=message):
    pairs.read_pairs(_write(tmp_path / name, text), columns)


def test_teacher_scores_from_a_list_or_columns_and_into_the_batch(tmp_path):
  # mine.py --scores's layout (one list), and scalar columns of a CSV (their text) concatenated in order
  jsonl = _write(tmp_path / 'mined.jsonl', ''.join(json.dumps(r) + '\n' for r in (
      {'query': 'ab', 'positive': 'cd', 'negatives': ['e', 'f'], 'scores': [0.9, 0.5, -0.25]},
      {'query': 'g', 'positive': 'h', 'negatives': ['i', 'j'], 'scores': [3, 2, 1]})))
  rows = pairs.read_pairs(jsonl, pairs.PairColumns(negatives=('negatives',), scores=('scores',)))
  assert [r.scores for r in rows] == [(0.9, 0.5, -0.25), (3.0, 2.0, 1.0)]
  csv = _write(tmp_path / 'scored.csv', 'query,positive,neg,pos_score,neg_score\nab,cd,e,1.5,-2\n')
  assert pairs.read_pairs(csv, pairs.PairColumns(negatives=('neg',), scores=('pos_score', 'neg_score')))[0].scores == (
      1.5, -2.0)
  batch = pairs.make_batch(CharTokenizer(), rows, pairs.passage_ids(rows), [1], max_query_length=8,
                           max_passage_length=4, batch_size=2)
  np.testing.assert_array_equal(batch['teacher_scores'], [[3, 2, 1], [0, 0, 0]])  # padding row: zeros, weight 0
  assert batch['teacher_scores'].dtype == np.float32
  plain = pairs.read_pairs(jsonl, pairs.PairColumns(negatives=('negatives',)))  # no score columns: no scores
  assert plain[0].scores == () and 'teacher_scores' not in pairs.make_batch(
      CharTokenizer(), plain, pairs.passage_ids(plain), [0], max_query_length=8, max_passage_length=4)


_SCORED = pairs.PairColumns(negatives=('negatives',), scores=('scores',))


@pytest.mark.parametrize('row, message', [
    ({'scores': [0.9, float('nan'), 0.1]}, r"scored.jsonl:2: a teacher score in 'scores' must be a finite number, "
     r'got nan'),
    ({'scores': [0.9, 0.1]}, r'scored.jsonl:2: 2 teacher scores for 1 positive and 2 negatives: a row needs 3'),
    ({'scores': [0.9, 0.5, 0.1, 0.0]}, r'4 teacher scores for 1 positive and 2 negatives'),
    ({'scores': None}, r"scored.jsonl:2: no teacher scores in 'scores'"),
    ({}, r"scored.jsonl:2: no teacher scores in 'scores'"),
    ({'scores': [0.9, 'high', 0.1]}, r"must be a finite number, got 'high'"),
    ({'scores': [0.9, True, 0.1]}, r'must be a finite number, got True'),
])
def test_bad_teacher_scores_are_one_clear_error(tmp_path, row, message):
  good = {'query': 'a', 'positive': 'b', 'negatives': ['c', 'd'], 'scores': [1.0, 0.5, 0.0]}
  bad = {'query': 'e', 'positive': 'f', 'negatives': ['g', 'h'], **row}
  text = json.dumps(good) + '\n' + json.dumps(bad) + '\n'  # json writes a NaN as NaN, which JSONL readers take
  with pytest.raises(DataError, match=message):
    pairs.read_pairs(_write(tmp_path / 'scored.jsonl', text), _SCORED)


def test_a_missing_file(tmp_path):
  with pytest.raises(DataError, match='does not exist'):
    pairs.read_pairs(str(tmp_path / 'none.tsv'))
