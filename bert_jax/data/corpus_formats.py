"""Corpus formats: the reader options, a file's format, and each format's text as documents of paragraphs.

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

A parser (`wikiextractor_docs`, `wikitext_docs`, `plain_docs`, `jsonl_docs`) turns decoded text
of whole documents into documents as lists of cleaned paragraphs, which `readers` splits into
sentences. This module imports no jax: it runs in spawned worker processes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable, Iterator

from bert_jax import files
from bert_jax.data import corpus_files
from bert_jax.errors import ConfigError, DataError

FORMATS = ('auto', 'wikiextractor', 'wikitext', 'plain', 'jsonl')
# The first byte that is neither ASCII whitespace nor part of a UTF-8 byte order mark.
_NON_BLANK = re.compile(rb'[^\s\xef\xbb\xbf]')

WIKITEXT_ARTICLE = re.compile(r'^ = [^=].* = $')  # an article's first line (corpus_pieces cuts before it)
# WIKITEXT_ARTICLE on any line of a text ('\r' is a line break to str.splitlines).
_WIKITEXT_ARTICLE_IN = re.compile(r'^ = [^=\n\r][^\n\r]* = \r?$', re.MULTILINE)
_WIKITEXT_HEADING = re.compile(r'^ (= )+[^=].*( =)+ $')
# WikiText writes intra-word '-', ',' and '.' as ' @-@ ' etc.
_WIKITEXT_ESCAPE = re.compile(r' @([-,.])@ ')
DOC_START = re.compile(r'^<doc [^>]*>')  # a document's first line (corpus_pieces cuts before it)
_TAG = re.compile(r'</?[a-zA-Z][^>]*>')
# WikiExtractor renders a section heading as a short line ending in '.': 'Early life.'
_WIKIEXTRACTOR_HEADING = re.compile(r'^[^.!?:;,]{1,60}\.$')
_BLANK_LINES = re.compile(r'\n\s*\n')
# Hard-wrapped text: one blank line ends a paragraph, two or more end a document.
_PARAGRAPH_BREAK = re.compile(r'\n(?:[^\S\n]*\n)+')
_DOCUMENT_BREAK = re.compile(r'\n(?:[^\S\n]*\n){2,}')
_HEAD_BYTES = 1 << 20      # what format detection looks at


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


def detect_format(path: str, opts: ReaderOptions) -> tuple[str, str]:
  """Finds a file's format and compression.

  Args:
    path: a corpus file.
    opts: reader options; an explicit format is returned as given.

  Returns:
    (format, compression): format is never 'auto'; compression is '', 'gzip', 'bz2' or
    'xz', from the file's magic bytes.
  """
  fmt, compression, _ = sniff(path, opts)
  return fmt, compression


def sniff(path: str, opts: ReaderOptions) -> tuple[str, str, bool]:
  """detect_format, plus whether the (decompressed) file is empty."""
  with corpus_files.open_raw(path) as raw:
    compression = corpus_files.detect_compression(path, raw)
    with files.decompressed(path, raw, compression) as f:
      # An explicit format needs the head only to tell an empty file.
      head = corpus_files.read(f, _HEAD_BYTES if opts.format == 'auto' else 1, path, compression)
      text = _NON_BLANK.search(head)
      if (opts.format == 'auto' and text and head.startswith(b'{', text.start())
          and b'\n' not in head[text.start():]):
        # The first line is a JSON object that runs past the head: read the rest of it.
        while chunk := corpus_files.read(f, corpus_files.READ_BYTES, path, compression):
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


def _clean(line: str) -> str:
  # str.split() and the regex '\s' agree on what whitespace is; split is faster.
  return ' '.join(line.split())


def wikiextractor_docs(text: str) -> list[list[str]]:
  docs, doc, title = [], None, None
  for line in text.splitlines():
    m = DOC_START.match(line)
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


def wikitext_docs(text: str) -> list[list[str]]:
  docs: list[list[str]] = [[]]
  for line in text.splitlines():
    if WIKITEXT_ARTICLE.match(line):
      docs.append([])
    elif not _WIKITEXT_HEADING.match(line):
      line = _clean(_WIKITEXT_ESCAPE.sub(r'\1', line))
      if line:
        docs[-1].append(line)
  return docs


def plain_docs(text: str, hard_wrapped: bool) -> list[list[str]]:
  if not hard_wrapped:
    return [[_clean(line) for line in block.splitlines() if line.strip()]
            for block in _BLANK_LINES.split(text)]
  return [_wrapped_paragraphs(block)
          for page in text.split('\f') for block in _DOCUMENT_BREAK.split(page)]


def _wrapped_paragraphs(text: str) -> list[str]:
  paragraphs = (_clean(p) for p in _PARAGRAPH_BREAK.split(text))
  return [p for p in paragraphs if p]


def jsonl_docs(text: str, opts: ReaderOptions,
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
