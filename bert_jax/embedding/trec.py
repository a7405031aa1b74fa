"""TREC run files: a ranking as trec_eval reads it, one `qid Q0 docid rank score tag` line per retrieved document.

The ids are a BEIR set's (`embedding.beir`): query ids of queries.jsonl, document ids of corpus.jsonl. `read_run`
turns a run into each judged query's top k corpus indices, by score (highest first; ties: file order, as the run's
writer listed them; trec_eval breaks them by docid instead); the rank and the Q0 and tag columns are checked for
shape and otherwise not read. `write_run` writes a ranking back, atomically.

A run may hold queries this split does not judge (another split's in queries.jsonl): they are skipped. A judged
query with no line in the run retrieves nothing: all its metrics are 0, as `trec_eval -c` counts it, with one
counted warning line (BEIR's evaluator instead leaves such a query out of the mean, which favours a run that skips
hard queries). Every bad input is one DataError naming the file and line: a line without six fields, a rank that is
not an integer, a score that is not a finite number, a document ranked twice for a query, ids the set lacks (how
many, and the first few), no line of any judged query.

Files are read and written through `bert_jax.files`: compressed by their suffix (.gz, .bz2, .xz), local or remote.
"""

from __future__ import annotations

import math
import numpy as np

from bert_jax import files
from bert_jax.embedding.beir import BeirSet
from bert_jax.errors import DataError
from bert_jax.runs import reporting

FIELDS = ('qid', 'Q0', 'docid', 'rank', 'score', 'tag')
EMPTY = -1  # a corpus index past a query's candidates (search.StreamingTopK's empty slot; no judgement matches it)
_NAMED = 3  # unknown ids or missing queries named in a message


def _unknown(what: str, found: dict[str, int], lines: int, source: str) -> str:
  """'N <what>s that <source> lacks, on L lines (the first: 'x' line 3, ...)' of {id: its first line}."""
  first = ', '.join(f'{value!r} line {line}' for value, line in list(found.items())[:_NAMED])
  return (f'{len(found)} {what}{"s" * (len(found) > 1)} that {source} lacks, on {lines} line{"s" * (lines > 1)} '
          f'({first}{", ..." if len(found) > _NAMED else ""})')


def read_run(path: str, data: BeirSet, k: int, log=reporting.log) -> np.ndarray:
  """Each judged query's top `k` corpus indices from the run file at `path`: int32 [Q, min(k, most candidates of a
  query)] in `data.query_ids` order, best first, EMPTY past a query's candidates.

  Raises:
    DataError: a missing, empty or malformed file, or ids the set lacks (see the module docstring).
  """
  files.check_regular(path, 'run file')
  if not files.isfile(path):
    raise DataError(f'run file {path} does not exist (a TREC run: qid Q0 docid rank score tag per line)')
  query_index = {q: i for i, q in enumerate(data.query_ids)}
  corpus_index = {d: i for i, d in enumerate(data.corpus_ids)}
  candidates: list[dict[int, tuple[float, int]]] = [{} for _ in data.query_ids]  # doc -> (score, line)
  unknown_queries: dict[str, int] = {}  # id -> its first line
  unknown_documents: dict[str, int] = {}
  lines = unknown_query_lines = unknown_document_lines = 0
  try:
    with files.open(path, encoding='utf-8') as f:
      for line, text in enumerate(f, 1):
        fields = text.split()
        if not fields:
          continue
        lines += 1
        if len(fields) != len(FIELDS):
          raise DataError(f'{path} line {line}: {len(fields)} whitespace-separated fields; a TREC run line is '
                          f'{" ".join(FIELDS)!r}')
        qid, _, docid, rank, score, _ = fields
        try:
          int(rank)
          value = float(score)
        except ValueError:
          value = math.nan
        if not math.isfinite(value) or not rank.lstrip('-').isdigit():
          raise DataError(f'{path} line {line}: rank {rank!r} must be an integer and score {score!r} a finite '
                          'number')
        doc = corpus_index.get(docid)
        if doc is None:
          unknown_documents.setdefault(docid, line)
          unknown_document_lines += 1
        if qid not in query_index:
          if qid not in data.unjudged_query_ids:
            unknown_queries.setdefault(qid, line)
            unknown_query_lines += 1
          continue
        if doc is None:
          continue
        ranked = candidates[query_index[qid]]
        if doc in ranked:
          raise DataError(f'{path} line {line}: query {qid!r} ranks document {docid!r} again (line '
                          f'{ranked[doc][1]})')
        ranked[doc] = (value, line)
  except UnicodeDecodeError:
    raise files.not_utf8(path, 'run file') from None
  if not lines:
    raise DataError(f'run file {path} is empty')
  if unknown_queries or unknown_documents:
    parts = ([_unknown('query id', unknown_queries, unknown_query_lines, 'queries.jsonl')] if unknown_queries
             else []) + ([_unknown('document id', unknown_documents, unknown_document_lines, 'corpus.jsonl')]
                         if unknown_documents else [])
    raise DataError(f'{path}: ' + '; '.join(parts) + ': is it a run of this BEIR set?')
  missing = [q for q, ranked in zip(data.query_ids, candidates) if not ranked]
  if len(missing) == len(candidates):
    raise DataError(f'{path}: no line names a query that this split\'s qrels judge ({len(candidates)} queries, e.g. '
                    f'{data.query_ids[0]!r}): is it a run of this split?')
  if missing:
    named = ', '.join(map(repr, missing[:_NAMED])) + (', ...' if len(missing) > _NAMED else '')
    log(f'warning: {path}: {len(missing)} of the {len(candidates)} judged queries have no line ({named}): each '
        'retrieves nothing (0 for every metric, as trec_eval -c counts them)')
  width = min(k, max(len(ranked) for ranked in candidates))
  ids_qk = np.full((len(candidates), width), EMPTY, np.int32)
  for q, ranked in enumerate(candidates):
    best = sorted(ranked, key=lambda doc: (-ranked[doc][0], ranked[doc][1]))[:width]  # ties: file order
    ids_qk[q, :len(best)] = best
  return ids_qk


def write_run(path: str, data: BeirSet, ids_qk: np.ndarray, scores_qk: np.ndarray, tag: str = 'bert_jax') -> None:
  """Writes a ranking (corpus indices [Q, k] of `data`'s queries, best first, EMPTY skipped; their scores) as a
  TREC run, ranks from 1, atomically (compressed by the path's suffix)."""
  lines = []
  for q, (ids, scores) in enumerate(zip(np.asarray(ids_qk), np.asarray(scores_qk))):
    rank = 0
    for doc, score in zip(ids, scores):
      if doc == EMPTY:
        continue
      rank += 1
      line = f'{data.query_ids[q]} Q0 {data.corpus_ids[doc]} {rank} {float(score):.6f} {tag}\n'
      if len(line.split()) != len(FIELDS):
        raise DataError(f'query {data.query_ids[q]!r} or document {data.corpus_ids[doc]!r} holds whitespace: a '
                        'TREC run cannot name it')
      lines.append(line)
  files.write_bytes_atomic(path, ''.join(lines).encode('utf-8'), compress=True)
