"""Class weights and label smoothing (finetuning.class_weights, head_objective): resolved from label names and
training counts, and the losses they give against hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import sharding as shd
from bert_jax.config import MeshConfig, preset
from bert_jax.errors import ConfigError
from bert_jax.finetuning import batching, class_weights
from bert_jax.finetuning.head_objective import Finetuning, task_loss
from bert_jax.finetuning.head_tasks import finetuning_model

from harness.inputs import features as _features
from harness.numerics import tolerance

NAMES = ['negative', 'neutral', 'positive']


def test_auto_weights_are_inverse_frequency_and_named_ones_are_checked():
  counts = np.array([90, 8, 2])
  auto = class_weights.resolve('auto', 'classification', NAMES, counts, 100)
  np.testing.assert_allclose(auto, [100 / 270, 100 / 24, 100 / 6])
  assert float(np.dot(auto, counts)) == pytest.approx(100)  # the weighted examples still count N
  assert class_weights.resolve('auto', 'multilabel', NAMES, counts, 100) == pytest.approx((10 / 90, 92 / 8, 98 / 2))
  assert class_weights.resolve('auto', 'classification', NAMES, np.array([5, 0, 5]), 10)[1] == 1.0  # absent: 1
  assert class_weights.resolve(' positive=3, negative=0.5', 'token', NAMES, counts, 100) == (0.5, 1.0, 3.0)
  assert class_weights.resolve('', 'classification', NAMES, counts, 100) == ()
  for bad, message in (('happy=2', 'with labels of negative, neutral, positive'), ('positive=0', '> 0'),
                       ('positive=-1', '> 0'), ('positive=nan', '> 0'), ('positive=x', '> 0'), ('positive', 'labels of')):
    with pytest.raises(ConfigError, match=message):
      class_weights.resolve(bad, 'classification', NAMES, counts, 100)
  with pytest.raises(ConfigError, match='a regression task has no classes'):
    class_weights.resolve('auto', 'regression', [], np.zeros(0), 100)


def test_label_counts_of_each_head_kind():
  feats = _features([6, 7, 8, 9, 10])  # labels i % 3; token labels on even positions
  counts, total = class_weights.label_counts(feats, 'classification', 3)
  assert counts.tolist() == [2, 2, 1] and total == 5
  counts, total = class_weights.label_counts(feats, 'token', 3)
  assert counts.tolist() == [3 + 5, 4 + 5, 4] and total == 21  # ceil(n / 2) labelled tokens each


def _numpy_ce(logits, targets):
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -(targets * logp).sum(-1)


def test_weighted_and_smoothed_losses_match_hand_computations():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 3)).astype(np.float32)
  labels = np.array([0, 0, 0, 1, 2, 2])
  batch = {'labels': labels.astype(np.int32), 'weights': np.array([1, 1, 1, 1, 1, 0], np.float32)}
  w = (0.4, 2.0, 5.0)
  per = _numpy_ce(logits, np.eye(3)[labels]) * np.array(w)[labels] * batch['weights']
  expected = per.sum() / (np.array(w)[labels] * batch['weights']).sum()
  close = tolerance(np.float32, 3)
  np.testing.assert_allclose(task_loss('classification', logits, batch, w), expected, rtol=close)
  smoothed = np.eye(3)[labels] * 0.8 + 0.2 / 3
  expected = (_numpy_ce(logits, smoothed) * batch['weights']).sum() / 5
  np.testing.assert_allclose(task_loss('classification', logits, batch, smoothing=0.2), expected, rtol=close)
  # multilabel: the weights multiply each label's positive term (pos_weight); smoothing moves targets towards 1/2
  hot = (rng.random((6, 3)) > 0.5).astype(np.float32)
  mbatch = {'labels': hot, 'weights': batch['weights']}
  y = hot * 0.9 + 0.05
  logsig = lambda x: -np.log1p(np.exp(-x))
  per = -(np.array(w) * y * logsig(logits) + (1 - y) * logsig(-logits)).mean(-1)
  np.testing.assert_allclose(task_loss('multilabel', logits, mbatch, w, smoothing=0.1),
                             (per * batch['weights']).sum() / 5, rtol=close)
  # no weights, no smoothing: what the loss was before (optax's integer-label cross-entropy)
  plain = optax.softmax_cross_entropy_with_integer_labels(jnp.asarray(logits), jnp.asarray(labels))
  np.testing.assert_allclose(task_loss('classification', logits, batch), float((plain * batch['weights']).sum() / 5),
                             rtol=close)


@pytest.mark.slow
def test_one_example_of_a_light_class_trains_on_its_plain_loss():
  """The step divides by the batch's summed class weights even below 1 (one example of weight 0.25): its loss and
  gradient are that example's unweighted ones, not a quarter of them."""
  cfg = preset('tiny', vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
  host = batching.make_batch(_features([9]), 'classification', batch_size=8, row_length=16, pack=True,
                             rows_multiple=8)
  out = []
  for objective in (Finetuning('classification', class_weights=(0.25, 1.0, 4.0)), Finetuning('classification')):
    model = finetuning_model(cfg, 'classification', 3, optax.sgd(0.0), shd.make_mesh(MeshConfig()),
                             objective=objective)
    state = model.init_state(None, seed=0)
    _, metrics = model.train_step(state, model.global_batch(host), model.rest)
    out.append((float(metrics['loss']), float(metrics['grad_norm'])))
  close = tolerance(np.float32, 128, depth=2)
  assert out[0] == pytest.approx(out[1], rel=close)
  assert jax.device_count() == 8
