"""Quantized embeddings (embedding.quantization) against sentence-transformers' `quantize_embeddings`, and the
retrieval evaluation at each precision against a brute-force ranking of the quantized vectors."""

import hashlib
import os

import numpy as np
import pytest

from bert_jax.embedding import beir, quantization, ranking
from bert_jax.embedding.retrieval_eval import evaluate_retrieval
from bert_jax.errors import ConfigError

from harness.inputs import REPO


def test_every_precision_is_sentence_transformers_bytes():
  st = pytest.importorskip('sentence_transformers.util.quantization')
  rng = np.random.default_rng(0)
  x = rng.normal(size=(50, 37)).astype(np.float32)  # 37: the last packed byte partly filled
  calibration = rng.normal(size=(80, 37)).astype(np.float32)
  ranges = quantization.calibration_ranges(calibration)
  for precision in quantization.PRECISIONS:
    ours, theirs = quantization.quantize(x, precision), st.quantize_embeddings(x, precision)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), precision
    if precision.endswith('int8'):
      assert np.array_equal(quantization.quantize(x, precision, ranges),
                            st.quantize_embeddings(x, precision, calibration_embeddings=calibration))
  with pytest.raises(ConfigError, match='choose one of float32, int8, uint8, binary, ubinary'):
    quantization.quantize(x, 'int4')
  with pytest.raises(ConfigError, match='at least 2 calibration embeddings'):
    quantization.quantize(x[:1], 'int8')


def test_binary_search_vectors_rank_by_hamming_distance():
  rng = np.random.default_rng(1)
  q, d = rng.normal(size=(5, 64)), rng.normal(size=(9, 64))
  packed_q, packed_d = quantization.quantize(q, 'ubinary'), quantization.quantize(d, 'ubinary')
  hamming = np.unpackbits(packed_q[:, None, :] ^ packed_d[None, :, :], axis=-1).sum(-1).astype(np.int64)
  dots = quantization.search_vectors(q, 'binary') @ quantization.search_vectors(d, 'binary').T
  np.testing.assert_array_equal(dots, 64 - 2 * hamming)


def _embed(texts):
  """A deterministic stand-in encoder: a vector from each text's hash, plus a shared direction by word overlap."""
  out = []
  for t in texts:
    seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], 'little')
    v = np.random.default_rng(seed).normal(size=24)
    for w in t.lower().split()[:6]:
      v += np.random.default_rng(int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], 'little')).normal(size=24)
    out.append(v / np.linalg.norm(v))
  return np.array(out, np.float32)


def test_the_evaluation_reports_each_precision_as_a_brute_force_ranking():
  data = beir.read_beir(os.path.join(REPO, 'data', 'samples', 'retrieval', 'beir'))
  result = evaluate_retrieval(data, _embed, precisions=('int8', 'binary'), block_size=4096)
  plain = evaluate_retrieval(data, _embed)
  assert {k: v for k, v in result.items() if k != 'precision'} == plain
  queries, passages = _embed(data.queries), _embed(data.passages())
  ranges = quantization.calibration_ranges(np.concatenate([queries, passages]))  # one block: all of it
  for precision in ('int8', 'binary'):
    scores = (quantization.search_vectors(queries, precision, ranges)
              @ quantization.search_vectors(passages, precision, ranges).T)
    top = np.argsort(-scores, axis=1, kind='stable')[:, :max(ranking.RECALL_AT + (ranking.CUTOFF,))]
    assert result['precision'][precision] == ranking.ranking_metrics(top, data.qrels)
  with pytest.raises(ConfigError, match="precision 'fp8'"):
    evaluate_retrieval(data, _embed, precisions=('fp8',))
