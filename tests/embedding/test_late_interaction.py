"""Multi-vector training inputs and losses: the token rows on a known tokenization (markers, [MASK] filling,
punctuation), MaxSim InfoNCE and KL against numpy references, and the InfoNCE on 8 devices equal to one device."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import late_interaction as li
from bert_jax.errors import ConfigError
from bert_jax.model.colbert import MultiVectorSpec
from bert_jax.model.pooling import l2_normalize
from bert_jax.train.step import StepModel

from harness.numerics import tolerance

SPEC = li.TokenSpec(query_length=12, document_length=16)


def test_query_rows_carry_the_marker_and_mask_filling(wordpiece):
  rows = li.MultiVectorInputs(wordpiece, SPEC).rows(['what is it?'], 'query', 2, SPEC.query_length)
  # [CLS] [ q ] what is it ? [SEP], then [MASK] up to query_length (sentence-transformers' preprocess gives these ids)
  assert rows['query_input_ids'][0].tolist() == [101, 1031, 1053, 1033, 2054, 2003, 2009, 1029, 102, 103, 103, 103]
  assert rows['query_attention_mask'][0].tolist() == [1] * 9 + [0] * 3  # the filling is not attended to ...
  assert rows['query_score_mask'][0].tolist() == [1] * 12  # ... but scored
  assert rows['query_input_ids'].shape == (2, 12)  # a padding row, and exactly query_length wide
  long = li.MultiVectorInputs(wordpiece, SPEC).rows(['what is it ' * 20], 'query', 1, SPEC.query_length)
  assert long['query_input_ids'].shape == (1, 12) and long['query_input_ids'][0, -1] == 102  # cut, [SEP] last


def test_document_rows_skip_punctuation_in_scoring_only(wordpiece):
  rows = li.MultiVectorInputs(wordpiece, SPEC).rows(['Paris, the city.'], 'passage', 1, SPEC.document_length)
  ids = rows['passage_input_ids'][0]
  # [CLS] [ d ] paris , the city . [SEP] and padding to the bucket width
  assert ids[:10].tolist() == [101, 1031, 1040, 1033, 3000, 1010, 1996, 2103, 1012, 102]
  assert rows['passage_attention_mask'][0, :10].tolist() == [1] * 10 and not rows['passage_attention_mask'][0, 10:].any()
  assert rows['passage_score_mask'][0, :10].tolist() == [1, 0, 1, 0, 1, 0, 1, 1, 0, 1]
  assert not rows['passage_score_mask'][0, 10:].any()
  plain = li.MultiVectorInputs(wordpiece, dataclasses.replace(SPEC, markers=False, skip_punctuation=False))
  rows = plain.rows(['Paris, the city.'], 'passage', 1, SPEC.document_length)
  assert rows['passage_input_ids'][0, :7].tolist() == [101, 3000, 1010, 1996, 2103, 1012, 102]
  assert rows['passage_score_mask'][0, :7].tolist() == [1] * 7
  query = plain.rows(['what is it?'], 'query', 1, SPEC.query_length)['query_input_ids'][0]
  assert query[:6].tolist() == [101, 2054, 2003, 2009, 1029, 102] and set(query[6:].tolist()) == {103}


def test_a_query_length_shorter_than_the_marker_is_refused(wordpiece):
  with pytest.raises(ConfigError, match=r"query_length=5 is too short for the query marker '\[Q\]' \(3 tokens "
                                        r'here\).*at least 6'):
    li.MultiVectorInputs(wordpiece, li.TokenSpec(query_length=5))
  li.MultiVectorInputs(wordpiece, li.TokenSpec(query_length=5, markers=False))  # no marker: room enough


def _np_maxsim(q, qm, d, dm):
  sim = np.einsum('qd,td->qt', q, d)
  sim = np.where(dm[None, :].astype(bool), sim, -np.inf)
  return float(np.sum(np.where(qm.astype(bool), sim.max(1), 0.0)))


def _case(b=8, k=1, tq=4, tp=5, d=6, seed=0):
  rng = np.random.default_rng(seed)
  unit = lambda *s: np.asarray(l2_normalize(jnp.asarray(rng.normal(size=s + (d,)), jnp.float32)))
  e = {'query': {'vectors': unit(b, tq), 'mask': np.ones((b, tq), np.int32)},
       'passage': {'vectors': unit(b, tp), 'mask': (rng.random((b, tp)) < 0.7).astype(np.int32)},
       'negative': {'vectors': unit(b, k, tp + 2), 'mask': (rng.random((b, k, tp + 2)) < 0.7).astype(np.int32)}}
  e['passage']['mask'][:, 0] = 1
  e['negative']['mask'][..., 0] = 1
  pid = rng.integers(0, b // 2, b).astype(np.int32)  # duplicate positives: masked as false negatives
  nid = rng.integers(b, 3 * b, (b, k)).astype(np.int32)
  return e, pid, nid


def test_maxsim_info_nce_matches_a_numpy_reference():
  e, pid, nid = _case()
  b, k = pid.shape[0], nid.shape[1]
  out = jax.jit(lambda e: li.maxsim_info_nce(e, temperature=0.5, passage_ids_b=pid, negative_ids_bk=nid))(e)
  cands = [(e['passage']['vectors'][c], e['passage']['mask'][c], pid[c]) for c in range(b)]
  cands += [(e['negative']['vectors'][r, j], e['negative']['mask'][r, j], nid[r, j]) for r in range(b) for j in range(k)]
  for i in range(b):
    logits = np.array([_np_maxsim(e['query']['vectors'][i], e['query']['mask'][i], v, m) / 0.5 for v, m, _ in cands])
    keep = np.array([c == i or cid != pid[i] for c, (_, _, cid) in enumerate(cands)])
    ref = np.log(np.sum(np.exp(logits[keep]))) - logits[i]
    np.testing.assert_allclose(out['loss'][i], ref, rtol=tolerance(np.float32, 24))
    assert out['correct'][i] == float(logits[i] >= logits[keep].max())


def test_maxsim_kl_matches_a_numpy_reference():
  e, _, _ = _case(k=2)
  teacher = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)
  out = jax.jit(lambda e: li.maxsim_kl(e, jnp.asarray(teacher), temperature=2.0, teacher_temperature=0.5))(e)
  for i in range(8):
    docs = [(e['passage']['vectors'][i], e['passage']['mask'][i])] + [
        (e['negative']['vectors'][i, j], e['negative']['mask'][i, j]) for j in range(2)]
    s = np.array([_np_maxsim(e['query']['vectors'][i], e['query']['mask'][i], v, m) for v, m in docs]) / 2.0
    t = teacher[i] / 0.5
    log_p, log_s = t - np.log(np.exp(t).sum()), s - np.log(np.exp(s).sum())
    np.testing.assert_allclose(out['loss'][i], 4.0 * np.sum(np.exp(log_p) * (log_p - log_s)), rtol=1e-5, atol=1e-6)
  with pytest.raises(ConfigError, match='teacher scores must be'):
    li.maxsim_kl(e, jnp.zeros((8, 2)), temperature=1.0, teacher_temperature=1.0)


def _linear_loss(w, batch):
  """Token vectors of a linear model (the encoder is not the point here): MaxSim InfoNCE over the global batch."""
  def side(x, mask):
    return {'vectors': l2_normalize(jnp.tanh(x @ w)), 'mask': mask}
  e = {'query': side(batch['q'], batch['qm']), 'passage': side(batch['p'], batch['pm']),
       'negative': side(batch['n'], batch['nm'])}
  out = li.maxsim_info_nce(e, temperature=0.2, passage_ids_b=batch['pid'], negative_ids_bk=batch['nid'])
  return jnp.mean(out['loss'])


def test_the_loss_on_8_devices_is_the_one_device_loss_of_the_global_batch():
  rng = np.random.default_rng(1)
  b = 16
  batch = {'q': rng.normal(size=(b, 4, 6)), 'p': rng.normal(size=(b, 5, 6)), 'n': rng.normal(size=(b, 1, 5, 6))}
  batch = {k: v.astype(np.float32) for k, v in batch.items()}
  batch['qm'] = np.ones((b, 4), np.int32)
  batch['pm'] = (rng.random((b, 5)) < 0.8).astype(np.int32)
  batch['nm'] = (rng.random((b, 1, 5)) < 0.8).astype(np.int32)
  batch['pm'][:, 0] = batch['nm'][..., 0] = 1
  batch['pid'] = rng.integers(0, b // 2, b).astype(np.int32)
  batch['nid'] = rng.integers(b, 3 * b, (b, 1)).astype(np.int32)
  w = rng.normal(size=(6, 8)).astype(np.float32)
  one = jax.jit(jax.value_and_grad(_linear_loss))(w, batch)
  mesh = sharding.make_mesh(config.MeshConfig(data=4, fsdp=2, tensor=1))
  step = jax.jit(sharding.under_mesh(mesh, jax.value_and_grad(_linear_loss)))
  sharded = jax.device_put(batch, sharding.batch_sharding(mesh))
  compiled = step.lower(w, sharded).compile()
  many = compiled(jax.device_put(w, sharding.replicated(mesh)), sharded)
  n = 2 * b * 4 * 5  # candidates x query tokens x document tokens
  np.testing.assert_allclose(many[0], one[0], rtol=tolerance(np.float32, n))
  np.testing.assert_allclose(many[1], one[1], rtol=tolerance(np.float32, n, depth=2),
                             atol=tolerance(np.float32, n, depth=2))
  assert 'all-gather' in compiled.as_text()  # every query meets every candidate of the global batch
  per_device = np.mean([jax.jit(_linear_loss)(w, jax.tree.map(lambda x, s=s: x[s:s + 2], batch))
                        for s in range(0, b, 2)])
  assert abs(per_device - float(one[0])) > 0.1  # scoring each device's rows alone is another loss


class ToyMultiVector(nnx.Module):
  """MultiVectorEncoder's interface (embed, temperature_value) over token features: dense + tanh, normalised."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(6, 8, rngs=rngs)

  def embed(self, batch, *, deterministic):
    del deterministic
    return {side: l2_normalize(jnp.tanh(self.dense(batch[f'{side}_x']))) for side in ('query', 'passage')}

  def temperature_value(self):
    return jnp.float32(0.5)


