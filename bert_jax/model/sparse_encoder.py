"""The SPLADE encoder: one weight per vocabulary term from the masked-LM head's logits.

  w[v] = max over the text's real tokens t of log(1 + ReLU(logits[t, v]))

(SPLADE v2's max pooling; sentence-transformers' `SpladePooling(pooling_strategy='max', activation_function='relu')`).
The weights are >= 0 and most are exactly 0: a text is a sparse bag of (expanded) terms, and two texts score by the
dot product of their weights.

`SparseEncoder` is the encoder (`bert`, loaded from a checkpoint as for every head model) and the masked-LM head
(`mlm`, `heads.MaskedLMHead`: dense + GELU + LayerNorm, then the word-embedding matrix, tied, plus a bias). A
checkpoint with that head (a pretraining workdir, a BertForMaskedLM directory) brings it; one without (MiniLM) gets a
fresh one as Hugging Face's BertForMaskedLM does: the transform initialised like BERT's, the bias 0, the decoder the
word embeddings.

Its batch is the bi-encoder's (`model.biencoder`): query_*, passage_*, negative_* token ids and attention masks.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import ModelConfig
from bert_jax.model.biencoder import SIDES
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.heads import MaskedLMHead


def splade_pool(logits_btv: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
  """float32 [B, V]: the max over the real tokens (attention mask 1) of log(1 + ReLU(logits)).

  Padding contributes 0, which the max over values >= 0 never exceeds (a row without real tokens is all 0).
  """
  w_btv = jnp.log1p(jax.nn.relu(logits_btv.astype(jnp.float32)))
  return jnp.max(jnp.where(attention_mask_bt[..., None].astype(bool), w_btv, 0.0), axis=1)


class SparseEncoder(nnx.Module):
  """An encoder and its masked-LM head, pooled by `splade_pool` (`platform`: `BertEncoder`'s)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    self.mlm = MaskedLMHead(cfg, rngs=rngs, platform=platform)

  def weights(self, input_ids_bt, attention_mask_bt, *, deterministic: bool = True) -> jax.Array:
    """float32 [B, V] term weights of padded texts (token types 0: each text is encoded alone)."""
    seq_btd, _ = self.bert(input_ids_bt, jnp.zeros_like(input_ids_bt), attention_mask_bt,
                           deterministic=deterministic)
    logits_btv = self.mlm(seq_btd, self.bert.embeddings.word_embeddings)
    return splade_pool(logits_btv, attention_mask_bt)

  def embed(self, batch: dict[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
    """{'query': [B, V], 'passage': [B, V], and with negatives 'negative': [B, K, V]} term weights, float32."""
    out = {}
    for side in SIDES:
      if f'{side}_input_ids' not in batch:
        continue
      ids, mask = batch[f'{side}_input_ids'], batch[f'{side}_attention_mask']
      lead = ids.shape[:-1]
      w = self.weights(ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1]),
                       deterministic=deterministic)
      out[side] = w.reshape(*lead, w.shape[-1])
    return out
