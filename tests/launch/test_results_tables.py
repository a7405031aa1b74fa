"""Results tables: markdown (floats to 6 digits, '|' escaped) and CSV, both files written."""

import csv

from bert_jax.launch import results_tables as tables


def test_markdown_and_csv_of_the_same_rows(tmp_path):
  header, rows = ['name', 'value'], [['a|b', 1 / 3], ['c', 2]]
  md = tables.markdown(header, rows)
  assert md.splitlines() == ['| name | value |', '|---|---|', '| a\\|b | 0.333333 |', '| c | 2 |']
  csv_path, md_path = tables.write(str(tmp_path / 'out' / 'results'), md, tables.csv_text([header, *rows]))
  with open(csv_path, newline='') as f:
    assert list(csv.reader(f)) == [['name', 'value'], ['a|b', str(1 / 3)], ['c', '2']]
  with open(md_path) as f:
    assert f.read() == md
