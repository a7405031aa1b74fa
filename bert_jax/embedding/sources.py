"""Built-in pair sources for the two stages of the embedding recipe, from what ../shared/data holds.

- `squad_pairs`: SQuAD v1.1 question -> its paragraph (the article's title in front, as BEIR's passages read), split
  by article: the first articles train, the last `eval_articles` are held out as a BEIR-layout set (their questions
  against their paragraphs), so no paragraph is on both sides.
- `enwiki_pairs`: weak pairs from a pretraining corpus in WikiExtractor's `<doc title=...>` files (enwiki-2015): an
  article's title -> its first paragraph, and each paragraph -> the next one of the same article, for the
  contrastive pre-fine-tuning stage (docs/embeddings.md).

Both return plain records ({'query', 'positive'} dicts; the BEIR set as corpus/queries/qrels rows) that
`write_pairs` and `write_beir` put on disk in the layouts `pairs.read_pairs` and `beir.read_beir` read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from typing import Any, Iterable, Sequence

from bert_jax import files
from bert_jax.errors import DataError

MIN_WORDS = 20  # a weak-pair paragraph shorter than this is a heading, a list item or a stub


@dataclasses.dataclass(frozen=True)
class BeirRecords:
  """A retrieval set as BEIR writes it: corpus and query rows, and (query id, corpus id) judgements."""

  corpus: list[dict[str, str]]
  queries: list[dict[str, str]]
  qrels: list[tuple[str, str]]


def _title(article: dict[str, Any]) -> str:
  return str(article.get('title', '')).replace('_', ' ')


def squad_pairs(path: str, eval_articles: int = 8) -> tuple[list[dict[str, str]], BeirRecords]:
  """(training pairs of the first articles, the held-out articles as a BEIR set) of a SQuAD v1.1 JSON file."""
  try:
    with files.open(path, encoding='utf-8') as f:
      articles = json.load(f)['data']
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f'{path} is not a readable SQuAD JSON file ({type(e).__name__}: {e})') from None
  if not 0 < eval_articles < len(articles):
    raise DataError(f'{path} has {len(articles)} articles: eval_articles={eval_articles} must leave some on each '
                    'side')
  train = []
  for article in articles[:-eval_articles]:
    for paragraph in article['paragraphs']:
      passage = f'{_title(article)} {paragraph["context"].strip()}'
      train.extend({'query': qa['question'].strip(), 'positive': passage} for qa in paragraph['qas'])
  corpus, queries, qrels = [], [], []
  for a, article in enumerate(articles[-eval_articles:]):
    for p, paragraph in enumerate(article['paragraphs']):
      doc = f'a{a}p{p}'
      corpus.append({'_id': doc, 'title': _title(article), 'text': paragraph['context'].strip()})
      for qa in paragraph['qas']:
        queries.append({'_id': str(qa['id']), 'text': qa['question'].strip()})
        qrels.append((str(qa['id']), doc))
  return train, BeirRecords(corpus, queries, qrels)


_DOC = re.compile(r'<doc [^>]*title="([^"]*)"[^>]*>\n(.*?)</doc>', re.S)


def _paragraphs(body: str, title: str) -> list[str]:
  """The article's paragraphs of at least MIN_WORDS words (headings, the title line and stubs left out)."""
  lines = [l.strip() for l in body.split('\n')]
  return [l for l in lines if l and l != title and len(l.split()) >= MIN_WORDS]


def enwiki_pairs(paths: Sequence[str], max_pairs: int = 0, seed: int = 0) -> list[dict[str, str]]:
  """Weak pairs of WikiExtractor files: title -> first paragraph, paragraph -> next paragraph; shuffled by `seed`
  and cut to `max_pairs` (0: all)."""
  pairs = []
  for path in paths:
    with files.open(path, encoding='utf-8', errors='replace') as f:
      text = f.read()
    docs = _DOC.findall(text)
    if not docs:
      raise DataError(f'{path} holds no <doc title="..."> article (WikiExtractor\'s format)')
    for title, body in docs:
      paragraphs = _paragraphs(body, title.strip())
      if paragraphs:
        pairs.append({'query': title.strip(), 'positive': paragraphs[0]})
      pairs.extend({'query': a, 'positive': b} for a, b in zip(paragraphs, paragraphs[1:]))
  random.Random(seed).shuffle(pairs)
  return pairs[:max_pairs] if max_pairs else pairs


def write_pairs(path: str, pairs: Iterable[dict[str, str]]) -> int:
  """Writes pairs as JSONL (query, positive) atomically; returns how many."""
  pairs = list(pairs)
  files.write_text_atomic(path, _jsonl(pairs))
  return len(pairs)


def _jsonl(rows: Iterable[dict[str, str]]) -> str:
  return '\n'.join(json.dumps(r, ensure_ascii=False) for r in rows) + '\n'


def write_beir(directory: str, records: BeirRecords, split: str = 'test') -> None:
  """corpus.jsonl, queries.jsonl and qrels/<split>.tsv under `directory`."""
  files.write_text_atomic(os.path.join(directory, 'corpus.jsonl'), _jsonl(records.corpus))
  files.write_text_atomic(os.path.join(directory, 'queries.jsonl'), _jsonl(records.queries))
  qrels = ''.join(f'{q}\t{d}\t1\n' for q, d in records.qrels)
  files.write_text_atomic(os.path.join(directory, 'qrels', f'{split}.tsv'), 'query-id\tcorpus-id\tscore\n' + qrels)
