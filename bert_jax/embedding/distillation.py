"""Distillation for embedding models: a student bi-encoder learns a teacher's scores of each query's candidates (its
positive, then its K hard negatives), as the best small embedders are trained (MarginMSE: Hofstätter et al. 2020;
KL over a query's candidates: ColBERTv2, EmbeddingGemma).

Each row is a query, its candidates c = 0 (the positive), 1..K (the negatives) and the teacher's scores t_c of them
(`embedding.pairs` reads them; `experiments/mine.py --scores` writes them). The student's score s_c is the cosine of
the query's and the candidate's embeddings (the run's similarity: vectors are normalised here, after any Matryoshka
truncation), in float32. Only a row's own candidates take part: no in-batch negatives, so the loss of a batch is the
mean of independent per-row losses.

- MarginMSE (sentence-transformers' `MarginMSELoss`): mean over k of ((s_0 - s_k) - (t_0 - t_k))^2: the student
  learns the teacher's margins, not its scale.
- KL (sentence-transformers' `DistillKLDivLoss`): KL(teacher || student) between softmax(t / T_t) and
  softmax(s / T) over the 1 + K candidates, times T^2 (so the gradient's scale does not shrink with the temperature;
  the factor is a constant: a learned T is fitted to the teacher's distribution, not pushed down to shrink it).
  T is the run's temperature (fixed or learned), T_t the teacher's (sentence-transformers' `teacher_temperature`;
  by default T's fixed value, as its single `temperature`).

`Distillation` is the `train.step.Objective` of either loss for a `model.biencoder.BiEncoder`. Its rows are
independent, so gradient accumulation (optim.grad_accum_steps = k) sums k micro-batch losses, each normalised by the
whole batch's count: the exact gradient of the whole batch, at one micro-batch's activations (GradCache's second
forward pass would buy nothing). Its batch: `Contrastive`'s, with negatives required, plus teacher_scores [B, 1 + K].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from bert_jax.embedding.contrastive import Contrastive, _check_weights
from bert_jax.errors import ConfigError
from bert_jax.model.biencoder import check_matryoshka_dims, check_temperature
from bert_jax.model.pooling import truncate

LOSSES = ('margin_mse', 'kl')


def student_scores(query_bd: jax.Array, candidates_bcd: jax.Array, dim: int | None = None) -> jax.Array:
  """float32 [B, C]: the cosine of each query with each of its own candidates (at the leading `dim` components)."""
  dim = dim or query_bd.shape[-1]
  return jnp.einsum('bd,bcd->bc', truncate(query_bd, dim), truncate(candidates_bcd, dim),
                    preferred_element_type=jnp.float32)


def margin_mse_rows(scores_bc: jax.Array, teacher_bc: jax.Array) -> jax.Array:
  """[B]: mean over k >= 1 of ((s_0 - s_k) - (t_0 - t_k))^2."""
  teacher_bc = jax.lax.stop_gradient(teacher_bc.astype(jnp.float32))
  student_bk = scores_bc[:, :1] - scores_bc[:, 1:]
  return jnp.mean(jnp.square(student_bk - (teacher_bc[:, :1] - teacher_bc[:, 1:])), axis=1)


def kl_rows(scores_bc: jax.Array, teacher_bc: jax.Array, temperature, teacher_temperature) -> jax.Array:
  """[B]: T^2 KL(softmax(t / T_t) || softmax(s / T)) over each row's candidates (T^2 a constant factor)."""
  teacher_log_bc = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_bc.astype(jnp.float32)) / teacher_temperature,
                                      axis=1)
  student_log_bc = jax.nn.log_softmax(scores_bc / temperature, axis=1)
  kl_b = jnp.sum(jnp.exp(teacher_log_bc) * (teacher_log_bc - student_log_bc), axis=1)
  return kl_b * jnp.square(jax.lax.stop_gradient(jnp.asarray(temperature, jnp.float32)))


