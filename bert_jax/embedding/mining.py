"""Hard-negative mining: for each query of a pairs file, K passages that an embedding model ranks high but that are
not one of its positives, searched exactly over a corpus (`search.StreamingTopK`: streamed in blocks, each block's
rows split over the mesh) — one code path, deterministic.

The semantics are sentence-transformers' `util.mine_hard_negatives` (6.2.0), so that the same model and settings
give the same negatives:

- Queries are the distinct query texts in first-appearance order; a query's positives are every distinct positive
  of its rows (several rows of one query: several positives), and none of them is ever a negative of that query.
- The corpus is the pairs' own positives, deduplicated in file order, or a given list of passages (deduplicated);
  every positive must be in a given corpus (sentence-transformers appends missing ones silently; here it is an
  error: a positive the corpus lacks is usually a corpus from another version of the data).
- Candidates: each query's top `range_max + P` passages by score (P: the most positives any query has), best first,
  ties broken by the lower corpus index. Removed from them: the query's positives, then those the margins refuse
  against the query's *lowest* positive score s+ (absolute: kept when score + m <= s+; relative: kept when
  score <= s+ - |s+| * m), then those above `max_score` or below `min_score`. The rank window is taken from what
  is left: skip the first `range_min`, keep up to rank `range_max`.
- Sampling 'top': the first K of the window; 'random': K drawn from the window with Python's `random` seeded once
  by `seed` (`random.Random(seed).sample(range(n), K)` per query in query order, n = max(window size, K): the draw
  sentence-transformers makes after `random.seed(seed)`), a draw past the window being a missing negative; the
  drawn ones sorted by score.
- A row keeps its negatives only when its query has all K (sentence-transformers' 'n-tuple' output drops the row
  too); the rows left short are counted in `Mined.stats` (`short_rows`) for the caller to report.

Scores are the model's own similarity: the dot product of the vectors `embed` returns (cosine when they are
normalised, as every sentence-transformers model's are by default; sentence-transformers' miner normalises any
model's vectors, so for a model that does not normalise the two differ).

Resuming: `BlockCache` keeps each embedded block (the queries' and the corpus's, `block_size` texts each) as a file
named by a digest of the model's identity and the block's texts, written atomically. A run killed at any point and
started again embeds only the blocks it had not finished, and since embedding a given block gives the same bytes,
writes the same output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import re
from typing import Callable, Sequence

import numpy as np

from bert_jax import files
from bert_jax.embedding import search
from bert_jax.embedding.pairs import Pair
from bert_jax.errors import ConfigError, DataError
from bert_jax.runs import reporting

SAMPLINGS = ('top', 'random')
LAYOUTS = ('negatives', 'pairs')
# The filters in the order they are applied (and counted): sentence-transformers' order.
FILTERS = ('absolute_margin', 'relative_margin', 'max_score', 'min_score')


@dataclasses.dataclass(frozen=True)
class MiningSpec:
  """What to mine (the module doc says how each is applied).

  Attributes:
    num_negatives: K, negatives per query.
    range_min: the best candidates skipped (after positives and the filters are removed).
    range_max: the last rank a negative may have.
    absolute_margin, relative_margin: a negative must score at most s+ - m, or at most s+ - |s+| * m (None: no
      such margin).
    max_score, min_score: a negative must score at most / at least this (None: no bound).
    sampling: 'top' or 'random'.
    seed: the random sampling's seed.
  """

  num_negatives: int = 3
  range_min: int = 0
  range_max: int = 50
  absolute_margin: float | None = None
  relative_margin: float | None = None
  max_score: float | None = None
  min_score: float | None = None
  sampling: str = 'top'
  seed: int = 0

  def check(self) -> None:
    """ConfigError for a window that cannot hold K negatives, an unknown sampling or a NaN bound."""
    if self.num_negatives < 1:
      raise ConfigError(f'num_negatives={self.num_negatives} must be at least 1')
    if self.range_min < 0:
      raise ConfigError(f'range_min={self.range_min} must be >= 0')
    if self.range_max - self.range_min < self.num_negatives:
      raise ConfigError(f'the rank window (range_min={self.range_min}, range_max={self.range_max}] holds '
                        f'{max(self.range_max - self.range_min, 0)} candidates, fewer than num_negatives='
                        f'{self.num_negatives}: raise range_max or lower range_min')
    if self.sampling not in SAMPLINGS:
      raise ConfigError(f'sampling must be one of {", ".join(SAMPLINGS)}, got {self.sampling!r}')
    for name in FILTERS:
      value = getattr(self, name)
      if value is not None and not np.isfinite(value):
        raise ConfigError(f'{name}={value} must be a finite number')


@dataclasses.dataclass(frozen=True)
class Grouped:
  """The pairs as mining sees them.

  Attributes:
    queries: distinct query texts, first-appearance order.
    corpus: the passages searched (distinct), corpus index = position.
    positives: per query, its distinct positives' corpus indices (first-appearance order).
    query_of_row, positive_of_row: per input row, its query's index and its positive's corpus index.
  """

  queries: list[str]
  corpus: list[str]
  positives: list[list[int]]
  query_of_row: np.ndarray
  positive_of_row: np.ndarray


def group(pairs: Sequence[Pair], corpus: Sequence[str] | None = None, corpus_name: str = 'the corpus',
          pairs_name: str = 'the pairs file') -> Grouped:
  """The distinct queries and their positives, and the corpus (the positives', or `corpus` deduplicated).

  Raises:
    DataError: no pairs; a given corpus that is empty or lacks a positive (the row's line).
  """
  if not pairs:
    raise DataError(f'{pairs_name} has no pairs to mine for')
  if corpus is None:
    texts = list(dict.fromkeys(p.positive for p in pairs))
  else:
    texts = list(dict.fromkeys(corpus))
    if not texts:
      raise DataError(f'{corpus_name} has no passages')
  index = {t: i for i, t in enumerate(texts)}
  queries: dict[str, int] = {}
  positives: list[list[int]] = []
  query_of_row, positive_of_row = [], []
  for p in pairs:
    if p.positive not in index:
      raise DataError(f'{pairs_name}:{p.line}: the positive is not in {corpus_name} ({p.positive[:60]!r}...): '
                      'give the corpus the pairs were drawn from, or leave the corpus out to mine among the '
                      "pairs' own passages")
    q = queries.setdefault(p.query, len(queries))
    if q == len(positives):
      positives.append([])
    if index[p.positive] not in positives[q]:
      positives[q].append(index[p.positive])
    query_of_row.append(q)
    positive_of_row.append(index[p.positive])
  return Grouped(list(queries), texts, positives, np.array(query_of_row, np.int64),
                 np.array(positive_of_row, np.int64))


def prepare(pairs: Sequence[Pair], spec: MiningSpec, corpus: Sequence[str] | None = None,
            corpus_name: str = 'the corpus', pairs_name: str = 'the pairs file') -> Grouped:
  """`group`, with the spec checked against the corpus: what `mine` refuses, found before any embedding.

  Raises:
    ConfigError: a bad spec, or a rank window that reaches past the corpus (range_max plus the most positives of a
      query > the corpus's size: sentence-transformers pads such a window with missing candidates).
    DataError: what `group` refuses.
  """
  spec.check()
  g = group(pairs, corpus, corpus_name, pairs_name)
  n, most = len(g.corpus), max(len(p) for p in g.positives)
  if spec.range_max + most > n:
    raise ConfigError(f'the rank window reaches rank range_max={spec.range_max}, but {corpus_name} holds {n} '
                      f'passages, {most} of them positives of one query: {n - most} candidates at most; lower '
                      f'range_max to {max(n - most, 0)} or less, or give a larger corpus')
  return g


@dataclasses.dataclass(frozen=True)
class Mined:
  """What `mine` found.

  Attributes:
    grouped: the queries, corpus and positives (`group`).
    negatives: per query, the chosen negatives' corpus indices, best first (fewer than K: short).
    negative_scores: per query, their scores.
    positive_scores: per input row, its query's score of its positive.
    stats: counts: rows, queries, corpus, candidates (after positives), removed by each filter, short_queries,
      short_rows.
  """

  grouped: Grouped
  spec: MiningSpec
  negatives: list[np.ndarray]
  negative_scores: list[np.ndarray]
  positive_scores: np.ndarray
  stats: dict

  def complete(self, row: int) -> bool:
    """Whether input row `row`'s query has all K negatives."""
    return len(self.negatives[self.grouped.query_of_row[row]]) == self.spec.num_negatives

  def negative_rows(self, pairs: Sequence[Pair], scores: bool = False) -> list[dict]:
    """The retrieval task's layout, one row per input row with all K negatives, in file order:
    {'query', 'positive', 'negatives': [K texts]} (+ 'scores': [positive's, then each negative's])."""
    out = []
    corpus = self.grouped.corpus
    for r, p in enumerate(pairs):
      if not self.complete(r):
        continue
      q = self.grouped.query_of_row[r]
      row = {'query': p.query, 'positive': p.positive, 'negatives': [corpus[i] for i in self.negatives[q]]}
      if scores:
        row['scores'] = [float(self.positive_scores[r])] + [float(s) for s in self.negative_scores[q]]
      out.append(row)
    return out

  def pair_rows(self, scores: bool = False) -> list[dict]:
    """Labelled pairs for a cross-encoder, query by query (first-appearance order): each distinct positive
    (label 1), then each negative found (label 0, however many: as sentence-transformers' 'labeled-pair'):
    {'query', 'passage', 'label'} (+ 'score')."""
    g, out = self.grouped, []
    first_row = {}
    for r, q in enumerate(g.query_of_row):
      first_row.setdefault((int(q), int(g.positive_of_row[r])), r)
    for q, query in enumerate(g.queries):
      for c in g.positives[q]:
        row = {'query': query, 'passage': g.corpus[c], 'label': 1}
        if scores:
          row['score'] = float(self.positive_scores[first_row[(q, c)]])
        out.append(row)
      for c, s in zip(self.negatives[q], self.negative_scores[q]):
        row = {'query': query, 'passage': g.corpus[int(c)], 'label': 0}
        if scores:
          row['score'] = float(s)
        out.append(row)
    return out


class BlockCache:
  """Embedded blocks of texts kept in `directory` (local or remote), one .npy file each, named by the block's kind
  and index and a digest of `identity` (the model and its embedding settings: the caller's fingerprint) and the
  block's texts; written atomically, so a block file is whole or absent. A different model or corpus never reads
  another's blocks (their names differ)."""

  _NAME = re.compile(r'^(queries|corpus)_\d{6}_[0-9a-f]{16}\.npy(\.tmp)?$')

  def __init__(self, directory: str, identity: str):
    self.directory, self.identity = directory, identity
    self.hits = 0

  def _path(self, kind: str, index: int, texts: Sequence[str]) -> str:
    digest = hashlib.sha256(json.dumps([self.identity, list(texts)], ensure_ascii=False).encode()).hexdigest()
    return os.path.join(self.directory, f'{kind}_{index:06d}_{digest[:16]}.npy')

  def vectors(self, kind: str, index: int, texts: Sequence[str],
              embed: Callable[[Sequence[str]], np.ndarray]) -> np.ndarray:
    """Block `index` of `kind` ('queries' or 'corpus'): read when cached, else `embed(texts)`, then cached."""
    path = self._path(kind, index, texts)
    if files.isfile(path):
      with files.open(path, 'rb') as f:
        out = np.load(io.BytesIO(f.read()), allow_pickle=False)
      if out.ndim == 2 and len(out) == len(texts):
        self.hits += 1
        return out
    out = embed(texts)
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(out, np.float32), allow_pickle=False)
    files.write_bytes_atomic(path, buffer.getvalue())
    return out

  def remove(self) -> None:
    """Deletes the block files (this class's names only) and the directory when that leaves it empty."""
    if not files.isdir(self.directory):
      return
    for name in files.listdir(self.directory):
      if self._NAME.match(name):
        files.remove(os.path.join(self.directory, name))
    if not files.listdir(self.directory):
      files.rmdir(self.directory)


def _embedded(embed, texts: Sequence[str], batch_size: int):
  """`embed` over `texts` at most `batch_size` at a time, checked: float32 [n, D]."""
  parts = []
  for start in range(0, len(texts), batch_size):
    chunk = texts[start:start + batch_size]
    out = np.asarray(embed(chunk), np.float32)
    if out.ndim != 2 or len(out) != len(chunk) or parts and out.shape[1] != parts[0].shape[1]:
      raise DataError(f'the embedding function returned {out.shape} for {len(chunk)} texts; expected [n, D]')
    parts.append(out)
  return np.concatenate(parts) if len(parts) > 1 else parts[0]


def mine(pairs: Sequence[Pair], embed: Callable[[Sequence[str]], np.ndarray], spec: MiningSpec, *,
         corpus: Sequence[str] | None = None, block_size: int = search.DEFAULT_BLOCK_SIZE,
         batch_size: int | None = None, mesh=None, cache: BlockCache | None = None, label: str = 'mining',
         corpus_name: str = 'the corpus', pairs_name: str = 'the pairs file') -> Mined:
  """Hard negatives for `pairs` (the module doc: the semantics).

  Args:
    pairs: (query, positive) rows (`pairs.read_pairs`; their negatives, if any, are ignored).
    embed: texts -> float [n, D] vectors; queries and passages alike.
    spec: what to mine.
    corpus: the passages to search (None: the pairs' positives).
    block_size: texts embedded, cached and searched at a time.
    batch_size: texts per `embed` call (default `block_size`): the grain of the progress lines.
    mesh: split each corpus block over this mesh's devices (`search.StreamingTopK`).
    cache: embedded blocks kept for a rerun (`BlockCache`), or None.
    label: the progress lines' label.
    corpus_name, pairs_name: how errors name the inputs (their paths).

  Raises:
    ConfigError, DataError: what `prepare` refuses; DataError: an embedding function that returns the wrong shape.
  """
  g = prepare(pairs, spec, corpus, corpus_name, pairs_name)
  n, most = len(g.corpus), max(len(p) for p in g.positives)
  step = min(batch_size or block_size, block_size)
  ticker = reporting.Ticker(f'{label}: embedding', len(g.queries) + n, unit='texts')
  done = 0

  def block(kind, index, texts):
    nonlocal done
    fn = lambda t: _embedded(embed, t, step)
    out = cache.vectors(kind, index, texts, fn) if cache else fn(texts)
    done += len(texts)
    ticker.tick(done)
    return out

  queries_qd = np.concatenate([block('queries', i, g.queries[s:s + block_size])
                               for i, s in enumerate(range(0, len(g.queries), block_size))])
  k = spec.range_max + most
  # Compiled at the corpus's size when it is smaller than a block: the padding of a short last block is scored too.
  top = search.StreamingTopK(queries_qd, k=k, block_size=min(block_size, n), mesh=mesh)
  # Each row's positive score as its block passes (the corpus is never held whole): float32 dot products.
  by_positive = np.argsort(g.positive_of_row, kind='stable')
  sorted_positives = g.positive_of_row[by_positive]
  positive_scores = np.zeros(len(g.query_of_row), np.float32)
  for i, s in enumerate(range(0, n, block_size)):
    block_nd = block('corpus', i, g.corpus[s:s + block_size])
    if block_nd.shape[1] != queries_qd.shape[1]:
      raise DataError(f'the embedding function returned vectors of width {block_nd.shape[1]} for passages and '
                      f'{queries_qd.shape[1]} for queries')
    top.add(block_nd)
    rows = by_positive[np.searchsorted(sorted_positives, s):np.searchsorted(sorted_positives, s + len(block_nd))]
    positive_scores[rows] = np.einsum('nd,nd->n', queries_qd[g.query_of_row[rows]],
                                      block_nd[g.positive_of_row[rows] - s])
  scores_qk, ids_qk = top.result()
  lowest = np.full(len(g.queries), np.inf, np.float32)
  np.minimum.at(lowest, g.query_of_row, positive_scores)
  return _select(g, spec, scores_qk, ids_qk, positive_scores, lowest)


def _select(g: Grouped, spec: MiningSpec, scores_qk, ids_qk, positive_scores, lowest) -> Mined:
  """The negatives of each query from its candidates (best first): the filters, the window, the sampling."""
  removed = dict.fromkeys(('positives',) + FILTERS, 0)
  draw = random.Random(spec.seed)
  negatives, negative_scores, candidates = [], [], 0
  for q in range(len(g.queries)):
    ids, scores = ids_qk[q], scores_qk[q].astype(np.float32)
    keep = ~np.isin(ids, g.positives[q])
    removed['positives'] += int((~keep).sum())
    candidates += int(keep.sum())
    s_pos = np.float32(lowest[q])
    tests = {
        'absolute_margin': lambda m: scores + np.float32(m) > s_pos,
        'relative_margin': lambda m: scores > s_pos - np.abs(s_pos) * np.float32(m),
        'max_score': lambda m: scores > np.float32(m),
        'min_score': lambda m: scores < np.float32(m),
    }
    for name in FILTERS:
      value = getattr(spec, name)
      if value is not None:
        out = keep & tests[name](value)
        removed[name] += int(out.sum())
        keep &= ~out
    window = np.flatnonzero(keep)[:spec.range_max][spec.range_min:]
    if spec.sampling == 'top':
      chosen = window[:spec.num_negatives]
    else:
      drawn = draw.sample(range(max(len(window), spec.num_negatives)), k=spec.num_negatives)
      chosen = np.array([window[i] for i in drawn if i < len(window)], np.int64)
      chosen = chosen[np.lexsort((chosen, -scores[chosen]))] if len(chosen) else chosen  # by score, then rank
    negatives.append(ids[chosen].astype(np.int64))
    negative_scores.append(scores[chosen])
  short = [len(x) < spec.num_negatives for x in negatives]
  stats = {'rows': len(g.query_of_row), 'queries': len(g.queries), 'corpus': len(g.corpus),
           'candidates': candidates, 'removed': {k: v for k, v in removed.items() if k == 'positives' or
                                                 getattr(spec, k) is not None},
           'short_queries': int(sum(short)), 'short_rows': int(sum(short[q] for q in g.query_of_row))}
  return Mined(g, spec, negatives, negative_scores, positive_scores, stats)


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
  """`rows` as JSONL, written atomically (compressed as the path's suffix names)."""
  text = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in rows)
  files.write_bytes_atomic(path, text.encode('utf-8'), compress=True)
