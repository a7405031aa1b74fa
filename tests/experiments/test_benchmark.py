"""The performance record: compiled FLOPs split evenly over devices, the analytic FLOP count, the
peak table, the HF baseline's labels and the benchmark entry point (8 fake CPU devices)."""

import importlib.util
import json
import math

import jax
import numpy as np
import pytest

from bert_jax.config import MeshConfig, preset

from harness.entry_points import assert_one_line_error, run_experiment
from tools import benchmark as bm

CFG = preset('tiny', vocab_size=512)
B, T, P = 16, 64, 10


@pytest.fixture(scope='module')
def flops():
  """Compiled train-step FLOPs per device by (data, fsdp, tensor) layout, compiled once each."""
  cache = {}

  def get(layout):
    if layout not in cache:
      n = int(np.prod(layout))
      cache[layout] = bm.per_device_flops(CFG, MeshConfig(*layout), B, T, P, devices=jax.devices()[:n])
    return cache[layout]
  return get


@pytest.mark.slow
@pytest.mark.parametrize('layout,max_overhead', [
    # Measured on jax 0.10.2 CPU for this config: fsdp 1x8x1 +0.6% beyond an even split (dropout's
    # random bits and the backward pass's gradient reductions; the forward alone splits exactly
    # 1/8); data parallel 8x1x1 +3.1% (every device also runs the whole AdamW update on its
    # replicated parameters). BERT-base at 16x128: +0.1% and +1.5%.
    ((1, 8, 1), 0.03),
    ((8, 1, 1), 0.08),
])
def test_compiled_flops_split_evenly_over_devices(flops, layout, max_overhead):
  overhead = flops(layout) * 8 / flops((1, 1, 1)) - 1
  assert -0.01 < overhead < max_overhead, (layout, overhead)


@pytest.mark.slow
def test_fsdp_replicates_less_than_data_parallel(flops):
  # Both split the batch; only fsdp also shards the optimizer update instead of repeating it.
  assert flops((1, 8, 1)) < flops((8, 1, 1))


@pytest.mark.slow  # compiles a whole train step (shared with the slow test above, so free in the full suite)
def test_analytic_flops_match_compiled_count(flops):
  # The compiled program counts everything (LayerNorm, softmax, GELU, dropout, losses, AdamW) on
  # top of the matmuls the formula counts, so it is higher: 1.16x for this d=64 model (the share
  # shrinks as d grows). The bounds catch real formula errors: scoring all T positions in the MLM
  # head would give 0.92, leaving out the attention matmuls 1.34.
  ratio = flops((1, 1, 1)) / bm.pretraining_flops_per_step(CFG, B, T, P)
  assert 1.0 < ratio < 1.3, ratio


def test_peak_table_lookup_and_override():
  h100 = 'NVIDIA H100 80GB HBM3'
  assert bm.peak_tflops(h100, 'gpu', 'bfloat16')[0] == 989.4
  assert bm.peak_tflops(h100, 'gpu', 'float32')[0] == 494.7  # jax's default: TF32 tensor cores
  assert bm.peak_tflops(h100, 'gpu', 'float32', precision='highest')[0] == 66.9
  assert bm.peak_tflops('NVIDIA H200', 'gpu', 'bfloat16')[0] == 989.4  # the H100 SXM's chip
  assert bm.peak_tflops('TPU v5 lite', 'tpu', 'float32')[0] == 197.0  # one bf16 pass by default
  assert bm.peak_tflops('TPU v5 lite', 'tpu', 'float32', precision='highest')[0] is None
  peak, source = bm.peak_tflops('cpu', 'cpu', 'float32')
  assert peak is None and '--peak_tflops' in source
  assert bm.peak_tflops('NVIDIA H100 NVL', 'gpu', 'bfloat16')[0] is None  # unlisted part: no guess
  assert bm.peak_tflops('cpu', 'cpu', 'float32', override=2.5)[0] == 2.5
  assert bm.peak_tflops(h100, 'gpu', 'bfloat16', override=500)[0] == 500


def test_hf_labels_put_masked_ids_at_their_positions():
  batch = bm.synthetic_batch(4, 32, 5, 100)
  labels = bm.hf_labels(batch)
  assert (labels != -100).sum() == 4 * 5  # positions are distinct within a row
  rows = np.arange(4)[:, None]
  np.testing.assert_array_equal(labels[rows, batch['masked_lm_positions']], batch['masked_lm_ids'])


def _has_flax_bert():
  return importlib.util.find_spec('transformers') is not None and hasattr(
      importlib.import_module('transformers'), 'FlaxBertForPreTraining')


@pytest.mark.slow
@pytest.mark.e2e
def test_benchmark_prints_table_and_json_lines():
  result = run_experiment('benchmark.py', '--preset=tiny', '--batch_size=8', '--seq_len=32', '--vocab_size=200',
                          '--steps=1', '--peak_tflops=1')
  assert result.returncode == 0, result.stderr[-3000:]
  assert '| config | batch × seq (preds) | median step time |' in result.stdout
  assert '| tiny/float32 | 8 × 32 (5) |' in result.stdout
  row = json.loads(result.stdout.strip().splitlines()[-1])
  assert row['step_time_s'] > 0 and row['tokens_per_s'] > 0 and math.isfinite(row['loss'])
  assert row['mfu'] == pytest.approx(row['model_tflop_per_s'] / row['num_devices'])  # 1 TFLOP/s per device


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(_has_flax_bert(), reason='transformers with Flax BERT is installed')
def test_compare_hf_without_flax_bert_is_one_error_line():
  assert_one_line_error(run_experiment('benchmark.py', '--preset=tiny', '--compare_hf'),
                        'pip install transformers==4.57.6')


@pytest.mark.skipif(not _has_flax_bert(), reason='needs transformers 4.57.6 (see bm.INSTALL_HINT)')
def test_hf_baseline_trains_the_same_objective():
  cfg = preset('tiny', vocab_size=200, num_layers=1)
  r = bm.benchmark_hf_train_step(cfg, bm.synthetic_batch(8, 32, 5, 200), steps=1)
  assert r['tokens_per_s'] > 0
  assert r['loss'] == pytest.approx(math.log(200) + math.log(2), abs=0.3)  # untrained MLM + NSP
