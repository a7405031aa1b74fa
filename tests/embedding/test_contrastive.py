"""InfoNCE: hand-computed cases, a brute-force reference, bad inputs, and the global batch on 8 devices."""

import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import contrastive
from bert_jax.model import biencoder
from bert_jax.errors import ConfigError
from bert_jax.model.encoder import BertEncoder

from harness.numerics import tolerance


def _loss(*args, **kwargs):
  arrays = [jnp.asarray(a, jnp.float32) for a in args]
  # Under jit: one compilation, not one per operation run eagerly.
  return np.asarray(jax.jit(lambda *a: contrastive.info_nce(*a, **kwargs)['loss'])(*arrays))


E0, E1 = [1.0, 0.0], [0.0, 1.0]


def test_in_batch_negatives_by_hand():
  # Row 0 scores [1, 0] against passages (E0, E1), row 1 [0, 1]: log(e + 1) - 1 each, at temperature 1.
  expected = math.log(math.e + 1) - 1
  np.testing.assert_allclose(_loss([E0, E1], [E0, E1], temperature=1.0), [expected] * 2, atol=tolerance(np.float32, 2))
  # Temperature 0.5 doubles the logits.
  np.testing.assert_allclose(_loss([E0, E1], [E0, E1], temperature=0.5), [math.log(math.e**2 + 1) - 2] * 2,
                             atol=tolerance(np.float32, 2, magnitude=2))
  # Cosine: the lengths of the vectors do not matter.
  np.testing.assert_allclose(_loss([[3.0, 0.0], E1], [E0, [0.0, 7.0]], temperature=1.0), [expected] * 2,
                             atol=tolerance(np.float32, 2, depth=2))


def test_false_negatives_are_masked_by_id():
  # Both rows have the same passage (E0). Counted as a negative it ties with the positive: log 2 for row 0; row 1
  # (E1 . E0 = 0 for both) log 2 as well. Masked (same id), each row has only its positive left: loss 0.
  np.testing.assert_allclose(_loss([E0, E1], [E0, E0], temperature=1.0), [math.log(2)] * 2,
                             atol=tolerance(np.float32, 2))
  np.testing.assert_allclose(_loss([E0, E1], [E0, E0], temperature=1.0, passage_ids_b=jnp.array([7, 7])),
                             [0.0, 0.0], atol=tolerance(np.float32, 2))
  # Different ids: nothing masked, whatever the vectors.
  np.testing.assert_allclose(_loss([E0, E1], [E0, E0], temperature=1.0, passage_ids_b=jnp.array([7, 8])),
                             [math.log(2)] * 2, atol=tolerance(np.float32, 2))
  # The same query twice (query ids) with different passages: each row's other passage is a positive too.
  np.testing.assert_allclose(_loss([E0, E0], [E0, E1], temperature=1.0, query_ids_b=jnp.array([3, 3])),
                             [0.0, 0.0], atol=tolerance(np.float32, 2))


def test_hard_negatives_by_hand():
  # Row 0: candidates p0=E0 (id 1), p1=E1 (id 2), n0=E1 (id 2), n1=E0 (id 1: row 0's own passage -> masked).
  # Logits [1, 0, 0, masked]: log(e + 2) - 1. Row 1: p0=E0 (id 1), p1 (its positive), n0 (id 2: masked), n1=E0:
  # logits [0, 1, masked, 0]: log(e + 2) - 1.
  q, p, n = [E0, E1], [E0, E1], [[E1], [E0]]
  out = _loss(q, p, n, temperature=1.0, passage_ids_b=jnp.array([1, 2]), negative_ids_bk=jnp.array([[2], [1]]))
  np.testing.assert_allclose(out, [math.log(math.e + 2) - 1] * 2, atol=tolerance(np.float32, 4))
  # Without ids, n1 counts for row 0 and n0 for row 1: log(2e + 2) - 1.
  np.testing.assert_allclose(_loss(q, p, n, temperature=1.0), [math.log(2 * math.e + 2) - 1] * 2,
                             atol=tolerance(np.float32, 4))


