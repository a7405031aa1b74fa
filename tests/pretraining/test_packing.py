"""Packed pretraining batches (data.pack): the same examples and masks, the same function.

Packing puts several examples in a row with per-example attention, restarted positions and
[CLS] pooling; per example the logits, and over the batch the losses and gradients, must
equal the unpacked batch's. The packed rows must also train end to end and be validated.
"""

import dataclasses
import functools
import itertools
import json
import os

import jax
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.data import hashing, loader as ip, masking, tokenization
from bert_jax.data.records import SpecialIds
from bert_jax.data.tokenization import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID
from bert_jax.errors import ConfigError
from bert_jax.pretraining import pretrain_run as pretraining
from bert_jax.pretraining.objective import pretraining_sums
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

from harness.faults import SpyDataset
from harness.inputs import SMALL_VOCAB, small_data_config, tiny_pretrain_config
from harness.numerics import largest, tolerance


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """conftest's small corpus as pairs of random length up to 256 tokens, which packing combines.

  (At its 64 tokens nearly every pair is full: its sentences alone are ~60 pieces long.)
  """
  from bert_jax.data import prepare as pretraining_data  # pylint: disable=g-import-not-at-top
  cfg = small_data_config(str(tmp_path_factory.mktemp('data')), short_seq_prob=1.0, max_seq_length=256)
  return cfg, pretraining_data.prepare_pretraining_data(cfg, vocab_size=SMALL_VOCAB, seed=0)


@functools.cache
def _vocab(tokenizer_path, special_ids):
  return ip.Vocab.from_tokenizer(tokenization.load_tokenizer(tokenizer_path), special_ids)


def _synthetic_vocab(size):
  """A Vocab of `size` ids with the SentencePiece special ids (0..4)."""
  special_v = np.zeros(size, bool)
  special_v[[PAD_ID, CLS_ID, SEP_ID, MASK_ID]] = True
  return ip.Vocab(SpecialIds(pad=PAD_ID, unk=UNK_ID, cls=CLS_ID, sep=SEP_ID, mask=MASK_ID), special_v, None)


def _rows(examples, width):
  """Rows as the dataset gathers them, from (tokens, len_a, is_random_next) or None (padding)."""
  rows = ip.Rows(np.zeros((len(examples), width), np.int32), *(np.zeros(len(examples), np.int64) for _ in range(3)))
  for r, example in enumerate(examples):
    if example is not None:
      tokens, rows.len_a[r], rows.random_next[r] = example
      rows.tokens[r, :len(tokens)], rows.lengths[r] = tokens, len(tokens)
  return rows


def _unpacked_examples(batch):
  """Each real row of a make_batch batch as (ids, types, mlm positions, mlm ids, nsp label)."""
  out = []
  for e in np.flatnonzero(batch['nsp_weights'] > 0):
    n = int(batch['attention_mask'][e].sum())
    sel = batch['masked_lm_weights'][e] > 0
    out.append((tuple(batch['input_ids'][e, :n]), tuple(batch['token_type_ids'][e, :n]),
                tuple(batch['masked_lm_positions'][e, sel]), tuple(batch['masked_lm_ids'][e, sel]),
                int(batch['next_sentence_labels'][e])))
  return out


def _packed_segments(batch):
  """Cuts every example out of packed rows: [(row, slot, mlm slot mask, example tuple)]."""
  out = []
  r, k = batch['nsp_weights'].shape
  for row in range(r):
    segments = set(batch['segment_ids'][row].tolist()) - {0}
    assert segments == set(range(1, int((batch['nsp_weights'][row] > 0).sum()) + 1))
    for s in range(k):
      if batch['nsp_weights'][row, s] == 0:
        continue
      cols = np.flatnonzero(batch['segment_ids'][row] == s + 1)
      off, n = int(cols[0]), len(cols)
      assert list(cols) == list(range(off, off + n)) and batch['cls_positions'][row, s] == off
      assert batch['input_ids'][row, off] == CLS_ID
      np.testing.assert_array_equal(batch['position_ids'][row, cols], np.arange(n))
      pos = batch['masked_lm_positions'][row]
      sel = (batch['masked_lm_weights'][row] > 0) & (pos >= off) & (pos < off + n)
      out.append((row, s, sel, (tuple(batch['input_ids'][row, cols]), tuple(batch['token_type_ids'][row, cols]),
                                tuple(pos[sel] - off), tuple(batch['masked_lm_ids'][row, sel]),
                                int(batch['next_sentence_labels'][row, s]))))
  np.testing.assert_array_equal(batch['attention_mask'], batch['segment_ids'] > 0)
  return out


