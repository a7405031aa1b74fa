"""The SPLADE objective: the ranking loss on sparse term weights plus the FLOPS regularisers of queries and documents.

  loss = InfoNCE(dot products / temperature)                    (`contrastive.info_nce`, normalize=False)
       + factor * query_weight * FLOPS(query weights)
       + factor * document_weight * FLOPS(positive and hard-negative weights)
  FLOPS(w [N, V]) = sum over v of (mean over the N texts of w[:, v])^2
  factor = min(1, step / warmup_steps)^2                        (1 without a warm-up)

— sentence-transformers' `SpladeLoss(SparseMultipleNegativesRankingLoss(scale=1 / temperature), ...)` with its
`FlopsLoss` regularisers and the quadratic `SpladeRegularizerWeightSchedulerCallback` (which sets the weights at
each step from the step about to be taken, counted from 0). The ranking loss is the dense bi-encoder's, over the
global batch (every query against every positive and hard negative, duplicates masked), and the FLOPS means are
over the global batch too: the loss of 8 devices is one device's.

The factor comes with the batch (`regularizer_factor`, [B], every row the step's value): the data position is the
step, so a resumed run regularises exactly as an uninterrupted one. The loss couples the batch's rows (both terms),
so gradient accumulation runs GradCache (`couples_rows`).

`encode` gives a loaded `model.sparse_encoder.SparseEncoder`'s term weights of texts, and `top_terms` a readable
{token: weight} of one text's largest ones (experiments/embed.py on a sparse workdir writes them).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.embedding.contrastive import info_nce
from bert_jax.embedding.encoding import bucket_length


def regularizer_factor(step: int, warmup_steps: int) -> float:
  """min(1, step / warmup_steps)^2; 1 without a warm-up (warmup_steps 0)."""
  if warmup_steps <= 0:
    return 1.0
  return min(1.0, step / warmup_steps) ** 2


def flops(w_nv: jax.Array, valid_n: jax.Array | None = None) -> jax.Array:
  """sum over v of (the mean over the valid rows of w[:, v])^2, float32 (padding rows, valid 0, left out)."""
  w_nv = w_nv.astype(jnp.float32)
  if valid_n is None:
    return jnp.sum(jnp.square(jnp.mean(w_nv, axis=0)))
  valid_n = valid_n.astype(jnp.float32)
  mean_v = jnp.sum(w_nv * valid_n[:, None], axis=0) / jnp.maximum(jnp.sum(valid_n), 1.0)
  return jnp.sum(jnp.square(mean_v))


def nonzero(w_nv: jax.Array) -> jax.Array:
  """float32 [N]: each row's number of non-zero weights."""
  return jnp.sum(w_nv != 0, axis=-1).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class SparseRanking:
  """The `train.step.Objective` of a `model.sparse_encoder.SparseEncoder` (or any module with `embed(batch,
  deterministic)` giving term weights)."""

  temperature: float = 1.0
  query_weight: float = 0.0
  document_weight: float = 0.0
  terms: tuple[str, ...] = ('ranking', 'query_flops', 'document_flops')
  couples_rows: bool = True

  def embed(self, module, batch, *, deterministic: bool) -> dict[str, jax.Array]:
    return module.embed(batch, deterministic=deterministic)

  def head(self, module, embeddings) -> dict[str, Any]:
    del module
    return {'embeddings': embeddings}

  def forward(self, module, batch, *, deterministic: bool):
    return self.head(module, self.embed(module, batch, deterministic=deterministic))

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    e = outputs['embeddings']
    valid_b = batch['weights'].astype(jnp.float32)
    out = info_nce(e['query'], e['passage'], e.get('negative'), temperature=self.temperature,
                   passage_ids_b=batch.get('passage_ids'), negative_ids_bk=batch.get('negative_ids'),
                   query_ids_b=batch.get('query_ids'), valid_b=valid_b, normalize=False)
    documents_nv, valid_n = e['passage'], valid_b
    if 'negative' in e:
      k = e['negative'].shape[1]
      documents_nv = jnp.concatenate([documents_nv, e['negative'].reshape(-1, documents_nv.shape[-1])])
      valid_n = jnp.concatenate([valid_b, jnp.repeat(valid_b, k)])
    factor = jnp.max(batch['regularizer_factor']) if 'regularizer_factor' in batch else jnp.float32(1.0)
    query_flops, document_flops = flops(e['query'], valid_b), flops(documents_nv, valid_n)
    count = jnp.sum(valid_b)
    return {'ranking_loss_sum': jnp.sum(out['loss']), 'ranking_count': count,
            'query_flops_loss_sum': factor * self.query_weight * query_flops,
            'document_flops_loss_sum': factor * self.document_weight * document_flops,
            'query_flops_sum': query_flops * count, 'document_flops_sum': document_flops * count,
            'correct_sum': jnp.sum(out['correct'] * valid_b),
            'query_nonzero_sum': jnp.sum(nonzero(e['query']) * valid_b),
            'document_nonzero_sum': jnp.sum(nonzero(documents_nv) * valid_n), 'document_count': jnp.sum(valid_n)}

  def counts(self, batch) -> dict[str, jax.Array]:
    # The FLOPS terms are already means over the batch: each counts once.
    return {'ranking': jnp.sum(batch['weights'].astype(jnp.float32)), 'query_flops': jnp.float32(1.0),
            'document_flops': jnp.float32(1.0)}

  def summarize(self, sums) -> dict[str, Any]:
    count = jnp.maximum(sums['ranking_count'], 1.0)
    ranking = sums['ranking_loss_sum'] / count
    return {'loss': ranking + sums['query_flops_loss_sum'] + sums['document_flops_loss_sum'],
            'ranking_loss': ranking, 'accuracy': sums['correct_sum'] / count,
            'query_flops': sums['query_flops_sum'] / count, 'document_flops': sums['document_flops_sum'] / count,
            'query_nonzero': sums['query_nonzero_sum'] / count,
            'document_nonzero': sums['document_nonzero_sum'] / jnp.maximum(sums['document_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _weights(graphdef, state, input_ids_bt, attention_mask_bt):
  return nnx.merge(graphdef, state).weights(input_ids_bt, attention_mask_bt)


def encode(encoder, tokenizer, texts: Sequence[str], *, max_length: int, batch_size: int = 32) -> np.ndarray:
  """float32 [n, V]: the term weights of `texts` (each cut to `max_length` tokens) by `encoder` (a
  `model.sparse_encoder.SparseEncoder` holding its parameters), `batch_size` texts at a time, padded to length
  buckets."""
  graphdef, state = nnx.split(encoder)
  out = []
  for start in range(0, len(texts), batch_size):
    rows = [tokenizer.encode_inputs(t, None, max_length=max_length)[0] for t in texts[start:start + batch_size]]
    width = bucket_length(max(map(len, rows)), max_length)
    ids = np.full((batch_size, width), tokenizer.pad_id, np.int32)
    mask = np.zeros((batch_size, width), np.int32)
    for i, row in enumerate(rows):
      ids[i, :len(row)], mask[i, :len(row)] = row, 1
    out.append(np.asarray(_weights(graphdef, state, ids, mask))[:len(rows)])
  return np.concatenate(out) if out else np.zeros((0, encoder.bert.embeddings.word_embeddings.embedding.shape[0]),
                                                  np.float32)


def top_terms(w_v: np.ndarray, tokenizer, k: int) -> dict[str, float]:
  """{token: weight} of the `k` largest non-zero weights of one text, largest first (ties: lower id first)."""
  order = np.argsort(-w_v, kind='stable')[:k]
  return {tokenizer.id_to_token(int(i)): round(float(w_v[i]), 4) for i in order if w_v[i] > 0}
