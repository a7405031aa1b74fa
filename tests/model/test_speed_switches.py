"""Speed switches compute the same function: attention kernel, remat, scan over layers, bfloat16."""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.errors import ConfigError
from bert_jax.model import attention, encoder as model, heads
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

from harness.inputs import random_pretraining_batch
from harness.numerics import largest, tolerance


def _cfg(**overrides):
  return config.preset('tiny', vocab_size=100, **overrides)


# --- attention kernel ------------------------------------------------------------------------


def test_attention_choice_is_automatic():
  bf16 = _cfg(dtype='bfloat16', attention_dropout=0.0)
  choose = attention.choose_attention
  assert choose(bf16, 'gpu', training=False) == 'cudnn'
  assert choose(bf16, 'gpu', training=True, seq_len=128) == 'cudnn'
  assert choose(bf16, 'gpu', training=True, seq_len=127) == 'xla'  # cuDNN's bias backward: even lengths
  assert choose(bf16, 'gpu', training=False, seq_len=127) == 'cudnn'
  for platform in ('cpu', 'tpu', 'rocm'):
    assert choose(bf16, platform, training=False) == 'xla'
  assert choose(_cfg(attention_dropout=0.0), 'gpu', training=False) == 'xla'  # float32
  wide = _cfg(dtype='bfloat16', hidden_size=512, num_heads=2)  # head dim 256
  assert choose(wide, 'gpu', training=False) == 'xla'
  dropout = _cfg(dtype='bfloat16', attention_dropout=0.1)
  assert choose(dropout, 'gpu', training=True) == 'einsum'  # the only path with attention dropout
  assert choose(dropout, 'gpu', training=False) == 'cudnn'
  line = attention.describe_attention(dropout, 'gpu')
  assert line.startswith('attention: cudnn (flash) for inference; einsum') and 'attention_dropout=0.1' in line
  assert attention.describe_attention(_cfg(), 'cpu').startswith('attention: xla')


def test_forced_attention_impl_is_honoured():
  choose = attention.choose_attention
  bf16 = dict(dtype='bfloat16', attention_dropout=0.0)
  assert choose(_cfg(attention_impl='xla', **bf16), 'gpu', training=True) == 'xla'
  assert choose(_cfg(attention_impl='cudnn', **bf16), 'gpu', training=False) == 'cudnn'
  assert choose(_cfg(attention_impl='einsum', **bf16), 'gpu', training=False) == 'einsum'
  # Attention dropout while training needs the explicit path whatever is forced.
  assert choose(_cfg(attention_impl='cudnn', dtype='bfloat16'), 'gpu', training=True) == 'einsum'
  with pytest.raises(ConfigError, match="attention_impl='cudnn' cannot run: it needs an NVIDIA GPU"):
    choose(_cfg(attention_impl='cudnn'), 'cpu', training=False)
  with pytest.raises(ConfigError, match='model.attention_impl must be one of'):
    _cfg(attention_impl='flash')
  with pytest.raises(ConfigError, match='model.remat_policy must be one of'):
    _cfg(remat_policy='some')
  assert config.architecture_diffs(dataclasses.asdict(_cfg()), _cfg(remat_policy='full', scan_layers=True)) == []


def _naive_attention(attn, x_btd, mask_b1ts):
  """softmax(QK^T / sqrt(h)) V in float64; a query row with no visible key averages every value."""
  q, k, v = (np.asarray(f(x_btd), np.float64) for f in (attn.query, attn.key, attn.value))
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(q.shape[-1])
  logits = np.where(np.asarray(mask_b1ts), logits, -1e30)  # all -1e30: uniform
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return attn.output(jnp.asarray(np.einsum('bnts,bsnh->btnh', p, v), jnp.float32))


