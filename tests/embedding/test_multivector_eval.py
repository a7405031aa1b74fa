"""Exact MaxSim retrieval streamed over document blocks: the top-k of a brute-force score matrix, on one device and
with each block's documents split over 8 devices, and the metrics of a BEIR set through an embedding function."""

import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import multivector_eval, ranking
from bert_jax.embedding.beir import BeirSet
from bert_jax.errors import DataError


def _case(q=5, n=23, d=8, seed=0):
  rng = np.random.default_rng(seed)
  queries = rng.normal(size=(q, 4, d)).astype(np.float32)
  docs = rng.normal(size=(n, 6, d)).astype(np.float32)
  masks = (rng.random((n, 6)) < 0.6).astype(np.int32)
  masks[:, 0] = 1
  masks[7] = 0  # a document with nothing scored: 0
  docs[11] = docs[3]  # a tie: the lower index first
  masks[11] = masks[3]
  sim = np.einsum('qad,ntd->qnat', queries, docs)
  brute = np.where(masks[None, :, None, :].astype(bool), sim, -np.inf).max(-1)
  brute = np.where(np.isfinite(brute), brute, 0.0).sum(-1)
  return queries, docs, masks, brute


@pytest.mark.parametrize('devices', [1, 8])
def test_streamed_top_k_is_the_brute_force_top_k(devices):
  queries, docs, masks, brute = _case()
  mesh = sharding.make_mesh(config.MeshConfig(data=devices, fsdp=1, tensor=1)) if devices > 1 else None
  top = multivector_eval.StreamingMaxSim(queries, np.ones(queries.shape[:2], np.int32), k=10, block_size=8,
                                         query_chunk=2, mesh=mesh)
  for start in range(0, len(docs), 8):  # blocks of 8, the last of 7
    top.add(docs[start:start + 8], masks[start:start + 8])
  scores, ids = top.result()
  expected = np.argsort(-brute, axis=1, kind='stable')[:, :10]
  np.testing.assert_array_equal(ids, expected)
  np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), rtol=1e-5, atol=1e-5)


def test_evaluate_multivector_reads_the_beir_set_through_the_embedding_function():
  queries, docs, masks, brute = _case(q=3, n=12)
  data = BeirSet(corpus_ids=[str(i) for i in range(12)], titles=[''] * 12, texts=[f'd{i}' for i in range(12)],
                 query_ids=['0', '1', '2'], queries=['q0', 'q1', 'q2'], qrels=[{0: 1}, {5: 1, 6: 2}, {11: 1}])

  def embed(texts, side):
    rows = [int(t[1:]) for t in texts]
    return (queries[rows], np.ones((len(rows), 4), np.int32)) if side == 'query' else (docs[rows], masks[rows])

  got = multivector_eval.evaluate_multivector(data, embed, batch_size=4, block_size=5)
  ranked = np.argsort(-brute, axis=1, kind='stable')[:, :10]
  assert got == ranking.ranking_metrics(ranked, data.qrels)
  with pytest.raises(DataError, match='expected'):
    multivector_eval.evaluate_multivector(data, lambda texts, side: (np.zeros((1, 4, 8)), np.ones((1, 4))),
                                          batch_size=4)