def test_symmetric_adds_the_passage_to_query_direction():
  # q = (E0, E0 + E1), p = (E0, E1); cosines q.p: [[1, 0], [s, s]] with s = 1/sqrt(2).
  s = 1 / math.sqrt(2)
  q2p = [math.log(math.e + 1) - 1, math.log(2 * math.exp(s)) - s]
  # passage -> query: p0 scores (q0, q1) = (1, s), p1 scores (0, s).
  p2q = [math.log(math.e + math.exp(s)) - 1, math.log(1 + math.exp(s)) - s]
  q, p = [E0, [1.0, 1.0]], [E0, E1]
  np.testing.assert_allclose(_loss(q, p, temperature=1.0), q2p, atol=tolerance(np.float32, 2, depth=2))
  np.testing.assert_allclose(_loss(q, p, temperature=1.0, symmetric=True), np.add(q2p, p2q) / 2,
                             atol=tolerance(np.float32, 2, depth=2))


def test_matryoshka_weights_the_loss_at_each_leading_size():
  # At 2 dims the vectors are the hand case above; at 4 dims the extra components change the cosines.
  q = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
  p = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
  out = contrastive.info_nce(jnp.array(q), jnp.array(p), temperature=1.0, dims=(4, 2), dim_weights=(1.0, 3.0))
  at2 = math.log(math.e + 1) - 1
  s = 1 / math.sqrt(2)  # at 4 dims each query's cosine with its positive is s, with the other passage 0
  at4 = math.log(math.exp(s) + 1) - s
  np.testing.assert_allclose(out['loss_2'], [at2] * 2, atol=tolerance(np.float32, 4, depth=2))
  np.testing.assert_allclose(out['loss_4'], [at4] * 2, atol=tolerance(np.float32, 4, depth=2))
  np.testing.assert_allclose(out['loss'], [(at4 + 3 * at2) / 4] * 2, atol=tolerance(np.float32, 4, depth=2))
  np.testing.assert_array_equal(out['correct'], [1.0, 1.0])


def _reference(q, p, n, t, pid, nid, qid, valid, symmetric, dims, weights):
  """Brute force: loops over rows and candidates, in float64."""
  def unit(x, d):
    x = np.asarray(x, np.float64)[..., :d]
    return x / np.linalg.norm(x, axis=-1, keepdims=True)
  b, k = len(q), n.shape[1]
  total = np.zeros(b)
  for d, w in zip(dims, weights):
    qd, pd, nd = unit(q, d), unit(p, d), unit(n, d)
    cands = [(pd[j], pid[j], qid[j], valid[j]) for j in range(b)]
    cands += [(nd[j, m], nid[j, m], None, valid[j]) for j in range(b) for m in range(k)]
    loss = np.zeros(b)
    for i in range(b):
      logits = []
      for c, (vec, cid, cqid, cvalid) in enumerate(cands):
        dropped = c != i and (cid == pid[i] or (cqid is not None and cqid == qid[i]) or not cvalid)
        if not dropped:
          logits.append((c == i, qd[i] @ vec / t))
      z = np.log(sum(np.exp(v) for _, v in logits))
      loss[i] = z - next(v for own, v in logits if own)
      if symmetric:
        back = [(j == i, pd[i] @ qd[j] / t) for j in range(b)
                if j == i or not (pid[j] == pid[i] or qid[j] == qid[i] or not valid[j])]
        z = np.log(sum(np.exp(v) for _, v in back))
        loss[i] = (loss[i] + z - next(v for own, v in back if own)) / 2
    total += w * np.where(valid, loss, 0.0)
  return total / sum(weights)


@pytest.mark.parametrize('symmetric', [False, True])
def test_matches_a_brute_force_reference(symmetric):
  rng = np.random.default_rng(0)
  b, k, d = 12, 2, 16
  q, p, n = rng.normal(size=(b, d)), rng.normal(size=(b, d)), rng.normal(size=(b, k, d))
  pid = rng.integers(0, 8, b)  # duplicates among the positives
  nid = rng.integers(0, 8, (b, k))  # and negatives equal to some positive
  n[nid < 8] = 0  # placeholder, replaced below: a negative with a positive's id is that passage
  for j in range(b):
    for m in range(k):
      same = np.flatnonzero(pid == nid[j, m])
      n[j, m] = p[same[0]] if same.size else rng.normal(size=d)
  for j in range(b):  # equal ids, equal passages
    p[j] = p[np.flatnonzero(pid == pid[j])[0]]
  qid = rng.integers(0, 10, b)
  valid = np.ones(b, bool)
  valid[-2:] = False
  dims, weights, t = (16, 8, 4), (1.0, 0.5, 0.25), 0.07
  loss = functools.partial(contrastive.info_nce, temperature=t, symmetric=symmetric, dims=dims, dim_weights=weights)
  got = jax.jit(loss)(*(jnp.asarray(x, jnp.float32) for x in (q, p, n)), passage_ids_b=pid, negative_ids_bk=nid,
                      query_ids_b=qid, valid_b=valid)
  np.testing.assert_allclose(got['loss'], _reference(q, p, n, t, pid, nid, qid, valid, symmetric, dims, weights),
                             atol=tolerance(np.float32, 3 * 12, magnitude=1 / t))  # 36 candidates
  assert np.all(np.asarray(got['loss'])[~valid] == 0)


