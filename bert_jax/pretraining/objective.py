"""Masked LM + next-sentence or sentence-order prediction (or masked LM alone): the pretraining `Objective`.

Losses are cross-entropies at the masked positions (weighted: padding slots have weight 0)
and on each sequence's [CLS] (packed rows: each example's own [CLS], NSP arrays [R, K]).
Held-out sums add the baselines the run reports: always predicting the most frequent
training token (MLM) and the held-out majority class (NSP). Sentence-order prediction (SOP)
trains the same two-way head on other labels: its sums are the head's (nsp_*), its metrics
are reported as sop_*.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

MODEL_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask', 'masked_lm_positions')
# Only in packed batches (data.loader.pack_batch): keyword arguments of BertForPreTraining.
PACKED_INPUTS = {'segment_ids': 'segment_ids_bt', 'cls_positions': 'cls_positions_bk'}


def pretraining_sums(mlm_logits_bpv, nsp_logits_b2, batch) -> dict[str, jax.Array]:
  """Summed losses, correct counts and weights for MLM and NSP (float32).

  Packed batches give NSP logits [R, K, 2] with labels and weights [R, K]: the same sums.
  Without an NSP head (`nsp_logits_b2` None) the NSP sums are zero.
  """
  w_bp = batch['masked_lm_weights'].astype(jnp.float32)
  labels_bp = batch['masked_lm_ids']
  mlm_xent_bp = optax.softmax_cross_entropy_with_integer_labels(mlm_logits_bpv, labels_bp)
  sums = {
      'mlm_loss_sum': jnp.sum(mlm_xent_bp * w_bp),
      'mlm_correct': jnp.sum((jnp.argmax(mlm_logits_bpv, -1) == labels_bp) * w_bp),
      'mlm_count': jnp.sum(w_bp),
  }
  if nsp_logits_b2 is None:
    zero = jnp.zeros((), jnp.float32)
    return {**sums, 'nsp_loss_sum': zero, 'nsp_correct': zero, 'nsp_count': zero}
  w_b = batch['nsp_weights'].astype(jnp.float32)
  nsp_labels_b = batch['next_sentence_labels']
  nsp_xent_b = optax.softmax_cross_entropy_with_integer_labels(nsp_logits_b2, nsp_labels_b)
  return {
      **sums,
      'nsp_loss_sum': jnp.sum(nsp_xent_b * w_b),
      'nsp_correct': jnp.sum((jnp.argmax(nsp_logits_b2, -1) == nsp_labels_b) * w_b),
      'nsp_count': jnp.sum(w_b),
  }


def summarize(sums: dict[str, Any]) -> dict[str, Any]:
  """Mean losses and accuracies from summed counts (works on jax or numpy values)."""
  mlm_n = jnp.maximum(sums['mlm_count'], 1.0)
  nsp_n = jnp.maximum(sums['nsp_count'], 1.0)
  out = {
      'mlm_loss': sums['mlm_loss_sum'] / mlm_n,
      'nsp_loss': sums['nsp_loss_sum'] / nsp_n,
      'mlm_accuracy': sums['mlm_correct'] / mlm_n,
      'nsp_accuracy': sums['nsp_correct'] / nsp_n,
  }
  out['loss'] = out['mlm_loss'] + out['nsp_loss']
  if 'mlm_baseline_correct' in sums:
    out['mlm_baseline_accuracy'] = sums['mlm_baseline_correct'] / mlm_n
  if 'nsp_label1' in sums:  # always predicting the held-out majority class
    share = sums['nsp_label1'] / nsp_n
    out['nsp_baseline_accuracy'] = jnp.maximum(share, 1.0 - share)
  return out


@dataclasses.dataclass(frozen=True)
class Pretraining:
  """The pretraining `Objective` of `BertForPreTraining`; `pair_task` as data.objective: 'nsp' or
  'sop' (the two-way head and its loss, metrics named after the task) or 'none' (masked LM only)."""

  pair_task: str = 'nsp'
  terms: tuple[str, ...] = ('mlm', 'nsp')
  couples_rows: bool = False  # each example's loss is its own: micro-batch losses add up

  def forward(self, module, batch, *, deterministic: bool):
    packed = {arg: batch[k] for k, arg in PACKED_INPUTS.items() if k in batch}
    return module(*(batch[k] for k in MODEL_INPUTS), batch.get('position_ids'), **packed,
                  deterministic=deterministic)

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    return pretraining_sums(*outputs, batch)

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'mlm': jnp.sum(batch['masked_lm_weights']), 'nsp': jnp.sum(batch['nsp_weights'])}

  def summarize(self, sums) -> dict[str, Any]:
    out = summarize(sums)
    if self.pair_task == 'none':  # masked LM only: the NSP sums are empty, their means meaningless zeros
      return {k: v for k, v in out.items() if not k.startswith('nsp_')}
    if self.pair_task != 'nsp':
      out = {(self.pair_task + k[3:] if k.startswith('nsp_') else k): v for k, v in out.items()}
    return out

  def eval_sums(self, outputs, batch, baseline_token) -> dict[str, jax.Array]:
    """`sums` plus the MLM baseline's correct count, real sequences and NSP label-1 weight."""
    sums = pretraining_sums(*outputs, batch)
    sums['mlm_baseline_correct'] = jnp.sum(
        (batch['masked_lm_ids'] == baseline_token) * batch['masked_lm_weights'])
    sums['num_sequences'] = jnp.sum(jnp.any(batch['attention_mask'] > 0, axis=-1).astype(jnp.float32))
    # Label 1 = random next: with the label counts, the NSP majority-class baseline.
    sums['nsp_label1'] = jnp.sum(batch['next_sentence_labels'] * batch['nsp_weights'].astype(jnp.float32))
    return sums
