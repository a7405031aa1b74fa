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


def _loss_weights(kind: str, batch, class_weights: tuple[float, ...] = ()) -> jax.Array:
  """Each example's (token kind: each row token's) weight in the mean loss: 0 for padding, else 1 or its class's
  weight (classification and token kinds; `class_weights`)."""
  if kind == 'token':
    w = (batch['labels'] >= 0).astype(jnp.float32)  # per row; padding is labelled IGNORE
  else:
    w = batch['weights'].astype(jnp.float32)
  if class_weights and kind in ('classification', 'token'):
    w = w * jnp.asarray(class_weights, jnp.float32)[jnp.maximum(batch['labels'], 0)]
  return w


def _cross_entropy(logits, labels, smoothing: float) -> jax.Array:
  if not smoothing:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32), smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def _losses(kind: str, logits, batch, class_weights: tuple[float, ...] = (), smoothing: float = 0.0) -> jax.Array:
  """The unweighted loss of every example (token kind: of every row token); multilabel: `class_weights` weigh each
  label's positive term, `smoothing` moves each target that far towards 1/2."""
  if kind == 'classification':
    return _cross_entropy(logits, batch['labels'], smoothing)
  if kind == 'regression':
    return jnp.square(logits[:, 0] - batch['labels'].astype(jnp.float32))
  if kind == 'multilabel':
    targets = batch['labels'].astype(jnp.float32)
    targets = targets * (1.0 - smoothing) + smoothing / 2 if smoothing else targets
    if class_weights:  # pos_weight: -(w y log s(x) + (1 - y) log(1 - s(x)))
      positive = jnp.asarray(class_weights, jnp.float32)
      return jnp.mean(-(positive * targets * jax.nn.log_sigmoid(logits)
                        + (1.0 - targets) * jax.nn.log_sigmoid(-logits)), axis=-1)
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, targets), axis=-1)
  if kind == 'token':
    return _cross_entropy(logits, jnp.maximum(batch['labels'], 0), smoothing)
  if kind == 'span':
    logits_et2, valid_et = example_windows(logits, batch)
    logits_et2 = jnp.where(valid_et[..., None], logits_et2, -1e9)
    start = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 0], batch['start_positions'])
    end = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 1], batch['end_positions'])
    return (start + end) / 2
  raise ValueError(f'unknown head kind {kind!r}; choose from {", ".join(HEAD_KINDS)}')


def task_loss(kind: str, logits, batch, class_weights: tuple[float, ...] = (), smoothing: float = 0.0) -> jax.Array:
  """The mean loss over real examples (token kind: over labelled tokens), weighted by class, float32."""
  w = _loss_weights(kind, batch, class_weights)
  return jnp.sum(_losses(kind, logits, batch, class_weights, smoothing) * w) / jnp.where(jnp.sum(w) > 0, jnp.sum(w), 1.0)


@dataclasses.dataclass(frozen=True)
class Finetuning:
  """The `Objective` of a head model (`model.heads.head_model(kind, ...)`): its loss, weighted by class
  (`class_weights`, one per label: `finetuning.class_weights`) and with `label_smoothing`."""

  kind: str
  terms: tuple[str, ...] = ('task',)
  couples_rows: bool = False  # each example's loss is its own: micro-batch losses add up
  class_weights: tuple[float, ...] = ()
  label_smoothing: float = 0.0

  def forward(self, module, batch, *, deterministic: bool):
    """Logits: [E, num_labels] for sequence heads, per row [B, T, C] for token and span heads."""
    return module(*(batch[k] for k in MODEL_INPUTS), deterministic=deterministic)

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    w = _loss_weights(self.kind, batch, self.class_weights)
    losses = _losses(self.kind, outputs, batch, self.class_weights, self.label_smoothing)
    return {'task_loss_sum': jnp.sum(losses * w), 'task_count': jnp.sum(w)}

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'task': jnp.sum(_loss_weights(self.kind, batch, self.class_weights))}

  def summarize(self, sums) -> dict[str, Any]:
    return {'loss': sums['task_loss_sum'] / jnp.where(sums['task_count'] > 0, sums['task_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux) -> dict[str, jax.Array]:
    del aux
    return self.sums(outputs, batch)
