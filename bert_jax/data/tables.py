"""Tables: the rows of a CSV, TSV, JSONL or Parquet file by column name, each with its line.

The format comes from the file's extension (`FORMATS`), read past a compression suffix (`train.csv.gz`); the file
may be compressed (.gz, .bz2, .xz) and local or remote (gs://, s3://): `bert_jax.files.open` reads them all. CSV is
quoted as Excel writes it; TSV is split on tabs only (a quote is text); JSONL is one object per line
(`json_objects`, the one parser of JSONL files a user gives); Parquet needs the optional pyarrow
(`pip install bert_jax[parquet]`). Every bad row is one DataError naming the file and its line (Parquet: the row's
1-based index). What the rows mean (texts, labels, pairs) is the reader's that asks for them: the fine-tuning
tasks, retrieval pairs, BEIR, STS, predict.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from typing import Any, Iterable, Iterator, Sequence

from bert_jax import files
from bert_jax.errors import DataError
from bert_jax.files import check_regular, not_utf8

FORMATS = {'.csv': 'csv', '.tsv': 'tsv', '.tab': 'tsv', '.jsonl': 'jsonl', '.ndjson': 'jsonl', '.parquet': 'parquet'}


def extension(path: str) -> str:
  """The lower-case extension that names `path`'s format, past a compression suffix ('a.CSV.gz' -> '.csv')."""
  return os.path.splitext(files.without_compression(path))[1].lower()


def file_format(path: str) -> str:
  """'csv', 'tsv', 'jsonl' or 'parquet' from the file's extension; DataError for any other."""
  fmt = FORMATS.get(extension(path))
  if fmt is None:
    raise DataError(f'{path}: unknown file type; name it .csv, .tsv, .jsonl or .parquet (compressed: with .gz, '
                    '.bz2 or .xz after it)')
  return fmt


def records(path: str, what: str = '') -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
  """(the file's column names, [(line, {column: value})]) of a CSV, TSV, JSONL or Parquet file.

  Args:
    path: the file, local or remote, compressed or not.
    what: what the file is, for the messages ('' names the path alone).

  Raises:
    DataError: a missing, empty or malformed file (an unclosed quote, a JSONL line that is not an object), naming
      the file and the line.
  """
  name = f'{what} {path}' if what else path
  check_regular(path, what or 'data file')
  if not files.isfile(path):
    raise DataError(f'{name} does not exist')
  fmt = file_format(path)
  if fmt == 'parquet':
    return _parquet(path)
  try:
    with files.open(path, encoding='utf-8-sig', newline='') as f:
      columns, rows = _jsonl(path, f) if fmt == 'jsonl' else _delimited(path, f, fmt)
  except UnicodeDecodeError:
    raise not_utf8(path, what) from None
  if not rows:
    raise DataError(f'{name} is empty' if not columns else f'{name} has a header but no data rows')
  return columns, rows


