"""Exact streamed top-k against a full numpy sort, ties and ragged blocks included."""

import numpy as np
import pytest

from bert_jax.embedding import search
from bert_jax.errors import ConfigError, DataError

from harness.numerics import tolerance


def _reference(queries, corpus, k):
  scores = queries.astype(np.float64) @ corpus.astype(np.float64).T
  order = np.argsort(-scores, axis=1, kind='stable')[:, :k]  # ties: the lower corpus index first
  return np.take_along_axis(scores, order, axis=1), order


def test_equals_a_full_sort_with_ties_and_a_block_size_that_does_not_divide_the_corpus():
  rng = np.random.default_rng(0)
  # Small integer vectors: exact float scores, many ties, some across block boundaries.
  queries = rng.integers(-2, 3, (9, 4)).astype(np.float32)
  corpus = rng.integers(-2, 3, (50, 4)).astype(np.float32)
  corpus[37] = corpus[3]  # an exact duplicate in another block
  scores, ids = search.exact_top_k(queries, corpus, k=10, block_size=7)
  ref_scores, ref_ids = _reference(queries, corpus, 10)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_array_equal(scores, ref_scores)
  # The same as a stream of ragged blocks, and at other block sizes.
  blocks = [corpus[:5], corpus[5:12], corpus[12:13], corpus[13:]]
  np.testing.assert_array_equal(search.exact_top_k(queries, blocks, k=10, block_size=37)[1], ref_ids)
  for block_size in (1, 50, 64):
    np.testing.assert_array_equal(search.exact_top_k(queries, corpus, k=10, block_size=block_size)[1], ref_ids)


def test_k_above_the_corpus_size_returns_the_whole_corpus_ranked():
  rng = np.random.default_rng(1)
  queries, corpus = rng.normal(size=(3, 5)), rng.normal(size=(4, 5))
  scores, ids = search.exact_top_k(queries, corpus, k=10, block_size=3)
  assert ids.shape == (3, 4)
  np.testing.assert_array_equal(ids, _reference(queries, corpus, 4)[1])
  np.testing.assert_allclose(scores, _reference(queries, corpus, 4)[0], atol=tolerance(np.float32, 5, magnitude=4))


def test_bad_inputs_raise_one_clear_error():
  q = np.ones((2, 3), np.float32)
  with pytest.raises(DataError, match='corpus is empty'):
    search.exact_top_k(q, np.zeros((0, 3), np.float32), k=1)
  with pytest.raises(DataError, match='do not match the queries\' width 3'):
    search.exact_top_k(q, np.ones((4, 2), np.float32), k=1)
  with pytest.raises(ConfigError, match='exceeds block_size=2'):
    search.exact_top_k(q, [np.ones((3, 3), np.float32)], k=1, block_size=2)
  with pytest.raises(ConfigError, match='must be positive'):
    search.exact_top_k(q, np.ones((4, 3), np.float32), k=0)


def test_a_mesh_splits_each_block_over_its_devices_and_gives_the_one_device_result():
  """8 fake devices as data x fsdp x tensor = 2 x 2 x 2: each block's rows spread over all of them; the scores and
  ids equal the full sort's, ties across devices and a short last block included."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import config, sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(config.MeshConfig(data=2, fsdp=2, tensor=2))
  assert mesh.size == 8 == len(jax.devices())
  rng = np.random.default_rng(2)
  queries = rng.integers(-2, 3, (5, 4)).astype(np.float32)
  corpus = rng.integers(-2, 3, (45, 4)).astype(np.float32)
  corpus[40] = corpus[1]  # the same vector on another device, in another block
  ref_scores, ref_ids = _reference(queries, corpus, 12)
  for block_size in (16, 20, 64):  # 20: rounded up to 24 rows, 3 per device
    scores, ids = search.exact_top_k(queries, corpus, k=12, block_size=block_size, mesh=mesh)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)
  blocks = [corpus[:3], corpus[3:19], corpus[19:]]
  np.testing.assert_array_equal(search.exact_top_k(queries, blocks, k=12, block_size=26, mesh=mesh)[1], ref_ids)
