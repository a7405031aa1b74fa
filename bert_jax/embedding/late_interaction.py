"""Multi-vector (ColBERT) training: the token rows of queries and documents, MaxSim InfoNCE over the global batch,
KL distillation from teacher scores, and their `train.step.Objective`.

Token rows (`MultiVectorInputs`), as sentence-transformers' `MultiVectorEncoder` makes them (its export target):
- markers: the query is read as '[Q] ' + query, a document as '[D] ' + document (its `prompts`: plain text, so on a
  BERT vocabulary each marker is the three pieces '[', 'q' or 'd', ']');
- query augmentation (its `query_expansion`, strategy 'fixed', not attended): a query is cut to query_length tokens
  and filled up to exactly query_length with [MASK]; the encoder does not attend to the [MASK] positions but MaxSim
  scores their vectors (a query's score mask is all ones);
- punctuation (its `MultiVectorMask` skiplist, `string.punctuation`): on the document side only, tokens whose id is
  a punctuation character's are attended to but not scored (a marker's brackets included).

The losses read MaxSim scores (`model.colbert.maxsim`, float32) where the dense kind reads cosines, and are the
dense kind's own: InfoNCE (`contrastive.softmax_rows` over `contrastive.candidate_masks`: in-batch passages and hard
negatives over the global batch, duplicates masked) and KL (`distillation.kl_rows`, times T^2). The global batch as
in `embedding.contrastive`: queries stay split over the batch axes, candidates' token vectors are gathered.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.embedding import pairs as pairs_lib
from bert_jax.embedding.contrastive import Contrastive, candidate_masks, softmax_rows
from bert_jax.embedding.distillation import kl_rows
from bert_jax.errors import ConfigError
from bert_jax.model.colbert import DOCUMENT_MARKER, QUERY_MARKER, MultiVectorSpec, maxsim, paired_maxsim
from bert_jax.sharding import constrain

SKIPLIST = tuple(string.punctuation)  # PyLate's and Stanford ColBERT's document-side skiplist
LOSSES = ('contrastive', 'kl')
_ROWS = ('activation_batch', None, None)
_GATHERED = (None, None, None)


@dataclasses.dataclass(frozen=True)
class TokenSpec:
  """How texts become token rows: lengths (special tokens and markers included), markers, the skiplist."""

  query_length: int = 32
  document_length: int = 180
  markers: bool = True
  skip_punctuation: bool = True

  @classmethod
  def of(cls, cfg) -> TokenSpec:
    return cls(query_length=cfg.query_length, document_length=cfg.document_length, markers=cfg.markers,
               skip_punctuation=cfg.skip_punctuation)


class MultiVectorInputs:
  """A tokenizer's query and document rows under a `TokenSpec` (the module doc).

  Raises (from __init__):
    ConfigError: query_length leaves no room for a query token after [CLS], the marker and [SEP].
  """

  def __init__(self, tokenizer, spec: TokenSpec):
    self.tokenizer, self.spec = tokenizer, spec
    unk = getattr(tokenizer, 'unk_id', None)
    skip = {tokenizer.token_to_id(w) for w in SKIPLIST} if spec.skip_punctuation else set()
    self.skip_ids = np.array(sorted(i for i in skip if i is not None and i != unk), np.int32)
    marker = len(tokenizer.encode(QUERY_MARKER.strip())) if spec.markers else 0
    if spec.query_length < marker + 3:
      raise ConfigError(f'query_length={spec.query_length} is too short for the query marker '
                        f'{QUERY_MARKER.strip()!r} ({marker} tokens here) with [CLS], [SEP] and one query token: '
                        f'set --config.query_length to at least {marker + 3}')

  def encode(self, texts: Sequence[str], side: str, limit: int | None = None) -> list[list[int]]:
    """Token id rows of `texts` as queries ('query') or documents (any other side), markers prepended."""
    marker = (QUERY_MARKER if side == 'query' else DOCUMENT_MARKER) if self.spec.markers else ''
    limit = limit or (self.spec.query_length if side == 'query' else self.spec.document_length)
    return [self.tokenizer.encode_inputs(marker + t, None, max_length=limit)[0] for t in texts]

  def finish(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` (padded rows, `pairs.make_batch`'s) with the queries expanded to query_length with [MASK] and each
    side's score mask."""
    out = dict(batch)
    if 'query_input_ids' in out:
      ids, mask = out['query_input_ids'], out['query_attention_mask']
      width = self.spec.query_length
      ids = np.concatenate([ids, np.zeros(ids.shape[:-1] + (width - ids.shape[-1],), ids.dtype)], -1)
      mask = np.concatenate([mask, np.zeros(mask.shape[:-1] + (width - mask.shape[-1],), mask.dtype)], -1)
      out['query_input_ids'] = np.where(mask.astype(bool), ids, self.tokenizer.mask_id).astype(ids.dtype)
      out['query_attention_mask'] = mask
      out['query_score_mask'] = np.ones_like(mask)
    for side in ('passage', 'negative'):
      if f'{side}_input_ids' in out:
        ids, mask = out[f'{side}_input_ids'], out[f'{side}_attention_mask']
        out[f'{side}_score_mask'] = (mask.astype(bool) & ~np.isin(ids, self.skip_ids)).astype(mask.dtype)
    return out

  def rows(self, texts: Sequence[str], side: str, rows: int, width_limit: int) -> dict[str, np.ndarray]:
    """`side`'s ids, attention and score masks of `texts` ('query' or 'passage'), padded to `rows` rows (a padding
    row: one attended [PAD]) and to `pairs.bucket_width` of the longest text (queries: exactly query_length)."""
    encoded = self.encode(texts, side)
    encoded += [[self.tokenizer.pad_id]] * (rows - len(encoded))
    width = pairs_lib.bucket_width(max(map(len, encoded)), width_limit)
    ids, mask = pairs_lib._pad(encoded, width, self.tokenizer.pad_id)  # pylint: disable=protected-access
    mask[:, 0] = 1
    return self.finish({f'{side}_input_ids': ids, f'{side}_attention_mask': mask})