def distill(query_bd: jax.Array, passage_bd: jax.Array, negative_bkd: jax.Array, teacher_bc: jax.Array, *,
            loss: str, temperature=None, teacher_temperature=None, valid_b: jax.Array | None = None,
            dims: Sequence[int] | None = None, dim_weights: Sequence[float] | None = None) -> dict[str, jax.Array]:
  """Per-row distillation losses of a batch of (query, positive, K negatives, 1 + K teacher scores).

  Args:
    query_bd, passage_bd: [B, D] embeddings (normalised or not: cosine similarity is used).
    negative_bkd: [B, K, D], K >= 1.
    teacher_bc: [B, 1 + K] teacher scores: the positive's, then each negative's.
    loss: 'margin_mse' or 'kl'.
    temperature: the student's (kl only): a python float (checked) or a jax scalar (a learned one).
    teacher_temperature: the teacher's (kl only); None: `temperature`.
    valid_b: [B] 1 for real rows, 0 for padding (loss 0); None: all real.
    dims, dim_weights: Matryoshka sizes and weights, as `contrastive.info_nce`'s.

  Returns:
    float32 [B] arrays: 'loss' (the weighted Matryoshka mean; 0 at padding), 'loss_<d>' per dim, and 'correct'
    (1 where the student scores the positive at least as high as each of its negatives, at dims[0]).

  Raises:
    ConfigError: an unknown loss, shapes that disagree, no negatives, a bad temperature, dims or weights.
  """
  if loss not in LOSSES:
    raise ConfigError(f'distillation loss must be one of {", ".join(LOSSES)}, got {loss!r}')
  b, d = query_bd.shape
  if passage_bd.shape != (b, d):
    raise ConfigError(f'passages {passage_bd.shape} do not match queries {query_bd.shape}')
  if negative_bkd is None or negative_bkd.ndim != 3 or negative_bkd.shape[0] != b or negative_bkd.shape[2] != d:
    raise ConfigError(f'distillation needs hard negatives [B, K, D] = [{b}, K, {d}], got '
                      f'{None if negative_bkd is None else negative_bkd.shape}')
  k = negative_bkd.shape[1]
  if k < 1 or teacher_bc.shape != (b, 1 + k):
    raise ConfigError(f'teacher scores must be [B, 1 + K] = [{b}, {1 + k}] (K >= 1), got {teacher_bc.shape}')
  if loss == 'kl':
    if temperature is None:
      raise ConfigError("loss='kl' needs the student's temperature")
    temperature = check_temperature(temperature) if isinstance(temperature, (int, float)) else temperature
    teacher_temperature = temperature if teacher_temperature is None else teacher_temperature
    if isinstance(teacher_temperature, (int, float)):
      teacher_temperature = check_temperature(teacher_temperature)
  dims = check_matryoshka_dims(dims, d) if dims is not None else (d,)
  weights = _check_weights(dim_weights, dims)

  candidates_bcd = jnp.concatenate([passage_bd[:, None], negative_bkd], axis=1)
  out, total_b = {}, jnp.zeros((b,), jnp.float32)
  for i, (dim, weight) in enumerate(zip(dims, weights)):
    scores_bc = student_scores(query_bd, candidates_bcd, dim)
    if loss == 'margin_mse':
      loss_b = margin_mse_rows(scores_bc, teacher_bc)
    else:
      loss_b = kl_rows(scores_bc, teacher_bc, temperature, teacher_temperature)
    if valid_b is not None:
      loss_b = jnp.where(valid_b.astype(bool), loss_b, 0.0)
    out[f'loss_{dim}'] = loss_b
    total_b = total_b + weight * loss_b
    if i == 0:
      out['correct'] = (scores_bc[:, 0] >= jnp.max(scores_bc[:, 1:], axis=1)).astype(jnp.float32)
  out['loss'] = total_b / sum(weights)
  return out


@dataclasses.dataclass(frozen=True)
class Distillation(Contrastive):
  """The `Objective` of a `BiEncoder` distilled from teacher scores by `loss` ('margin_mse' or 'kl'); `spec` is the
  module's own (pooling, temperature, Matryoshka sizes); `teacher_temperature` the kl teacher's (0: spec's fixed or
  initial temperature)."""

  loss: str = 'kl'
  teacher_temperature: float = 0.0
  terms: tuple[str, ...] = ('distillation',)
  couples_rows: bool = False  # independent rows: plain accumulation is exact

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ConfigError(f'distillation loss must be one of {", ".join(LOSSES)}, got {self.loss!r}')

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    e, spec = outputs['embeddings'], self.spec
    if 'teacher_scores' not in batch:
      raise ConfigError(f'loss={self.loss!r} needs teacher scores in the batch (teacher_scores [B, 1 + K])')
    weights_b = batch['weights'].astype(jnp.float32)
    out = distill(e['query'], e['passage'], e.get('negative'), batch['teacher_scores'], loss=self.loss,
                  temperature=outputs['temperature'], teacher_temperature=self.teacher_temperature or spec.temperature,
                  valid_b=weights_b, dims=spec.matryoshka_dims or None, dim_weights=spec.matryoshka_weights or None)
    count = jnp.sum(weights_b)
    sums = {'distillation_loss_sum': jnp.sum(out['loss']), 'distillation_count': count,
            'correct_sum': jnp.sum(out['correct'] * weights_b)}
    if self.loss == 'kl':
      sums['temperature_sum'] = outputs['temperature'] * count
    if spec.matryoshka_dims:
      sums.update({f'loss_{d}_sum': jnp.sum(out[f'loss_{d}']) for d in spec.matryoshka_dims})
    return sums

  def counts(self, batch) -> dict[str, jax.Array]:
    return {'distillation': jnp.sum(batch['weights'].astype(jnp.float32))}

  def summarize(self, sums) -> dict[str, Any]:
    count = jnp.maximum(sums['distillation_count'], 1.0)
    out = {'loss': sums['distillation_loss_sum'] / count, 'accuracy': sums['correct_sum'] / count}
    for name in sums:
      if name == 'temperature_sum' or name.startswith('loss_') and name.endswith('_sum'):
        out[name[:-len('_sum')]] = sums[name] / count
    return out
