"""Retrieval evaluation from texts, the corpus streamed in blocks, equals the metrics of the whole matrices."""

import numpy as np
import pytest

from bert_jax.embedding import metrics
from bert_jax.embedding.beir import BeirSet
from bert_jax.embedding.evaluation import evaluate_retrieval
from bert_jax.errors import DataError


def _set_and_embed(num_docs=23, num_queries=7, width=8, seed=0):
  rng = np.random.default_rng(seed)
  table = {}
  docs = [f'doc {i}' for i in range(num_docs)]
  queries = [f'query {i}' for i in range(num_queries)]
  for text in docs + queries:
    table[text] = rng.normal(size=width).astype(np.float32)
  qrels = [{int(d): int(rng.integers(1, 3)) for d in rng.choice(num_docs, 2, replace=False)}
           for _ in range(num_queries)]
  data = BeirSet(corpus_ids=[str(i) for i in range(num_docs)], titles=[''] * num_docs, texts=docs,
                 query_ids=[str(i) for i in range(num_queries)], queries=queries, qrels=qrels)
  calls = []

  def embed(texts):
    calls.append(len(texts))
    return np.stack([table[t] for t in texts])

  return data, embed, calls, table


def test_streamed_evaluation_equals_the_whole_matrices_at_every_size():
  data, embed, calls, table = _set_and_embed()
  got = evaluate_retrieval(data, embed, dims=(4, 2), block_size=5)
  assert calls == [7, 5, 5, 5, 5, 3]  # the queries, then the corpus five texts at a time, each embedded once
  q = np.stack([table[t] for t in data.queries])
  c = np.stack([table[t] for t in data.texts])
  assert got == metrics.retrieval_metrics(q, c, data.qrels, dims=(4, 2), block_size=5)


def test_an_embedding_function_of_the_wrong_shape_is_an_error():
  data, _, _, _ = _set_and_embed()
  with pytest.raises(DataError, match=r'returned \(6, 8\) for 7 texts'):
    evaluate_retrieval(data, lambda texts: np.zeros((len(texts) - 1, 8)))
