"""Retrieval evaluation of an embedding function on a BEIR-layout set, the corpus embedded and searched block by
block: one block of corpus vectors and the running top-k of each size are all it holds, whatever the corpus size.

`embed` is any texts -> [n, D] function (e.g. `inference.embed` of a checkpoint, or a training run's model); the
queries are embedded once, each corpus block once, and every Matryoshka size is searched from the same block
(truncated and normalised again). `embed` is called with at most `batch_size` texts at a time, and a long evaluation
says where it is every 10 s with an ETA (`reporting.Ticker`, as the fine-tuning evaluation), counted in texts.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from bert_jax.embedding import quantization, search

from bert_jax.embedding import ranking as metrics

from bert_jax.model import pooling
from bert_jax.embedding.beir import BeirSet
from bert_jax.errors import ConfigError, DataError
from bert_jax.runs import reporting

_truncate = jax.jit(pooling.truncate, static_argnums=1)


def evaluate_retrieval(data: BeirSet, embed: Callable[[Sequence[str]], np.ndarray], *,
                       embed_queries: Callable[[Sequence[str]], np.ndarray] | None = None,
                       batch_size: int | None = None, dims: Sequence[int] | None = None,
                       block_size: int = search.DEFAULT_BLOCK_SIZE, recall_at: Sequence[int] = metrics.RECALL_AT,
                       cutoff: int = metrics.CUTOFF, mesh=None, label: str = 'evaluating retrieval',
                       normalize: bool = True, precisions: Sequence[str] = ()) -> dict:
  """recall@k, MRR@cutoff and nDCG@cutoff of `data`'s queries against its corpus (`metrics.ranking_metrics`).

  Args:
    data: a `beir.read_beir` set.
    embed: texts -> float [n, D] embeddings (the passages; the queries too unless `embed_queries` is given).
    embed_queries: the queries' embedding function, where a query is embedded otherwise (e.g. cut shorter).
    batch_size: texts per call of `embed` (default `block_size`): the grain of the progress lines.
    dims: Matryoshka sizes reported besides the full one ('matryoshka': {dim: metrics}).
    precisions: quantized precisions reported besides float32 ('precision': {name: metrics}), e.g. ('int8',
      'binary') (`quantization`): queries and passages quantized alike, int8 ranges calibrated on the queries and
      the first corpus block, binary ranked by Hamming distance.
    block_size: corpus texts searched at a time.
    mesh: search each block with its rows split over this mesh's devices (`search.StreamingTopK`).
    label: the progress lines' label.
    normalize: score by cosine (the vectors normalised); False: by the dot product of the vectors as given (sparse
      term weights: a block of vocabulary-sized vectors at a time), with no Matryoshka dims.

  Raises:
    DataError: `embed` returned another number of vectors than texts, or vectors of another width.
  """
  for p in precisions:
    quantization.check_precision(p)
  passages = data.passages()
  step = min(batch_size or block_size, block_size)
  ticker = reporting.Ticker(label, len(data.queries) + len(passages), unit='texts')
  done = 0

  def vectors(fn, texts):
    nonlocal done
    parts = []
    for start in range(0, max(len(texts), 1), step):  # no texts: one call, whose answer is checked too
      chunk = texts[start:start + step]
      out = np.asarray(fn(chunk), np.float32)
      if out.ndim != 2 or len(out) != len(chunk) or parts and out.shape[1] != parts[0].shape[1]:
        raise DataError(f'the embedding function returned {out.shape} for {len(chunk)} texts; expected [n, D]')
      parts.append(out)
      done += len(chunk)
      ticker.tick(done)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]

  if not normalize and dims:
    raise ConfigError('Matryoshka dims truncate normalised embeddings; normalize=False scores the vectors as given')
  cut = _truncate if normalize else (lambda x, _: x)
  queries_qd = vectors(embed_queries or embed, data.queries)
  full = queries_qd.shape[1]
  sizes = (full,) + tuple(int(d) for d in dims or ())
  k = max(tuple(recall_at) + (cutoff,))
  tops = {d: search.StreamingTopK(cut(queries_qd, d), k=k, block_size=block_size, mesh=mesh) for d in sizes}
  quantized, ranges = {}, None
  for start in range(0, len(passages), block_size):
    block_nd = vectors(embed, passages[start:start + block_size])
    for d, top in tops.items():
      top.add(cut(block_nd, d))
    if precisions and not quantized:  # the first block calibrates the int8 buckets
      ranges = quantization.calibration_ranges(np.concatenate([queries_qd, block_nd]))
      quantized = {p: search.StreamingTopK(quantization.search_vectors(queries_qd, p, ranges), k=k,
                                           block_size=block_size, mesh=mesh) for p in precisions}
    for p, top in quantized.items():
      top.add(quantization.search_vectors(block_nd, p, ranges))

  def scores(d):
    return metrics.ranking_metrics(tops[d].result()[1], data.qrels, recall_at=recall_at, cutoff=cutoff)

  out = scores(full)
  if dims:
    out['matryoshka'] = {d: scores(d) for d in sizes[1:]}
  if quantized:
    out['precision'] = {p: metrics.ranking_metrics(top.result()[1], data.qrels, recall_at=recall_at, cutoff=cutoff)
                        for p, top in quantized.items()}
  return out
