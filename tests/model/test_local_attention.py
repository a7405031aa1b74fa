"""Local attention at linear cost: the blockwise path (each block of w/2 queries against three key blocks) is
the masked full path's function, on padded and packed rows, forward and backward, in a layer and a model."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config import preset
from bert_jax.model import attention, encoder, heads

from harness.inputs import random_pretraining_batch
from harness.numerics import tolerance


def _full_local(q, k, v, mask_b11s, window):
  """The masked full path: softmax over every key, those outside the window masked."""
  logits = jnp.einsum('btnh,bsnh->bnts', q, k) * q.shape[-1] ** -0.5
  logits = jnp.where(encoder.window_mask_b1ts(mask_b11s, window), logits, jnp.finfo(jnp.float32).min)
  return jnp.einsum('bnts,bsnh->btnh', jax.nn.softmax(logits, axis=-1), v)


def _inputs(t, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.normal(size=(2, t, 3, 8)), jnp.float32) for _ in range(3)]


def _no_dropout(x, deterministic):
  del deterministic
  return x


@pytest.mark.parametrize('t,window', [(16, 4), (37, 8), (5, 8), (64, 16), (33, 2)])
@pytest.mark.parametrize('rows', ['padded', 'packed'])
def test_blockwise_equals_the_masked_full_path(t, window, rows):
  """Both blockwise paths: the einsums, and 'fused', the blocks as one batch of jax.nn.dot_product_attention
  calls, the way GPUs run them through cuDNN; here with its XLA implementation (the same reshapes and mask), on GPU
  `test_..._cudnn_on_gpu`."""
  q, k, v = _inputs(t)
  rng = np.random.default_rng(1)
  if rows == 'padded':
    valid = np.ones((2, t), np.int32)
    valid[0, t - t // 3:] = 0  # padding at the end of the first row
    # Padding queries are compared nowhere: with no real key in reach their output is arbitrary (and unused).
    band, full, real = (attention.band_mask(window, t, valid), encoder.attention_mask_b11s(jnp.asarray(valid)),
                        valid > 0)
  else:  # examples of random lengths back to back, then padding
    segments = np.zeros((2, t), np.int32)
    for b in range(2):
      at, seg = 0, 1
      while at < t - 2:
        n = int(rng.integers(1, t // 2 + 2))
        segments[b, at:at + n] = seg
        at, seg = at + n, seg + 1
    band, full, real = attention.band_mask(window, t, None, segments), encoder.segment_mask_b1ts(segments), segments > 0

  paths = [lambda q, k, v: attention.blockwise_local_attention(q, k, v, band, _no_dropout, deterministic=True),
           lambda q, k, v: attention.blockwise_local_attention_fused(q, k, v, band, implementation='xla'),
           lambda q, k, v: _full_local(q, k, v, full, window)]

  # Outputs, and gradients of a loss over the real positions, of the three paths: one compiled program (op by op,
  # the same computation compiles each of its many small operations, several times slower on CPU).
  weight = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32) * real[:, :, None, None]

  @jax.jit
  def outputs_and_grads(q, k, v):
    return [(f(q, k, v), jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * weight), argnums=(0, 1, 2))(q, k, v))
            for f in paths]
  *blockwise, (want, want_grads) = outputs_and_grads(q, k, v)
  # The blocks sum over the keys in reach (a window's worth; masked keys add exact zeros to the full path's sums),
  # after scores summed over the head size: two reductions, each path in its own order.
  for got, grads in blockwise:
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real],
                               atol=tolerance(np.float32, window + 1, magnitude=np.abs(want).max(), depth=2))
    for g_block, g_full in zip(grads, want_grads):
      np.testing.assert_allclose(g_block, g_full,
                                 atol=tolerance(np.float32, window + 1, magnitude=np.abs(g_full).max(), depth=2))


def test_the_band_is_linear_in_the_row_length():
  window, t = 16, 4096
  band = attention.band_mask(window, t, jnp.ones((1, t), jnp.int32))
  assert band.shape == (1, 1, t // 8, 8, 24)  # T x 1.5 w elements, not T x T
  assert int(band.sum()) == int(encoder.window_mask_b1ts(jnp.ones((1, 1, 1, 64), bool), window).sum()) + (t - 64) * 17


@pytest.mark.slow
@pytest.mark.parametrize('packed', [False, True])
def test_a_modernbert_model_is_the_same_function_blockwise(packed):
  """A ModernBERT-shaped model (every third layer global, window 8) on rows longer than the window: the
  blockwise local layers give the full path's outputs (the full path is what attention maps use)."""
  cfg = preset('tiny', vocab_size=100, norm_position='pre', position_embedding='rotary', mlp='geglu',
               use_bias=False, type_vocab_size=0, attention_window=8, global_attention_every=3, num_layers=4,
               hidden_dropout=0.0, attention_dropout=0.0)
  model = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)).bert
  batch = random_pretraining_batch(batch_size=4, seq_len=40, vocab_size=100, seed=5)
  kwargs = {}
  if packed:
    segments = np.repeat(np.array([[1] * 17 + [2] * 15 + [0] * 8]), 4, axis=0).astype(np.int32)
    kwargs = dict(segment_ids_bt=segments)
    real = segments > 0
  else:
    real = batch['attention_mask'].astype(bool)
  blockwise, _ = model(batch['input_ids'], None, batch['attention_mask'], **kwargs)
  full, _, _ = model(batch['input_ids'], None, batch['attention_mask'], **kwargs, return_attention=True)
  close = tolerance(np.float32, cfg.intermediate_size, depth=cfg.num_layers)  # normalised outputs: magnitude 1
  np.testing.assert_allclose(np.asarray(blockwise)[real], np.asarray(full)[real], atol=close)
  scanned = dataclasses.replace(cfg, scan_layers=True, remat_policy='dots')
  graphdef, state = nnx.split(model)
  again = nnx.merge(nnx.split(heads.BertForPreTraining(scanned, rngs=nnx.Rngs(0)).bert)[0], state)
  np.testing.assert_allclose(np.asarray(again(batch['input_ids'], None, batch['attention_mask'], **kwargs)[0])[real],
                             np.asarray(blockwise)[real], atol=close)
  del graphdef