@pytest.mark.parametrize('kind', ['padding', 'segments'])
def test_attention_kernels_match_naive_reference(kind):
  x = jax.random.normal(jax.random.key(1), (2, 8, 64))
  if kind == 'padding':
    mask = model.attention_mask_b11s(jnp.array([[1] * 8, [1] * 5 + [0] * 3]))
  else:  # two packed examples and padding (segment 0: a query row that sees no key)
    mask = model.segment_mask_b1ts(jnp.array([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]))
    assert not np.asarray(mask)[0, 0, 6].any()
  ref = close = None
  for impl in ('', 'xla', 'einsum'):
    attn = attention.SelfAttention(_cfg(attention_impl=impl, attention_dropout=0.0), rngs=nnx.Rngs(0))
    if ref is None:  # outputs of size |ref| (0.03 at this init) from sums over the keys and the hidden size
      ref = _naive_attention(attn, x, mask)
      close = tolerance(np.float32, 64, magnitude=np.abs(ref).max(), depth=2)
    for deterministic in (True, False):  # no dropout: training computes the same function
      out = attn(x, mask, deterministic=deterministic)
      assert np.all(np.isfinite(out))
      np.testing.assert_allclose(out, ref, atol=close, err_msg=f'{impl!r} deterministic={deterministic}')
  out, probs = attn(x, mask, deterministic=True, return_probs=True)
  np.testing.assert_allclose(out, ref, atol=close)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=tolerance(np.float32, 8))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs an NVIDIA GPU: JAX_PLATFORMS=cuda pytest -m gpu')
@pytest.mark.parametrize('kind', ['padding', 'padding_dense', 'segments'])
def test_cudnn_matches_xla_on_gpu(kind):
  """Padding reaches cuDNN as row lengths (model.fused_mask='lengths', the default) or as a dense mask."""
  x = jax.random.normal(jax.random.key(1), (4, 16, 64)).astype(jnp.bfloat16)
  if kind.startswith('padding'):
    mask = model.attention_mask_b11s(jnp.arange(16)[None] < jnp.array([[16], [9], [12], [1]]))
  else:
    mask = model.segment_mask_b1ts(jnp.array([[1] * 6 + [2] * 6 + [0] * 4] * 4))
  valid = np.asarray(jnp.broadcast_to(mask, (4, 1, 16, 16)).any(-1))[:, 0]  # query rows that see a key
  results = {}
  for impl in ('xla', 'cudnn'):
    cfg = _cfg(dtype='bfloat16', attention_dropout=0.0, attention_impl=impl,
               fused_mask='dense' if kind == 'padding_dense' else 'lengths')
    graphdef, params, rest = nnx.split(attention.SelfAttention(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

    def loss(params, x):
      y = nnx.merge(graphdef, params, rest)(x, mask, deterministic=False)
      return jnp.sum(jnp.where(valid[..., None], y, 0).astype(jnp.float32) ** 2), y
    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    results[impl] = y, grads
  (y_xla, g_xla), (y_cudnn, g_cudnn) = results['xla'], results['cudnn']
  np.testing.assert_allclose(np.asarray(y_cudnn, np.float32)[valid], np.asarray(y_xla, np.float32)[valid],
                             atol=2e-2, rtol=2e-2)
  for a, b in zip(jax.tree.leaves(g_cudnn), jax.tree.leaves(g_xla)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=5e-2, rtol=5e-2)


# --- remat and scan over layers ----------------------------------------------------------------

_BATCH = random_pretraining_batch(batch_size=8, seq_len=16, vocab_size=100, seed=3)


_BASE = _cfg(num_layers=3, hidden_dropout=0.1, attention_dropout=0.1)


def _new_model(cfg):
  return heads.BertForPreTraining(cfg, rngs=nnx.Rngs(params=0, dropout=1))


@functools.cache
def _init():
  """(params, rest) as pure dicts, created once under jit (eager init is slow): no switch changes them."""
  return jax.jit(lambda: tuple(nnx.to_pure_dict(s) for s in nnx.split(_new_model(_BASE), nnx.Param, ...)[1:]))()


def _losses_and_grads(cfg):
  """{'off', 'on'}: (loss, grads) without / with dropout; the same init and dropout keys for every cfg."""
  graphdef = nnx.split(nnx.eval_shape(lambda: _new_model(cfg)), nnx.Param, ...)[0]
  params, rest = _init()

  def loss_fn(params, deterministic):
    b = _BATCH
    mlm, nsp = nnx.merge(graphdef, params, rest)(b['input_ids'], b['token_type_ids'], b['attention_mask'],
                                                  b['masked_lm_positions'], deterministic=deterministic)
    w = b['masked_lm_weights']
    mlm_loss = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(mlm, b['masked_lm_ids']) * w) / w.sum()
    return mlm_loss + optax.softmax_cross_entropy_with_integer_labels(nsp, b['next_sentence_labels']).mean()

  both = jax.jit(lambda p: {'off': jax.value_and_grad(loss_fn)(p, True),
                            'on': jax.value_and_grad(loss_fn)(p, False)})
  return jax.device_get(both(params))


@pytest.fixture(scope='module')
def unscanned():
  return _losses_and_grads(_BASE)


@pytest.mark.slow
@pytest.mark.parametrize('remat,scan', [('full', False), ('dots', False), ('none', True), ('full', True)])
def test_remat_and_scan_give_the_same_loss_and_grads(unscanned, remat, scan):
  got = _losses_and_grads(dataclasses.replace(_BASE, remat_policy=remat, scan_layers=scan))
  # Dropout on too: every layer keeps its own dropout streams, so the masks are the same.
  for mode in ('off', 'on'):
    (loss, grads), (ref_loss, ref_grads) = got[mode], unscanned[mode]
    # Other fusions, other summation orders: the widest sums (the MLP's), once per layer; a gradient sums over the
    # batch's 8 x 16 tokens too.
    np.testing.assert_allclose(loss, ref_loss, rtol=tolerance(np.float32, _BASE.intermediate_size,
                                                              depth=_BASE.num_layers), err_msg=mode)
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)  # the same parameter tree
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, atol=tolerance(np.float32, 8 * 16, magnitude=largest(ref_grads),
                                                      depth=_BASE.num_layers), err_msg=mode)
  assert unscanned['on'][0] != unscanned['off'][0]  # dropout did act