@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=0.0), 'temperature must be a finite number > 0'),
    (dict(temperature=-0.05), 'temperature must be a finite number > 0'),
    (dict(temperature=float('nan')), 'temperature must be a finite number > 0'),
    (dict(temperature=0.05, dims=(8, 2)), 'exceeds the model\'s hidden size 4'),
    (dict(temperature=0.05, dims=(2, 4)), 'strictly decreasing'),
    (dict(temperature=0.05, dims=(4, 4)), 'strictly decreasing'),
    (dict(temperature=0.05, dims=(4, 0)), 'positive integers'),
    (dict(temperature=0.05, dims=()), 'at least one size'),
    (dict(temperature=0.05, dims=(4, 2), dim_weights=(1.0,)), '1 matryoshka weights for 2 dims'),
    (dict(temperature=0.05, dims=(4, 2), dim_weights=(0.0, 0.0)), 'not all 0'),
])
def test_bad_settings_raise_one_clear_error(kwargs, message):
  q = jnp.ones((2, 4))
  with pytest.raises(ConfigError, match=message):
    contrastive.info_nce(q, q, **kwargs)


def test_negatives_without_ids_next_to_passage_ids_are_refused():
  q = jnp.ones((2, 4))
  with pytest.raises(ConfigError, match='negative_ids_bk is needed'):
    contrastive.info_nce(q, q, jnp.ones((2, 1, 4)), temperature=0.05, passage_ids_b=jnp.array([0, 1]))
  with pytest.raises(ConfigError, match='hard negatives must be'):
    contrastive.info_nce(q, q, jnp.ones((2, 1, 3)), temperature=0.05)


def test_learned_temperature_stays_in_its_bounds_with_a_live_gradient():
  raw = biencoder.temperature_parameter(0.05)
  np.testing.assert_allclose(biencoder.bounded_temperature(raw), 0.05, rtol=1e-5)
  for far in (-1e4, 1e4):
    t = biencoder.bounded_temperature(far)
    assert np.float32(biencoder.TEMPERATURE_MIN) <= t <= np.float32(biencoder.TEMPERATURE_MAX)
  grad = jax.grad(lambda r: biencoder.bounded_temperature(r))(jnp.float32(raw))
  assert np.isfinite(grad) and grad > 0
  for lo, hi, init, message in [(0.1, 0.05, 0.07, 'min < max'), (0.01, 1.0, 2.0, 'outside its bounds'),
                                (0.0, 1.0, 0.5, '> 0')]:
    with pytest.raises(ConfigError, match=message):
      biencoder.temperature_parameter(init, lo, hi)


# ------------------------------------------------------------------------------------------ the global batch


def _mesh():
  return sharding.make_mesh(config.MeshConfig(data=4, fsdp=2, tensor=1))


def _linear_loss(params, batch):
  """A linear embedding model (the encoder is not the point here) with a learned temperature."""
  def emb(x):
    return jnp.tanh(x @ params['w'])
  out = contrastive.info_nce(emb(batch['q']), emb(batch['p']), emb(batch['n']),
                             temperature=biencoder.bounded_temperature(params['t']),
                             passage_ids_b=batch['pid'], negative_ids_bk=batch['nid'], symmetric=True)
  return contrastive.mean_loss(out['loss'])


