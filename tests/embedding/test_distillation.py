"""Distillation losses: MarginMSE and KL against plain numpy and against sentence-transformers' own losses; the
objective in the one train step (accumulation exact, the loss falls)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.embedding import distillation
from bert_jax.embedding.distillation import Distillation
from bert_jax.errors import ConfigError
from bert_jax.model import pooling
from bert_jax.model.biencoder import ContrastiveSpec
from bert_jax.train.step import StepModel

from harness.numerics import tolerance

B, K, D = 6, 3, 16


def _inputs(seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  q, p, n = (rng.normal(size=s).astype(np.float32) for s in ((B, D), (B, D), (B, K, D)))
  teacher = (rng.normal(size=(B, 1 + K)) * scale).astype(np.float32)
  return q, p, n, teacher


def _cosines(q, p, n, dim=D):
  unit = lambda x: x[..., :dim] / np.linalg.norm(x[..., :dim], axis=-1, keepdims=True)
  candidates = np.concatenate([p[:, None], n], axis=1)
  return np.einsum('bd,bcd->bc', unit(q).astype(np.float64), unit(candidates).astype(np.float64))


def _np_margin_mse(s, t):
  return np.mean(((s[:, :1] - s[:, 1:]) - (t[:, :1] - t[:, 1:])) ** 2, axis=1)


def _np_log_softmax(x):
  x = x - x.max(axis=1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _np_kl(s, t, temperature, teacher_temperature):
  log_t, log_s = _np_log_softmax(t / teacher_temperature), _np_log_softmax(s / temperature)
  return np.sum(np.exp(log_t) * (log_t - log_s), axis=1) * temperature ** 2


def test_margin_mse_and_kl_are_the_plain_formulas_per_row():
  q, p, n, t = _inputs()
  s = _cosines(q, p, n)
  valid = np.array([1, 1, 1, 1, 0, 1], np.float32)
  got = distillation.distill(q, p, n, t, loss='margin_mse', valid_b=valid)
  np.testing.assert_allclose(got['loss'], _np_margin_mse(s, t) * valid, rtol=tolerance(np.float32, D, 4.0), atol=1e-6)
  got = distillation.distill(q, p, n, t, loss='kl', temperature=0.05, teacher_temperature=1.0)
  # the student's scores / 0.05 reach 20: errors of its log-softmax scale with them
  np.testing.assert_allclose(got['loss'], _np_kl(s, t, 0.05, 1.0), rtol=tolerance(np.float32, D, 20.0),
                             atol=tolerance(np.float32, D, 20.0) * 0.05 ** 2)
  np.testing.assert_array_equal(got['correct'], s[:, 0] >= s[:, 1:].max(axis=1))
  # the teacher's temperature defaults to the student's
  np.testing.assert_allclose(distillation.distill(q, p, n, t, loss='kl', temperature=0.5)['loss'],
                             _np_kl(s, t, 0.5, 0.5), rtol=tolerance(np.float32, D, 2.0), atol=1e-7)


def test_matryoshka_sizes_weigh_the_loss_at_each_leading_size():
  q, p, n, t = _inputs(1)
  got = distillation.distill(q, p, n, t, loss='margin_mse', dims=(16, 8), dim_weights=(1.0, 3.0))
  per_dim = {d: _np_margin_mse(_cosines(q, p, n, d), t) for d in (16, 8)}
  np.testing.assert_allclose(got['loss_8'], per_dim[8], rtol=tolerance(np.float32, D, 4.0), atol=1e-6)
  np.testing.assert_allclose(got['loss'], (per_dim[16] + 3 * per_dim[8]) / 4, rtol=tolerance(np.float32, D, 4.0),
                             atol=1e-6)


def test_the_teacher_gets_no_gradient_and_a_perfect_student_no_loss():
  q, p, n, _ = _inputs(2)
  s = _cosines(q, p, n).astype(np.float32)
  # a teacher whose margins are the student's: MarginMSE 0; a teacher with the student's distribution: KL 0
  assert float(jnp.max(distillation.distill(q, p, n, s + 7.0, loss='margin_mse')['loss'])) < 1e-10
  assert float(jnp.max(jnp.abs(distillation.distill(q, p, n, s * 20, loss='kl', temperature=0.05,
                                                    teacher_temperature=1.0)['loss']))) < 1e-9
  grad = jax.grad(lambda t: jnp.sum(distillation.distill(q, p, n, t, loss='kl', temperature=0.1)['loss']))(s)
  np.testing.assert_array_equal(grad, 0)


@pytest.mark.parametrize('kwargs, message', [
    (dict(loss='mse'), 'must be one of margin_mse, kl'),
    (dict(loss='kl'), "needs the student's temperature"),
    (dict(loss='kl', temperature=0.0), 'temperature must be a finite number > 0'),
    (dict(loss='margin_mse', teacher=np.zeros((B, K), np.float32)), r'teacher scores must be \[B, 1 \+ K\] = \[6, 4\]'),
    (dict(loss='margin_mse', negatives=None), 'distillation needs hard negatives'),
])
def test_bad_arguments_are_config_errors(kwargs, message):
  q, p, n, t = _inputs()
  n = kwargs.pop('negatives', n)
  t = kwargs.pop('teacher', t)
  with pytest.raises(ConfigError, match=message):
    distillation.distill(q, p, n, t, **kwargs)


@pytest.mark.slow  # importing sentence-transformers takes 6 s
def test_equal_to_sentence_transformers_losses():
  import torch  # pylint: disable=g-import-not-at-top
  st_losses = pytest.importorskip('sentence_transformers.sentence_transformer.losses')
  q, p, n, t = _inputs(3, scale=3.0)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # a normalising model's embeddings
  columns = [torch.from_numpy(unit(q)), torch.from_numpy(unit(p))] + [torch.from_numpy(unit(n[:, i])) for i in range(K)]
  labels = torch.from_numpy(t)
  # the model is only used to embed; the losses are computed from the embeddings
  ours = float(jnp.mean(distillation.distill(q, p, n, t, loss='margin_mse')['loss']))
  theirs = float(st_losses.MarginMSELoss(model=None).compute_loss_from_embeddings(columns, labels))
  np.testing.assert_allclose(ours, theirs, rtol=tolerance(np.float32, D * B * K, 4.0))
  for temperature, teacher_temperature in ((1.0, 1.0), (0.05, 2.0)):
    loss = st_losses.DistillKLDivLoss(model=None, student_temperature=temperature,
                                      teacher_temperature=teacher_temperature)
    theirs = float(loss.compute_loss_from_embeddings(columns, labels))
    ours = float(jnp.mean(distillation.distill(q, p, n, t, loss='kl', temperature=temperature,
                                               teacher_temperature=teacher_temperature)['loss']))
    np.testing.assert_allclose(ours, theirs, rtol=tolerance(np.float32, D * B * (1 + K), 1 / temperature))


FEATURES, WIDTH = 6, 8


class ToyBiEncoder(nnx.Module):
  """BiEncoder's interface (embed with negatives, temperature_value) over feature vectors: dense + tanh, a learned
  temperature; compiles in a fraction of BERT's time."""

  def __init__(self, spec: ContrastiveSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.dense = nnx.Linear(FEATURES, WIDTH, rngs=rngs)
    self.temperature = nnx.Param(jnp.asarray(0.0))

  def embed(self, batch, *, deterministic):
    del deterministic
    return {side: pooling.l2_normalize(jnp.tanh(self.dense(batch[side]))) for side in ('query', 'passage', 'negative')}

  def temperature_value(self):
    return 0.05 + 0.2 * jax.nn.sigmoid(self.temperature[...])


def _batch(b=16, seed=0):
  rng = np.random.default_rng(seed)
  weights = np.ones(b, np.float32)
  weights[-2:] = 0  # padding rows
  return {'query': rng.normal(size=(b, FEATURES)).astype(np.float32),
          'passage': rng.normal(size=(b, FEATURES)).astype(np.float32),
          'negative': rng.normal(size=(b, 2, FEATURES)).astype(np.float32),
          'teacher_scores': rng.normal(size=(b, 3)).astype(np.float32), 'weights': weights}


@pytest.mark.parametrize('loss', ['margin_mse', 'kl'])
def test_accumulated_steps_equal_the_whole_batch_and_training_lowers_the_loss(loss):
  # Rows are independent: 4 micro-batches summed (each over the whole batch's count) are the whole batch's loss and
  # gradient, on 8 devices; and steps on one batch lower its loss.
  spec = ContrastiveSpec(learn_temperature=loss == 'kl')
  objective = Distillation(spec, loss=loss, teacher_temperature=0.1)
  assert not objective.couples_rows  # plain accumulation, not GradCache
  mesh = sharding.make_mesh(config.MeshConfig(data=8))
  batch = _batch()

  def run(k, steps):  # (the loss of each step, the first step's gradient norm)
    model = StepModel(lambda rngs: ToyBiEncoder(spec, rngs=rngs), objective, optax.sgd(0.5), mesh,
                      grad_accum_steps=k)
    state, losses, norms = model.init_state(seed=0), [], []
    for _ in range(steps):
      state, metrics = model.train_step(state, model.global_batch(batch), model.rest)
      losses.append(float(metrics['loss']))
      norms.append(float(metrics['grad_norm']))
    return losses, norms[0]

  whole, whole_norm = run(1, 8)
  accumulated, accumulated_norm = run(4, 1)
  np.testing.assert_allclose(accumulated[0], whole[0], rtol=tolerance(np.float32, 16, depth=3))
  np.testing.assert_allclose(accumulated_norm, whole_norm, rtol=tolerance(np.float32, 16, depth=3))
  assert whole[-1] < 0.9 * whole[0], whole
