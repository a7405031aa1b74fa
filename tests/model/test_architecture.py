"""Architecture switches (ModelConfig): parameter trees and shapes per switch, the definitions each computes,
masking (padding, packed segments, local windows) and the equivalences two settings must satisfy.

Default BERT stays bit-identical (tests/interop/families/test_bert.py, tests/train/test_layouts.py); against
transformers, the ModernBERT-shaped combination is checked in tests/interop/families/test_modernbert.py.
"""

import dataclasses
import functools

from flax import nnx, traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config, sharding
from bert_jax.errors import ConfigError
from bert_jax.model import encoder as model, heads, layers

from harness.inputs import random_pretraining_batch
from harness.numerics import largest, tolerance

MODERN = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False, type_vocab_size=0,
              attention_window=4, global_attention_every=2, rope_theta=160000.0)  # global, local, ...
# One switch at a time from BERT, and all of them (ModernBERT-shaped).
VARIANTS = {
    'bert': {},
    'pre_ln': dict(norm_position='pre'),
    'rotary': dict(position_embedding='rotary'),
    'geglu': dict(mlp='geglu'),
    'no_bias': dict(use_bias=False),
    'no_token_types': dict(type_vocab_size=0),
    'local_window': dict(attention_window=4, global_attention_every=2),
    'modernbert': MODERN,
    'embedding_size': dict(embedding_size=16),  # ELECTRA's narrower embeddings, projected to hidden_size
}


# Model-compiling tests run every variant in the slow tier, the ModernBERT-shaped one (all switches) in the fast one.
def _cfg(variant='bert', **overrides):
  fields = dict(vocab_size=100, num_layers=2, hidden_dropout=0.0, attention_dropout=0.0)
  fields.update(VARIANTS[variant] if isinstance(variant, str) else variant)
  fields.update(overrides)
  return config.preset('tiny', **fields)


def _paths(cfg):
  abstract = nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  flat = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  return {'/'.join(map(str, p)): tuple(x.shape) for p, x in flat.items()}


@functools.cache
def _built(cfg):
  """(graphdef, params, rest) of a BertForPreTraining (pure dicts), initialised under jit (eager init is slow)."""
  graphdef = nnx.split(nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)[0]
  params, rest = jax.jit(lambda: tuple(nnx.to_pure_dict(s) for s in nnx.split(
      heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)[1:]))()
  return graphdef, params, rest


@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg, params, ids, types, mask, positions, segment_ids=None, cls_positions=None):
  """(sequence output, pooled, MLM logits at every position, NSP logits); packed rows (`segment_ids`): the
  pretraining model's own call, with every position as a masked one and NSP at `cls_positions`."""
  graphdef, _, rest = _built(cfg)
  m = nnx.merge(graphdef, params, rest)
  if segment_ids is not None:
    every_bt = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return (None, None) + m(ids, types, mask, every_bt, positions, segment_ids_bt=segment_ids,
                            cls_positions_bk=cls_positions)
  seq, pooled = m.bert(ids, types, mask, positions)
  return seq, pooled, m.mlm(seq, m.bert.embeddings.word_embeddings), m.nsp(pooled)  # BertForPreTraining's heads


def _run(cfg, ids, types=None, mask=None, positions=None, params=None, **kwargs):
  """`_forward` on numpy inputs (zero token types, no padding and 0..T-1 by default), as numpy."""
  ids = jnp.asarray(ids)
  types = jnp.zeros_like(ids) if types is None else jnp.asarray(types)
  mask = jnp.ones_like(ids) if mask is None else jnp.asarray(mask)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape) if positions is None else jnp.asarray(positions)
  params = _built(cfg)[1] if params is None else params
  return jax.device_get(_forward(cfg, params, ids, types, mask, positions, **kwargs))


def _ids(batch=2, length=16, seed=0):
  return np.asarray(jax.random.randint(jax.random.key(seed), (batch, length), 5, 100), np.int32)


# --- parameter trees and shapes ----------------------------------------------------------------


