"""A retrieval set in BEIR's on-disk layout, read and checked.

  <dir>/corpus.jsonl       {"_id": ..., "title": ..., "text": ...} per line (title optional)
  <dir>/queries.jsonl      {"_id": ..., "text": ...} per line
  <dir>/qrels/<split>.tsv  a header `query-id<TAB>corpus-id<TAB>score`, then one judgement per line (integer score)

Only the queries that the split's qrels judge are evaluated (BEIR's queries.jsonl holds every split's), in
queries.jsonl order. Ids are strings as written (JSON numbers are read as their decimal text, as BEIR does). Every
bad input is one DataError naming the file and line: a missing file, a line that is not a JSON object, a missing or
duplicate `_id`, a qrels file without its header or with a malformed row, an id that no file defines, a judged query
with no relevant document (no score > 0).
"""

from __future__ import annotations

import dataclasses
import json
import os

from bert_jax import files
from bert_jax.errors import DataError

QRELS_HEADER = ('query-id', 'corpus-id', 'score')


@dataclasses.dataclass(frozen=True)
class BeirSet:
  """A corpus, the judged queries and their judgements (qrels[i]: corpus index -> score, for query i)."""

  corpus_ids: list[str]
  titles: list[str]
  texts: list[str]
  query_ids: list[str]
  queries: list[str]
  qrels: list[dict[int, int]]

  def passages(self) -> list[str]:
    """Each document as one text: title and text joined by a space (BEIR's sentence-transformers models)."""
    return [f'{title} {text}' if title else text for title, text in zip(self.titles, self.texts)]


def _read_lines(path: str, what: str) -> list[tuple[int, str]]:
  files.check_regular(path, what)
  if not files.isfile(path):
    raise DataError(f'{what} {path} does not exist')
  with files.open_file(path, 'r', encoding='utf-8', errors='strict') as f:
    try:
      text = f.read()
    except UnicodeDecodeError as e:
      raise DataError(f'{what} {path} is not UTF-8 text ({e.reason} at byte {e.start})') from None
  lines = [(i, line.removesuffix('\r')) for i, line in enumerate(text.split('\n'), 1)]
  lines = [(i, line) for i, line in lines if line.strip()]
  if not lines:
    raise DataError(f'{what} {path} is empty')
  return lines


def _id(value, path: str, line: int) -> str:
  if isinstance(value, bool) or not isinstance(value, (str, int)) or value == '':
    raise DataError(f'{path} line {line}: "_id" must be a non-empty string (or integer), got {value!r}')
  return str(value)


def _read_jsonl(path: str, what: str, fields: tuple[str, ...]) -> tuple[list[str], list[tuple[str, ...]]]:
  """(ids, per line the string values of `fields`; a missing 'title' is '') of a BEIR JSONL file."""
  ids, rows, seen = [], [], {}
  for line, text in _read_lines(path, what):
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      raise DataError(f'{path} line {line} is not valid JSON ({e.msg})') from None
    if not isinstance(obj, dict):
      raise DataError(f'{path} line {line} is not a JSON object')
    if '_id' not in obj:
      raise DataError(f'{path} line {line} has no "_id"')
    doc_id = _id(obj['_id'], path, line)
    if doc_id in seen:
      raise DataError(f'{path} line {line}: "_id" {doc_id!r} repeats line {seen[doc_id]}')
    seen[doc_id] = line
    values = []
    for field in fields:
      value = obj.get(field, '' if field == 'title' else None)
      if value is None:
        raise DataError(f'{path} line {line} has no "{field}"')
      if not isinstance(value, str):
        raise DataError(f'{path} line {line}: "{field}" must be a string, got {type(value).__name__}')
      values.append(value)
    ids.append(doc_id)
    rows.append(tuple(values))
  return ids, rows


def _read_qrels(path: str, query_index: dict[str, int], corpus_index: dict[str, int]) -> dict[int, dict[int, int]]:
  lines = _read_lines(path, 'qrels file')
  (first, header), rows = lines[0], lines[1:]
  if tuple(h.strip() for h in header.split('\t')) != QRELS_HEADER:
    raise DataError(f'{path} line {first} must be the header {chr(9).join(QRELS_HEADER)!r} (tab-separated), '
                    f'got {header!r}')
  if not rows:
    raise DataError(f'{path} has a header but no judgements')
  judged: dict[int, dict[int, int]] = {}
  for line, text in rows:
    fields = [f.strip() for f in text.split('\t')]
    if len(fields) != 3:
      raise DataError(f'{path} line {line} has {len(fields)} tab-separated fields; expected query-id, corpus-id, '
                      'score')
    query_id, corpus_id, score = fields
    try:
      value = int(score)
    except ValueError:
      raise DataError(f'{path} line {line}: the score {score!r} is not an integer') from None
    if query_id not in query_index:
      raise DataError(f'{path} line {line}: query-id {query_id!r} is not in queries.jsonl')
    if corpus_id not in corpus_index:
      raise DataError(f'{path} line {line}: corpus-id {corpus_id!r} is not in corpus.jsonl')
    per_query = judged.setdefault(query_index[query_id], {})
    if corpus_index[corpus_id] in per_query:
      raise DataError(f'{path} line {line}: query {query_id!r} judges document {corpus_id!r} twice')
    per_query[corpus_index[corpus_id]] = value
  return judged


def read_beir(directory: str, split: str = 'test') -> BeirSet:
  """Reads `directory`'s corpus.jsonl, queries.jsonl and qrels/<split>.tsv.

  Raises:
    DataError: a missing directory or file, or any bad line (see the module docstring).
  """
  if not files.isdir(directory):
    raise DataError(f'BEIR directory {directory} does not exist (it holds corpus.jsonl, queries.jsonl and '
                    'qrels/<split>.tsv)')
  corpus_ids, docs = _read_jsonl(os.path.join(directory, 'corpus.jsonl'), 'corpus file', ('title', 'text'))
  query_ids, queries = _read_jsonl(os.path.join(directory, 'queries.jsonl'), 'queries file', ('text',))
  qrels_path = os.path.join(directory, 'qrels', f'{split}.tsv')
  judged = _read_qrels(qrels_path, {q: i for i, q in enumerate(query_ids)},
                       {c: i for i, c in enumerate(corpus_ids)})
  for i in sorted(judged):
    if not any(score > 0 for score in judged[i].values()):
      raise DataError(f'{qrels_path}: query {query_ids[i]!r} has no relevant document (no score > 0)')
  kept = sorted(judged)
  return BeirSet(corpus_ids=corpus_ids, titles=[t for t, _ in docs], texts=[x for _, x in docs],
                 query_ids=[query_ids[i] for i in kept], queries=[queries[i][0] for i in kept],
                 qrels=[judged[i] for i in kept])