def test_accumulation_is_gradcache_over_the_whole_global_batch():
  """4 micro-batches on 8 devices report the loss and gradient norm of the whole batch's MaxSim InfoNCE."""
  rng = np.random.default_rng(2)
  b = 16
  batch = {'query_x': rng.normal(size=(b, 4, 6)).astype(np.float32), 'query_score_mask': np.ones((b, 4), np.int32),
           'passage_x': rng.normal(size=(b, 5, 6)).astype(np.float32),
           'passage_score_mask': (rng.random((b, 5)) < 0.8).astype(np.int32),
           'passage_ids': rng.integers(0, b // 2, b).astype(np.int32), 'weights': np.ones(b, np.float32)}
  batch['passage_score_mask'][:, 0] = 1
  objective = li.MultiVectorObjective(spec=MultiVectorSpec(temperature=0.5))
  assert objective.couples_rows and objective.terms == ('contrastive',)
  model = StepModel(lambda rngs: ToyMultiVector(rngs=rngs), objective, optax.sgd(0.5),
                    sharding.make_mesh(config.MeshConfig(data=4, fsdp=2)), grad_accum_steps=4)
  state = model.init_state(seed=0)
  params = jax.device_get(state['params'])

  def whole_batch_loss(p):
    sums = objective.sums(objective.forward(model.merge(p, model.rest), batch, deterministic=True), batch)
    return sums['contrastive_loss_sum'] / sums['contrastive_count']

  value, grads = jax.jit(jax.value_and_grad(whole_batch_loss))(params)
  _, metrics = model.train_step(state, model.global_batch(batch), model.rest)
  np.testing.assert_allclose(metrics['loss'], value, rtol=tolerance(np.float32, 2 * b * 20, depth=3))
  np.testing.assert_allclose(metrics['grad_norm'], optax.tree.norm(grads), rtol=tolerance(np.float32, 2 * b * 20, depth=3))
