"""Retrieval metrics against a brute-force reference and hand computations; STS Spearman against scipy."""

import math

import numpy as np
import pytest

from bert_jax.embedding import ranking as metrics
from bert_jax.errors import ConfigError, DataError


def test_hand_computed_ranking_metrics():
  # Query 0: relevant {2: grade 2, 5: grade 1}, ranked [5, 1, 2, ...]; query 1: relevant {0}, not in its top 10.
  ranked = np.array([[5, 1, 2, 3, 4, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
  qrels = [{2: 2, 5: 1, 7: 0}, {0: 1}]
  got = metrics.ranking_metrics(ranked, qrels)
  assert got['recall@1'] == pytest.approx((1 / 2 + 0) / 2)
  assert got['recall@10'] == pytest.approx((2 / 2 + 0) / 2)
  assert got['mrr@10'] == pytest.approx((1 / 1 + 0) / 2)
  dcg = 1 / math.log2(2) + 2 / math.log2(4)  # grade 1 at rank 1, grade 2 at rank 3 (7 is judged 0: no gain)
  ideal = 2 / math.log2(2) + 1 / math.log2(3)
  assert got['ndcg@10'] == pytest.approx((dcg / ideal + 0) / 2)


def _reference(queries, corpus, qrels):
  """Brute force: every score, a stable descending sort (ties: lower index first), metrics by definition."""
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  order = np.argsort(-(unit(queries) @ unit(corpus).T), axis=1, kind='stable')
  out = {'recall@1': [], 'recall@10': [], 'mrr@10': [], 'ndcg@10': []}
  for ranking, judged in zip(order, qrels):
    relevant = {d for d, g in judged.items() if g > 0}
    out['recall@1'].append(len(relevant & set(ranking[:1])) / len(relevant))
    out['recall@10'].append(len(relevant & set(ranking[:10])) / len(relevant))
    ranks = [r for r, d in enumerate(ranking[:10], 1) if d in relevant]
    out['mrr@10'].append(1 / ranks[0] if ranks else 0.0)
    dcg = sum(judged.get(d, 0) / math.log2(r + 1) for r, d in enumerate(ranking[:10], 1))
    ideal = sum(g / math.log2(r + 1) for r, g in enumerate(sorted(judged.values(), reverse=True)[:10], 1))
    out['ndcg@10'].append(dcg / ideal)
  return {name: float(np.mean(v)) for name, v in out.items()}


def _norm_two_vectors(rng, n):
  """Vectors of 8 with four entries of +-1: norm 2, so normalising is exact and every cosine is an exact multiple
  of 1/4 in float32 as in float64 (many exact ties, ranked alike on both sides)."""
  x = np.zeros((n, 8), np.float32)
  for row in x:
    row[rng.choice(8, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
  return x


def _qrels(rng, num_queries, corpus_size):
  return [{int(d): int(rng.integers(1, 3)) for d in rng.choice(corpus_size, rng.integers(1, 5), replace=False)}
          for _ in range(num_queries)]


def test_retrieval_metrics_equal_a_brute_force_reference_with_ties():
  rng = np.random.default_rng(0)
  corpus, queries = _norm_two_vectors(rng, 61), _norm_two_vectors(rng, 17)  # 61: no multiple of the block size
  corpus[40] = corpus[4]
  qrels = _qrels(rng, 17, 61)
  got = metrics.retrieval_metrics(queries, corpus, qrels, block_size=8)
  ref = _reference(queries, corpus, qrels)
  assert got == pytest.approx(ref, abs=1e-12)
  # A stream of (normalised) blocks gives the same.
  streamed = metrics.retrieval_metrics(queries, (corpus[i:i + 8] / 2 for i in range(0, 61, 8)), qrels, block_size=8)
  assert streamed == got


def test_matryoshka_metrics_are_those_of_the_truncated_vectors():
  rng = np.random.default_rng(1)
  corpus, queries = rng.normal(size=(45, 8)), rng.normal(size=(11, 8))  # no ties
  qrels = _qrels(rng, 11, 45)
  got = metrics.retrieval_metrics(queries, corpus, qrels, dims=(4, 2), block_size=16)
  assert {k: v for k, v in got.items() if k != 'matryoshka'} == pytest.approx(_reference(queries, corpus, qrels))
  for dim in (4, 2):
    assert got['matryoshka'][dim] == pytest.approx(_reference(queries[:, :dim], corpus[:, :dim], qrels)), dim
  with pytest.raises(ConfigError, match='need the corpus as one array'):
    metrics.retrieval_metrics(queries, iter([corpus]), qrels, dims=(4,))


def test_a_query_without_a_relevant_document_is_an_error():
  with pytest.raises(DataError, match='query 1 has no relevant document'):
    metrics.ranking_metrics(np.zeros((2, 10), int), [{0: 1}, {3: 0}])
  with pytest.raises(DataError, match='2 rankings for 1 queries'):
    metrics.ranking_metrics(np.zeros((2, 10), int), [{0: 1}])


def test_sts_spearman_equals_scipy_of_the_cosines():
  stats = pytest.importorskip('scipy.stats')
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(30, 6)), rng.normal(size=(30, 6))
  gold = rng.integers(0, 5, 30).astype(float)  # ties among the gold scores
  cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
  assert metrics.sts_spearman(a, b, gold) == pytest.approx(stats.spearmanr(cos, gold).statistic, abs=1e-12)
  with pytest.raises(DataError, match='one gold score per pair'):
    metrics.sts_spearman(a, b, gold[:-1])
  with pytest.raises(DataError, match='at least two scored pairs'):
    metrics.sts_spearman(a[:1], b[:1], gold[:1])
