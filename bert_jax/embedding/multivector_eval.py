"""Exact MaxSim retrieval evaluation of a multi-vector encoder on a BEIR-layout set, streamed over document blocks.

The queries' token vectors are embedded once ([Q, T_q, D]); the corpus is embedded `block_size` documents at a time,
each block scored against every query by exact MaxSim (`model.colbert.maxsim`, `query_chunk` queries at a time so
that the [queries, documents, T_q, T_d] similarities stay small) and merged into the running top-k
(`search.merge_scores`, the dense search's merge: ties keep the lower corpus index). A block's token vectors and the
running top-k are all it holds of the corpus, whatever its size. On a mesh each block's documents are split over its
devices (the block is placed sharded along its documents; XLA partitions the scores by document and gathers the
top-k). Metrics: `ranking.ranking_metrics` (recall@k, MRR@10, nDCG@10), as the dense retrieval task reports them.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from bert_jax.embedding import ranking, search
from bert_jax.embedding.beir import BeirSet
from bert_jax.errors import DataError
from bert_jax.model.colbert import maxsim
from bert_jax.runs import reporting

DEFAULT_BLOCK_SIZE = 256  # documents per block: a block holds [block, T_d, D] token vectors
QUERY_CHUNK = 64

# texts, side ('query' or 'passage') -> (float vectors [n, T, D], score mask [n, T])
TokenEmbed = Callable[[Sequence[str], str], tuple[np.ndarray, np.ndarray]]


@functools.partial(jax.jit, static_argnames=('k',))
def _merge_block(top_scores_qk, top_ids_qk, queries_cqtd, queries_mask_cqt, docs_ntd, docs_mask_nt, offset,
                 num_valid, *, k: int):
  """The running top-k merged with one block's MaxSim scores (queries in chunks [C, chunk, T_q, D])."""
  scores_cqn = jax.lax.map(lambda qm: maxsim(qm[0], qm[1], docs_ntd, docs_mask_nt),
                           (queries_cqtd, queries_mask_cqt))
  scores_qn = scores_cqn.reshape(-1, scores_cqn.shape[-1])[:top_scores_qk.shape[0]]
  return search.merge_scores(top_scores_qk, top_ids_qk, scores_qn, offset, num_valid, k=k)


class StreamingMaxSim:
  """The running exact MaxSim top-k of fixed queries over document blocks added in corpus order."""

  def __init__(self, queries_qtd, queries_mask_qt, *, k: int, block_size: int = DEFAULT_BLOCK_SIZE,
               query_chunk: int = QUERY_CHUNK, mesh=None):
    q = queries_qtd.shape[0]
    chunk = max(1, min(query_chunk, q))
    pad = -q % chunk
    queries_qtd = np.concatenate([queries_qtd, np.zeros((pad,) + queries_qtd.shape[1:], np.float32)])
    queries_mask_qt = np.concatenate([queries_mask_qt, np.zeros((pad,) + queries_mask_qt.shape[1:],
                                                                queries_mask_qt.dtype)])
    self.mesh = mesh if mesh is not None and mesh.size > 1 else None
    self._place = (lambda x: jax.device_put(x, NamedSharding(self.mesh, P()))) if self.mesh else jnp.asarray
    self.queries = self._place(queries_qtd.reshape(-1, chunk, *queries_qtd.shape[1:]).astype(np.float32))
    self.queries_mask = self._place(queries_mask_qt.reshape(-1, chunk, queries_mask_qt.shape[-1]))
    self.k, self.size = k, 0
    self._rows = block_size if not self.mesh else -(-block_size // self.mesh.size) * self.mesh.size
    self._scores = self._place(jnp.full((q, k), -jnp.inf, jnp.float32))
    self._ids = self._place(jnp.full((q, k), -1, jnp.int32))

  def add(self, docs_ntd: np.ndarray, docs_mask_nt: np.ndarray) -> None:
    """Scores the next documents' token vectors [n, T_d, D] (score mask [n, T_d]) and merges them in."""
    n = docs_ntd.shape[0]
    if n > self._rows:
      raise DataError(f'a block of {n} documents exceeds the block size {self._rows}')
    if n == 0:
      return
    docs = np.zeros((self._rows,) + docs_ntd.shape[1:], np.float32)  # one compiled shape per document width
    docs[:n] = docs_ntd
    mask = np.zeros((self._rows, docs_mask_nt.shape[1]), np.int32)
    mask[:n] = docs_mask_nt
    if self.mesh:
      axes = tuple(self.mesh.axis_names)
      docs = jax.device_put(docs, NamedSharding(self.mesh, P(axes, None, None)))
      mask = jax.device_put(mask, NamedSharding(self.mesh, P(axes, None)))
    self._scores, self._ids = _merge_block(self._scores, self._ids, self.queries, self.queries_mask, docs, mask,
                                           np.int32(self.size), np.int32(n), k=self.k)
    self.size += n

  def result(self) -> tuple[np.ndarray, np.ndarray]:
    """(float32 scores, int32 corpus indices), [Q, min(k, N)] each, best first."""
    if not self.size:
      raise DataError('the corpus is empty: nothing to retrieve')
    kept = min(self.k, self.size)
    return np.asarray(self._scores[:, :kept]), np.asarray(self._ids[:, :kept])


def _stack(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  """Token vectors and masks of several batches as one, padded to the widest (padding unscored)."""
  width = max(v.shape[1] for v, _ in parts)
  vectors = np.concatenate([np.pad(v, ((0, 0), (0, width - v.shape[1]), (0, 0))) for v, _ in parts])
  masks = np.concatenate([np.pad(m, ((0, 0), (0, width - m.shape[1]))) for _, m in parts])
  return vectors, masks


def evaluate_multivector(data: BeirSet, embed: TokenEmbed, *, batch_size: int, block_size: int = DEFAULT_BLOCK_SIZE,
                         recall_at: Sequence[int] = ranking.RECALL_AT, cutoff: int = ranking.CUTOFF, mesh=None,
                         label: str = 'evaluating multi-vector retrieval') -> dict[str, float]:
  """recall@k, MRR@cutoff and nDCG@cutoff of `data`'s queries against its corpus by exact MaxSim.

  Args:
    embed: texts, side -> (token vectors [n, T, D], score masks [n, T]); called with at most `batch_size` texts.
    block_size: documents scored at a time.
    mesh: split each block's documents over this mesh's devices.

  Raises:
    DataError: `embed` returned another number of rows than texts.
  """
  passages = data.passages()
  block_size = max(block_size, batch_size)
  ticker = reporting.Ticker(label, len(data.queries) + len(passages), unit='texts')
  done = 0

  def vectors(texts, side):
    nonlocal done
    parts = []
    for start in range(0, len(texts), batch_size):
      chunk = texts[start:start + batch_size]
      v, m = embed(chunk, side)
      if v.ndim != 3 or len(v) != len(chunk) or m.shape != v.shape[:2]:
        raise DataError(f'the token embedding function returned {v.shape} and {m.shape} for {len(chunk)} texts; '
                        'expected [n, T, D] and [n, T]')
      parts.append((np.asarray(v, np.float32), np.asarray(m)))
      done += len(chunk)
      ticker.tick(done)
    return _stack(parts)

  k = max(tuple(recall_at) + (cutoff,))
  top = StreamingMaxSim(*vectors(list(data.queries), 'query'), k=k, block_size=block_size, mesh=mesh)
  for start in range(0, len(passages), block_size):
    top.add(*vectors(passages[start:start + block_size], 'passage'))
  return ranking.ranking_metrics(top.result()[1], data.qrels, recall_at=recall_at, cutoff=cutoff)