def _linear_case(b=32):
  rng = np.random.default_rng(1)
  batch = {'q': rng.normal(size=(b, 6)), 'p': rng.normal(size=(b, 6)), 'n': rng.normal(size=(b, 2, 6))}
  batch = {k: v.astype(np.float32) for k, v in batch.items()}
  batch['pid'] = rng.integers(0, b // 2, b).astype(np.int32)  # duplicates across devices
  batch['nid'] = rng.integers(b // 2, 2 * b, (b, 2)).astype(np.int32)
  params = {'w': rng.normal(size=(6, 8)).astype(np.float32), 't': biencoder.temperature_parameter(0.05)}
  return params, batch


def test_the_loss_on_8_devices_is_the_one_device_loss_of_the_global_batch():
  params, batch = _linear_case()
  one = jax.jit(jax.value_and_grad(_linear_loss))(params, batch)  # numpy inputs: one device

  mesh = _mesh()
  sharded = jax.device_put(batch, sharding.batch_sharding(mesh))
  assert sharded['q'].sharding.spec == P(('data', 'fsdp'))
  step = jax.jit(sharding.under_mesh(mesh, jax.value_and_grad(_linear_loss)))
  compiled = step.lower(params, sharded).compile()
  many = compiled(jax.device_put(params, sharding.replicated(mesh)), sharded)
  np.testing.assert_allclose(many[0], one[0], rtol=tolerance(np.float32, 96))  # 96 candidates
  for a, b in zip(jax.tree.leaves(many[1]), jax.tree.leaves(one[1])):
    np.testing.assert_allclose(a, b, rtol=tolerance(np.float32, 96, depth=2), atol=tolerance(np.float32, 96, depth=2))
  # The candidates are gathered (every query sees all 32 passages), not scored per device.
  assert 'all-gather' in compiled.as_text()
  # Scoring each device's 4 rows only would give another loss: the equality above is not vacuous.
  local = jax.jit(_linear_loss)
  per_device = np.mean([local(params, jax.tree.map(lambda x, s=s: x[s:s + 4], batch)) for s in range(0, 32, 4)])
  assert abs(per_device - float(one[0])) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize('dtype,rtol', [('float32', 1e-5), ('bfloat16', 1e-2)])
def test_tiny_bert_on_8_devices_equals_one_device(dtype, rtol):
  # bfloat16: Dense's CPU backward (row-major copies of the transposed operands, `layers.matmul`) on sharded rows;
  # the tolerance is a few bfloat16 roundings of the largest gradient (the position table's differs by up to 0.01
  # with jax's own backward too), where a mis-sharded transpose would be off by O(1).
  cfg = config.preset('tiny', vocab_size=64, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
                      dtype=dtype)
  graphdef, params, rest = nnx.split(BertEncoder(cfg, rngs=nnx.Rngs(params=0, dropout=1)), nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  rng = np.random.default_rng(0)
  b, t = 16, 8
  batch = {}
  for side in ('query', 'passage'):
    batch[f'{side}_input_ids'] = rng.integers(1, 64, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    mask[:, rng.integers(3, t):] = 0
    batch[f'{side}_attention_mask'] = mask
  embed = biencoder.embed_fn(graphdef, rest, pooling='mean')  # dropout on: its masks do not depend on the layout

  def loss(params, batch):
    e = embed(params, batch, jax.random.key(5))
    return contrastive.mean_loss(contrastive.info_nce(e['query'], e['passage'], temperature=0.05)['loss'])

  one = jax.jit(jax.value_and_grad(loss))(params, batch)
  mesh = _mesh()
  many = jax.jit(sharding.under_mesh(mesh, jax.value_and_grad(loss)))(
      jax.device_put(params, sharding.replicated(mesh)), jax.device_put(batch, sharding.batch_sharding(mesh)))
  np.testing.assert_allclose(many[0], one[0], rtol=rtol)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(one[1]))
  for a, g in zip(jax.tree.leaves(many[1]), jax.tree.leaves(one[1])):
    np.testing.assert_allclose(a, g, atol=rtol * scale)


def test_replicated_candidates_use_the_rules_table():
  # The queries follow 'activation_batch' (data x fsdp); the candidates are replicated whatever the table says.
  mesh = _mesh()
  spec = sharding.logical_to_spec(contrastive._ROWS)  # pylint: disable=protected-access
  assert NamedSharding(mesh, spec).spec == P(('data', 'fsdp'), None)
  assert sharding.logical_to_spec(contrastive._GATHERED) == P(None, None)  # pylint: disable=protected-access
