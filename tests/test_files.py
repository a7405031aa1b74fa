"""bert_jax.files: `open` of a compressed file (by its suffix) in every mode, and `read_json`'s one-line errors."""

import bz2
import gzip
import json
import lzma
import os

import pytest

from bert_jax import files
from bert_jax.errors import CheckpointError, ConfigError, DataError

COMPRESSED = {'.gz': gzip.decompress, '.bz2': bz2.decompress, '.xz': lzma.decompress}


@pytest.mark.parametrize('suffix', sorted(COMPRESSED))
def test_a_compressed_file_round_trips_in_text_and_bytes(tmp_path, suffix):
  path = str(tmp_path / f'rows.csv{suffix}')
  with files.open(path, 'w', encoding='utf-8') as f:
    f.write('text,label\r\ncafé,1\n')
  with files.open(path, 'a', encoding='utf-8') as f:  # a second compressed stream, which readers join
    f.write('thé,0\n')
  with open(path, 'rb') as f:
    raw = f.read()
  assert COMPRESSED[suffix](raw) == 'text,label\r\ncafé,1\nthé,0\n'.encode()  # what gzip -d, bzip2 -d, xz -d read
  with files.open(path, encoding='utf-8', newline='') as f:
    assert f.read() == 'text,label\r\ncafé,1\nthé,0\n'
  with files.open(path, encoding='utf-8') as f:  # universal newlines, as a plain file
    assert list(f) == ['text,label\n', 'café,1\n', 'thé,0\n']
  with files.open(path, 'rb') as f:
    assert f.read() == 'text,label\r\ncafé,1\nthé,0\n'.encode()
  with files.open(path, 'rb', compression='') as f:  # the bytes as stored
    assert f.read() == raw
  assert files.compression_of(path) == {'.gz': 'gzip', '.bz2': 'bz2', '.xz': 'xz'}[suffix]
  assert files.without_compression(path) == str(tmp_path / 'rows.csv')


def test_a_plain_file_is_opened_as_open_does(tmp_path):
  path = str(tmp_path / 'plain.txt')
  with files.open(path, 'w', encoding='utf-8') as f:
    f.write('a\n')
  with open(path, encoding='utf-8') as f:
    assert f.read() == 'a\n'
  assert files.compression_of(path) == '' and files.without_compression(path) == path
  with pytest.raises(FileNotFoundError):
    files.open(str(tmp_path / 'none.txt.gz'))


def test_damaged_compressed_data_is_one_error_naming_the_file(tmp_path):
  data = gzip.compress(b'one line\n' * 5000)
  cut = tmp_path / 'cut.txt.gz'
  cut.write_bytes(data[:len(data) // 2])
  with pytest.raises(DataError, match=r'cut\.txt\.gz: corrupt gzip data \(Compressed file ended'):
    with files.open(str(cut), encoding='utf-8') as f:
      f.read()
  renamed = tmp_path / 'plain.txt.xz'  # a name that says xz on a plain file
  renamed.write_text('not compressed\n')
  with pytest.raises(DataError, match=r'plain\.txt\.xz: corrupt xz data'):
    with files.open(str(renamed)) as f:
      f.read()
  with pytest.raises(ConfigError, match='unknown compression'):
    files.open(str(renamed), compression='zip')


def test_not_utf8_names_the_line_of_the_decompressed_text(tmp_path):
  path = tmp_path / 'latin1.tsv.gz'
  path.write_bytes(gzip.compress('a\tb\nd\xe9j\xe0\tc\n'.encode('latin-1')))
  assert str(files.not_utf8(str(path))).startswith(f'{path}:2:2: not UTF-8 text (byte 0xe9')


def test_read_json_gives_the_value_or_one_line(tmp_path):
  good = tmp_path / 'config.json.gz'
  good.write_bytes(gzip.compress(json.dumps({'a': 1}).encode()))
  assert files.read_json(str(good), 'config') == {'a': 1}
  listed = tmp_path / 'modules.json'
  listed.write_text('[{"type": "x"}]')
  assert files.read_json(str(listed), 'modules file', kind=list) == [{'type': 'x'}]
  assert files.read_json(str(listed), kind=object) == [{'type': 'x'}]
  with pytest.raises(DataError, match=r'^config .*modules.json holds a JSON list, not an object$'):
    files.read_json(str(listed), 'config')
  broken = tmp_path / 'broken.json'
  broken.write_text('{"a": ')
  with pytest.raises(CheckpointError, match=r'^checkpoint config .*broken.json is not valid JSON \(Expecting value'):
    files.read_json(str(broken), 'checkpoint config', error=CheckpointError)
  latin = tmp_path / 'latin.json'
  latin.write_bytes('{"a": "\xe9"}'.encode('latin-1'))
  with pytest.raises(DataError, match='latin.json is not valid JSON'):
    files.read_json(str(latin), 'tokenizer config')
  with pytest.raises(DataError, match=r'^config .*none.json does not exist$'):
    files.read_json(str(tmp_path / 'none.json'), 'config')
  with pytest.raises(ConfigError, match=r'^no such thing$'):
    files.read_json(str(tmp_path / 'none.json'), 'config', error=ConfigError, missing='no such thing')
  os.mkfifo(tmp_path / 'pipe.json')
  with pytest.raises(DataError, match='pipe.json is a FIFO'):  # refused before it could block
    files.read_json(str(tmp_path / 'pipe.json'), 'config')
