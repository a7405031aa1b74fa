"""Sentence splitting: a regex heuristic rather than nltk's punkt, which needs a model download the
training machines cannot make. This module imports no jax: it runs in spawned worker processes.
"""

from __future__ import annotations

import re

# A candidate sentence end: terminal punctuation, closing quotes/brackets glued to it,
# whitespace, then (looked ahead) an optional opening quote/bracket and a capital or digit.
_BOUNDARY = re.compile(r'[.!?]+["\'”’)\]]*(\s+)(?=["\'“‘(\[]?\s?[A-Z0-9])')
# _BOUNDARY in cleaned paragraphs (`corpus_formats._clean`) joined by '\n': their only
# whitespace within is ' ', and no match crosses into the next paragraph.
_BOUNDARY_CLEAN = re.compile(r'[.!?]+["\'”’)\]]*( +)(?=["\'“‘(\[]? ?[A-Z0-9])')
_CLOSERS = '"\'”’)]'
_ABBREVIATIONS = frozenset("""
    mr mrs ms dr st jr sr prof rev hon gen col lt sgt capt cmdr adm gov sen rep pres
    vs etc e.g i.e cf al ca approx inc ltd co corp bros dept univ mt ft est
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# These abbreviate only before a number ('No. 5'); 'no.' at the end of a sentence is a word.
_NUMBER_ABBREVIATIONS = frozenset('no nos vol vols pp p fig figs op ch art'.split())
_INITIALS = re.compile(r'^(?:[A-Za-z]\.)+[A-Za-z]$|^[A-Z]$')


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


def document_sentences(paragraphs: list[str]) -> list[str]:
  """`split_sentences` of every paragraph, in order, for cleaned (non-empty) paragraphs.

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
