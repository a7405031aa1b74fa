"""Retrieval and STS metrics, as BEIR and MTEB report them, in plain numpy.

Retrieval (per query, then the mean over queries): a document is relevant when its qrels score is > 0, and
  recall@k  = relevant documents in the top k / all relevant documents of the query
  MRR@k     = 1 / rank of the first relevant document in the top k (0 if none)
  nDCG@k    = DCG@k / ideal DCG@k with DCG = sum over ranks i <= k of gain_i / log2(i + 1), gain = the qrels score
              (linear gains, as trec_eval's ndcg_cut that BEIR uses; negative scores count as 0)
STS: Spearman's rank correlation of the cosine similarities against the gold scores (ties share their mean rank,
as scipy's spearmanr).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.embedding import search

from bert_jax.model import pooling
from bert_jax.errors import ConfigError, DataError
from bert_jax.metrics import spearman

RECALL_AT = (1, 10)
_truncate = jax.jit(pooling.truncate, static_argnums=1)  # one compilation per shape, not one per operation
CUTOFF = 10  # MRR@10 and nDCG@10


def ranking_metrics(ranked_ids_qk: np.ndarray, qrels: Sequence[Mapping[int, float]], *,
                    recall_at: Sequence[int] = RECALL_AT, cutoff: int = CUTOFF) -> dict[str, float]:
  """Mean recall@k (each k of `recall_at`), MRR@cutoff and nDCG@cutoff over the queries.

  Args:
    ranked_ids_qk: int [Q, K] corpus indices per query, best first (K >= max(recall_at + (cutoff,)) unless the
      corpus is smaller).
    qrels: per query, corpus index -> graded relevance; each query needs at least one score > 0.

  Raises:
    DataError: the number of queries differs, or a query has no relevant document.
  """
  ranked_ids_qk = np.asarray(ranked_ids_qk)
  if len(ranked_ids_qk) != len(qrels):
    raise DataError(f'{len(ranked_ids_qk)} rankings for {len(qrels)} queries\' relevance judgements')
  recall = {k: np.zeros(len(qrels)) for k in recall_at}
  mrr, ndcg = np.zeros(len(qrels)), np.zeros(len(qrels))
  discounts = 1.0 / np.log2(np.arange(2, cutoff + 2))
  for i, (ranked, judged) in enumerate(zip(ranked_ids_qk, qrels)):
    gains = np.array([max(float(judged.get(int(doc), 0.0)), 0.0) for doc in ranked])
    num_relevant = sum(1 for g in judged.values() if g > 0)
    if not num_relevant:
      raise DataError(f'query {i} has no relevant document (no qrels score > 0)')
    for k in recall_at:
      recall[k][i] = np.count_nonzero(gains[:k] > 0) / num_relevant
    hits = np.flatnonzero(gains[:cutoff] > 0)
    mrr[i] = 1.0 / (hits[0] + 1) if hits.size else 0.0
    dcg = float(np.dot(gains[:cutoff], discounts[:len(gains[:cutoff])]))
    ideal = np.sort([max(float(g), 0.0) for g in judged.values()])[::-1][:cutoff]
    ndcg[i] = dcg / float(np.dot(ideal, discounts[:len(ideal)]))
  out = {f'recall@{k}': float(recall[k].mean()) for k in recall_at}
  out[f'mrr@{cutoff}'] = float(mrr.mean())
  out[f'ndcg@{cutoff}'] = float(ndcg.mean())
  return out


def retrieval_metrics(queries_qd, corpus, qrels: Sequence[Mapping[int, float]], *,
                      dims: Sequence[int] | None = None, recall_at: Sequence[int] = RECALL_AT,
                      cutoff: int = CUTOFF, block_size: int = search.DEFAULT_BLOCK_SIZE) -> dict:
  """Ranking metrics of queries against a corpus by exact cosine top-k (`search.exact_top_k`).

  Args:
    queries_qd: [Q, D] query embeddings (normalised here, as the corpus array: cosine similarity).
    corpus: [N, D] corpus embeddings, or an iterable of already normalised blocks (`search.exact_top_k`; then
      without `dims`: a stream is read once).
    qrels: per query, corpus index -> graded relevance.
    dims: Matryoshka sizes to report besides the full one (vectors truncated and normalised again).

  Returns:
    {'recall@1', 'recall@10', 'mrr@10', 'ndcg@10'} at the full size and, with dims, 'matryoshka': {dim: the same}.
  """
  k = max(tuple(recall_at) + (cutoff,))
  queries_qd = np.asarray(queries_qd, np.float32)
  whole = isinstance(corpus, (np.ndarray, jax.Array))
  if dims and not whole:
    raise ConfigError('Matryoshka dims need the corpus as one array (a stream of blocks is read once)')

  def at(dim):
    q = _truncate(queries_qd, dim)
    c = _truncate(jnp.asarray(corpus, jnp.float32), dim) if whole else corpus
    _, ids = search.exact_top_k(q, c, k=k, block_size=block_size)
    return ranking_metrics(ids, qrels, recall_at=recall_at, cutoff=cutoff)

  out = at(queries_qd.shape[1])
  if dims:
    out['matryoshka'] = {int(d): at(int(d)) for d in dims}
  return out


def sts_spearman(a_nd, b_nd, gold_n) -> float:
  """Spearman correlation of cos(a_i, b_i) with the gold scores; nan when either side is constant.

  Raises:
    DataError: fewer than two pairs, or mismatched lengths.
  """
  a_nd, b_nd, gold_n = np.asarray(a_nd, np.float64), np.asarray(b_nd, np.float64), np.asarray(gold_n, np.float64)
  if not len(a_nd) == len(b_nd) == len(gold_n):
    raise DataError(f'STS needs one gold score per pair: {len(a_nd)} and {len(b_nd)} texts, {len(gold_n)} scores')
  if len(gold_n) < 2:
    raise DataError(f'STS needs at least two scored pairs, got {len(gold_n)}')
  norms = np.maximum(np.linalg.norm(a_nd, axis=1) * np.linalg.norm(b_nd, axis=1), 1e-12)
  return spearman(np.sum(a_nd * b_nd, axis=1) / norms, gold_n)
