"""A retrieval set in BEIR's on-disk layout, read and checked.

  <dir>/corpus.jsonl       {"_id": ..., "title": ..., "text": ...} per line (title optional)
  <dir>/queries.jsonl      {"_id": ..., "text": ...} per line
  <dir>/qrels/<split>.tsv  a header `query-id<TAB>corpus-id<TAB>score`, then one judgement per line (integer score)

Each file may be compressed (corpus.jsonl.gz, ...: bert_jax.files) and the directory remote; the JSONL files are
read by the one table reader (`data.tables`). Only the queries that the split's qrels judge are evaluated (BEIR's
queries.jsonl holds every split's), in queries.jsonl order. Ids are strings as written (JSON numbers are read as
their decimal text, as BEIR does). Every bad input is one DataError naming the file and line: a missing file, a
line that is not a JSON object, a missing or duplicate `_id`, a qrels file without its header or with a malformed
row, a judged query with no relevant document (no score > 0), a qrels file none of whose judgements names both a
query and a document of the set.

Published BEIR sets hold judgements of ids their files lack (ArguAna's qrels name a document its corpus does not
have; NFCorpus's a query its queries.jsonl does not). They are read as BEIR's evaluator (pytrec_eval) scores them,
counted (`BeirSet.absent`) and named in one warning line: a judgement of an absent query is skipped (that query is
never retrieved for), and one of an absent document stays a relevant document no model can retrieve (it lowers
recall and nDCG as in BEIR's published figures); it gets an index of ABSENT_FIRST or below in `qrels`, which no
ranking holds.
"""

from __future__ import annotations

import dataclasses
import os

from bert_jax import files
from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.runs import reporting

QRELS_HEADER = ('query-id', 'corpus-id', 'score')
# The index of the first judged document the corpus lacks; the next ones count down from it. -1 is taken: it is
# search.StreamingTopK's id of an empty slot (fewer corpus rows than k so far), which no judgement may match.
ABSENT_FIRST = -2


@dataclasses.dataclass(frozen=True)
class BeirSet:
  """A corpus, the judged queries and their judgements (qrels[i]: corpus index -> score, for query i; an index of
  ABSENT_FIRST or below: a judged document that the corpus lacks)."""

  corpus_ids: list[str]
  titles: list[str]
  texts: list[str]
  query_ids: list[str]
  queries: list[str]
  qrels: list[dict[int, int]]
  # qrels rows naming ids the set lacks: {'queries': rows skipped, 'documents': rows kept as unretrievable}
  absent: dict[str, int] = dataclasses.field(default_factory=lambda: {'queries': 0, 'documents': 0})
  # queries.jsonl's ids that this split does not judge (another split's): a first stage's run may name them
  unjudged_query_ids: frozenset[str] = frozenset()

  def passages(self) -> list[str]:
    """Each document as one text: title and text joined by a space (BEIR's sentence-transformers models)."""
    return [f'{title} {text}' if title else text for title, text in zip(self.titles, self.texts)]


def find(path: str) -> str:
  """`path`, or its compressed copy beside it (corpus.jsonl.gz, .bz2, .xz) when only that is there."""
  if files.isfile(path):
    return path
  return next((p for p in (path + suffix for suffix in files.COMPRESSIONS) if files.isfile(p)), path)


def _qrels_rows(path: str) -> list[tuple[int, list[str]]]:
  """(line, tab-separated fields, stripped) of each non-blank line of a qrels file."""
  files.check_regular(path, 'qrels file')
  if not files.isfile(path):
    raise DataError(f'qrels file {path} does not exist')
  try:
    with files.open(path, encoding='utf-8-sig', newline='') as f:
      rows = [(line, [v.strip() for v in row]) for line, row in tables.fields(path, f, 'tsv')]
  except UnicodeDecodeError:
    raise files.not_utf8(path, 'qrels file') from None
  if not rows:
    raise DataError(f'qrels file {path} is empty')
  return rows


def _id(value, path: str, line: int) -> str:
  if isinstance(value, bool) or not isinstance(value, (str, int)) or value == '':
    raise DataError(f'{path} line {line}: "_id" must be a non-empty string (or integer), got {value!r}')
  return str(value)


def _read_jsonl(path: str, what: str, fields: tuple[str, ...]) -> tuple[list[str], list[tuple[str, ...]]]:
  """(ids, per line the string values of `fields`; a missing 'title' is '') of a BEIR JSONL file."""
  ids, rows, seen = [], [], {}
  for line, obj in tables.records(path, what)[1]:
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


