"""Exact top-k retrieval streamed over corpus blocks: the query x corpus score matrix is never whole.

Each block of corpus vectors is scored against all queries ([Q, block] at a time) and merged into a running top-k
([Q, k]) inside one jitted function compiled once (the last block is padded to the block size). Memory is
O(Q * (k + block)) besides the vectors themselves, whatever the corpus size, and a corpus may arrive as an iterable
of blocks (embedded on the fly, read from disk) so that it is never held whole either.

Ties: among equal scores the lower corpus index (file order) ranks first. `jax.lax.top_k` puts the lower position
first among equals, and the running top-k (earlier blocks, lower indices, already in that order) sits before the
new block in what is merged, so this holds across blocks: the result equals a stable descending sort of the full
score matrix (`numpy.argsort(-scores, kind='stable')`). (trec_eval, which BEIR calls, breaks ties by document id
string instead; with real-valued embeddings exact ties are rare.)

On a mesh (`mesh=`), each block's rows are split over every device of the mesh: a device scores the queries
against its rows only, keeps its own top-k, and the devices' candidates are gathered and merged into the running
top-k (`_sharded_merge`, a shard_map). A device then holds 1/devices of each block, and the result is the one-device
result exactly, ties included (a device's rows are a contiguous run of the block, gathered in device order).
"""

from __future__ import annotations

import functools
from typing import Iterable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from bert_jax.errors import ConfigError, DataError

DEFAULT_BLOCK_SIZE = 8192


@functools.partial(jax.jit, static_argnames=('k',))
def _merge_block(top_scores_qk, top_ids_qk, queries_qd, block_nd, offset, num_valid, *, k: int):
  """The running top-k merged with one block's scores; rows of the block at or past `num_valid` are padding."""
  scores_qn = jnp.einsum('qd,nd->qn', queries_qd, block_nd, preferred_element_type=jnp.float32)
  return merge_scores(top_scores_qk, top_ids_qk, scores_qn, offset, num_valid, k=k)


def merge_scores(top_scores_qk, top_ids_qk, scores_qn, offset, num_valid, *, k: int):
  """The running top-k ([Q, k] scores and corpus indices) merged with a block's scores [Q, n] (any scoring: dot
  products here, MaxSim in `embedding.multivector_eval`), the block's first row at corpus index `offset`; columns
  at or past `num_valid` are padding. Traceable (call it inside a jitted function)."""
  n = scores_qn.shape[1]
  scores_qn = jnp.where(jnp.arange(n)[None, :] < num_valid, scores_qn, -jnp.inf)
  ids_qn = jnp.broadcast_to(offset + jnp.arange(n, dtype=jnp.int32), scores_qn.shape)
  scores_qm = jnp.concatenate([top_scores_qk, scores_qn], axis=1)  # running entries first: they win ties
  ids_qm = jnp.concatenate([top_ids_qk, ids_qn], axis=1)
  top_scores_qk, where_qk = jax.lax.top_k(scores_qm, k)
  return top_scores_qk, jnp.take_along_axis(ids_qm, where_qk, axis=1)


@functools.lru_cache(maxsize=None)
def _sharded_merge(mesh: Mesh, k: int):
  """`_merge_block` with the block's rows split over all of `mesh`'s devices (a device's rows: a contiguous run)."""
  axes = tuple(mesh.axis_names)

  def local(top_scores_qk, top_ids_qk, queries_qd, block_nd, offset, num_valid):
    n = block_nd.shape[0]  # this device's rows
    first = jax.lax.axis_index(axes) * n
    scores_qn = jnp.einsum('qd,nd->qn', queries_qd, block_nd, preferred_element_type=jnp.float32)
    scores_qn = jnp.where((first + jnp.arange(n))[None, :] < num_valid, scores_qn, -jnp.inf)
    ids_qn = jnp.broadcast_to(offset + first + jnp.arange(n, dtype=jnp.int32), scores_qn.shape)
    mine_qk, where_qk = jax.lax.top_k(scores_qn, min(k, n))  # a global top-k entry is in its device's top-k
    mine_ids_qk = jnp.take_along_axis(ids_qn, where_qk, axis=1)
    # Every device's candidates in device order (= corpus order), after the running entries: ties keep lower ids.
    scores_qm = jnp.concatenate([top_scores_qk, jax.lax.all_gather(mine_qk, axes, axis=1, tiled=True)], axis=1)
    ids_qm = jnp.concatenate([top_ids_qk, jax.lax.all_gather(mine_ids_qk, axes, axis=1, tiled=True)], axis=1)
    top_scores_qk, where_qk = jax.lax.top_k(scores_qm, k)
    return top_scores_qk, jnp.take_along_axis(ids_qm, where_qk, axis=1)

  # The merged top-k is the same on every device (it is computed from the gathered candidates), which the varying
  # manual axes cannot tell (all_gather's result is typed as varying): hence check_vma=False.
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P(axes, None), P(), P()),
                               out_specs=(P(), P()), check_vma=False))


