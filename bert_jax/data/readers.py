"""Raw pretraining corpora → documents as lists of sentences.

Three on-disk formats are understood, detected per file:

* WikiExtractor (`<doc id=.. url=.. title=..>` … `</doc>`, one paragraph per line; the
  repeated title, section headings and leftover markup tags are dropped),
* WikiText (articles start at ` = Title = ` lines; headings are dropped and the
  ` @-@ `-style escapes undone),
* plain text (documents separated by blank lines).

Sentence splitting is a regex heuristic rather than nltk's punkt, which needs a
model download the training machines cannot make.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Sequence

from absl import logging

from bert_jax.errors import DataError

_WIKITEXT_ARTICLE = re.compile(r'^ = [^=].* = $')
_WIKITEXT_HEADING = re.compile(r'^ (= )+[^=].*( =)+ $')
# WikiText writes intra-word '-', ',' and '.' as ' @-@ ' etc.
_WIKITEXT_ESCAPE = re.compile(r' @([-,.])@ ')
_DOC_START = re.compile(r'^<doc [^>]*>')
_TAG = re.compile(r'</?[a-zA-Z][^>]*>')
# WikiExtractor renders a section heading as a short line ending in '.': 'Early life.'
_WIKIEXTRACTOR_HEADING = re.compile(r'^[^.!?:;,]{1,60}\.$')
_SPACES = re.compile(r'\s+')

# A candidate sentence end: terminal punctuation, closing quotes/brackets glued to it,
# whitespace, then (looked ahead) an optional opening quote/bracket and a capital or digit.
_BOUNDARY = re.compile(r'[.!?]+["\'”’)\]]*(\s+)(?=["\'“‘(\[]?\s?[A-Z0-9])')
# The word that carries the final '.', to tell abbreviations from sentence ends.
_LAST_WORD = re.compile(r'(\S*)\.["\'”’)\]]*$')
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


def resolve_files(spec: str) -> list[str]:
  """Expands a comma-separated list of files, globs and directories.

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
    if os.path.isdir(part):
      found = _walk(part)
    elif any(c in part for c in '*?['):
      found = sorted(p for p in glob.glob(part, recursive=True) if os.path.isfile(p))
    elif os.path.isfile(part):
      found = [part]
    else:
      raise DataError(f'corpus file {part!r}{where} does not exist; check the path or the '
                      'current directory')
    if not found:
      raise DataError(f'{part!r}{where} matches no files')
    files.extend(found)
  if not files:
    raise DataError(f'corpus spec {spec!r} names no files')
  return list(dict.fromkeys(files))


def _walk(root: str) -> list[str]:
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not d.startswith('.')]
    out.extend(os.path.join(dirpath, f) for f in filenames if not _NOT_CORPUS.search(f))
  return sorted(p for p in out if os.path.isfile(p))


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


def _is_sentence_end(text: str, m: re.Match) -> bool:
  head = text[m.start():m.start(1)]
  if not head.startswith('.') or head.startswith('..'):
    return True  # '!', '?' and ellipses always end a sentence
  # A bounded window keeps this O(1) per boundary on huge single-line inputs.
  word = _LAST_WORD.search(text[max(0, m.start(1) - 40):m.start(1)])
  word = word.group(1).lstrip('(["\'“‘') if word else ''
  if not word:
    return True  # ' . ' in WikiText: a tokenised full stop
  lower = word.lower()
  if lower in _ABBREVIATIONS or _INITIALS.match(word):
    return False
  if lower in _NUMBER_ABBREVIATIONS:
    return not text[m.end():m.end() + 1].isdigit()
  return True


def read_documents(paths: Sequence[str]) -> tuple[list[list[str]], dict]:
  """Reads corpus files into documents of sentences.

  Args:
    paths: files, e.g. from `resolve_files`.

  Returns:
    (documents, stats): documents are non-empty lists of sentences; stats counts
    files, empty_files, documents, sentences, invalid_utf8 (replaced byte sequences)
    and files per format.
  """
  documents: list[list[str]] = []
  stats = dict(files=len(paths), empty_files=0, documents=0, sentences=0, invalid_utf8=0,
               formats={'wikiextractor': 0, 'wikitext': 0, 'plain': 0})
  for path in paths:
    text, replaced = _read_text(path)
    if replaced:
      # Decision: a few bad bytes should not stop a long job; they become U+FFFD.
      logging.warning('%s: %d invalid UTF-8 byte sequence(s) replaced with U+FFFD', path, replaced)
      stats['invalid_utf8'] += replaced
    if not text.strip():
      stats['empty_files'] += 1
      continue
    fmt = _detect_format(text)
    stats['formats'][fmt] += 1
    raw_docs = {'wikiextractor': _wikiextractor_docs, 'wikitext': _wikitext_docs,
                'plain': _plain_docs}[fmt](text)
    for paragraphs in raw_docs:
      doc = [s for p in paragraphs for s in split_sentences(p)]
      if doc:
        documents.append(doc)
  if not documents:
    raise DataError(f'corpus {", ".join(paths) or "(no files)"} has no text')
  stats['documents'] = len(documents)
  stats['sentences'] = sum(len(d) for d in documents)
  return documents, stats


def _read_text(path: str) -> tuple[str, int]:
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f'cannot read corpus file {path}: {e.strerror}') from None
  try:
    return raw.decode('utf-8'), 0
  except UnicodeDecodeError:
    text = raw.decode('utf-8', errors='replace')
    # U+FFFD already present in the file is text, not damage.
    return text, text.count('\ufffd') - raw.count('\ufffd'.encode())


def _detect_format(text: str) -> str:
  first = next(line for line in text.splitlines() if line.strip())
  if first.startswith('<doc '):
    return 'wikiextractor'
  if any(_WIKITEXT_ARTICLE.match(line) for line in text.splitlines()):
    return 'wikitext'
  return 'plain'


def _clean(line: str) -> str:
  return _SPACES.sub(' ', line).strip()


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
    line = _clean(_TAG.sub(' ', line))
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


def _plain_docs(text: str) -> list[list[str]]:
  return [[_clean(line) for line in block.splitlines() if line.strip()]
          for block in re.split(r'\n\s*\n', text)]
