"""train.step.reused: the step models a process builds, memoised on their arguments."""

import dataclasses

import pytest

from bert_jax import config, sharding
from bert_jax.train import step


@pytest.fixture(autouse=True)
def _own_memo(monkeypatch):
  """Each test sees an empty memo (and leaves the session's as it was)."""
  monkeypatch.setattr(step, '_BUILT', type(step._BUILT)())  # pylint: disable=protected-access


def _counting():
  calls = []

  @step.reused
  def build(*args):
    calls.append(args)
    return object()

  return build, calls


def test_the_same_arguments_give_the_same_model_and_others_another():
  build, calls = _counting()
  mesh = sharding.make_mesh(config.MeshConfig())
  optim = config.OptimConfig()
  first = build(optim, 10, mesh)
  assert build(dataclasses.replace(optim), 10, mesh) is first and len(calls) == 1  # equal values: reused
  assert build(dataclasses.replace(optim, learning_rate=optim.learning_rate / 2), 10, mesh) is not first
  assert build(optim, 10.0, mesh) is not first  # 10 and 10.0 trace differently: keyed by repr, not ==
  assert build(optim, 10, sharding.make_mesh(config.MeshConfig(data=2, fsdp=4))) is not first  # another mesh
  assert len(calls) == 4


def test_only_the_last_few_are_kept():
  build, calls = _counting()
  models = [build(i) for i in range(step.STEP_MODELS_KEPT + 1)]
  assert build(step.STEP_MODELS_KEPT) is models[-1] and len(calls) == step.STEP_MODELS_KEPT + 1
  assert build(0) is not models[0]  # the oldest went
  assert len(step._BUILT) == step.STEP_MODELS_KEPT  # pylint: disable=protected-access


def test_a_failed_build_is_not_kept():
  @step.reused
  def build(x):
    raise ValueError(x)

  with pytest.raises(ValueError):
    build(1)
  assert not step._BUILT  # pylint: disable=protected-access
