"""Work units of a corpus: byte-range pieces of files, cut at document boundaries, grouped into units.

Work is planned as byte-range `Piece`s of files, cut at document boundaries so each piece
parses on its own exactly as it would inside the whole file, and grouped into units of
about `unit_bytes` for parallel workers (`plan_units`). `find_boundary` finds those boundaries
in raw bytes (`readers` ends the chunks it parses at them too). This module imports no jax: it
runs in spawned worker processes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import BinaryIO, Sequence

from bert_jax.data import corpus_files, corpus_formats
from bert_jax.errors import ConfigError

# Document boundaries in raw bytes: the end of each match is the start of a line where a
# new document begins. Only ASCII whitespace counts as blank here; a boundary this misses
# (a line of non-breaking spaces) merely moves a cut further on, it never makes a wrong one.
_WS = rb'[ \t\r\f\v]'
_BOUNDARY_PATTERNS = {
    ('wikiextractor', False): re.compile(rb'\n(?=<doc )'),
    ('wikitext', False): re.compile(rb'\n(?= = [^=])'),
    ('jsonl', False): re.compile(rb'\n'),
    # A non-blank line after a blank one.
    ('plain', False): re.compile(rb'\n' + _WS + rb'*\n(?=' + _WS + rb'*[^\s])'),
    # A non-blank line after two blank ones, or after a form feed with only whitespace
    # between; or a line opening with a form feed and then text.
    ('plain', True): re.compile(rb'\n' + _WS + rb'*\n' + _WS + rb'*\n(?=' + _WS + rb'*[^\s])|'
                                rb'\f' + _WS + rb'*\n(?=' + _WS + rb'*[^\s])|'
                                rb'\n(?=[ \t\r\v]*\f' + _WS + rb'*[^\s])'),
}
# Header lines of these formats must be confirmed on the decoded line.
_BOUNDARY_LINE = {'wikiextractor': corpus_formats.DOC_START, 'wikitext': corpus_formats.WIKITEXT_ARTICLE}
# How far before a cut a boundary pattern may start, and the longest header line checked.
_LOOKBACK = 4096
_MAX_HEADER_LINE = 1 << 16
NO_CUT = 1 << 62  # unit_bytes that keeps every file whole


@dataclasses.dataclass(frozen=True)
class Piece:
  """A byte range of one corpus file that parses on its own.

  Attributes:
    path: the file.
    start: byte offset at a document boundary (or 0).
    end: byte offset (exclusive) at a document boundary or the file size; -1 reads to the
      end of the file. Compressed files cannot seek, so their one piece is the whole file:
      start 0, end -1.
    format: the file's resolved format (never 'auto').
    compression: '', 'gzip', 'bz2' or 'xz'.
  """
  path: str
  start: int
  end: int
  format: str
  compression: str


def plan_units(paths: Sequence[str], opts: corpus_formats.ReaderOptions,
               unit_bytes: int) -> list[list[Piece]]:
  """Cuts files into pieces at document boundaries and groups them into units of work.

  Each uncompressed file is cut near every multiple of unit_bytes, at the first document
  boundary at or after it (wikiextractor: a `<doc ` line; wikitext: an article header;
  jsonl: any line; plain: a line after a blank line, or with hard_wrapped after two blank
  lines or a form feed); past the last boundary the rest stays in one piece. Compressed
  files cannot seek and are one piece each. Pieces are then packed in order into units of
  at most unit_bytes (counting compressed files by their size on disk); a larger piece is
  a unit of its own. Small files share units, so that NSP finds random-next segments from
  other documents of the same unit.

  The plan depends only on the files' bytes, opts and unit_bytes. Empty files give no
  pieces.

  Args:
    paths: corpus files, e.g. from `corpus_files.resolve_files`.
    opts: reader options.
    unit_bytes: the target size of a unit of work.

  Returns:
    Units, each a non-empty list of pieces, in file and offset order.
  """
  if not isinstance(unit_bytes, int) or unit_bytes < 1:
    raise ConfigError(f'unit_bytes must be a positive integer, got {unit_bytes!r}')
  sized: list[tuple[Piece, int]] = []
  for path in paths:
    fmt, compression, empty = corpus_formats.sniff(path, opts)
    if empty:
      continue
    with corpus_files.open_raw(path) as f:
      size = corpus_files.size(f, path)
      if compression:
        sized.append((Piece(path, 0, -1, fmt, compression), size))
        continue
      bounds = [0] + _cuts(f, path, size, fmt, opts.hard_wrapped, unit_bytes) + [size]
    sized.extend((Piece(path, a, b, fmt, ''), b - a) for a, b in zip(bounds, bounds[1:]))
  units: list[list[Piece]] = []
  total = 0
  for piece, size in sized:
    if not units or total + size > unit_bytes:
      units.append([])
      total = 0
    units[-1].append(piece)
    total += size
  return units


def _cuts(f: BinaryIO, path: str, size: int, fmt: str, hard_wrapped: bool,
          unit_bytes: int) -> list[int]:
  """Document boundaries at or after each multiple of unit_bytes, without repeats."""
  cuts = []
  k = 1
  while k * unit_bytes < size:
    cut = _next_boundary(f, path, k * unit_bytes, size, fmt, hard_wrapped)
    if cut < 0:
      break  # none after this cut, so none after any later one
    cuts.append(cut)
    # Every nominal cut up to `cut` moves forward to this same boundary.
    k = cut // unit_bytes + 1
  return cuts


def _next_boundary(f: BinaryIO, path: str, pos: int, size: int, fmt: str,
                   hard_wrapped: bool) -> int:
  """The first document boundary at or after byte pos of an uncompressed file, or -1."""
  base = max(0, pos - _LOOKBACK)
  f.seek(base)
  buf = bytearray(corpus_files.read(f, pos - base + corpus_files.READ_BYTES, path, ''))
  lo = pos - base
  while True:
    final = base + len(buf) >= size
    found, resume = find_boundary(buf, lo, fmt, hard_wrapped, final)
    if found >= 0:
      return base + found
    if final:
      return -1
    # Keep only what a later match may still need, so a file without boundaries is
    # scanned in constant memory.
    drop = max(0, resume - _LOOKBACK)
    del buf[:drop]
    base += drop
    lo = resume - drop
    data = corpus_files.read(f, corpus_files.READ_BYTES, path, '')
    if not data:
      return -1
    buf += data


def find_boundary(buf: bytearray | bytes, lo: int, fmt: str, hard_wrapped: bool,
                  final: bool) -> tuple[int, int]:
  """Finds a document boundary at or after index lo of buf.

  Args:
    buf: raw bytes of a file; buf[0] need not start a line.
    lo: the least boundary wanted; bytes before it are looked at, not cut at.
    fmt: the file's format.
    hard_wrapped: the reader option.
    final: whether buf reaches the end of the data.

  Returns:
    (boundary, -1), or (-1, resume) when buf has none: search again from resume once
    more bytes are appended to buf.
  """
  rx = _BOUNDARY_PATTERNS[fmt, hard_wrapped and fmt == 'plain']
  header = _BOUNDARY_LINE.get(fmt)
  s = max(0, lo - _LOOKBACK)
  while (m := rx.search(buf, s)) is not None:
    p = m.end()
    s = max(m.start() + 1, p - 1)
    if p < lo:
      continue
    if p >= len(buf):
      break  # the line after it is not here yet
    if header is not None:
      end = buf.find(b'\n', p, p + _MAX_HEADER_LINE)
      if end < 0 and len(buf) - p < _MAX_HEADER_LINE:
        if not final:
          return -1, p  # the header line is not complete yet
        end = len(buf)
      if end < 0:
        continue  # far too long for a header
      line = bytes(buf[p:end])
      # The parsers split lines with str.splitlines, which also breaks at '\r', '\x85'….
      line = (line.decode('utf-8', errors='replace').splitlines() or [''])[0]
      if not header.match(line):
        continue
    return p, -1
  return -1, max(lo, len(buf) - _LOOKBACK)
