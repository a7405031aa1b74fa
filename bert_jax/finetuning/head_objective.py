"""The fine-tuning `Objective` of a head kind: its loss over real examples (or labelled tokens).

Batches come from `batching.make_batch` (packed or padded rows plus per-example positions);
examples with `weights` 0 are padding and count nowhere. classification: cross-entropy on
`labels` [E]; regression: squared error on `labels` [E] (float); multilabel: the mean over labels of the
sigmoid cross-entropy on multi-hot `labels` [E, L] (float); token: cross-entropy on
per-row `labels` [B, T] where labels >= 0 (-100 = ignored); span: the mean of the start and end
cross-entropies on `start_positions`/`end_positions`, each a softmax over the example's own
tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bert_jax.model.heads import HEAD_KINDS

MODEL_INPUTS = ('input_ids', 'token_type_ids', 'segment_ids', 'position_ids', 'example_row', 'example_offset')


def example_windows(values_bt, batch):
  """Each example's tokens [E, T, ...] cut from per-row values [B, T, ...], and a validity mask [E, T]."""
  width = values_bt.shape[1]
  j_t = jnp.arange(width)
  cols_et = jnp.minimum(batch['example_offset'][:, None] + j_t, width - 1)
  valid_et = j_t < batch['example_length'][:, None]
  return values_bt[batch['example_row'][:, None], cols_et], valid_et


def _loss_weights(kind: str, batch) -> jax.Array:
  if kind == 'token':
    return (batch['labels'] >= 0).astype(jnp.float32)  # per row; padding is labelled IGNORE
  return batch['weights'].astype(jnp.float32)


def _losses(kind: str, logits, batch) -> jax.Array:
  """The unweighted loss of every example (token kind: of every row token)."""
  if kind == 'classification':
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['labels'])
  if kind == 'regression':
    return jnp.square(logits[:, 0] - batch['labels'].astype(jnp.float32))
  if kind == 'multilabel':
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, batch['labels'].astype(jnp.float32)), axis=-1)
  if kind == 'token':
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(batch['labels'], 0))
  if kind == 'span':
    logits_et2, valid_et = example_windows(logits, batch)
    logits_et2 = jnp.where(valid_et[..., None], logits_et2, -1e9)
    start = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 0], batch['start_positions'])
    end = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 1], batch['end_positions'])
    return (start + end) / 2
  raise ValueError(f'unknown head kind {kind!r}; choose from {", ".join(HEAD_KINDS)}')


def task_loss(kind: str, logits, batch) -> jax.Array:
  """The mean loss over real examples (token kind: over labelled tokens), float32."""
  w = _loss_weights(kind, batch)
  return jnp.sum(_losses(kind, logits, batch) * w) / jnp.maximum(jnp.sum(w), 1.0)


@dataclasses.dataclass(frozen=True)
class Finetuning:
  """The `Objective` of a head model (`model.heads.head_model(kind, ...)`)."""

  kind: str
  terms: tuple[str, ...] = ('task',)
  couples_rows: bool = False  # each example's loss is its own: micro-batch losses add up

  def forward(self, module, batch, *, deterministic: bool):
    """Logits: [E, num_labels] for sequence heads, per row [B, T, C] for token and span heads."""
    return module(*(batch[k] for k in MODEL_INPUTS), deterministic=deterministic)

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    w = _loss_weights(self.kind, batch)
    return {'task_loss_sum': jnp.sum(_losses(self.kind, outputs, batch) * w), 'task_count': jnp.sum(w)}

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'task': jnp.sum(_loss_weights(self.kind, batch))}

  def summarize(self, sums) -> dict[str, Any]:
    return {'loss': sums['task_loss_sum'] / jnp.maximum(sums['task_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)
