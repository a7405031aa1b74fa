"""The first stage of a two-stage retrieval: each query's top k documents of a BEIR set, for a cross-encoder to
rerank (the rerank task's evaluation, `finetuning.rerank`; experiments/rerank.py).

A first stage is either
  an embedding model directory (a retrieval workdir, a Hugging Face or sentence-transformers directory): the queries
    and the corpus embedded by the one embedding core (`embedding.encoding`, with the pooling and length the
    directory records, as experiments/embed.py embeds; always normalised: cosine similarity), and each query's top k
    by exact search (`embedding.search`, over the mesh when given);
  or a TREC run file (`embedding.trec`): its scores, its top k per query.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from bert_jax import files
from bert_jax.embedding import encoding, search, trec
from bert_jax.embedding.beir import BeirSet
from bert_jax.errors import DataError
from bert_jax.interop import pretrained as pretrained_lib
from bert_jax.runs import reporting

WHAT = ('an embedding model directory (a retrieval workdir, a Hugging Face or sentence-transformers directory) or a '
        'TREC run file (qid Q0 docid rank score tag per line)')


def is_run_file(first_stage: str) -> bool:
  """Whether `first_stage` names a file (a TREC run) rather than a directory (an embedding model)."""
  return not files.isdir(first_stage) and files.isfile(first_stage)


def check(first_stage: str, what: str = 'first_stage') -> None:
  """DataError when `first_stage` is neither a directory nor a file (a local path; a remote one is read later)."""
  if files.is_remote(first_stage) or files.isdir(first_stage):
    return
  files.check_regular(first_stage, what)
  if not files.isfile(first_stage):
    raise DataError(f'{what} {first_stage} does not exist; give {WHAT}')


def embedder(directory: str, batch_size: int, log=reporting.log) -> Callable[[Sequence[str]], np.ndarray]:
  """texts -> normalised embeddings [n, D] of the embedding model in `directory`, as experiments/embed.py embeds
  them (`encoding.embedding_settings`: the pooling and length it records; normalised whatever it records)."""
  model = pretrained_lib.load_encoder(directory)
  settings = encoding.embedding_settings(directory, model, normalize=True, log=lambda _: None)
  log(f'first stage {directory}: {settings.pooling} pooling, normalised, max_length {settings.max_seq_length}'
      + (f' (from {settings.origin})' if settings.origin else ''))

  def embed(texts: Sequence[str]) -> np.ndarray:
    return encoding.embed(model, [(t, None) for t in texts], max_length=settings.max_seq_length,
                          batch_size=batch_size, pooling=settings.pooling, normalize=True,
                          sentence_only=True)['sentence_embedding']

  return embed


def retrieve(directory: str, data: BeirSet, k: int, batch_size: int, mesh=None,
             log=reporting.log) -> tuple[np.ndarray, np.ndarray]:
  """(corpus indices [Q, min(k, N)], their cosine similarities) of each query of `data` by the embedding model in
  `directory`, best first (ties: lower corpus index)."""
  embed = embedder(directory, batch_size, log)
  scores, ids = search.exact_top_k(embed(data.queries), embed(data.passages()), k=k, mesh=mesh)
  return ids, scores


def ranking(first_stage: str, data: BeirSet, k: int, batch_size: int, mesh=None, log=reporting.log) -> np.ndarray:
  """Each query's top `k` corpus indices [Q, <= k] of `data` by `first_stage` (a directory or a run file), best
  first; trec.EMPTY past a query's candidates.

  Raises:
    DataError: a missing first stage, or a bad run file (`trec.read_run`).
    CheckpointError: a directory that holds no model.
  """
  check(first_stage)
  if is_run_file(first_stage):
    log(f'first stage {first_stage}: a TREC run, each query\'s top {k} by its scores')
    return trec.read_run(first_stage, data, k, log=log)
  return retrieve(first_stage, data, k, batch_size, mesh, log)[0]
