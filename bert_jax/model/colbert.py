"""The multi-vector (ColBERT) encoder: one vector per token, scored by MaxSim.

`MultiVectorEncoder` is the encoder (`bert`, so a checkpoint's encoder loads as for every head model) and a linear
projection without bias (`projection`, hidden size -> `MultiVectorSpec.projection_dim`) of every token's output,
L2-normalised: sentence-transformers' `MultiVectorEncoder` pipeline (Transformer, a token-level Dense, MultiVectorMask,
a token-level Normalize), to which `interop.st_multivector` exports it.

Each side of a batch holds, besides the encoder's ids and attention mask, a scoring mask (`<side>_score_mask`): which
token vectors MaxSim reads. It differs from the attention mask on both sides (`embedding.late_interaction` makes
them): a query's expansion [MASK] tokens are scored but not attended to, a document's punctuation is attended to but
not scored.

  query_input_ids, query_attention_mask, query_score_mask              int [B, T_q]
  passage_input_ids, passage_attention_mask, passage_score_mask        int [B, T_p]
  negative_input_ids, negative_attention_mask, negative_score_mask     int [B, K, T_p]  (optional)

MaxSim (`maxsim`): for each query token the largest dot product with a scored document token, summed over the scored
query tokens, in float32.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.model.biencoder import SIDES, check_temperature
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.layers import Dense, compute_dtype
from bert_jax.model.pooling import l2_normalize

# The query and document markers, prepended as text: sentence-transformers' ColBERT prompts.
QUERY_MARKER, DOCUMENT_MARKER = '[Q] ', '[D] '
DEFAULT_PROJECTION_DIM = 128  # ColBERT's, PyLate's and sentence-transformers' MultiVectorEncoder's
DEFAULT_TEMPERATURE = 1.0  # MaxSim is a sum of up to query_length cosines: PyLate and sentence-transformers use 1


@dataclasses.dataclass(frozen=True)
class MultiVectorSpec:
  """How a multi-vector encoder is built and trained: its token vectors' size and the loss's temperature."""

  projection_dim: int = DEFAULT_PROJECTION_DIM
  temperature: float = DEFAULT_TEMPERATURE

  @classmethod
  def of(cls, cfg) -> MultiVectorSpec:
    """The spec of a multivector `FinetuneConfig`."""
    return cls(projection_dim=cfg.projection_dim, temperature=cfg.temperature)

  def check(self, hidden_size: int) -> None:
    """ConfigError for a projection wider than the model (or < 1), or a bad temperature."""
    if not 1 <= self.projection_dim <= hidden_size:
      raise ConfigError(f'projection_dim={self.projection_dim} must be between 1 and the model\'s hidden size '
                        f'{hidden_size} (a projection to at most as many components as the encoder has)')
    check_temperature(self.temperature)


def maxsim(query_bqd: jax.Array, query_mask_bq: jax.Array, docs_ntd: jax.Array, docs_mask_nt: jax.Array) -> jax.Array:
  """float32 [B, N]: MaxSim of every query against every document.

  Args:
    query_bqd, docs_ntd: token vectors (normalised: their dot products are cosines).
    query_mask_bq, docs_mask_nt: 1 where a token is scored. A document with no scored token scores 0.
  """
  sim_bnqt = jnp.einsum('bqd,ntd->bnqt', query_bqd, docs_ntd, preferred_element_type=jnp.float32)
  sim_bnqt = jnp.where(docs_mask_nt[None, :, None, :].astype(bool), sim_bnqt, -jnp.inf)
  best_bnq = jnp.max(sim_bnqt, axis=-1)
  best_bnq = jnp.where(jnp.isfinite(best_bnq) & query_mask_bq[:, None, :].astype(bool), best_bnq, 0.0)
  return jnp.sum(best_bnq, axis=-1)


def paired_maxsim(query_bqd: jax.Array, query_mask_bq: jax.Array, docs_bctd: jax.Array,
                  docs_mask_bct: jax.Array) -> jax.Array:
  """float32 [B, C]: MaxSim of each query against its own C documents (distillation's candidates)."""
  return jax.vmap(lambda q, qm, d, dm: maxsim(q[None], qm[None], d, dm)[0])(query_bqd, query_mask_bq, docs_bctd,
                                                                          docs_mask_bct)


class MultiVectorEncoder(nnx.Module):
  """The encoder and its token projection (`platform`: `BertEncoder`'s)."""

  def __init__(self, cfg: ModelConfig, spec: MultiVectorSpec, *, rngs: nnx.Rngs, platform: str | None = None):
    spec.check(cfg.hidden_size)
    self.spec = spec
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    self.projection = Dense((cfg.hidden_size,), (spec.projection_dim,), ('embed', None), std=cfg.initializer_range,
                            dtype=compute_dtype(cfg), rngs=rngs, use_bias=False, platform=platform)

  def token_vectors(self, input_ids_bt: jax.Array, attention_mask_bt: jax.Array, *,
                    deterministic: bool = True) -> jax.Array:
    """float32 [B, T, projection_dim]: every position's normalised vector (the caller's score mask picks)."""
    seq_btd, _ = self.bert(input_ids_bt, jnp.zeros_like(input_ids_bt), attention_mask_bt,
                           deterministic=deterministic)
    return l2_normalize(self.projection(seq_btd))

  def embed(self, batch: dict[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
    """{side: token vectors [..., T, D]} for each side in `batch` (negatives [B, K, T, D]); the score masks stay in
    the batch (only float outputs: GradCache differentiates them)."""
    out = {}
    for side in SIDES:
      if f'{side}_input_ids' not in batch:
        continue
      ids, mask = batch[f'{side}_input_ids'], batch[f'{side}_attention_mask']
      lead = ids.shape[:-1]
      vectors = self.token_vectors(ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1]),
                                   deterministic=deterministic)
      out[side] = vectors.reshape(*lead, *vectors.shape[-2:])
    return out

  def temperature_value(self) -> jax.Array:
    return jnp.float32(self.spec.temperature)