def column_names(path: str) -> list[str]:
  """The column names `records` gives `path` (a CSV/TSV header, a JSONL file's first object's keys, a Parquet
  file's schema), reading only the start of the file; [] when it has no row.

  Raises:
    DataError: an unknown file type, text that is not UTF-8, a malformed first row, an unreadable Parquet file: as
      `records` says them.
  """
  fmt = file_format(path)
  if fmt == 'parquet':
    pq = _pyarrow_parquet(path)
    try:
      with _parquet_source(path) as source:
        return list(pq.read_schema(source).names)
    except DataError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (pyarrow's many error types: a damaged file)
      raise DataError(f'{path}: unreadable Parquet ({e})') from None
  try:
    with files.open(path, encoding='utf-8-sig', newline='') as f:
      first = next(json_objects(path, enumerate(f, 1)) if fmt == 'jsonl' else fields(path, f, fmt), None)
  except UnicodeDecodeError:
    raise not_utf8(path) from None
  if first is None:
    return []
  return list(first[1]) if fmt == 'jsonl' else [c.strip() for c in first[1]]


def fields(path: str, f, fmt: str) -> Iterator[tuple[int, list[str]]]:
  """(line, fields) of each non-blank row of a CSV (quoted, strict: an unclosed quote is an error) or TSV (tabs
  only) file open as `f` (newline=''), the line where the row starts."""
  reader = (csv.reader(f, strict=True) if fmt == 'csv' else
            csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
  start = 1
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise DataError(f'{path}:{start}: unreadable CSV ({e}): a quote opened on this line is never closed, or '
                      'text follows a closing quote') from None
    line, start = start, reader.line_num + 1
    if any(v.strip() for v in row):  # blank lines are skipped
      yield line, row


def _delimited(path: str, f, fmt: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
  """CSV or TSV (`fields`); the first row is the header."""
  header, rows = None, []
  for line, row in fields(path, f, fmt):
    if header is None:
      header = [c.strip() for c in row]
      continue
    if len(row) != len(header):
      raise DataError(f'{path}:{line}: {len(row)} field(s) but the header has {len(header)} '
                      f'({", ".join(header)})')
    rows.append((line, dict(zip(header, row))))
  return header or [], rows


def json_objects(path: str, lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, dict[str, Any]]]:
  """(line, object) of each non-blank line of a JSONL file, given as (line number, text): each must be a JSON
  object."""
  for line, text in lines:
    if not text.strip():
      continue
    try:
      obj = json.loads(text)
    except ValueError as e:
      raise DataError(f'{path}:{line}: not JSON ({e})') from None
    if not isinstance(obj, dict):
      raise DataError(f'{path}:{line}: a JSONL line must be an object ({{"column": value, ...}}), '
                      f'not {type(obj).__name__}')
    yield line, obj


def _jsonl(path: str, f) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
  """One JSON object per non-blank line (`json_objects`); the columns are the keys of the first."""
  rows = list(json_objects(path, enumerate(f, 1)))
  return (list(rows[0][1]) if rows else []), rows


def _pyarrow_parquet(path: str):
  """pyarrow.parquet, or a DataError naming the install for `path`."""
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise DataError(f'{path}: reading Parquet needs pyarrow, which is not installed: '
                    'pip install "bert_jax[parquet]" (or pyarrow), or give CSV/TSV/JSONL') from None
  return pq


@contextlib.contextmanager
def _parquet_source(path: str):
  """What pyarrow reads a Parquet file from: a local path as it is, a remote file open, a compressed one in memory
  (Parquet seeks to its footer first)."""
  if not files.is_remote(path) and not files.compression_of(path):
    yield path
    return
  with files.open(path, 'rb') as f:
    yield io.BytesIO(f.read()) if files.compression_of(path) else f


def _parquet(path: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
  pq = _pyarrow_parquet(path)
  try:
    with _parquet_source(path) as source:
      table = pq.read_table(source)
  except DataError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (pyarrow's many error types: a damaged file)
    raise DataError(f'{path}: unreadable Parquet ({e})') from None
  rows = [(i + 1, r) for i, r in enumerate(table.to_pylist())]
  if not rows:
    raise DataError(f'{path} is empty' if not table.column_names else f'{path} has columns but no rows')
  return list(table.column_names), rows


# ------------------------------------------------------------------------------------------ columns


def find_column(path: str, names: Sequence[str], wanted: str, default: str, fallbacks: Sequence[str] = (),
                flags: str = '') -> str:
  """`wanted` when the file has it; when `wanted` is its field's `default`, the first of `fallbacks` the file has
  (the names other datasets use); else a DataError naming the file's columns (and the `flags` that set them)."""
  if wanted and wanted in names:
    return wanted
  found = [c for c in fallbacks if c in names] if wanted == default else []
  if found:
    return found[0]
  raise missing_column(path, wanted or fallbacks[0], names, flags)


def missing_column(path: str, column: str, names: Sequence[str], flags: str = '') -> DataError:
  """The error for a file whose columns `names` lack `column` (`flags`: the options that name the columns)."""
  return DataError(f'{path}:1: no column {column!r}; the file has {", ".join(map(repr, names)) or "none"}' +
                   (f' (set {flags})' if flags else ''))


def value_at(path: str, line: int, record: dict[str, Any], column: str) -> Any:
  """The row's value in `column`; DataError when the row has none (a JSONL line with other keys)."""
  if column not in record:
    raise DataError(f'{path}:{line}: no {column!r} (this line has {", ".join(map(repr, record)) or "no keys"})')
  return record[column]


def text_at(path: str, line: int, record: dict[str, Any], column: str) -> str:
  """The row's non-empty text in `column`; DataError naming the file and line otherwise."""
  value = value_at(path, line, record, column)
  if not isinstance(value, str) or not value.strip():
    raise DataError(f'{path}:{line}: {column!r} must be a non-empty text, got {value!r}')
  return value
