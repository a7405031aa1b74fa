"""A contrastive batch through the encoder: queries, positive passages and hard negatives to embeddings.

The batch holds padded token ids per side (token types are all 0: each text is encoded alone):

  query_input_ids, query_attention_mask        int [B, T_q]
  passage_input_ids, passage_attention_mask    int [B, T_p]
  negative_input_ids, negative_attention_mask  int [B, K, T_p]  (optional: K hard negatives per query)

`embed_fn` turns a module into the pure (params, micro_batch, key) -> embeddings function that `gradcache` (and the
uncached step) differentiate: the dropout streams are reseeded from `key` inside it, so the masks are a function of
the key alone and a recomputation with the same key draws the same ones.
"""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax

from bert_jax.embedding.pooling import sentence_embedding

SIDES = ('query', 'passage', 'negative')


def embed_batch(encoder, batch: dict[str, jax.Array], *, pooling: str, normalize: bool = True,
                deterministic: bool = True) -> dict[str, jax.Array]:
  """{'query': [B, D], 'passage': [B, D], and with negatives 'negative': [B, K, D]}, float32.

  The encoder runs once per side (query, passage, negatives flattened to [B * K, T]); with dropout each call draws
  its own masks (the module's dropout stream advances between calls).
  """
  out = {}
  for side in SIDES:
    if f'{side}_input_ids' not in batch:
      continue
    ids, mask = batch[f'{side}_input_ids'], batch[f'{side}_attention_mask']
    lead = ids.shape[:-1]
    ids, mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
    emb = sentence_embedding(encoder, ids, jax.numpy.zeros_like(ids), mask, pooling=pooling, normalize=normalize,
                             deterministic=deterministic)
    out[side] = emb.reshape(*lead, emb.shape[-1])
  return out


def embed_fn(graphdef: nnx.GraphDef, rest: Any, *, pooling: str, normalize: bool = True, train: bool = True):
  """The pure embedding function of an encoder split as `nnx.split(encoder, nnx.Param, ...)`.

  Args:
    graphdef, rest: the encoder's graph and non-parameter state (its dropout RNG streams), e.g. as pure dicts.
    pooling: 'mean' or 'cls'.
    train: dropout on (masks drawn from the key), else deterministic.

  Returns:
    (params, batch, key) -> `embed_batch` of the merged encoder, its dropout streams reseeded from `key`.
  """
  def fn(params, batch, key):
    encoder = nnx.merge(graphdef, params, rest)
    if train:
      nnx.reseed(encoder, dropout=key)
    return embed_batch(encoder, batch, pooling=pooling, normalize=normalize, deterministic=not train)
  return fn