@pytest.mark.slow
def test_a_local_layer_trains_blockwise_with_attention_dropout():
  """Dropout on the band's probabilities (training): finite outputs and gradients, and some of them dropped."""
  cfg = preset('tiny', vocab_size=100, norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False,
               type_vocab_size=0, attention_window=8, global_attention_every=2, num_layers=2, attention_dropout=0.5)
  model = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)).bert
  batch = random_pretraining_batch(batch_size=2, seq_len=24, vocab_size=100, seed=3)  # 3 windows, padding in each row

  weight = jnp.asarray(np.random.default_rng(4).normal(size=(2, 24, cfg.hidden_size)), jnp.float32)

  def loss(model, deterministic=False):  # a normed output's sum of squares is constant: weight it
    return jnp.sum(model(batch['input_ids'], None, batch['attention_mask'], deterministic=deterministic)[0] * weight)

  value, grads = nnx.jit(nnx.value_and_grad(loss))(model)  # compiled whole: op by op is several times slower
  assert np.isfinite(float(value)) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert float(value) != float(nnx.jit(loss, static_argnames='deterministic')(model, deterministic=True))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs an NVIDIA GPU: JAX_PLATFORMS=cuda pytest -m gpu')
@pytest.mark.parametrize('rows', ['full', 'padded', 'packed'])
def test_a_local_layer_runs_blockwise_cudnn_on_gpu(rows):
  """A bfloat16 local layer on GPU runs its blocks through cuDNN flash attention (the compiled step holds the
  fused call) and equals the einsum blockwise path (forced with attention_impl='xla'), forward and backward."""
  t, window = 300, 128  # a last block cut short
  cfg = preset('tiny', vocab_size=100, norm_position='pre', position_embedding='rotary', mlp='geglu',
               use_bias=False, type_vocab_size=0, attention_window=window, num_heads=2, hidden_size=128,
               intermediate_size=256, dtype='bfloat16', hidden_dropout=0.0, attention_dropout=0.0,
               max_position_embeddings=t)
  if rows in ('full', 'padded'):
    valid = (np.arange(t)[None] < np.array([[t], [t if rows == 'full' else 170]])).astype(np.int32)
    band, real = attention.band_mask(window, t, valid), valid > 0
  else:
    segments = np.array([[1] * 120 + [2] * 150 + [0] * 30, [1] * 40 + [2] * 200 + [3] * 60], np.int32)
    band, real = attention.band_mask(window, t, None, segments), segments > 0
  x = jax.random.normal(jax.random.key(1), (2, t, cfg.hidden_size), jnp.float32)
  weight = jnp.asarray(np.random.default_rng(2).normal(size=x.shape), jnp.float32) * real[:, :, None]
  results = {}
  for impl in ('xla', ''):
    layer = attention.SelfAttention(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def loss(params, x, graphdef=graphdef, rest=rest):
      y = nnx.merge(graphdef, params, rest)(x, band, deterministic=False)
      return jnp.sum(y.astype(jnp.float32) * weight), y
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    hlo = step.lower(params, x).compile().as_text()
    assert ('cudnn$fmha' in hlo) == (impl == ''), impl
    (_, y), grads = step(params, x)
    results[impl] = np.asarray(y, np.float32), jax.tree.map(lambda g: np.asarray(g, np.float32), grads)
  (y_xla, g_xla), (y_cudnn, g_cudnn) = results['xla'], results['']
  np.testing.assert_allclose(y_cudnn[real], y_xla[real], atol=3e-2, rtol=3e-2)
  for a, b in zip(jax.tree.leaves(g_cudnn), jax.tree.leaves(g_xla)):
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, atol=5e-2 * max(1.0, float(np.abs(b).max())), rtol=5e-2)