def _candidates(e: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
  """The passages and negatives of a batch as [B, 1 + K, T, D] and [B, 1 + K, T] (the wider side's T)."""
  p, n = e['passage'], e.get('negative')
  if n is None:
    return p['vectors'][:, None], p['mask'][:, None]
  pv, pm, nv, nm = p['vectors'], p['mask'], n['vectors'], n['mask']
  t = max(pv.shape[1], nv.shape[2])
  pv, pm = jnp.pad(pv, ((0, 0), (0, t - pv.shape[1]), (0, 0))), jnp.pad(pm, ((0, 0), (0, t - pm.shape[1])))
  nv, nm = (jnp.pad(nv, ((0, 0), (0, 0), (0, t - nv.shape[2]), (0, 0))),
            jnp.pad(nm, ((0, 0), (0, 0), (0, t - nm.shape[2]))))
  return jnp.concatenate([pv[:, None], nv], 1), jnp.concatenate([pm[:, None], nm], 1)


def maxsim_info_nce(e: dict[str, Any], *, temperature, passage_ids_b=None, negative_ids_bk=None, query_ids_b=None,
                    valid_b=None) -> dict[str, jax.Array]:
  """Per-row InfoNCE of MaxSim scores over the global batch: query i against every passage and hard negative.

  Args:
    e: {side: {'vectors': `MultiVectorEncoder.embed`'s [..., T, D], 'mask': the batch's score mask [..., T]}}.
    temperature, passage_ids_b, negative_ids_bk, query_ids_b, valid_b: as `contrastive.info_nce`'s.

  Returns:
    float32 [B]: 'loss' (0 at padding) and 'correct' (the positive is the query's top candidate).
  """
  q, p, n = e['query'], e['passage'], e.get('negative')
  b = q['vectors'].shape[0]
  k = 0 if n is None else n['vectors'].shape[1]
  qv, qm = constrain(q['vectors'], _ROWS), q['mask']
  scores_bc = maxsim(qv, qm, constrain(p['vectors'], _GATHERED), constrain(p['mask'], _GATHERED[:2]))
  if k:
    nv = n['vectors'].reshape(b * k, *n['vectors'].shape[2:])
    nm = n['mask'].reshape(b * k, -1)
    scores_bc = jnp.concatenate(
        [scores_bc, maxsim(qv, qm, constrain(nv, _GATHERED), constrain(nm, _GATHERED[:2]))], axis=1)
  mask_bc, _ = candidate_masks(passage_ids_b, negative_ids_bk, query_ids_b, valid_b, b, k)
  loss_b, hit_b = softmax_rows(scores_bc / temperature, mask_bc)
  if valid_b is not None:
    loss_b = jnp.where(valid_b.astype(bool), loss_b, 0.0)
  return {'loss': loss_b, 'correct': hit_b.astype(jnp.float32)}


def maxsim_kl(e: dict[str, Any], teacher_bc: jax.Array, *, temperature, teacher_temperature,
              valid_b=None) -> dict[str, jax.Array]:
  """Per-row KL distillation of each query's own candidates' MaxSim scores (positive, then its K negatives) from
  the teacher's: `distillation.kl_rows`. Returns float32 [B] 'loss' and 'correct' (as `distillation.distill`)."""
  docs_bctd, docs_mask_bct = _candidates(e)
  if teacher_bc.shape != docs_mask_bct.shape[:2] or docs_mask_bct.shape[1] < 2:
    raise ConfigError(f'teacher scores must be [B, 1 + K] = {list(docs_mask_bct.shape[:2])} with K >= 1, got '
                      f'{list(teacher_bc.shape)}')
  scores_bc = paired_maxsim(e['query']['vectors'], e['query']['mask'], docs_bctd, docs_mask_bct)
  loss_b = kl_rows(scores_bc, teacher_bc, temperature, teacher_temperature)
  if valid_b is not None:
    loss_b = jnp.where(valid_b.astype(bool), loss_b, 0.0)
  correct_b = (scores_bc[:, 0] >= jnp.max(scores_bc[:, 1:], axis=1)).astype(jnp.float32)
  return {'loss': loss_b, 'correct': correct_b}


@dataclasses.dataclass(frozen=True)
class MultiVectorObjective(Contrastive):
  """The `Objective` of a `model.colbert.MultiVectorEncoder`: MaxSim InfoNCE over the global batch ('contrastive',
  rows coupled: GradCache under gradient accumulation) or KL from teacher scores ('kl', independent rows)."""

  spec: MultiVectorSpec = MultiVectorSpec()
  loss: str = 'contrastive'
  teacher_temperature: float = 0.0  # kl: 0 the spec's temperature

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ConfigError(f'multivector loss must be one of {", ".join(LOSSES)}, got {self.loss!r}')
    object.__setattr__(self, 'terms', (self.loss,))
    object.__setattr__(self, 'couples_rows', self.loss == 'contrastive')

  def sums(self, outputs, batch) -> dict[str, jax.Array]:
    e = {side: {'vectors': v, 'mask': batch[f'{side}_score_mask']} for side, v in outputs['embeddings'].items()}
    weights_b = batch['weights'].astype(jnp.float32)
    if self.loss == 'kl':
      if 'teacher_scores' not in batch:
        raise ConfigError("loss='kl' needs teacher scores in the batch (teacher_scores [B, 1 + K])")
      out = maxsim_kl(e, batch['teacher_scores'], temperature=outputs['temperature'],
                      teacher_temperature=self.teacher_temperature or self.spec.temperature, valid_b=weights_b)
    else:
      out = maxsim_info_nce(e, temperature=outputs['temperature'], passage_ids_b=batch.get('passage_ids'),
                            negative_ids_bk=batch.get('negative_ids'), query_ids_b=batch.get('query_ids'),
                            valid_b=weights_b)
    count = jnp.sum(weights_b)
    return {f'{self.loss}_loss_sum': jnp.sum(out['loss']), f'{self.loss}_count': count,
            'correct_sum': jnp.sum(out['correct'] * weights_b)}

  def counts(self, batch) -> dict[str, jax.Array]:
    return {self.loss: jnp.sum(batch['weights'].astype(jnp.float32))}

  def summarize(self, sums) -> dict[str, Any]:
    count = jnp.maximum(sums[f'{self.loss}_count'], 1.0)
    return {'loss': sums[f'{self.loss}_loss_sum'] / count, 'accuracy': sums['correct_sum'] / count}
