"""Contrastive training in the one train step: the bi-encoder module and its `Objective`.

`BiEncoder` is the encoder (`bert`, so a checkpoint's encoder loads as for every head model) and, when the
temperature is learned, its one unconstrained parameter. `Contrastive` is the `train.step.Objective` of InfoNCE
over the global batch (`contrastive.info_nce`). Its forward pass has two halves, `embed` (per row: the encoder) and
`head` (the loss's inputs from the embeddings of the whole batch), because its rows are coupled: with
`optim.grad_accum_steps = k > 1` the train step does not sum k independent micro-batch losses (each with only its
micro-batch's negatives: another loss) but runs GradCache (`gradcache.grad_cache`) over k micro-batches: the exact
gradient of the loss of the whole batch, at one micro-batch's activation memory.

The batch (padded per side; `encode` describes the token arrays):
  query_*, passage_*, negative_* (optional)  token ids and attention masks
  weights       [B]     1 for real pairs, 0 for padding rows
  passage_ids   [B]     ids (or content hashes) of the positives: duplicates are not negatives (optional)
  negative_ids  [B, K]  of the hard negatives (with passage_ids and negatives)
  query_ids     [B]     rows of one query are each other's positives (optional)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax.config import ModelConfig
from bert_jax.embedding import contrastive, encode
from bert_jax.embedding.pooling import POOLINGS
from bert_jax.errors import ConfigError
from bert_jax.model.encoder import BertEncoder


@dataclasses.dataclass(frozen=True)
class ContrastiveSpec:
  """How a bi-encoder is trained: pooling, temperature, directions and Matryoshka sizes."""

  pooling: str = 'mean'
  temperature: float = contrastive.DEFAULT_TEMPERATURE  # fixed, or the learned one's initial value
  learn_temperature: bool = False
  temperature_min: float = contrastive.TEMPERATURE_MIN
  temperature_max: float = contrastive.TEMPERATURE_MAX
  symmetric: bool = False
  matryoshka_dims: tuple[int, ...] = ()  # () : the full size only
  matryoshka_weights: tuple[float, ...] = ()  # () : equal

  @classmethod
  def of(cls, cfg) -> ContrastiveSpec:
    """The spec of a retrieval `FinetuneConfig` (what its run trains, and what its checkpoints hold)."""
    return cls(pooling=cfg.pooling, temperature=cfg.temperature, learn_temperature=cfg.learn_temperature,
               temperature_min=cfg.temperature_min, temperature_max=cfg.temperature_max, symmetric=cfg.symmetric,
               matryoshka_dims=cfg.retrieval_dims(), matryoshka_weights=cfg.retrieval_weights())

  def check(self, hidden_size: int) -> None:
    """ConfigError for a bad pooling, temperature, bounds or Matryoshka sizes for a model of `hidden_size`."""
    if self.pooling not in POOLINGS:
      raise ConfigError(f'pooling must be one of {", ".join(POOLINGS)}, got {self.pooling!r}')
    contrastive.check_temperature(self.temperature)
    if self.learn_temperature:
      contrastive.check_temperature_bounds(self.temperature_min, self.temperature_max, self.temperature)
    if self.matryoshka_dims:
      dims = contrastive.check_matryoshka_dims(self.matryoshka_dims, hidden_size)
      if self.matryoshka_weights and len(self.matryoshka_weights) != len(dims):
        raise ConfigError(f'{len(self.matryoshka_weights)} matryoshka weights for {len(dims)} dims')
    elif self.matryoshka_weights:
      raise ConfigError('matryoshka weights without matryoshka dims')


class BiEncoder(nnx.Module):
  """One encoder for queries and passages (shared weights), pooled and normalised, and the temperature; `platform`:
  `BertEncoder`'s."""

  def __init__(self, cfg: ModelConfig, spec: ContrastiveSpec, *, rngs: nnx.Rngs, platform: str | None = None):
    spec.check(cfg.hidden_size)
    self.spec = spec
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    # The learned temperature's unconstrained parameter (`contrastive.bounded_temperature`), or None when fixed.
    self.temperature = nnx.Param(jnp.asarray(contrastive.temperature_parameter(
        spec.temperature, spec.temperature_min, spec.temperature_max))) if spec.learn_temperature else None

  def embed(self, batch: dict[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
    return encode.embed_batch(self.bert, batch, pooling=self.spec.pooling, deterministic=deterministic)

  def temperature_value(self) -> jax.Array:
    if self.temperature is None:
      return jnp.float32(self.spec.temperature)
    return contrastive.bounded_temperature(self.temperature[...], self.spec.temperature_min,
                                           self.spec.temperature_max)


@dataclasses.dataclass(frozen=True)
class Contrastive:
  """The `Objective` of a `BiEncoder` (or any module with `embed(batch, deterministic)` and `temperature_value()`)
  trained with `spec` (the module's own)."""

  spec: ContrastiveSpec = ContrastiveSpec()
  terms: tuple[str, ...] = ('contrastive',)
  couples_rows: bool = True  # the train step accumulates by GradCache, not by summing micro-batch losses

  def embed(self, module, batch, *, deterministic: bool) -> dict[str, jax.Array]:
    """The per-row half of the forward pass: embeddings of `batch`'s rows."""
    return module.embed(batch, deterministic=deterministic)

  def head(self, module, embeddings) -> dict[str, Any]:
    """The whole-batch half: what `sums` reads, from the embeddings of the whole batch."""
    return {'embeddings': embeddings, 'temperature': module.temperature_value()}

  def forward(self, module, batch, *, deterministic: bool):
    return self.head(module, self.embed(module, batch, deterministic=deterministic))

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    e, spec = outputs['embeddings'], self.spec
    weights_b = batch['weights'].astype(jnp.float32)
    out = contrastive.info_nce(
        e['query'], e['passage'], e.get('negative'), temperature=outputs['temperature'],
        passage_ids_b=batch.get('passage_ids'), negative_ids_bk=batch.get('negative_ids'),
        query_ids_b=batch.get('query_ids'), valid_b=weights_b, symmetric=spec.symmetric,
        dims=spec.matryoshka_dims or None, dim_weights=spec.matryoshka_weights or None)
    count = jnp.sum(weights_b)
    sums = {'contrastive_loss_sum': jnp.sum(out['loss']), 'contrastive_count': count,
            'correct_sum': jnp.sum(out['correct'] * weights_b),
            'temperature_sum': outputs['temperature'] * count}
    if spec.matryoshka_dims:
      sums.update({f'loss_{d}_sum': jnp.sum(out[f'loss_{d}']) for d in spec.matryoshka_dims})
    return sums

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'contrastive': jnp.sum(batch['weights'].astype(jnp.float32))}

  def summarize(self, sums) -> dict[str, Any]:
    count = jnp.maximum(sums['contrastive_count'], 1.0)
    out = {'loss': sums['contrastive_loss_sum'] / count, 'accuracy': sums['correct_sum'] / count,
           'temperature': sums['temperature_sum'] / count}
    for name in sums:
      if name.startswith('loss_') and name.endswith('_sum'):
        out[name[:-len('_sum')]] = sums[name] / count
    return out

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)
