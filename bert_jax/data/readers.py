"""Raw pretraining corpora → documents as lists of sentences, streamed piece by piece.

Formats, detected per file from its first MiB ('auto') or named in `ReaderOptions.format`:

* wikiextractor: `<doc id=.. url=.. title=..>` … `</doc>`, one paragraph per line; the
  repeated title, section headings and leftover markup tags are dropped.
* wikitext: articles start at ` = Title = ` lines; headings are dropped and the
  ` @-@ `-style escapes undone.
* jsonl: one JSON object per line; the document is the string in its `text_field`, whose
  lines are paragraphs.
* plain: documents are separated by blank lines and every line is a paragraph.

With `hard_wrapped` (plain and jsonl), text is wrapped at a fixed width as in books and man
pages: a paragraph is the lines up to a blank line, joined with spaces, and in plain files
documents are separated by two or more blank lines or a form feed.

Files may be gzip, bzip2 or xz compressed, recognised by their magic bytes rather than
their names. Invalid UTF-8 is replaced with U+FFFD and counted rather than fatal.

Work is planned as byte-range `Piece`s of files, cut at document boundaries so each piece
parses on its own exactly as it would inside the whole file, and grouped into units of
about `unit_bytes` for parallel workers (`plan_units`). `read_documents` streams a unit's
documents holding a few MiB of text at a time. This module imports no jax: it runs in
spawned worker processes.

Sentence splitting is a regex heuristic rather than nltk's punkt, which needs a
model download the training machines cannot make.
"""

from __future__ import annotations

import bz2
import dataclasses
import glob
import gzip
import io
import json
import lzma
import re
from typing import BinaryIO, Callable, Iterator, Sequence
import zlib

from etils import epath

from bert_jax.errors import ConfigError, DataError
from bert_jax.files import check_regular, check_remote

FORMATS = ('auto', 'wikiextractor', 'wikitext', 'plain', 'jsonl')
# The first byte that is neither ASCII whitespace nor part of a UTF-8 byte order mark.
_NON_BLANK = re.compile(rb'[^\s\xef\xbb\xbf]')
_COMPRESSIONS = ('gzip', 'bz2', 'xz')
_MAGIC = ((b'\x1f\x8b', 'gzip'), (b'BZh', 'bz2'), (b'\xfd7zXZ\x00', 'xz'))

_WIKITEXT_ARTICLE = re.compile(r'^ = [^=].* = $')
# _WIKITEXT_ARTICLE on any line of a text ('\r' is a line break to str.splitlines).
_WIKITEXT_ARTICLE_IN = re.compile(r'^ = [^=\n\r][^\n\r]* = \r?$', re.MULTILINE)
_WIKITEXT_HEADING = re.compile(r'^ (= )+[^=].*( =)+ $')
# WikiText writes intra-word '-', ',' and '.' as ' @-@ ' etc.
_WIKITEXT_ESCAPE = re.compile(r' @([-,.])@ ')
_DOC_START = re.compile(r'^<doc [^>]*>')
_TAG = re.compile(r'</?[a-zA-Z][^>]*>')
# WikiExtractor renders a section heading as a short line ending in '.': 'Early life.'
_WIKIEXTRACTOR_HEADING = re.compile(r'^[^.!?:;,]{1,60}\.$')
_BLANK_LINES = re.compile(r'\n\s*\n')
# Hard-wrapped text: one blank line ends a paragraph, two or more end a document.
_PARAGRAPH_BREAK = re.compile(r'\n(?:[^\S\n]*\n)+')
_DOCUMENT_BREAK = re.compile(r'\n(?:[^\S\n]*\n){2,}')