def _assert_same_examples(unpacked, packed):
  segments = _packed_segments(packed)
  assert sorted(e for *_, e in segments) == sorted(_unpacked_examples(unpacked))
  # Every masked-LM slot belongs to exactly one example.
  assert sum(int(sel.sum()) for _, _, sel, _ in segments) == int(packed['masked_lm_weights'].sum())


def _pack_cfg(prepared, pack=True, rows_multiple=1):
  return dataclasses.replace(prepared[0], pack=pack, pack_rows_multiple=rows_multiple)


def _stream(prepared, pack, dataset=None, rows_multiple=1, **kwargs):
  cfg, data = prepared
  args = dict(global_batch_size=16, seed=0, cfg=_pack_cfg(prepared, pack, rows_multiple),
              vocab=_vocab(data.tokenizer_path, data.special_ids),
              prefetch=0)
  args.update(kwargs)
  return ip.PretrainingBatches(dataset or ip.PretrainingDataset(data.dir, 'train'), **args)


def test_packed_batches_hold_the_same_examples_and_masks(prepared):
  cfg = prepared[0]
  plain, packed = _stream(prepared, False), _stream(prepared, True)
  rows = 0
  for k in (0, 1, 5):
    a, b = plain.batch_at(k), packed.batch_at(k)
    _assert_same_examples(a, b)
    assert b['masked_lm_positions'].shape[1] == ip.packed_mlm_width(cfg)
    assert b['nsp_weights'].shape[1] == cfg.max_segments_per_row
    rows += len(b['input_ids'])
  assert rows < 3 * 16  # short pairs: packing saves rows
  # Resuming: batch k of a packed stream is a pure function of (seed, k).
  resumed = _stream(prepared, True, start_position=5)
  for key, value in next(resumed).items():
    np.testing.assert_array_equal(value, packed.batch_at(5)[key], err_msg=key)


def test_processes_pack_their_rows_into_equal_counts(prepared):
  whole = _stream(prepared, False).batch_at(2)
  parts = [_stream(prepared, True, process_index=p, process_count=2).batch_at(2) for p in range(2)]
  assert len(parts[0]['input_ids']) == len(parts[1]['input_ids'])
  examples = sorted(e for part in parts for *_, e in _packed_segments(part))
  assert examples == sorted(_unpacked_examples(whole))
  with_multiple = _stream(prepared, True, rows_multiple=4).batch_at(2)
  assert len(with_multiple['input_ids']) % 4 == 0


@pytest.mark.parametrize('rows_multiple', [1, 4])
def test_each_process_packs_its_own_block_reading_only_its_records(prepared, rows_multiple):
  """2 processes: each packs exactly its unpacked block into as many rows as the fuller one needs.

  That is what each emitted when every process read the whole global batch to count rows; now
  the other block's row count comes from the stored record lengths, and a spy shows that each
  process reads only its own block's records.
  """
  cfg = _pack_cfg(prepared, rows_multiple=rows_multiple)
  plain = [_stream(prepared, False, process_index=p, process_count=2) for p in range(2)]
  spies = [SpyDataset(ip.PretrainingDataset(prepared[1].dir, 'train')) for _ in range(2)]
  packed = [_stream(prepared, True, dataset=spies[p], rows_multiple=rows_multiple, process_index=p,
                    process_count=2) for p in range(2)]
  whole = _stream(prepared, False)
  uneven = 0
  for k in range(6):
    unpacked = [s.batch_at(k) for s in plain]
    for key, value in whole.batch_at(k).items():  # the blocks make the 1-process batch
      np.testing.assert_array_equal(np.concatenate([unpacked[0][key], unpacked[1][key]]), value, err_msg=key)
    own_rows = [len(ip.pack_batch(u, cfg)['input_ids']) for u in unpacked]
    uneven += own_rows[0] != own_rows[1]
    reads_before = [len(s.read) for s in spies]
    parts = [s.batch_at(k) for s in packed]
    assert len(parts[0]['input_ids']) == len(parts[1]['input_ids']) == max(own_rows)
    for p in range(2):
      _assert_same_examples(unpacked[p], parts[p])
      expected = ip.pack_batch(unpacked[p], cfg, max(own_rows))
      assert parts[p].keys() == expected.keys()
      for key in expected:
        np.testing.assert_array_equal(parts[p][key], expected[key], err_msg=f'{k} {p} {key}')
      block = packed[p].maker.record_indices(np.arange(16 * k + 8 * p, 16 * k + 8 * p + 8)).tolist()
      assert spies[p].read[reads_before[p]:] == block  # only this process's records
  if rows_multiple == 1:
    assert uneven  # some batch where the fuller process sets the other's row count


