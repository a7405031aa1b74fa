"""BertEncoder / BertForPreTraining: parameter counts, shapes, dtypes, padding invariance."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config
from bert_jax.model import encoder as model, heads

from harness.numerics import tolerance


@pytest.mark.parametrize('name,expected', [('base', 110_106_428), ('large', 336_226_108)])
def test_parameter_counts_match_original_bert(name, expected):
  cfg = config.preset(name, vocab_size=30522)
  abstract = nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  assert model.count_params(nnx.state(abstract, nnx.Param)) == expected


@pytest.fixture(scope='module')
def tiny():
  cfg = config.preset('tiny', vocab_size=120)
  return cfg, heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))


def _inputs(batch=2, length=9, vocab=120, seed=0):
  ids = jax.random.randint(jax.random.key(seed), (batch, length), 5, vocab)
  types = (jnp.arange(length)[None] >= length // 2).astype(jnp.int32).repeat(batch, 0)
  return ids, types, jnp.ones_like(ids)


@pytest.mark.slow
def test_shapes_and_dtypes(tiny):
  cfg, m = tiny
  ids, types, mask = _inputs()
  positions = jnp.array([[1, 3, 0], [2, 2, 5]])
  mlm, nsp = m(ids, types, mask, positions)
  assert mlm.shape == (2, 3, cfg.vocab_size) and mlm.dtype == jnp.float32
  assert nsp.shape == (2, 2) and nsp.dtype == jnp.float32
  seq, pooled = m.bert(ids, types, mask)
  assert seq.shape == (2, 9, cfg.hidden_size) and pooled.shape == (2, cfg.hidden_size)
  assert np.all(np.abs(pooled) <= 1)  # tanh pooler


@pytest.mark.slow
def test_bfloat16_model_outputs_float32_logits():
  cfg = config.preset('tiny', vocab_size=120, dtype='bfloat16')
  m = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  ids, types, mask = _inputs()
  mlm, nsp = m(ids, types, mask, jnp.zeros((2, 1), jnp.int32))
  seq, _ = m.bert(ids, types, mask)
  assert seq.dtype == jnp.bfloat16 and mlm.dtype == jnp.float32 and nsp.dtype == jnp.float32


@pytest.mark.slow
def test_extra_padding_does_not_change_real_positions(tiny):
  cfg, m = tiny
  ids, types, mask = _inputs(length=7)
  seq, pooled = m.bert(ids, types, mask)
  pad = 5
  ids_p = jnp.pad(ids, ((0, 0), (0, pad)))
  types_p = jnp.pad(types, ((0, 0), (0, pad)))
  mask_p = jnp.pad(mask, ((0, 0), (0, pad)))
  seq_p, pooled_p = m.bert(ids_p, types_p, mask_p)
  # Longer rows, other kernels and blockings: float32 rounding of the widest sums, once per layer.
  close = tolerance(np.float32, cfg.intermediate_size, depth=cfg.num_layers)
  np.testing.assert_allclose(seq_p[:, :7], seq, atol=close)
  np.testing.assert_allclose(pooled_p, pooled, atol=close)


def test_mlm_logits_use_tied_embeddings(tiny):
  cfg, m = tiny
  ids, types, mask = _inputs()
  positions = jnp.array([[4], [6]])

  @nnx.jit  # one compiled program: op by op, on 8 fake devices, it takes seconds
  def logits_and_reference(m):
    mlm, _ = m(ids, types, mask, positions)
    seq, _ = m.bert(ids, types, mask)
    h = jnp.take_along_axis(seq, positions[..., None], axis=1)
    h = m.mlm.layer_norm(jax.nn.gelu(m.mlm.transform(h), approximate=False))
    return mlm, h @ m.bert.embeddings.word_embeddings.embedding[...].T + m.mlm.bias[...]

  mlm, ref = logits_and_reference(m)
  np.testing.assert_allclose(mlm, ref,
                             atol=tolerance(np.float32, cfg.hidden_size, magnitude=np.abs(ref).max(), depth=2))