def _blocks(corpus, block_size: int):
  if isinstance(corpus, (np.ndarray, jax.Array)):
    return (corpus[i:i + block_size] for i in range(0, corpus.shape[0], block_size))
  return iter(corpus)


class StreamingTopK:
  """The running exact top-k of fixed queries over corpus blocks added in corpus order (`exact_top_k` streams
  one; several of them share one pass over a corpus, e.g. one per Matryoshka size of the same embedded block).

  Raises (from __init__ and add):
    ConfigError: k or block_size < 1, or a block larger than block_size.
    DataError: vectors whose width differs from the queries'.
  """

  def __init__(self, queries_qd, *, k: int, block_size: int = DEFAULT_BLOCK_SIZE, mesh: Mesh | None = None):
    if k < 1 or block_size < 1:
      raise ConfigError(f'k and block_size must be positive, got k={k} block_size={block_size}')
    self.mesh = mesh if mesh is not None and mesh.size > 1 else None
    place = (lambda x: jax.device_put(x, NamedSharding(self.mesh, P()))) if self.mesh else jnp.asarray
    self.queries_qd = place(jnp.asarray(queries_qd, jnp.float32))
    q = self.queries_qd.shape[0]
    self.k, self.block_size, self.size = k, block_size, 0
    # The compiled block: block_size rows, on a mesh rounded up to a multiple of its devices.
    self._rows = block_size if not self.mesh else -(-block_size // self.mesh.size) * self.mesh.size
    self._scores, self._ids = place(jnp.full((q, k), -jnp.inf, jnp.float32)), place(jnp.full((q, k), -1, jnp.int32))

  def add(self, block_nd) -> None:
    """Scores the next `block_nd` [n, D] (n <= block_size) of the corpus and merges it in."""
    block_nd = np.asarray(block_nd, np.float32) if not isinstance(block_nd, jax.Array) else block_nd
    d, n = self.queries_qd.shape[1], block_nd.shape[0]
    if block_nd.ndim != 2 or block_nd.shape[1] != d:
      raise DataError(f'corpus vectors {tuple(block_nd.shape)} do not match the queries\' width {d}')
    if n > self.block_size:
      raise ConfigError(f'a corpus block of {n} rows exceeds block_size={self.block_size}')
    if n == 0:
      return
    if self.mesh:
      host_nd = np.zeros((self._rows, d), np.float32)  # one compiled shape: the short (last) block padded
      host_nd[:n] = np.asarray(block_nd, np.float32)
      spread = NamedSharding(self.mesh, P(tuple(self.mesh.axis_names), None))
      block_nd = jax.make_array_from_callback(host_nd.shape, spread, lambda index: host_nd[index])
      self._scores, self._ids = _sharded_merge(self.mesh, self.k)(self._scores, self._ids, self.queries_qd,
                                                                  block_nd, np.int32(self.size), np.int32(n))
    else:
      if n < self._rows:  # one compiled shape: pad the short (last) block
        block_nd = jnp.pad(jnp.asarray(block_nd, jnp.float32), ((0, self._rows - n), (0, 0)))
      self._scores, self._ids = _merge_block(self._scores, self._ids, self.queries_qd, block_nd,
                                             jnp.int32(self.size), jnp.int32(n), k=self.k)
    self.size += n

  def result(self) -> tuple[np.ndarray, np.ndarray]:
    """(float32 scores [Q, min(k, N)], int32 corpus indices [Q, min(k, N)]), best first; ties: lower index first.

    Raises:
      DataError: no corpus vector was added.
    """
    if not self.size:
      raise DataError('the corpus is empty: nothing to retrieve')
    kept = min(self.k, self.size)
    return np.asarray(self._scores[:, :kept]), np.asarray(self._ids[:, :kept])


def exact_top_k(queries_qd, corpus: np.ndarray | jax.Array | Iterable[np.ndarray], *, k: int,
                block_size: int = DEFAULT_BLOCK_SIZE, mesh: Mesh | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The k highest dot-product scores of each query over the corpus, and their corpus indices, best first.

  Args:
    queries_qd: [Q, D] query vectors (normalised: cosine similarity).
    corpus: [N, D] corpus vectors, or an iterable of blocks [n_i, D] (each at most `block_size` rows) in corpus
      order: indices count rows across blocks.
    k: results per query; min(k, N) come back.
    block_size: corpus rows scored at a time (the padded shape every block is compiled at).
    mesh: split each block's rows over this mesh's devices (None: one device).

  Returns:
    (float32 scores [Q, min(k, N)], int32 corpus indices [Q, min(k, N)]); ties: lower index first.

  Raises:
    ConfigError: k or block_size < 1, or a block larger than block_size.
    DataError: an empty corpus, or vectors whose width differs from the queries'.
  """
  top = StreamingTopK(queries_qd, k=k, block_size=block_size, mesh=mesh)
  for block_nd in _blocks(corpus, block_size):
    top.add(block_nd)
  return top.result()
