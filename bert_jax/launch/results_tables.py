"""Results tables of several runs (a sweep's, a ladder's): markdown and CSV text, written atomically; no jax."""

from __future__ import annotations

import csv
import io
from typing import Any, Sequence

from bert_jax import files


def markdown(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table (floats to 6 significant digits, a '|' in a value escaped)."""
  def line(row):
    return '| ' + ' | '.join((f'{v:.6g}' if isinstance(v, float) else str(v)).replace('|', '\\|') for v in row) + ' |'
  return '\n'.join([line(header), '|' + '|'.join('---' for _ in header) + '|', *map(line, rows)]) + '\n'


def csv_text(rows: Sequence[Sequence[Any]]) -> str:
  """CSV text of `rows` (the header first)."""
  buffer = io.StringIO(newline='')
  csv.writer(buffer).writerows(rows)
  return buffer.getvalue()


def write(base: str, markdown_text: str, text: str) -> tuple[str, str]:
  """Writes BASE.csv (`text`) and BASE.md (`markdown_text`), each atomically; returns their paths, (csv, md)."""
  files.write_text_atomic(base + '.csv', text)
  files.write_text_atomic(base + '.md', markdown_text)
  return base + '.csv', base + '.md'
