"""The accelerator table (tools/levers.py) on CPU: settings and their changes, which switches a ladder keeps and
carries to the targets, the table's cells and CSV, kernel kinds, and the FLOP count of the target shapes."""

import csv
import os

import pytest

from bert_jax.config import preset

from tools import benchmark as bm
from tools import levers


def test_setting_apply_merges_model_options_and_shape():
  s = levers.BASELINE.apply({'model': {'fused_mask': 'lengths'}, 'options': {'xla_x': False}, 'batch_size': 512})
  assert dict(s.model) == {'dtype': 'bfloat16', 'attention_dropout': 0.0, 'fused_mask': 'lengths',
                           'logits_backward': 'float32'}
  assert dict(s.options) == {'xla_x': False} and s.batch_size == 512 and s.seq_len == 128
  assert dict(levers.BASELINE.model)['fused_mask'] == 'dense'  # the baseline itself is unchanged
  cfg = s.config()
  assert (cfg.num_layers, cfg.hidden_size, cfg.fused_mask, cfg.dtype) == (12, 768, 'lengths', 'bfloat16')


def test_every_lever_and_target_is_a_valid_config():
  for lever in levers.LADDER:
    levers.BASELINE.apply(lever.change).config()  # a bad field or value raises ConfigError
  for _, target in levers.TARGETS:
    cfg = target.config()
    assert cfg.dtype == 'bfloat16' and target.seq_len <= cfg.max_position_embeddings


def _row(lever, tokens, adopted, **kw):
  return dict(dict(check='ladder', lever=lever, preset='base', batch_size=256, seq_len=128, step_time_s=0.05,
                   tokens_per_s=tokens, model_tflop_per_s=(tokens or 0) * 1e-3, mfu=(tokens or 0) * 1e-6,
                   adopted=adopted,
                   compiled_memory_gb=10.0, peak_device_memory_gb=None, compile_s=30.0,
                   model={'fused_mask': 'dense', 'vocab_size': 30522}, options={}), **kw)


def test_targets_take_the_last_adopted_switches_only():
  rows = [_row('baseline', 100, True),
          _row('lengths', 120, True, model={'fused_mask': 'lengths', 'vocab_size': 30592},
               options={'xla_gpu_enable_triton_gemm': False}),
          _row('dropout off', 150, False, model={'fused_mask': 'lengths', 'hidden_dropout': 0.0}),
          _row('oom', None, False, error='XlaRuntimeError: RESOURCE_EXHAUSTED')]
  # The vocabulary and the dropout are the target's own; the mask switch and the compiler options carry over.
  assert levers.adopted_switches(rows) == {'model': {'fused_mask': 'lengths'},
                                           'options': {'xla_gpu_enable_triton_gemm': False}}
  assert levers.adopted_switches([]) == {}


def test_tables_hold_every_row_with_errors_in_place(tmp_path):
  rows = [_row('baseline', 474_923, True, mfu=0.262), _row('batch 1,024', None, False, error='RESOURCE_EXHAUSTED')]
  rows[0]['speedup'] = None
  levers.write_tables(rows, str(tmp_path))
  md = (tmp_path / 'gpu_table.md').read_text().splitlines()
  assert md[0].startswith('cpu x') and 'jax ' in md[0]  # the environment line first
  table = [line for line in md if line.startswith('|')]
  assert len(table) == 4 and table[0].count('|') == len(levers._HEAD) + 1  # pylint: disable=protected-access
  assert '| 474,923 |' in table[2] and '| 26.2% |' in table[2] and '| 50.0 |' in table[2]
  assert 'RESOURCE_EXHAUSTED' in table[3] and '| no |' in table[3]
  with open(tmp_path / 'gpu_table.csv') as f:
    got = list(csv.DictReader(f))
  assert float(got[0]['tokens_per_s']) == 474_923 and got[1]['error'] == 'RESOURCE_EXHAUSTED'


def test_read_rows_appends_across_processes(tmp_path):
  record = levers._recorder(str(tmp_path), log=lambda line: None)  # pylint: disable=protected-access
  record(_row('baseline', 100, True))
  record(dict(_row('BERT-large x 512', 50, None), check='target'))
  assert [r['lever'] for r in levers.read_rows(str(tmp_path))] == ['baseline', 'BERT-large x 512']
  assert os.path.exists(tmp_path / 'gpu_table.md')


@pytest.mark.parametrize('name,kind', [
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64', 'matmul'),
    ('cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8', 'matmul'),
    ('gemm_fusion_dot_12', 'matmul'),
    ('cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0', 'attention (cuDNN)'),
    ('input_reduce_fusion_3', 'reduction (norms, softmax, losses)'),
    ('loop_multiply_fusion_7', 'elementwise fusion (activations, dropout, optimizer)'),
    ('transpose_12', 'copy / transpose'),
    ('scatter_add_fusion', 'scatter / gather (embeddings, MLM positions)'),
    ('something_else', 'other'),
])
def test_kernel_kinds(name, kind):
  assert levers.classify(name) == kind


def test_profile_of_an_empty_trace_dir_says_so(tmp_path):
  assert 'no trace' in levers.profile_breakdown(str(tmp_path), 3)['error']


@pytest.mark.slow
def test_a_cpu_profile_sums_the_kernels_of_a_step():
  setting = levers.Setting('tiny', 8, 32, model=(('vocab_size', 512),))  # 8 rows: one per fake device
  p = levers.profile_step(setting, steps=2)
  assert p['busy_ms'] > 0 and p['planes'] == ['/host:CPU'] and abs(sum(p['by_kind'].values()) - p['busy_ms']) < 1e-6
  assert p['by_kind'].get('matmul', 0) > 0 and len(p['top']) == 20
  text = levers.format_profile(p, setting)
  assert text.startswith('Profile of the best base step (tiny, 8 x 32') and '| matmul |' in text


def test_model_flops_count_geglu_and_local_windows():
  bert = preset('base')
  modern = preset('base', mlp='geglu', intermediate_size=1152, attention_window=128, global_attention_every=3,
                  num_layers=6)
  glob = preset('base', mlp='geglu', intermediate_size=1152, num_layers=6)
  t, d, i = 1024, 768, 1152
  # Per layer and row: 3 x (2 t (4 d^2 + 3 d i) + 4 t keys d); layers 0 and 3 global (t keys), 4 local (129 keys).
  per_row = sum(3 * (2 * t * (4 * d * d + 3 * d * i) + 4 * t * keys * d) for keys in (t, 129, 129, t, 129, 129))
  heads = 3 * (2 * d * d + 4 * d + 5 * (2 * d * d + 2 * d * 30522))
  assert bm.pretraining_flops_per_step(modern, 1, t, 5) == pytest.approx(per_row + heads)
  assert bm.pretraining_flops_per_step(glob, 1, t, 5) > bm.pretraining_flops_per_step(modern, 1, t, 5)
  # BERT's count is unchanged by the generalisation: 2 d i MLP, every layer global.
  t = 128
  want = 3 * 8 * (12 * (2 * t * (4 * d * d + 2 * d * 3072) + 4 * t * t * d) + 2 * d * d + 4 * d
                  + 20 * (2 * d * d + 2 * d * 30522))
  assert bm.pretraining_flops_per_step(bert, 8, t, 20) == pytest.approx(want)
