"""bert_jax.data.tables: CSV, TSV and JSONL rows by column name, compressed or not, and one DataError naming the
file and line for each kind of malformed file (Parquet: tests/finetuning/tasks/test_parquet.py)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os

import pytest

from bert_jax.data import tables
from bert_jax.errors import DataError

ROWS = [('A gripping, funny film.', 'positive'), ('Dull and far too long.', 'negative'),
        ('It was fine, I suppose.', 'neutral')]
COMPRESS = {'.gz': gzip.compress, '.bz2': bz2.compress, '.xz': lzma.compress}


def _write(tmp_path, name: str, text: str) -> str:
  path = tmp_path / name
  data = text.encode('utf-8')
  suffix = next((s for s in COMPRESS if name.endswith(s)), '')
  path.write_bytes(COMPRESS[suffix](data) if suffix else data)
  return str(path)


def _error(path: str) -> str:
  with pytest.raises(DataError) as e:
    tables.records(path)
  return str(e.value)


def _texts(fmt: str) -> str:
  return {'csv': 'text,label\n' + ''.join(f'"{t}",{l}\n' for t, l in ROWS),
          'tsv': 'label\ttext\n' + ''.join(f'{l}\t{t}\n' for t, l in ROWS),
          'jsonl': ''.join(json.dumps({'text': t, 'label': l}) + '\n' for t, l in ROWS)}[fmt]


def test_csv_tsv_and_jsonl_read_the_same_records(tmp_path):
  read = {fmt: tables.records(_write(tmp_path, f'train.{fmt}', _texts(fmt))) for fmt in ('csv', 'tsv', 'jsonl')}
  assert read['csv'][0] == ['text', 'label'] and read['tsv'][0] == ['label', 'text']
  for fmt, (_, records) in read.items():
    assert [(r['text'], r['label']) for _, r in records] == ROWS, fmt
  assert [line for line, _ in read['csv'][1]] == [2, 3, 4] and [line for line, _ in read['jsonl'][1]] == [1, 2, 3]


@pytest.mark.parametrize('suffix', sorted(COMPRESS))
@pytest.mark.parametrize('fmt', ['csv', 'tsv', 'jsonl'])
def test_a_compressed_file_reads_as_the_plain_one(tmp_path, fmt, suffix):
  plain = _write(tmp_path, f'train.{fmt}', _texts(fmt))
  compressed = _write(tmp_path, f'train.{fmt}{suffix}', _texts(fmt))
  assert tables.file_format(compressed) == fmt and tables.extension(compressed) == f'.{fmt}'
  assert tables.records(compressed) == tables.records(plain)
  assert tables.column_names(compressed) == tables.column_names(plain)


def test_errors_in_a_compressed_file_name_its_line(tmp_path):
  text = 'text,label\n' + ''.join(f'row {i},a\n' for i in range(3000)) + 'one,two,three\n'
  assert _error(_write(tmp_path, 'big.csv.gz', text)).endswith('big.csv.gz:3002: 3 field(s) but the header has 2 '
                                                               '(text, label)')
  jsonl = ''.join(json.dumps({'text': f'row {i}'}) + '\n' for i in range(2000)) + '{"text": \n'
  assert ':2001: not JSON' in _error(_write(tmp_path, 'big.jsonl.xz', jsonl))
  latin = tmp_path / 'latin.tsv.bz2'
  latin.write_bytes(bz2.compress('text\tlabel\nok\ta\nd\xe9j\xe0\tb\n'.encode('latin-1')))
  assert _error(str(latin)).startswith(f'{latin}:3:2: not UTF-8 text (byte 0xe9')
  cut = gzip.compress(text.encode())
  damaged = tmp_path / 'cut.csv.gz'
  damaged.write_bytes(cut[:len(cut) // 2])
  assert 'cut.csv.gz: corrupt gzip data' in _error(str(damaged))


def test_column_names_are_the_ones_records_reads_from_the_start_alone(tmp_path):
  """Blank lines first, a byte order mark, a quoted header cell with a newline, spaces around names: the same names
  as `records` gives; a bad row further down is not read."""
  texts = {'a.csv': '\ufeff\n \n"first\nname", label \nx,y\n', 'a.tsv': '\n first\tlabel \nx\ty\n',
           'a.jsonl': '\n{"first": "x", "label": "y"}\n'}
  for name, text in texts.items():
    path = _write(tmp_path, name, text)
    assert tables.column_names(path) == tables.records(path)[0], name
    with open(path, 'a', encoding='utf-8') as f:
      f.write('"never closed\n' if name != 'a.jsonl' else 'not json\n')
    assert tables.column_names(path) == (['first\nname', 'label'] if name == 'a.csv' else ['first', 'label']), name
    with pytest.raises(DataError):
      tables.records(path)
  assert tables.column_names(_write(tmp_path, 'blank.tsv', '\n \n')) == []
  with pytest.raises(DataError, match=r'bad\.csv:1: unreadable CSV'):
    tables.column_names(_write(tmp_path, 'bad.csv', '"never closed\n'))


@pytest.mark.parametrize('name,text,pattern', [
    ('empty.csv', '', 'empty.csv is empty'),
    ('header.csv', 'text,label\n\n', 'header.csv has a header but no data rows'),
    ('quote.csv', 'text,label\nfine,a\n"never closed,b\nmore,c\n', 'quote.csv:3: unreadable CSV'),
    ('fields.csv', 'text,label\na,b,c\n', 'fields.csv:2: 3 field(s) but the header has 2'),
    ('list.jsonl', '{"text": "a", "label": "x"}\n["b", "y"]\n', 'list.jsonl:2: a JSONL line must be an object'),
    ('broken.jsonl', '{"text": "a", "label": "x"}\n{"text": \n', 'broken.jsonl:2: not JSON'),
    ('data.txt', 'text,label\n', 'data.txt: unknown file type'),
    ('data.txt.gz', 'text,label\n', 'data.txt.gz: unknown file type'),
])
def test_bad_files_name_the_file_and_line(tmp_path, name, text, pattern):
  assert pattern in _error(_write(tmp_path, name, text))


def test_a_missing_file_and_what_it_is(tmp_path):
  assert _error(str(tmp_path / 'none.csv')) == f'{tmp_path}/none.csv does not exist'
  with pytest.raises(DataError, match=r'^queries file .*none.jsonl does not exist$'):
    tables.records(str(tmp_path / 'none.jsonl'), 'queries file')
  with pytest.raises(DataError, match=r'^queries file .*empty.jsonl is empty$'):
    tables.records(_write(tmp_path, 'empty.jsonl', '\n\n'), 'queries file')


def test_columns_and_values():
  names = ['question', 'context']
  assert tables.find_column('f.csv', names, 'text', 'text', ('question',)) == 'question'  # the default's fallback
  with pytest.raises(DataError, match=r"^f.csv:1: no column 'query'; the file has 'question', 'context' "
                                      r'\(set --config.x\)$'):
    tables.find_column('f.csv', names, 'query', 'text', ('question',), flags='--config.x')  # given: no fallback
  assert str(tables.missing_column('f.csv', 'a', [])) == "f.csv:1: no column 'a'; the file has none"
  assert tables.text_at('f.jsonl', 3, {'text': 'x'}, 'text') == 'x'
  with pytest.raises(DataError, match=r"^f.jsonl:3: no 'text' \(this line has 'txt'\)$"):
    tables.value_at('f.jsonl', 3, {'txt': 'x'}, 'text')
  with pytest.raises(DataError, match=r"^f.jsonl:3: 'text' must be a non-empty text, got 5$"):
    tables.text_at('f.jsonl', 3, {'text': 5}, 'text')
  lines = [(1, '{"a": 1}'), (2, ' '), (4, '{"b": 2}\r\n')]
  assert list(tables.json_objects('f.jsonl', lines)) == [(1, {'a': 1}), (4, {'b': 2})]


@pytest.mark.parametrize('fmt', ['csv', 'tsv', 'jsonl'])
def test_bytes_that_are_not_utf8_name_the_line_and_column(tmp_path, fmt):
  # Far past the decoder's first buffer (8 KB), whose own byte position counts from that buffer's start; after
  # two-byte characters on the line, so a byte count is no column; a byte order mark first, which is no text.
  row = {'csv': 'row {i},a\n', 'tsv': 'row {i}\ta\n', 'jsonl': '{{"text": "row {i}", "label": "a"}}\n'}[fmt]
  header = {'csv': 'text,label\n', 'tsv': 'text\tlabel\n', 'jsonl': ''}[fmt]
  lines = [row.format(i=i).encode() for i in range(3000)]
  before = {'csv': 'naïve façade ', 'tsv': 'naïve façade ', 'jsonl': '{"text": "naïve façade '}[fmt]
  lines[2500] = before.encode() + 'café'.encode('latin-1') + lines[2500][len(before.split('naïve')[0]):]
  path = tmp_path / f'big.{fmt}'
  path.write_bytes(b'\xef\xbb\xbf' + header.encode() + b''.join(lines))
  line = 2501 + bool(header)
  message = _error(str(path))
  assert message.startswith(f'{path}:{line}:{len(before) + 4}: not UTF-8 text (byte 0xe9: '), message
  assert 'position' not in message


def test_a_remote_file_reads_as_a_local_one(fake_bucket, tmp_path):
  """A gs:// file (a GCS emulator: conftest's fake_bucket), compressed or not, gives the local file's records; its
  errors name the remote path and line."""
  from bert_jax import files  # pylint: disable=g-import-not-at-top
  for name in ('train.csv', 'train.csv.gz', 'train.jsonl.bz2'):
    local = _write(tmp_path, name, _texts(name.split('.')[1]))
    remote = f'{fake_bucket}/own/{name}'
    with open(local, 'rb') as f, files.open(remote, 'wb', compression='') as out:  # the bytes as they are
      out.write(f.read())
    assert tables.records(remote) == tables.records(local), name
    assert tables.column_names(remote) == tables.column_names(local), name
    assert files.getsize(remote) == os.path.getsize(local) and files.getmtime(remote) > 0
  with files.open(f'{fake_bucket}/own/bad.tsv.gz', 'w', encoding='utf-8') as f:
    f.write('text\tlabel\ngood\tpos\nbad\n')
  assert _error(f'{fake_bucket}/own/bad.tsv.gz') == (f'{fake_bucket}/own/bad.tsv.gz:3: 1 field(s) but the header has '
                                                     '2 (text, label)')
  assert _error(f'{fake_bucket}/own/none.csv') == f'{fake_bucket}/own/none.csv does not exist'


def test_the_reader_stands_on_the_floor():
  """data/ is below runs/, finetuning/ and embedding/: the table reader imports bert_jax's I/O layer and errors only."""
  import ast  # pylint: disable=g-import-not-at-top
  with open(tables.__file__, encoding='utf-8') as f:
    tree = ast.parse(f.read())
  imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
      alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
  assert {name for name in imported if name.startswith('bert_jax')} == {'bert_jax', 'bert_jax.errors',
                                                                        'bert_jax.files'}