def test_every_remat_policy_maps_to_a_jax_policy():
  assert tuple(model.REMAT_POLICIES) == config.REMAT_POLICIES
  assert model.REMAT_POLICIES['dots_no_batch'] is jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@pytest.mark.slow
def test_scanned_rematerialised_train_step_on_a_sharded_mesh(unscanned):
  cfg = dataclasses.replace(_BASE, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=True, remat_policy='full')
  opt = config.OptimConfig(learning_rate=1e-3, warmup_steps=1)
  m = pretraining_model(cfg, optim.make_optimizer(opt, 10), sharding.make_mesh(config.MeshConfig(data=2, fsdp=4)))
  _, metrics = m.train_step(m.init_state(), m.global_batch(_BATCH), m.rest)
  ref_loss, ref_grads = unscanned['off']
  close = tolerance(np.float32, _BASE.intermediate_size, depth=_BASE.num_layers)
  np.testing.assert_allclose(metrics['loss'], ref_loss, rtol=close)
  np.testing.assert_allclose(metrics['grad_norm'], optax.tree.norm(ref_grads), rtol=close)


# --- bfloat16 compute, float32 master weights ----------------------------------------------------


@pytest.mark.slow
def test_bfloat16_training_tracks_float32():
  opt = config.OptimConfig(learning_rate=1e-3, warmup_steps=5)
  mesh = sharding.make_mesh(config.MeshConfig(1, 1, 1), jax.devices()[:1])
  models = {dtype: pretraining_model(_cfg(hidden_dropout=0.0, attention_dropout=0.0, dtype=dtype),
                                    optim.make_optimizer(opt, 50), mesh) for dtype in ('float32', 'bfloat16')}
  batches = [models['float32'].global_batch(random_pretraining_batch(seq_len=32, num_pad=6, num_predictions=5,
                                                                     seed=s)) for s in range(4)]
  losses = {}
  for dtype, m in models.items():
    state = models['float32'].init_state()  # the same float32 init (and one compile) for both
    losses[dtype] = []
    for step in range(50):
      state, metrics = m.train_step(state, batches[step % 4], m.rest)
      losses[dtype].append(float(metrics['loss']))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(state['params']))
    assert all(x.dtype != jnp.bfloat16 for x in jax.tree.leaves(state['opt_state']))
  f32, bf16 = np.array(losses['float32']), np.array(losses['bfloat16'])
  # Each example's loss carries bfloat16 rounding of relative size u = eps / 2 (2^-9); the mean over a batch's 16 x 5
  # masked tokens and 16 sentence pairs averages them: about u * loss / sqrt(96) = 2.1e-3 at loss 5.3, where rounding
  # the loss itself to bfloat16 would be off by up to 1.6e-2. Measured: 3.7e-4 to 5.1e-4 (2026-12-07, AMD EPYC,
  # XLA's CPU kernels at their default ISA and capped at AVX2, AVX and SSE4.2; jax 0.10.2).
  u = float(jnp.finfo(jnp.bfloat16).eps) / 2
  np.testing.assert_allclose(bf16, f32, atol=u * np.abs(f32).max() / np.sqrt(16 * 5 + 16))
  assert bf16[-4:].mean() < bf16[:4].mean() - 0.5, bf16