def test_default_config_is_bert():
  cfg = config.ModelConfig()
  assert (cfg.norm_position, cfg.position_embedding, cfg.mlp, cfg.use_bias, cfg.attention_window,
          cfg.global_attention_every, cfg.type_vocab_size) == ('post', 'learned', 'gelu', True, 0, 0, 2)
  assert cfg.layer_windows == (0,) * 12
  # A workdir written before the switches existed restores as BERT.
  saved = {k: v for k, v in dataclasses.asdict(config.preset('tiny')).items()
           if k not in ('norm_position', 'position_embedding', 'mlp', 'use_bias', 'attention_window')}
  assert config.ModelConfig.from_saved(saved) == config.preset('tiny')
  assert cfg.embedding_size == 0 and cfg.embed_dim == cfg.hidden_size  # and before model.embedding_size
  saved = {k: v for k, v in dataclasses.asdict(config.preset('tiny')).items() if k != 'embedding_size'}
  assert config.ModelConfig.from_saved(saved) == config.preset('tiny')


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_parameter_tree_per_switch(variant):
  cfg, bert = _cfg(variant), _paths(_cfg())
  paths = _paths(cfg)
  d, i = cfg.hidden_size, cfg.intermediate_size
  added, removed = set(paths) - set(bert), set(bert) - set(paths)
  if variant == 'bert' or variant == 'local_window':  # a window is data, not parameters
    assert paths == bert
  if variant == 'pre_ln':
    # LN before each sub-layer but the first layer's attention (the embeddings' LN precedes it), one at the end.
    assert added == {f'bert/layers/{n}/mlp_norm/{p}' for n in range(2) for p in ('scale', 'bias')} | {
        'bert/final_norm/scale', 'bert/final_norm/bias'}
    assert removed == {f'bert/layers/{n}/output_norm/{p}' for n in range(2) for p in ('scale', 'bias')} | {
        'bert/layers/0/attention_norm/scale', 'bert/layers/0/attention_norm/bias'}
  if variant == 'rotary':
    assert not added and removed == {'bert/embeddings/position_embeddings/embedding'}
  if variant == 'no_token_types':
    assert not added and removed == {'bert/embeddings/token_type_embeddings/embedding'}
  if variant == 'geglu':
    assert not added and not removed
    assert paths['bert/layers/1/intermediate/kernel'] == (d, 2, i)  # [:, 0] through GELU, [:, 1] the gate
    assert paths['bert/layers/1/intermediate/bias'] == (2, i) and paths['bert/layers/1/output/kernel'] == (i, d)
  if variant in ('no_bias', 'modernbert'):
    assert [p for p in paths if p.endswith('bias')] == ['mlm/bias', 'nsp/bias']  # the output layers keep theirs
  if variant == 'modernbert':
    assert 'bert/embeddings/position_embeddings/embedding' not in paths and 'bert/final_norm/scale' in paths
    assert paths['bert/layers/1/intermediate/kernel'] == (d, 2, i)
  if variant == 'embedding_size':  # the tables, their LayerNorm and the MLM transform's output are 16 wide
    assert added == {'bert/embeddings/project/kernel', 'bert/embeddings/project/bias'} and not removed
    assert paths['bert/embeddings/project/kernel'] == (16, d) and paths['bert/embeddings/word_embeddings/embedding'] == (
        cfg.vocab_size, 16)
    assert paths['bert/embeddings/layer_norm/scale'] == (16,) and paths['mlm/transform/kernel'] == (d, 16)
    assert paths['mlm/layer_norm/scale'] == (16,)
  if variant != 'embedding_size':  # embedding_size=hidden_size is the default's tree: no projection
    assert _paths(_cfg(variant, embedding_size=cfg.hidden_size)) == paths


@pytest.mark.slow
@pytest.mark.parametrize('variant', list(VARIANTS))
def test_shapes_dtypes_and_logical_axes_per_switch(variant):
  cfg = _cfg(variant)
  seq, pooled, mlm, nsp = _run(cfg, _ids())
  assert seq.shape == (2, 16, cfg.hidden_size) and pooled.shape == (2, cfg.hidden_size)
  assert mlm.shape == (2, 16, cfg.vocab_size) and nsp.shape == (2, 2)
  assert all(np.all(np.isfinite(x)) for x in (seq, pooled, mlm, nsp))
  # Every parameter names a logical axis per dimension: the rules table shards all of them.
  state = nnx.state(nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  specs = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.get_partition_spec(state)))
  shapes = traverse_util.flatten_dict(nnx.to_pure_dict(state))
  assert specs.keys() == shapes.keys()
  for path, spec in specs.items():
    assert len(spec) == len(shapes[path].shape), path


