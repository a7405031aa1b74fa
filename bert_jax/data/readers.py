"""Raw pretraining corpora → documents as lists of sentences, streamed piece by piece.

`read_documents` streams the documents of pieces (one unit of `corpus_pieces.plan_units`) holding
a few MiB of text at a time, cut at document boundaries: each chunk is decoded, parsed by its
format (`corpus_formats`) and its paragraphs split into sentences (`sentence_split`). Invalid
UTF-8 is replaced with U+FFFD and counted rather than fatal. `read_all` reads whole files.

Finding the files and reading their bytes (globs, remote paths, compression) is
`corpus_files`'s part. This module imports no jax: it runs in spawned worker processes.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from bert_jax import files
from bert_jax.data import corpus_files, corpus_formats, corpus_pieces, sentence_split
from bert_jax.errors import ConfigError, DataError

_CHUNK_BYTES = 4 << 20     # text parsed at once: what a worker holds, bar one long document


def read_documents(pieces: Sequence[corpus_pieces.Piece], opts: corpus_formats.ReaderOptions,
                   stats: dict | None = None) -> Iterator[list[str]]:
  """Streams the documents of pieces, in order.

  A few MiB of text are parsed at a time (cut at document boundaries), so memory does not
  grow with the size of a piece or file, only with the longest document.

  Args:
    pieces: e.g. one unit from `corpus_pieces.plan_units`.
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
      fmt = corpus_formats.detect_format(piece.path, opts)[0]
    if fmt not in corpus_formats.FORMATS:
      raise ConfigError(f'{piece.path}: unknown corpus format {fmt!r}; expected one of '
                        f'{", ".join(corpus_formats.FORMATS)}')
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
        raw_docs = corpus_formats.jsonl_docs(text, opts, _jsonl_where(piece, lines_before))
        lines_before += chunk.count(b'\n')
      elif fmt == 'plain':
        raw_docs = corpus_formats.plain_docs(text, opts.hard_wrapped)
      else:
        parse = corpus_formats.wikiextractor_docs if fmt == 'wikiextractor' else corpus_formats.wikitext_docs
        raw_docs = parse(text)
      for paragraphs in raw_docs:
        doc = sentence_split.document_sentences(paragraphs)
        if doc:
          stats['documents'] += 1
          stats['sentences'] += len(doc)
          yield doc
    if replaced:  # reported once for the corpus, by the preparation (this may run in a worker process)
      stats['invalid_utf8'] += replaced
      stats.setdefault('invalid_utf8_first', piece.path)


def read_all(paths: Sequence[str], opts: corpus_formats.ReaderOptions = corpus_formats.ReaderOptions(),
             stats: dict | None = None) -> list[list[str]]:
  """Reads whole files into documents: for tests and small corpora.

  Args:
    paths: corpus files, e.g. from `corpus_files.resolve_files`.
    opts: reader options.
    stats: if given, updated in place as by `read_documents`.

  Returns:
    The documents, non-empty lists of sentences.
  """
  pieces = [p for unit in corpus_pieces.plan_units(paths, opts, corpus_pieces.NO_CUT) for p in unit]
  documents = list(read_documents(pieces, opts, stats))
  if not documents:
    raise DataError(f'corpus {", ".join(paths) or "(no files)"} has no text')
  return documents


def _chunks(piece: corpus_pieces.Piece, fmt: str, hard_wrapped: bool) -> Iterator[bytes]:
  """A piece's bytes in chunks of a few MiB that end at document boundaries."""
  with corpus_files.open_raw(piece.path) as raw:
    with files.decompressed(piece.path, raw, piece.compression) as f:
      left = -1
      if not piece.compression:
        f.seek(piece.start)
        left = piece.end - piece.start
      buf = bytearray()
      lo = _CHUNK_BYTES - corpus_files.READ_BYTES
      while True:
        want = corpus_files.READ_BYTES if left < 0 else min(corpus_files.READ_BYTES, left)
        data = corpus_files.read(f, want, piece.path, piece.compression) if want else b''
        if not data:
          if buf:
            yield bytes(buf)
          return
        left -= len(data) if left >= 0 else 0
        buf += data
        if len(buf) < _CHUNK_BYTES:
          continue
        found, lo = corpus_pieces.find_boundary(buf, lo, fmt, hard_wrapped, final=False)
        if found >= 0:
          yield bytes(buf[:found])
          del buf[:found]
          lo = _CHUNK_BYTES - corpus_files.READ_BYTES


def _jsonl_where(piece: corpus_pieces.Piece, lines_before: int) -> Callable[[int], str]:
  """Names line i (0-based) of a chunk: the file and its 1-based line number."""
  def where(i: int) -> str:
    # Counting the lines before the piece costs a read of them: only done for a message.
    return f'{piece.path} line {_lines_before(piece) + lines_before + i + 1}'
  return where


def _lines_before(piece: corpus_pieces.Piece) -> int:
  if piece.compression or piece.start <= 0:
    return 0
  count, left = 0, piece.start
  with corpus_files.open_raw(piece.path) as f:
    while left > 0 and (data := corpus_files.read(f, min(left, corpus_files.READ_BYTES), piece.path, '')):
      count += data.count(b'\n')
      left -= len(data)
  return count