# A candidate sentence end: terminal punctuation, closing quotes/brackets glued to it,
# whitespace, then (looked ahead) an optional opening quote/bracket and a capital or digit.
_BOUNDARY = re.compile(r'[.!?]+["\'”’)\]]*(\s+)(?=["\'“‘(\[]?\s?[A-Z0-9])')
# _BOUNDARY in `_clean`ed paragraphs joined by '\n': their only whitespace within is ' ', and
# no match crosses into the next paragraph.
_BOUNDARY_CLEAN = re.compile(r'[.!?]+["\'”’)\]]*( +)(?=["\'“‘(\[]? ?[A-Z0-9])')
_CLOSERS = '"\'”’)]'
_ABBREVIATIONS = frozenset("""
    mr mrs ms dr st jr sr prof rev hon gen col lt sgt capt cmdr adm gov sen rep pres
    vs etc e.g i.e cf al ca approx inc ltd co corp bros dept univ mt ft est
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# These abbreviate only before a number ('No. 5'); 'no.' at the end of a sentence is a word.
_NUMBER_ABBREVIATIONS = frozenset('no nos vol vols pp p fig figs op ch art'.split())
# Files a directory spec skips: the bundled corpus folder carries its README.
_NOT_CORPUS = re.compile(r'^\.|^(README|LICENSE|LICENCE|SHA256SUMS)|\.md$', re.IGNORECASE)
_INITIALS = re.compile(r'^(?:[A-Za-z]\.)+[A-Za-z]$|^[A-Z]$')

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
_BOUNDARY_LINE = {'wikiextractor': _DOC_START, 'wikitext': _WIKITEXT_ARTICLE}
# How far before a cut a boundary pattern may start, and the longest header line checked.
_LOOKBACK = 4096
_MAX_HEADER_LINE = 1 << 16
_HEAD_BYTES = 1 << 20      # what format detection looks at
_READ_BYTES = 1 << 20      # one read
_CHUNK_BYTES = 4 << 20     # text parsed at once: what a worker holds, bar one long document
_NO_CUT = 1 << 62          # unit_bytes that keeps every file whole


@dataclasses.dataclass(frozen=True)
class ReaderOptions:
  """How to read corpus files.

  Attributes:
    format: one of FORMATS; 'auto' detects each file's format from its head.
    text_field: jsonl: the field holding a document's text.
    hard_wrapped: plain and jsonl text: a paragraph is the lines up to a blank line (joined
      with spaces), not one line; in plain files documents are then separated by two or
      more blank lines (or a form feed), not one.
  """
  format: str = 'auto'
  text_field: str = 'text'
  hard_wrapped: bool = False

  def __post_init__(self):
    if self.format not in FORMATS:
      raise ConfigError(f'unknown corpus format {self.format!r}; expected one of '
                        f'{", ".join(FORMATS)}')
    if not isinstance(self.text_field, str) or not self.text_field:
      raise ConfigError(f'the jsonl text field must be a non-empty string, got '
                        f'{self.text_field!r}')


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


def resolve_files(spec: str) -> list[str]:
  """Expands a comma-separated list of files, globs and directories.

  Local paths and anything etils.epath opens (gs://…) are accepted.

  Args:
    spec: e.g. 'data/wikitext-2-raw' or 'a.txt,corpus/*.txt'. Directories expand to every
      regular file below them (recursively, sorted), except hidden files and notes
      that ship beside data (README*, LICENSE*, *.md, SHA256SUMS).

  Returns:
    The files in spec order, each listed once.
  """
  files: list[str] = []
  for part in (p.strip() for p in spec.split(',')):
    if not part:
      continue
    where = '' if part == spec.strip() else f' (from {spec!r})'
    check_remote(part, 'corpus path')
    try:
      path = epath.Path(part)
      if path.is_dir():
        found = _walk(path)
      elif any(c in part for c in '*?['):
        found = _glob(part)
      elif path.is_file():
        found = [part]
      else:
        raise DataError(f'corpus file {part!r}{where} does not exist; check the path or the '
                        'current directory')
    except ImportError as e:  # epath's backend for gs:// etc. is an optional install
      raise DataError(f'cannot list {part!r}{where}: {_one_line(e)}') from None
    if not found:
      raise DataError(f'{part!r}{where} matches no files')
    for f in found:  # a FIFO or device would block the first read forever
      check_regular(f, 'corpus file' if f == part else f'corpus file (from {part!r})')
    files.extend(found)
  if not files:
    raise DataError(f'corpus spec {spec!r} names no files')
  return list(dict.fromkeys(files))


def _walk(root: epath.Path) -> list[str]:
  out = []
  for dirpath, dirnames, filenames in root.walk():
    dirnames[:] = [d for d in dirnames if not d.startswith('.')]
    out.extend(dirpath / f for f in filenames if not _NOT_CORPUS.search(f))
  return sorted(str(p) for p in out if p.exists() and not p.is_dir())  # FIFOs too: refused by the caller


def _glob(pattern: str) -> list[str]:
  if '://' not in pattern:
    # epath refuses '**' (a recursive listing costs thousands of requests on GCS); local
    # files keep it.
    found = glob.glob(pattern, recursive=True)
  else:
    # epath globs below a literal directory: split at the first component with a wildcard.
    parts = pattern.split('/')
    first = next(i for i, p in enumerate(parts) if any(c in p for c in '*?['))
    root = epath.Path('/'.join(parts[:first]))
    found = [str(p) for p in root.glob('/'.join(parts[first:]))]
  return sorted(p for p in found if epath.Path(p).exists() and not epath.Path(p).is_dir())


def detect_format(path: str, opts: ReaderOptions) -> tuple[str, str]:
  """Finds a file's format and compression.

  Args:
    path: a corpus file.
    opts: reader options; an explicit format is returned as given.

  Returns:
    (format, compression): format is never 'auto'; compression is '', 'gzip', 'bz2' or
    'xz', from the file's magic bytes.
  """
  fmt, compression, _ = _sniff(path, opts)
  return fmt, compression


def _sniff(path: str, opts: ReaderOptions) -> tuple[str, str, bool]:
  """detect_format, plus whether the (decompressed) file is empty."""
  with _open_raw(path) as raw:
    compression = _compression(path, raw)
    with _decompressed(path, raw, compression) as f:
      # An explicit format needs the head only to tell an empty file.
      head = _read(f, _HEAD_BYTES if opts.format == 'auto' else 1, path, compression)
      text = _NON_BLANK.search(head)
      if (opts.format == 'auto' and text and head.startswith(b'{', text.start())
          and b'\n' not in head[text.start():]):
        # The first line is a JSON object that runs past the head: read the rest of it.
        while chunk := _read(f, _READ_BYTES, path, compression):
          head += chunk
          if b'\n' in chunk:
            break
  if opts.format != 'auto':
    return opts.format, compression, not head
  return _guess_format(head), compression, not head


def _guess_format(head: bytes) -> str:
  text = _NON_BLANK.search(head)
  if text is None:
    return 'plain'
  # The first non-empty line (a byte order mark is no text).
  start = head.rfind(b'\n', 0, text.start()) + 1
  end = head.find(b'\n', start)
  first = head[start:end if end >= 0 else len(head)].decode('utf-8', errors='replace')
  first = first.removeprefix('\ufeff')
  if first.startswith('<doc '):
    return 'wikiextractor'
  if first.lstrip().startswith('{'):
    try:
      if isinstance(json.loads(first), dict):
        return 'jsonl'
    except ValueError:
      pass
  # One regex pass over the head rather than a match per line: this runs on every file.
  if _WIKITEXT_ARTICLE_IN.search(head.decode('utf-8', errors='replace')):
    return 'wikitext'
  return 'plain'


def plan_units(paths: Sequence[str], opts: ReaderOptions,
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
    paths: corpus files, e.g. from `resolve_files`.
    opts: reader options.
    unit_bytes: the target size of a unit of work.

  Returns:
    Units, each a non-empty list of pieces, in file and offset order.
  """
  if not isinstance(unit_bytes, int) or unit_bytes < 1:
    raise ConfigError(f'unit_bytes must be a positive integer, got {unit_bytes!r}')
  sized: list[tuple[Piece, int]] = []
  for path in paths:
    fmt, compression, empty = _sniff(path, opts)
    if empty:
      continue
    with _open_raw(path) as f:
      size = _size(f, path)
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
  buf = bytearray(_read(f, pos - base + _READ_BYTES, path, ''))
  lo = pos - base
  while True:
    final = base + len(buf) >= size
    found, resume = _find_boundary(buf, lo, fmt, hard_wrapped, final)
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
    data = _read(f, _READ_BYTES, path, '')
    if not data:
      return -1
    buf += data


def _find_boundary(buf: bytearray | bytes, lo: int, fmt: str, hard_wrapped: bool,
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


def read_documents(pieces: Sequence[Piece], opts: ReaderOptions,
                   stats: dict | None = None) -> Iterator[list[str]]:
  """Streams the documents of pieces, in order.

  A few MiB of text are parsed at a time (cut at document boundaries), so memory does not
  grow with the size of a piece or file, only with the longest document.

  Args:
    pieces: e.g. one unit from `plan_units`.
    opts: reader options (text_field and hard_wrapped; each piece carries its format).
    stats: if given, updated in place: files (pieces starting at byte 0, so that sums
      over units count each file once), bytes (read; decompressed for compressed files),
      documents, sentences, invalid_utf8 (replaced byte sequences) and formats (pieces
      per format).

  Yields:
    Documents: non-empty lists of sentences.
  """
  if stats is None:
    stats = {}
  for key in ('files', 'bytes', 'documents', 'sentences', 'invalid_utf8'):
    stats.setdefault(key, 0)
  stats.setdefault('formats', {})
  for piece in pieces:
    fmt = piece.format
    if fmt == 'auto':
      fmt = detect_format(piece.path, opts)[0]
    if fmt not in FORMATS:
      raise ConfigError(f'{piece.path}: unknown corpus format {fmt!r}; expected one of '
                        f'{", ".join(FORMATS)}')
    stats['files'] += piece.start == 0
    stats['formats'][fmt] = stats['formats'].get(fmt, 0) + 1
    replaced = 0
    lines_before = 0  # in this piece, for jsonl error messages
    for i, chunk in enumerate(_chunks(piece, fmt, opts.hard_wrapped)):
      stats['bytes'] += len(chunk)
      try:
        text = chunk.decode('utf-8')
      except UnicodeDecodeError:
        # Decision: a few bad bytes should not stop a long job; they become U+FFFD.
        text = chunk.decode('utf-8', errors='replace')
        # U+FFFD already present in the file is text, not damage.
        replaced += text.count('\ufffd') - chunk.count('\ufffd'.encode())
      if i == 0 and piece.start == 0 and text.startswith('\ufeff'):
        text = text[1:]  # a byte order mark, not text
      if fmt == 'jsonl':
        raw_docs = _jsonl_docs(text, opts, _jsonl_where(piece, lines_before))
        lines_before += chunk.count(b'\n')
      elif fmt == 'plain':
        raw_docs = _plain_docs(text, opts.hard_wrapped)
      else:
        raw_docs = (_wikiextractor_docs if fmt == 'wikiextractor' else _wikitext_docs)(text)
      for paragraphs in raw_docs:
        doc = _document_sentences(paragraphs)
        if doc:
          stats['documents'] += 1
          stats['sentences'] += len(doc)
          yield doc
    if replaced:  # reported once for the corpus, by the preparation (this may run in a worker process)
      stats['invalid_utf8'] += replaced
      stats.setdefault('invalid_utf8_first', piece.path)


def read_all(paths: Sequence[str], opts: ReaderOptions = ReaderOptions(),
             stats: dict | None = None) -> list[list[str]]:
  """Reads whole files into documents: for tests and small corpora.

  Args:
    paths: corpus files, e.g. from `resolve_files`.
    opts: reader options.
    stats: if given, updated in place as by `read_documents`.

  Returns:
    The documents, non-empty lists of sentences.
  """
  pieces = [p for unit in plan_units(paths, opts, _NO_CUT) for p in unit]
  documents = list(read_documents(pieces, opts, stats))
  if not documents:
    raise DataError(f'corpus {", ".join(paths) or "(no files)"} has no text')
  return documents


def _chunks(piece: Piece, fmt: str, hard_wrapped: bool) -> Iterator[bytes]:
  """A piece's bytes in chunks of a few MiB that end at document boundaries."""
  with _open_raw(piece.path) as raw:
    with _decompressed(piece.path, raw, piece.compression) as f:
      left = -1
      if not piece.compression:
        f.seek(piece.start)
        left = piece.end - piece.start
      buf = bytearray()
      lo = _CHUNK_BYTES - _READ_BYTES
      while True:
        want = _READ_BYTES if left < 0 else min(_READ_BYTES, left)
        data = _read(f, want, piece.path, piece.compression) if want else b''
        if not data:
          if buf:
            yield bytes(buf)
          return
        left -= len(data) if left >= 0 else 0
        buf += data
        if len(buf) < _CHUNK_BYTES:
          continue
        found, lo = _find_boundary(buf, lo, fmt, hard_wrapped, final=False)
        if found >= 0:
          yield bytes(buf[:found])
          del buf[:found]
          lo = _CHUNK_BYTES - _READ_BYTES


def _jsonl_where(piece: Piece, lines_before: int) -> Callable[[int], str]:
  """Names line i (0-based) of a chunk: the file and its 1-based line number."""
  def where(i: int) -> str:
    # Counting the lines before the piece costs a read of them: only done for a message.
    return f'{piece.path} line {_lines_before(piece) + lines_before + i + 1}'
  return where


def _lines_before(piece: Piece) -> int:
  if piece.compression or piece.start <= 0:
    return 0
  count, left = 0, piece.start
  with _open_raw(piece.path) as f:
    while left > 0 and (data := _read(f, min(left, _READ_BYTES), piece.path, '')):
      count += data.count(b'\n')
      left -= len(data)
  return count


def _open_raw(path: str) -> BinaryIO:
  try:
    return epath.Path(path).open('rb')
  except OSError as e:
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None
  except ImportError as e:  # no epath backend installed for this kind of path
    raise DataError(f'cannot read corpus file {path}: {_one_line(e)}') from None


def _compression(path: str, raw: BinaryIO) -> str:
  magic = _read(raw, 6, path, '')
  raw.seek(0)
  return next((name for prefix, name in _MAGIC if magic.startswith(prefix)), '')


def _decompressed(path: str, raw: BinaryIO, compression: str) -> BinaryIO:
  if not compression:
    return raw
  opener = {'gzip': lambda: gzip.GzipFile(fileobj=raw, mode='rb'),
            'bz2': lambda: bz2.BZ2File(raw, mode='rb'),
            'xz': lambda: lzma.LZMAFile(raw, mode='rb')}
  if compression not in opener:
    raise ConfigError(f'{path}: unknown compression {compression!r}; expected one of '
                      f'{", ".join(_COMPRESSIONS)}')
  return opener[compression]()


def _read(f: BinaryIO, n: int, path: str, compression: str) -> bytes:
  """f.read(n), with damaged data and I/O failures as DataErrors naming the file."""
  try:
    return f.read(n)
  except (EOFError, zlib.error, lzma.LZMAError) as e:
    raise DataError(f'{path}: corrupt {compression or "compressed"} data ({_one_line(e)})'
                    ) from None
  except OSError as e:
    if compression:  # gzip and bz2 report bad data as OSError
      raise DataError(f'{path}: corrupt {compression} data ({_one_line(e)})') from None
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None


def _size(f: BinaryIO, path: str) -> int:
  try:
    return f.seek(0, io.SEEK_END)
  except OSError as e:
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split()) or type(e).__name__


def split_sentences(text: str) -> list[str]:
  """Splits a paragraph into sentences with a regex heuristic.

  Splits after '.', '!' or '?' (plus closing quotes/brackets) when whitespace and a
  capital letter, digit or opening quote follow, except after abbreviations ('Mr.',
  'e.g.', 'U.S.', 'No. 5') and single initials ('H. americanus'). Works on normal
  text and on WikiText's space-tokenised text ('word . Next').

  Args:
    text: one paragraph.

  Returns:
    Non-empty, whitespace-stripped sentences.
  """
  sentences = []
  start = 0
  for m in _BOUNDARY.finditer(text):
    if not _is_sentence_end(text, m):
      continue
    end = m.start(1)
    # Space-tokenised text puts a closing quote after the space ('. " Next'); it
    # belongs to this sentence when the sentence has an unmatched '"'.
    sentence = text[start:end]
    cut = m.end(1)
    if text.startswith('" ', cut) and sentence.count('"') % 2 == 1:
      sentence += ' "'
      cut += 2
    sentences.append(sentence.strip())
    start = cut
  sentences.append(text[start:].strip())
  return [s for s in sentences if s]


def _document_sentences(paragraphs: list[str]) -> list[str]:
  """`split_sentences` of every paragraph, in order, for `_clean`ed (non-empty) paragraphs.

  One regex pass over the paragraphs joined by '\n' rather than a call per paragraph (most
  lines of code or documentation have no sentence boundary at all). In cleaned text the only
  whitespace is single spaces, so `_BOUNDARY_CLEAN` finds there what `_BOUNDARY` finds in
  each paragraph, and a piece from one cut to the next, stripped, is the sentence: the space
  (or ' " ') after a sentence's end falls to `strip`.
  """
  text = '\n'.join(paragraphs)
  cuts = [0]
  for m in _BOUNDARY_CLEAN.finditer(text):
    if not _is_sentence_end(text, m):
      continue
    cut = m.end(1)
    if text.startswith('" ', cut):  # as in split_sentences: an unmatched '"' keeps the closing quote
      end = m.start(1)
      start = max(cuts[-1], text.rfind('\n', 0, end) + 1)  # this sentence's start in its paragraph
      if text.count('"', start, end) % 2 == 1:
        cut += 2
    cuts.append(cut)
  if len(cuts) == 1:
    return paragraphs
  cuts.append(len(text))
  return [t for a, b in zip(cuts, cuts[1:]) for s in text[a:b].split('\n') if (t := s.strip())]


def _is_sentence_end(text: str, m: re.Match) -> bool:
  head = text[m.start():m.start(1)]
  if not head.startswith('.') or head.startswith('..'):
    return True  # '!', '?' and ellipses always end a sentence
  # The word that carries the final '.' (with any closing quotes or brackets after it), to tell
  # abbreviations from sentence ends; a bounded window keeps this O(1) per boundary on huge
  # single-line inputs.
  word = _last_word(text[max(0, m.start(1) - 40):m.start(1)]).lstrip('(["\'“‘')
  if not word:
    return True  # ' . ' in WikiText: a tokenised full stop
  lower = word.lower()
  if lower in _ABBREVIATIONS or _INITIALS.match(word):
    return False
  if lower in _NUMBER_ABBREVIATIONS:
    return not text[m.end():m.end() + 1].isdigit()
  return True


def _last_word(text: str) -> str:
  """The run of non-space characters before a final '.' (closing quotes or brackets may follow it), or ''.

  What the regex `(\\S*)\\.["\'”’)\\]]*$` captures in text that does not end in a line break, without
  trying it at every position.
  """
  dot = len(text.rstrip(_CLOSERS)) - 1
  if dot > 0 and text[dot] == '.' and not text[dot - 1].isspace():
    return text[:dot].rsplit(None, 1)[-1]
  return ''


def _clean(line: str) -> str:
  # str.split() and the regex '\s' agree on what whitespace is; split is faster.
  return ' '.join(line.split())


def _wikiextractor_docs(text: str) -> list[list[str]]:
  docs, doc, title = [], None, None
  for line in text.splitlines():
    m = _DOC_START.match(line)
    if m:
      doc = []
      docs.append(doc)
      title = re.search(r'title="([^"]*)"', m.group(0))
      title = title.group(1).strip() if title else None
      continue
    if line.startswith('</doc>'):
      doc = None
      continue
    line = _clean(_TAG.sub(' ', line) if '<' in line else line)
    if not line or doc is None or _WIKIEXTRACTOR_HEADING.match(line):
      continue
    if title is not None:
      # WikiExtractor repeats the title as the first line of the text.
      is_title, title = line == title, None
      if is_title:
        continue
    doc.append(line)
  return docs


def _wikitext_docs(text: str) -> list[list[str]]:
  docs: list[list[str]] = [[]]
  for line in text.splitlines():
    if _WIKITEXT_ARTICLE.match(line):
      docs.append([])
    elif not _WIKITEXT_HEADING.match(line):
      line = _clean(_WIKITEXT_ESCAPE.sub(r'\1', line))
      if line:
        docs[-1].append(line)
  return docs


def _plain_docs(text: str, hard_wrapped: bool) -> list[list[str]]:
  if not hard_wrapped:
    return [[_clean(line) for line in block.splitlines() if line.strip()]
            for block in _BLANK_LINES.split(text)]
  return [_wrapped_paragraphs(block)
          for page in text.split('\f') for block in _DOCUMENT_BREAK.split(page)]


def _wrapped_paragraphs(text: str) -> list[str]:
  paragraphs = (_clean(p) for p in _PARAGRAPH_BREAK.split(text))
  return [p for p in paragraphs if p]


def _jsonl_docs(text: str, opts: ReaderOptions,
                where: Callable[[int], str]) -> Iterator[list[str]]:
  field = opts.text_field
  for i, line in enumerate(text.split('\n')):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      detail = f'{e.msg}, column {e.colno}' if isinstance(e, json.JSONDecodeError) else str(e)
      raise DataError(f'{where(i)}: not a JSON object ({detail}); jsonl needs one object per '
                      'line') from None
    if not isinstance(record, dict):
      raise DataError(f'{where(i)}: not a JSON object but a {type(record).__name__}; jsonl '
                      'needs one object per line')
    if field not in record:
      keys = ', '.join(repr(k) for k in list(record)[:8]) or 'none'
      raise DataError(f'{where(i)}: no {field!r} field (it has {keys}); set the text field '
                      'to the one holding the text')
    value = record[field]
    if not isinstance(value, str):
      raise DataError(f'{where(i)}: field {field!r} is a JSON {_json_type(value)}, not a '
                      'string')
    if opts.hard_wrapped:
      yield _wrapped_paragraphs(value)
    else:
      yield [_clean(p) for p in value.splitlines() if p.strip()]


def _json_type(value) -> str:
  return {dict: 'object', list: 'array', bool: 'boolean', int: 'number', float: 'number',
          type(None): 'null'}.get(type(value), type(value).__name__)