def test_bad_switch_values_are_one_line():
  for overrides, pattern in [
      (dict(norm_position='sandwich'), "model.norm_position must be one of post, pre, got 'sandwich'"),
      (dict(position_embedding='alibi'), 'model.position_embedding must be one of learned, rotary'),
      (dict(mlp='swiglu'), 'model.mlp must be one of gelu, geglu'),
      (dict(attention_window=5), 'model.attention_window=5 must be even'),
      (dict(attention_window=-2), 'model.attention_window must be a non-negative integer'),
      (dict(global_attention_every=3), 'model.global_attention_every=3 needs model.attention_window > 0'),
      (dict(type_vocab_size=-1), 'model.type_vocab_size must be a non-negative integer'),
      (dict(embedding_size=-8), 'model.embedding_size must be a non-negative integer'),
      (dict(rope_theta=0.0), 'model.rope_theta must be positive'),
      (dict(position_embedding='rotary', hidden_size=66, num_heads=2), 'needs an even head dim'),
      (dict(position_offset=-1), 'model.position_offset must be a non-negative integer'),
      (dict(position_offset=2, position_embedding='rotary'), 'model.position_offset=2 needs learned positions'),
      (dict(pooler_activation='swish'), 'model.pooler_activation must be one of tanh, relu, gelu'),
  ]:
    with pytest.raises(ConfigError, match=pattern) as e:
      _cfg(**overrides)
    assert '\n' not in str(e.value)


def test_switches_are_architecture_in_checkpoints_and_configs():
  saved = dataclasses.asdict(_cfg())
  assert config.architecture_diffs(saved, _cfg('pre_ln')) == ["norm_position: post (checkpoint) vs pre (config)"]
  assert config.architecture_diffs(saved, _cfg(attention_window=8)) == [
      'attention_window: 0 (checkpoint) vs 8 (config)']
  cfg = config.PretrainConfig(model=_cfg('modernbert'))
  assert config.PretrainConfig.from_dict(cfg.to_dict()) == cfg


def test_layer_windows_follow_modernbert_pattern():
  assert _cfg(num_layers=7, attention_window=8, global_attention_every=3).layer_windows == (0, 8, 8, 0, 8, 8, 0)
  assert _cfg(num_layers=3, attention_window=8).layer_windows == (8, 8, 8)  # every layer local
  assert _cfg(num_layers=3).layer_windows == (0, 0, 0)


# --- what each switch computes -----------------------------------------------------------------


def _layer(cfg, first=False):
  layer = model.EncoderLayer(cfg, rngs=nnx.Rngs(0), first=first)
  # Non-trivial LayerNorm parameters, so a swapped norm shows.
  for norm in (layer.attention_norm, getattr(layer, 'mlp_norm', None), getattr(layer, 'output_norm', None)):
    if norm is not None:
      norm.scale[...] = 1 + 0.3 * jax.random.normal(jax.random.key(1), norm.scale.shape)
  return layer


def _mlp(layer, x, geglu=False):
  h = layer.intermediate(x)
  h = jax.nn.gelu(h[..., 0, :], approximate=False) * h[..., 1, :] if geglu else jax.nn.gelu(h, approximate=False)
  return layer.output(h)


@pytest.mark.parametrize('norm_position,mlp,first', [('post', 'gelu', False), ('pre', 'gelu', False),
                                                     ('pre', 'gelu', True), ('pre', 'geglu', False),
                                                     ('post', 'geglu', False)])
def test_layers_compute_their_definitions(norm_position, mlp, first):
  cfg = _cfg(norm_position=norm_position, mlp=mlp)
  layer = _layer(cfg, first)
  assert (layer.attention_norm is None) == (first and norm_position == 'pre')
  x = jax.random.normal(jax.random.key(2), (2, 8, cfg.hidden_size))
  mask = model.attention_mask_b11s(jnp.array([[1] * 8, [1] * 5 + [0] * 3]))
  geglu = mlp == 'geglu'

  @nnx.jit
  def both(layer, x):
    if norm_position == 'post':  # BERT: LN(x + f(x))
      h = layer.attention_norm(x + layer.attention(x, mask, deterministic=True))
      ref = layer.output_norm(h + _mlp(layer, h, geglu))
    else:  # x + f(LN(x)); the first layer's attention reads x as it is
      a = x if first else layer.attention_norm(x)
      h = x + layer.attention(a, mask, deterministic=True)
      ref = h + _mlp(layer, layer.mlp_norm(h), geglu)
    return layer(x, mask, deterministic=True), ref

  got, ref = both(layer, x)  # one program, fused differently
  np.testing.assert_allclose(got, ref, atol=tolerance(np.float32, cfg.intermediate_size, magnitude=np.abs(ref).max()))