@pytest.mark.parametrize('t, p, k, prob', [(32, 5, 3, 0.15), (40, 3, 4, 0.15), (24, 8, 2, 0.4)])
def test_mlm_width_is_the_most_any_row_can_need(t, p, k, prob):
  cfg = config.DataConfig(max_seq_length=t, max_predictions_per_seq=p, max_segments_per_row=k,
                          masked_lm_prob=prob)
  need = lambda n: min(masking.num_predictions(n, p, prob), n - 3)  # [CLS], [SEP], [SEP] are never masked
  brute = max(sum(need(n) for n in lengths) for j in range(1, k + 1)
              for lengths in itertools.combinations_with_replacement(range(5, t + 1), j) if sum(lengths) <= t)
  assert ip.packed_mlm_width(cfg) == brute


def test_short_examples_fill_the_mlm_width():
  # Short examples get the most predictions per token (round(10 * 0.15) = 2).
  cfg = config.DataConfig(max_seq_length=64, max_predictions_per_seq=10, max_segments_per_row=4, pack=True,
                          pack_rows_multiple=1)
  rows = _rows([([CLS_ID] + [7] * 4 + [SEP_ID] + [8] * 3 + [SEP_ID], 4, False)] * 8, cfg.max_seq_length)
  batch = ip.make_batch(rows, hashing.key(0, np.arange(8)), cfg=cfg, vocab=_synthetic_vocab(50))
  packed = ip.pack_batch(batch, cfg)
  assert len(packed['input_ids']) == 2  # 4 examples per row at most
  np.testing.assert_array_equal(packed['masked_lm_weights'].sum(1), [8, 8])
  assert packed['masked_lm_weights'].shape[1] == ip.packed_mlm_width(cfg) == 11  # one full row: 10
  _assert_same_examples(batch, packed)


# ----------------------------------------------------------------------------- the same function


