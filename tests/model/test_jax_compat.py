"""bert_jax.model.jax_compat: building a module under a trace never builds a tracer's origin message."""

from flax import nnx
import jax
from jax._src.interpreters import partial_eval as pe
import pytest

from bert_jax import config
from bert_jax.model.heads import BertForPreTraining


def test_building_a_model_abstractly_asks_no_tracer_for_its_origin(monkeypatch):
  asked = []
  monkeypatch.setattr(pe.DynamicJaxprTracer, '_origin_msg', lambda self: asked.append(1) or '')
  abstract = nnx.eval_shape(lambda: BertForPreTraining(config.preset('tiny', vocab_size=100), rngs=nnx.Rngs(0)))
  assert asked == []  # before the fix: two per RNG draw (each walked and printed the jaxpr so far)
  assert abstract.bert.embeddings.word_embeddings.embedding.get_value().shape == (100, config.preset('tiny').hidden_size)

  def sharding_of_a_tracer(x):
    assert not hasattr(x, 'sharding')  # what flax's getattr(value, 'sharding', None) relies on
    with pytest.raises(AttributeError, match="The 'sharding' attribute is not available"):
      x.sharding  # pylint: disable=pointless-statement
    return x

  jax.jit(sharding_of_a_tracer)(1.0)