def _scaled(cfg, factor=20.0):
  """The initial parameters with every kernel times `factor`: sub-layers that change their input by O(1)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x * factor if 'kernel' in jax.tree_util.keystr(path) else x, _built(cfg)[1])


@pytest.mark.slow
def test_pre_and_post_ln_differ_and_pre_ln_ends_with_a_layer_norm():
  ids = _ids()
  post, pre = _run(_cfg(), ids, params=_scaled(_cfg()))[0], _run(_cfg('pre_ln'), ids, params=_scaled(_cfg('pre_ln')))[0]
  assert np.abs(post - pre).max() > 0.1
  # The final LayerNorm (scale 1, bias 0 at init) leaves every position with mean 0 and variance 1.
  np.testing.assert_allclose(pre.mean(-1), 0, atol=tolerance(np.float32, pre.shape[-1], magnitude=np.abs(pre).max()))
  np.testing.assert_allclose(pre.var(-1), 1, atol=1e-3)


def test_rotary_rotates_each_pair_by_its_position_angle():
  h, theta = 8, 100.0
  x = jax.random.normal(jax.random.key(0), (1, 5, 2, h))
  positions = jnp.array([[0, 1, 2, 7, 30]])
  out = layers.rotate(x, *layers.rotary_tables(positions, h, theta))
  # As complex numbers: pair k (x[k], x[k + h/2]) times e^{i * position * theta^(-2k/h)}.
  z = np.asarray(x[..., :h // 2]) + 1j * np.asarray(x[..., h // 2:])
  angle = np.asarray(positions)[..., None, None] * theta ** (-np.arange(0, h, 2) / h)
  ref = z * np.exp(1j * angle)
  np.testing.assert_allclose(out, np.concatenate([ref.real, ref.imag], -1), atol=1e-5)
  np.testing.assert_array_equal(out[:, 0], x[:, 0])  # position 0: unrotated


@pytest.mark.slow
@pytest.mark.parametrize('variant', ['rotary', 'modernbert'])
def test_rotary_positions_are_relative(variant):
  """Rotary attention sees only offsets: shifting every position id changes nothing (learned positions do)."""
  ids = _ids(length=12)
  positions = np.broadcast_to(np.arange(12), ids.shape)
  base = _run(_cfg(variant), ids, positions=positions)[0]
  shifted = _run(_cfg(variant), ids, positions=positions + 17)[0]
  np.testing.assert_allclose(shifted, base, atol=2e-5)
  learned = _cfg(max_position_embeddings=64)
  assert np.abs(_run(learned, ids, positions=positions + 17)[0] - _run(learned, ids, positions=positions)[0]).max() > 1e-2


@pytest.mark.slow
def test_no_token_type_table_ignores_token_types():
  ids = _ids()
  types = np.ones_like(ids)
  np.testing.assert_array_equal(_run(_cfg('no_token_types'), ids, types)[0], _run(_cfg('no_token_types'), ids)[0])
  assert np.abs(_run(_cfg(), ids, types)[0] - _run(_cfg(), ids)[0]).max() > 1e-3


# --- masking --------------------------------------------------------------------------------


def test_window_mask_keeps_keys_within_half_the_window():
  mask = model.attention_mask_b11s(jnp.array([[1] * 6, [1] * 4 + [0] * 2]))
  local = np.asarray(model.window_mask_b1ts(mask, 4))
  t, s = np.meshgrid(np.arange(6), np.arange(6), indexing='ij')
  np.testing.assert_array_equal(local[0, 0], np.abs(t - s) <= 2)
  np.testing.assert_array_equal(local[1, 0], (np.abs(t - s) <= 2) & (s < 4))  # padding stays masked


@pytest.mark.slow
@pytest.mark.parametrize('base', ['local_window', 'modernbert'])
def test_window_as_long_as_the_sequence_equals_global(base):
  ids = _ids(length=16)
  mask = np.ones_like(ids)
  mask[1, 11:] = 0
  # Local layers rotate with local_rope_theta: the same base as the global layers' makes the same function.
  global_cfg = _cfg(base, attention_window=0, global_attention_every=0, local_rope_theta=160000.0)
  params = _built(global_cfg)[1]  # a window changes no parameter
  ref = _run(global_cfg, ids, mask=mask)
  for window in (30, 64):  # keys at most 15 or 32 positions away: every key of 16
    got = _run(_cfg(base, attention_window=window, local_rope_theta=160000.0), ids, mask=mask, params=params)
    for a, b in zip(got, ref):  # the windowed path's kernels: float32 rounding of each layer's widest sums
      np.testing.assert_allclose(a, b, atol=tolerance(np.float32, global_cfg.intermediate_size,
                                                      magnitude=np.abs(b).max(), depth=global_cfg.num_layers))
  narrow = _run(_cfg(base, attention_window=4, local_rope_theta=160000.0), ids, mask=mask, params=params)
  assert np.abs(narrow[0] - ref[0]).max() > 1e-3


@pytest.mark.slow
def test_local_layers_attend_within_their_window_only():
  cfg = _cfg('modernbert', num_layers=3, attention_window=4, global_attention_every=2)
  graphdef, params, rest = _built(cfg)
  m = nnx.merge(graphdef, params, rest)
  ids = jnp.asarray(_ids(batch=1, length=10))
  _, _, probs = m.bert(ids, return_attention=True)  # [L, B, N, T, S]
  t, s = np.meshgrid(np.arange(10), np.arange(10), indexing='ij')
  outside = np.abs(t - s) > 2
  assert np.all(np.asarray(probs)[1][..., outside] == 0)  # layer 1: local
  assert np.all(np.asarray(probs)[[0, 2]][..., outside] > 0)  # layers 0 and 2: global
  np.testing.assert_allclose(np.asarray(probs).sum(-1), 1, atol=tolerance(np.float32, 10))


@pytest.mark.slow
@pytest.mark.parametrize('variant', list(VARIANTS))
def test_extra_padding_does_not_change_real_positions(variant):
  cfg = _cfg(variant)
  ids = _ids(length=9)
  mask = np.ones_like(ids)
  mask[1, 6:] = 0
  ids = ids * mask
  seq, pooled, mlm, _ = _run(cfg, ids, mask=mask)
  seq_p, pooled_p, mlm_p, _ = _run(cfg, np.pad(ids, ((0, 0), (0, 7))), mask=np.pad(mask, ((0, 0), (0, 7))))
  real = mask == 1
  close = tolerance(np.float32, cfg.intermediate_size, depth=cfg.num_layers)  # other kernels for longer rows
  np.testing.assert_allclose(seq_p[:, :9][real], seq[real], atol=close)
  np.testing.assert_allclose(mlm_p[:, :9][real], mlm[real], atol=2e-5)
  np.testing.assert_allclose(pooled_p, pooled, atol=close)


@pytest.mark.slow
@pytest.mark.parametrize('variant', list(VARIANTS))
def test_packed_row_equals_its_examples_alone(variant):
  """Two examples and padding in one row (segment ids, positions restarting at each example): every token's
  logits and each example's NSP logits are those of the example alone, with rotary positions and windows too."""
  cfg = _cfg(variant)
  lengths, width = (7, 11), 24
  ids = _ids(batch=1, length=width, seed=3)
  segments = np.zeros((1, width), np.int32)
  positions = np.zeros((1, width), np.int32)
  types = np.zeros((1, width), np.int32)
  offset = 0
  for k, n in enumerate(lengths):
    segments[0, offset:offset + n], positions[0, offset:offset + n] = k + 1, np.arange(n)
    types[0, offset + n // 2:offset + n] = 1
    offset += n
  ids = ids * (segments > 0)
  cls = np.array([[0, lengths[0]]], np.int32)
  _, _, mlm, nsp = _run(cfg, ids, types, mask=segments > 0, positions=positions, segment_ids=jnp.asarray(segments),
                        cls_positions=jnp.asarray(cls))
  assert nsp.shape == (1, 2, 2)
  offset = 0
  for k, n in enumerate(lengths):
    alone = _run(cfg, ids[:, offset:offset + n], types[:, offset:offset + n])
    np.testing.assert_allclose(mlm[0, offset:offset + n], alone[2][0], atol=2e-5)
    np.testing.assert_allclose(nsp[0, k], alone[3][0], atol=2e-5)
    offset += n


# --- remat and scan: the same function with switches that break structural identity -------------


@pytest.mark.slow
@pytest.mark.parametrize('remat,scan', [('full', False), ('none', True), ('dots', True)])
def test_remat_and_scan_with_pre_ln_and_alternating_windows(remat, scan):
  """Pre-LN's first layer differs in structure and local/global layers alternate: scan still runs every layer
  (the first alone, the rest as one scan selecting each layer's mask and rotary tables) with the same losses,
  gradients and dropout masks as the plain loop."""
  base = _cfg('modernbert', num_layers=3, hidden_dropout=0.1, attention_dropout=0.1)  # global, local, global
  batch = random_pretraining_batch(batch_size=4, seq_len=16, vocab_size=100, seed=3)

  def losses_and_grads(cfg):
    graphdef = nnx.split(nnx.eval_shape(lambda: heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)[0]
    _, params, rest = _built(base)

    def loss_fn(params, deterministic):
      mlm, nsp = nnx.merge(graphdef, params, rest)(batch['input_ids'], batch['token_type_ids'],
                                                    batch['attention_mask'], batch['masked_lm_positions'],
                                                    deterministic=deterministic)
      return (optax.softmax_cross_entropy_with_integer_labels(mlm, batch['masked_lm_ids']).mean()
              + optax.softmax_cross_entropy_with_integer_labels(nsp, batch['next_sentence_labels']).mean())
    return jax.device_get(jax.jit(lambda p: [jax.value_and_grad(loss_fn)(p, d) for d in (True, False)])(params))

  ref = losses_and_grads(base)
  got = losses_and_grads(dataclasses.replace(base, remat_policy=remat, scan_layers=scan))
  # Other fusions, other summation orders: the widest sums, once per layer; a gradient sums over the 4 x 16 tokens.
  for (loss, grads), (ref_loss, ref_grads) in zip(got, ref):
    np.testing.assert_allclose(loss, ref_loss,
                               rtol=tolerance(np.float32, base.intermediate_size, depth=base.num_layers))
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, atol=tolerance(np.float32, 4 * 16, magnitude=largest(ref_grads),
                                                      depth=base.num_layers))
  assert ref[0][0] != ref[1][0]  # dropout did act


@pytest.mark.slow
def test_modernbert_shaped_step_on_a_sharded_mesh_equals_one_device():
  """The new parameters (GeGLU kernels [D, 2, I], no biases, final norm) shard by the rules table: a 2x2x2 mesh
  computes the one-device loss and gradients."""
  from bert_jax.pretraining.pretrain_run import pretraining_model  # pylint: disable=g-import-not-at-top
  cfg = _cfg('modernbert')
  batch = random_pretraining_batch(vocab_size=100)
  out = []
  for sizes, devices in (((1, 1, 1), jax.devices()[:1]), ((2, 2, 2), jax.devices())):
    m = pretraining_model(cfg, optax.sgd(1.0), sharding.make_mesh(config.MeshConfig(*sizes), devices))
    state = m.init_state()
    before = jax.device_get(state['params'])
    state, metrics = m.train_step(state, m.global_batch(batch), m.rest)
    out.append((float(metrics['loss']), jax.tree.map(lambda b, a: b - a, before, jax.device_get(state['params']))))
    if sizes == (2, 2, 2):
      kernel = state['params']['bert']['layers'][1]['intermediate']['kernel']
      assert kernel.addressable_shards[0].data.shape == (64 // 2, 2, 256 // 2)  # embed/fsdp, -, mlp/tensor
  # Sharded sums in other orders: the widest, once per layer; the updates (SGD at rate 1: the gradients) sum over
  # the 16 x 16 tokens too.
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=tolerance(np.float32, cfg.intermediate_size,
                                                                  depth=cfg.num_layers))
  for a, b in zip(jax.tree.leaves(out[1][1]), jax.tree.leaves(out[0][1])):
    np.testing.assert_allclose(a, b, atol=tolerance(np.float32, 16 * 16, magnitude=largest(out[0][1]),
                                                    depth=cfg.num_layers))