def _synthetic_batches(cfg, num=16, vocab=100, seed=0):
  rng = np.random.default_rng(seed)
  examples = []
  for _ in range(num):
    n = int(rng.integers(6, cfg.max_seq_length // 2 + 5))
    len_a = int(rng.integers(1, n - 4))
    tokens = rng.integers(5, vocab, n).astype(np.int32)
    tokens[0], tokens[len_a + 1], tokens[n - 1] = CLS_ID, SEP_ID, SEP_ID
    examples.append((tokens, len_a, bool(rng.integers(2))))
  examples[3] = None  # a padding example is dropped by packing
  unpacked = ip.make_batch(_rows(examples, cfg.max_seq_length), hashing.key(seed, np.arange(num)), cfg=cfg,
                           vocab=_synthetic_vocab(vocab))
  return unpacked, ip.pack_batch(unpacked, cfg)


def _pretraining_model(devices, accum=1):
  model_cfg = config.preset('tiny', vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
  opt = config.OptimConfig(learning_rate=1e-3, warmup_steps=1)
  mesh = sharding.make_mesh(config.MeshConfig(data=len(devices)), devices)
  return pretraining_model(model_cfg, optim.make_optimizer(opt, 10), mesh, grad_accum_steps=accum)


@pytest.mark.slow
def test_packed_rows_compute_the_same_logits_losses_and_gradients():
  cfg = config.DataConfig(max_seq_length=64, max_predictions_per_seq=10, pack=True, pack_rows_multiple=8,
                          max_segments_per_row=4)
  unpacked, packed = _synthetic_batches(cfg)
  assert len(packed['input_ids']) == 8 < len(unpacked['input_ids'])  # packed: fewer rows
  model = _pretraining_model(jax.devices()[:1])
  params = model.init_state()['params']

  @jax.jit
  def run(params, batch):  # logits, summed losses and gradients of the (global) mean losses
    def loss(params):
      logits = model.apply(params, model.rest, batch)
      sums = pretraining_sums(*logits, batch)
      return sums['mlm_loss_sum'] / sums['mlm_count'] + sums['nsp_loss_sum'] / sums['nsp_count'], (logits, sums)
    return jax.value_and_grad(loss, has_aux=True)(params)

  (loss_u, ((mlm_u, nsp_u), sums_u)), grads_u = jax.device_get(run(params, unpacked))
  (loss_p, ((mlm_p, nsp_p), sums_p)), grads_p = jax.device_get(run(params, packed))
  assert nsp_p.shape == (8, cfg.max_segments_per_row, 2)
  index = {e: i for i, e in zip(np.flatnonzero(unpacked['nsp_weights'] > 0), _unpacked_examples(unpacked))}
  segments = _packed_segments(packed)
  assert len(segments) == len(index) == 15
  # Other rows, other kernels and summation orders: float32 rounding of the tiny model's widest sums (256) in each
  # of its 2 layers, relative to the values compared; the gradients sum over the 8 x 64 packed tokens too.
  close = tolerance(np.float32, 256, depth=2)
  for row, s, sel, example in segments:
    e = index[example]
    np.testing.assert_allclose(mlm_p[row, sel], mlm_u[e, unpacked['masked_lm_weights'][e] > 0],
                               atol=close * np.abs(mlm_u).max())
    np.testing.assert_allclose(nsp_p[row, s], nsp_u[e], atol=close * np.abs(nsp_u).max())
  for key in sums_u:
    np.testing.assert_allclose(sums_p[key], sums_u[key], rtol=close, err_msg=key)
  np.testing.assert_allclose(loss_p, loss_u, rtol=close)
  for gu, gp in zip(jax.tree.leaves(grads_u), jax.tree.leaves(grads_p)):
    np.testing.assert_allclose(gp, gu, atol=tolerance(np.float32, 8 * 64, magnitude=largest(grads_u), depth=2))


@pytest.mark.slow
def test_packed_train_step_with_accumulation_on_8_devices_matches_unpacked():
  cfg = config.DataConfig(max_seq_length=64, max_predictions_per_seq=10, pack=True, pack_rows_multiple=16,
                          max_segments_per_row=4)
  unpacked, packed = _synthetic_batches(cfg)
  assert len(packed['input_ids']) == 16
  model = _pretraining_model(jax.devices(), accum=2)  # micro-batches of 8 unpacked rows, 8 packed rows
  metrics = [jax.device_get(model.train_step(model.init_state(), model.global_batch(batch), model.rest)[1])
             for batch in (unpacked, packed)]
  for key in ('loss', 'mlm_loss', 'nsp_loss', 'mlm_accuracy', 'grad_norm'):
    np.testing.assert_allclose(metrics[1][key], metrics[0][key], rtol=tolerance(np.float32, 256, depth=2), err_msg=key)


# ----------------------------------------------------------------------------- the training loop


@pytest.mark.slow
def test_train_and_evaluate_with_packing(small_corpus, tmp_path):
  # Pairs of random length up to 256 (short_seq_prob=1), as in a corpus of short documents. The
  # target length is drawn once per document and pass: 3 passes over its 10 documents give short
  # pairs enough that batches of 32 pack into fewer rows (20-24 needed: 24 rows).
  cfg = tiny_pretrain_config(small_corpus, str(tmp_path / 'cache'), batch_size=32, num_train_steps=4,
                             eval_every=4, checkpoint_every=4, log_every=1)
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, pack=True, short_seq_prob=1.0,
                                                          max_seq_length=256, dupe_factor=3))
  result = pretraining.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert result['step'] == 4 and np.isfinite(result['mlm_loss'])
  lines = [json.loads(l) for l in open(os.path.join(tmp_path, 'run', 'metrics_train.jsonl'))]
  assert len(lines) == 4
  for line in lines:  # one step each: a whole number of 8-row groups
    assert line['rows_per_step'] <= 32 and line['rows_per_step'] % 8 == 0
    assert line['unpacked_fill'] <= line['fill'] <= 1.0
  assert np.mean([line['rows_per_step'] for line in lines]) < 32  # packing saves rows
  assert np.mean([line['fill'] - line['unpacked_fill'] for line in lines]) > 0


@pytest.mark.parametrize('data, optim_, pattern', [
    (dict(pack_rows_multiple=4), {}, 'pack_rows_multiple=4'),
    (dict(pack_rows_multiple=8), dict(grad_accum_steps=2), 'grad_accum_steps=2'),
    (dict(max_segments_per_row=0), {}, 'max_segments_per_row=0'),
    (dict(pack_rows_multiple=0), {}, 'pack_rows_multiple=0'),
])
def test_bad_packing_config_is_refused(tmp_path, data, optim_, pattern):
  base = tiny_pretrain_config('corpus.txt', str(tmp_path))
  mesh = sharding.make_mesh(base.mesh)  # 8 batch shards
  with pytest.raises(ConfigError, match=pattern):  # when the config is built, or checked against the mesh
    cfg = dataclasses.replace(base, data=dataclasses.replace(base.data, pack=True, **data),
                              optim=dataclasses.replace(base.optim, **optim_))
    pretraining.validate_config(cfg, mesh)
  unpacked = dataclasses.replace(base, data=dataclasses.replace(base.data, pack=False, **data),
                                 optim=dataclasses.replace(base.optim, **optim_))
  pretraining.validate_config(unpacked, mesh)
