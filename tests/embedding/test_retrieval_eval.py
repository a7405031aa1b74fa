"""Retrieval evaluation from texts, the corpus streamed in blocks, equals the metrics of the whole matrices; a long
one says where it is."""

import types

import numpy as np
import pytest

from bert_jax.embedding import ranking as metrics
from bert_jax.embedding.beir import BeirSet
from bert_jax.embedding.retrieval_eval import evaluate_retrieval
from bert_jax.errors import DataError
from bert_jax.runs import reporting


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
  assert calls == [5, 2, 5, 5, 5, 5, 3]  # the queries, then the corpus, five texts at a time, each embedded once
  q = np.stack([table[t] for t in data.queries])
  c = np.stack([table[t] for t in data.texts])
  assert got == metrics.retrieval_metrics(q, c, data.qrels, dims=(4, 2), block_size=5)


def test_an_embedding_function_of_the_wrong_shape_is_an_error():
  data, _, _, _ = _set_and_embed()
  with pytest.raises(DataError, match=r'returned \(6, 8\) for 7 texts'):
    evaluate_retrieval(data, lambda texts: np.zeros((len(texts) - 1, 8)))


def test_the_queries_have_their_own_function_and_texts_come_in_batches():
  data, embed, calls, _ = _set_and_embed()
  queries = []
  got = evaluate_retrieval(data, embed, embed_queries=lambda texts: queries.append(len(texts)) or embed(texts),
                           batch_size=4, block_size=10)
  assert queries == [4, 3] and calls == [4, 3, 4, 4, 2, 4, 4, 2, 3]  # blocks of 10 passages, cut in batches of 4
  assert got == evaluate_retrieval(data, embed)


def test_a_long_evaluation_says_where_it_is_with_an_eta(monkeypatch):
  """The fine-tuning evaluation's progress lines (reporting.Ticker), counted in texts: one every 10 s and one at
  the end; a short evaluation says nothing."""
  data, embed, _, _ = _set_and_embed()  # 7 queries and 23 passages
  clock, lines = [0.0], []
  monkeypatch.setattr(reporting, 'time', types.SimpleNamespace(perf_counter=lambda: clock[0]))
  monkeypatch.setattr(reporting, 'log', lines.append)

  def slow(seconds):
    def timed(texts):
      clock[0] += seconds
      return embed(texts)
    return timed

  evaluate_retrieval(data, slow(4.0), batch_size=5, block_size=10)  # 4 s a batch: 5, 7, 12, 17, 22, 27, 30 texts
  assert lines == ['evaluating retrieval: 12/30 texts | elapsed 12s | ETA 18s',
                   'evaluating retrieval: 27/30 texts | elapsed 24s | ETA 2s',
                   'evaluating retrieval: 30/30 texts | elapsed 28s | ETA 0s']
  lines.clear()
  evaluate_retrieval(data, slow(1.0), batch_size=5, block_size=10)
  assert lines == []
