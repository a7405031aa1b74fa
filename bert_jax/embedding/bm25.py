"""BM25, the classic lexical baseline, over a BEIR set's passages, and reciprocal rank fusion of rankings.

BM25 is Lucene's (as Anserini and Pyserini score it): idf = log(1 + (N - df + 0.5) / (df + 0.5)), a term's weight
tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)), defaults k1 = 0.9, b = 0.4 (Pyserini's for BEIR). Texts are
lower-cased and split into words (`\\w+`, Unicode-aware); no stemming or stop words, so it is the plain baseline,
not a tuned one. The index is an inverted list per term (numpy arrays), and each query scores only the documents
its terms occur in.

Reciprocal rank fusion (Cormack et al. 2009): a document's fused score is the sum over rankings of 1 / (k + rank),
rank counted from 1, k = 60; a document absent from a ranking adds nothing. It needs no score calibration, which is
why hybrid dense + lexical (or + sparse) search uses it.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Sequence

import numpy as np

from bert_jax.embedding.trec import EMPTY

_WORD = re.compile(r'\w+')


def words(text: str) -> list[str]:
  return _WORD.findall(text.lower())


class BM25:
  """An index of `docs` (texts); `search` gives each query's top-k document indices and scores."""

  def __init__(self, docs: Sequence[str], k1: float = 0.9, b: float = 0.4):
    self.k1, self.b = k1, b
    postings: dict[str, dict[int, int]] = collections.defaultdict(dict)
    lengths = np.zeros(len(docs), np.float64)
    for i, doc in enumerate(docs):
      tokens = words(doc)
      lengths[i] = len(tokens)
      for term, count in collections.Counter(tokens).items():
        postings[term][i] = count
    n, avgdl = len(docs), float(lengths.mean()) if len(docs) else 0.0
    norm = k1 * (1 - b + b * lengths / max(avgdl, 1e-9))
    self.num_docs = n
    self.index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for term, docs_tf in postings.items():
      ids = np.fromiter(docs_tf, np.int64, len(docs_tf))
      tf = np.fromiter(docs_tf.values(), np.float64, len(docs_tf))
      idf = math.log(1 + (n - len(ids) + 0.5) / (len(ids) + 0.5))
      self.index[term] = ids, idf * tf * (k1 + 1) / (tf + norm[ids])

  def scores(self, query: str) -> np.ndarray:
    """Every document's score for `query` [num_docs] (a repeated query word counts once per occurrence)."""
    out = np.zeros(self.num_docs, np.float64)
    for term in words(query):
      if term in self.index:
        ids, weights = self.index[term]
        out[ids] += weights
    return out

  def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """([Q, k] document indices, [Q, k] scores), best first; ties by document order; a document no query word
    matches is not retrieved (EMPTY, score 0)."""
    ids = np.full((len(queries), k), EMPTY, np.int64)
    scores = np.zeros((len(queries), k), np.float64)
    for q, query in enumerate(queries):
      s = self.scores(query)
      order = np.argsort(-s, kind='stable')[:k]
      order = order[s[order] > 0]
      ids[q, :len(order)], scores[q, :len(order)] = order, s[order]
    return ids, scores


def reciprocal_rank_fusion(rankings: Sequence[np.ndarray], k: int = 60, depth: int = 100) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
  """The fused top-`depth` ([Q, depth] indices, fused scores) of rankings [Q, k_i] (EMPTY slots ignored); ties by
  the order documents first appear in (the first ranking's first)."""
  num_queries = len(rankings[0])
  ids = np.full((num_queries, depth), EMPTY, np.int64)
  fused = np.zeros((num_queries, depth), np.float64)
  for q in range(num_queries):
    total: dict[int, float] = {}
    for ranking in rankings:
      for rank, doc in enumerate(ranking[q], start=1):
        if doc != EMPTY:
          total[int(doc)] = total.get(int(doc), 0.0) + 1.0 / (k + rank)
    best = sorted(total.items(), key=lambda item: -item[1])[:depth]  # stable: first appearance breaks ties
    ids[q, :len(best)] = [d for d, _ in best]
    fused[q, :len(best)] = [s for _, s in best]
  return ids, fused