@dataclasses.dataclass
class _Absent:
  """The qrels rows naming an id that queries.jsonl or corpus.jsonl lacks: how many, and the first one."""

  rows: int = 0
  first: str = ''

  def add(self, what: str, value: str, line: int) -> None:
    self.rows += 1
    self.first = self.first or f'{what} {value!r}, line {line}'


def _read_qrels(path: str, query_index: dict[str, int], corpus_index: dict[str, int]
                ) -> tuple[dict[int, dict[int, int]], _Absent, _Absent]:
  """(query index -> {corpus index -> score}, the rows of absent queries, those of absent documents): see the module
  docstring for how those are read."""
  lines = _qrels_rows(path)
  (first, header), rows = lines[0], lines[1:]
  if tuple(header) != QRELS_HEADER:
    raise DataError(f'{path} line {first} must be the header {chr(9).join(QRELS_HEADER)!r} (tab-separated), '
                    f'got {chr(9).join(header)!r}')
  if not rows:
    raise DataError(f'{path} has a header but no judgements')
  judged: dict[int, dict[int, int]] = {}
  queries, documents, elsewhere, found = _Absent(), _Absent(), {}, False  # absent corpus-id -> its index
  for line, fields in rows:
    if len(fields) != 3:
      raise DataError(f'{path} line {line} has {len(fields)} tab-separated fields; expected query-id, corpus-id, '
                      'score')
    query_id, corpus_id, score = fields
    try:
      value = int(score)
    except ValueError:
      raise DataError(f'{path} line {line}: the score {score!r} is not an integer') from None
    if query_id not in query_index:
      queries.add('query-id', query_id, line)
      continue
    if corpus_id in corpus_index:
      doc, found = corpus_index[corpus_id], True
    else:
      documents.add('corpus-id', corpus_id, line)
      doc = elsewhere.setdefault(corpus_id, ABSENT_FIRST - len(elsewhere))
    per_query = judged.setdefault(query_index[query_id], {})
    if doc in per_query:
      raise DataError(f'{path} line {line}: query {query_id!r} judges document {corpus_id!r} twice')
    per_query[doc] = value
  if not found:
    raise DataError(f'{path}: none of its {len(rows)} judgements names both a query-id of queries.jsonl and a '
                    f'corpus-id of corpus.jsonl (the first: {(queries.first or documents.first)}): nothing to '
                    'evaluate; are these the qrels of this corpus?')
  return judged, queries, documents


def _warn_absent(path: str, queries: _Absent, documents: _Absent) -> None:
  """One warning line for the judgements of ids the set lacks (none: nothing)."""
  parts = []
  if queries.rows:
    parts.append(f'{queries.rows} name a query-id that queries.jsonl lacks (the first: {queries.first}): skipped')
  if documents.rows:
    parts.append(f'{documents.rows} name a corpus-id that corpus.jsonl lacks (the first: {documents.first}): '
                 'relevant documents no model can retrieve, as BEIR\'s evaluator counts them')
  if parts:
    reporting.log(f'warning: {path}: of its judgements, ' + '; '.join(parts))


def read_beir(directory: str, split: str = 'test') -> BeirSet:
  """Reads `directory`'s corpus.jsonl, queries.jsonl and qrels/<split>.tsv.

  Raises:
    DataError: a missing directory or file, or any bad line (see the module docstring).
  """
  if not files.isdir(directory):
    raise DataError(f'BEIR directory {directory} does not exist (it holds corpus.jsonl, queries.jsonl and '
                    'qrels/<split>.tsv)')
  corpus_ids, docs = _read_jsonl(find(os.path.join(directory, 'corpus.jsonl')), 'corpus file', ('title', 'text'))
  query_ids, queries = _read_jsonl(find(os.path.join(directory, 'queries.jsonl')), 'queries file', ('text',))
  qrels_path = find(os.path.join(directory, 'qrels', f'{split}.tsv'))
  judged, absent_queries, absent_documents = _read_qrels(qrels_path, {q: i for i, q in enumerate(query_ids)},
                                                        {c: i for i, c in enumerate(corpus_ids)})
  _warn_absent(qrels_path, absent_queries, absent_documents)
  for i in sorted(judged):
    if not any(score > 0 for score in judged[i].values()):
      raise DataError(f'{qrels_path}: query {query_ids[i]!r} has no relevant document (no score > 0)')
  kept = sorted(judged)
  return BeirSet(corpus_ids=corpus_ids, titles=[t for t, _ in docs], texts=[x for _, x in docs],
                 query_ids=[query_ids[i] for i in kept], queries=[queries[i][0] for i in kept],
                 qrels=[judged[i] for i in kept],
                 unjudged_query_ids=frozenset(q for i, q in enumerate(query_ids) if i not in judged),
                 absent={'queries': absent_queries.rows, 'documents': absent_documents.rows})
