"""Times the full pretraining train step (MLM + NSP + AdamW) on synthetic data over a grid; prints a table.

  python experiments/benchmark.py --preset=base --batch_size=8 --seq_len=128 --dtype=float32
  python experiments/benchmark.py --preset=base,large --dtype=bfloat16 --batch_size=8,32 --seq_len=128,512
  /tmp/hfvenv/bin/python3 experiments/benchmark.py --preset=mini --steps=3 --compare_hf
  python experiments/benchmark.py --preset=tiny --hlo_flops --cpu_devices=8
  python experiments/benchmark.py --attention_layers --seq_len=512,1024,2048,4096 --batch_size=1

One row per preset x dtype x batch x seq_len: median step time, tokens/s, model TFLOP/s, MFU,
peak device memory, compile time (`tools/benchmark.py`), then one JSON line per row.
--compare_hf adds Hugging Face Flax BERT on the same batch (needs transformers 4.57.6: see
the end of tools/benchmark.py). --hlo_flops compiles instead of timing and prints the per-device
FLOPs of the compiled step for each mesh layout. --attention_layers times forward + backward of one
ModernBERT-shaped encoder layer of the preset, global and local (--window, the blockwise path), per
sequence length: a local layer's time should grow linearly, a global one's quadratically.
"""

import dataclasses
import json
import os
import platform

from absl import flags
import jax

from bert_jax.config import DROPOUT_IMPLS, preset
from bert_jax.errors import ConfigError

import cli
from tools import benchmark
from tools import levers

_PRESET = flags.DEFINE_list('preset', ['base'], 'Model presets: tiny, mini, small, medium, base, large.')
_BATCH = flags.DEFINE_list('batch_size', ['8'], 'Global batch sizes.')
_SEQ = flags.DEFINE_list('seq_len', ['128'], 'Sequence lengths.')
_DTYPE = flags.DEFINE_list('dtype', ['float32'], 'Compute dtypes: float32, bfloat16.')
_VOCAB = flags.DEFINE_integer('vocab_size', 30522, 'Vocabulary size.')
_PREDS = flags.DEFINE_integer('num_predictions', None, 'Masked positions per sequence (default 20 per 128).')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps after compilation and one warm-up step.')
_ATTN_DROPOUT = flags.DEFINE_float('attention_dropout', 0.1, 'Attention-probability dropout (0 allows '
                                   'the fused dot_product_attention path while training).')
_ATTN_IMPL = flags.DEFINE_string('attention_impl', '', "model.attention_impl ('' = automatic).")
_REMAT = flags.DEFINE_string('remat', 'none', 'model.remat_policy: none, full, dots, dots_no_batch.')
_DROPOUT_IMPL = flags.DEFINE_enum('dropout_impl', 'hash', DROPOUT_IMPLS,
                                  "model.dropout_impl: hashed masks or jax.random.bernoulli (HF's).")
_SCAN = flags.DEFINE_bool('scan_layers', False, 'model.scan_layers: one lax.scan over the encoder layers.')
_PEAK = flags.DEFINE_float('peak_tflops', None, 'Peak TFLOP/s per device for MFU (overrides the table; '
                           'needed on CPUs and unlisted accelerators).')
_HF = flags.DEFINE_bool('compare_hf', False, 'Also time transformers 4.57.6 FlaxBertForPreTraining.')
_HLO = flags.DEFINE_bool('hlo_flops', False, 'Print per-device compiled FLOPs per mesh layout instead of timing.')
_ATTN_LAYERS = flags.DEFINE_bool('attention_layers', False, 'Time one global and one local encoder layer per '
                                  '--seq_len instead of the train step.')
_WINDOW = flags.DEFINE_integer('window', 128, 'With --attention_layers: the local layer\'s window (ModernBERT: 128).')
_LEVERS = flags.DEFINE_enum('levers', None, ['ladder', 'targets', 'hlo'],
                            'The accelerator table instead (tools/levers.py): '
                            "'ladder' times the speed levers one at a time on BERT-base and profiles the best step; "
                            "'targets' times the target shapes with the switches the ladder kept (read from --out); "
                            "'hlo' (no device needed) compares each shape's compiled FLOPs with the model's and lists "
                            'its float32 matmuls.')
_OUT = flags.DEFINE_string('out', '/tmp/gpu_checks', 'With --levers: where rows.jsonl, gpu_table.md/.csv and '
                           'profile.md go.')
_LEVERS_SMOKE = flags.DEFINE_bool('levers_smoke', False, 'With --levers: tiny shapes (a CPU dry run of the table).')
_CPU_DEVICES = flags.DEFINE_integer('cpu_devices', 0, 'Number of CPU devices to expose (e.g. 8 for '
                                    '--hlo_flops on a CPU machine); 0 leaves jax alone.')


def _positive_ints(name, values):
  try:
    out = [int(v) for v in values]
  except ValueError:
    raise ConfigError(f'--{name} takes comma-separated positive integers, got {",".join(values)!r}') from None
  if not out or min(out) <= 0:
    raise ConfigError(f'--{name} values must be positive, got {",".join(values)!r}')
  return out


def main(_):
  if _CPU_DEVICES.value:
    jax.config.update('jax_num_cpu_devices', _CPU_DEVICES.value)  # before any backend starts
  configs = {f'{p}/{d}': preset(p, vocab_size=_VOCAB.value, dtype=d, attention_dropout=_ATTN_DROPOUT.value,
                                attention_impl=_ATTN_IMPL.value, remat_policy=_REMAT.value,
                                scan_layers=_SCAN.value, dropout_impl=_DROPOUT_IMPL.value)
             for p in _PRESET.value for d in _DTYPE.value}
  batch_sizes, seq_lens = _positive_ints('batch_size', _BATCH.value), _positive_ints('seq_len', _SEQ.value)
  device = jax.devices()[0]
  print(f'machine: {device.platform} x{jax.device_count()} ({device.device_kind}); '
        f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores')
  if _LEVERS.value:
    _levers(_LEVERS.value, _OUT.value)
    return
  if _ATTN_LAYERS.value:
    _attention_layers(batch_sizes, seq_lens)
    return
  if _HLO.value:
    for name, cfg in configs.items():
      for b in batch_sizes:
        for s in seq_lens:
          preds = _PREDS.value or benchmark.default_num_predictions(s)
          rows = benchmark.hlo_flops_rows(cfg, b, s, preds)
          analytic = benchmark.pretraining_flops_per_step(cfg, b, s, preds)
          print(f'\n{name}, batch {b} × seq {s} ({preds} predictions): compiled train-step FLOPs per device; '
                f'1-device HLO / analytic model FLOPs = {rows[0]["flops_per_device"] / analytic:.3f}\n')
          print(benchmark.format_hlo_table(rows))
          for r in rows:
            print(json.dumps(dict(r, config=name, batch_size=b, seq_len=s, num_predictions=preds)), flush=True)
    return
  rows = benchmark.benchmark_grid(configs, batch_sizes, seq_lens, num_predictions=_PREDS.value,
                                     steps=_STEPS.value, peak_override=_PEAK.value, compare_hf=_HF.value)
  for source in dict.fromkeys(r['peak_source'] for r in rows):
    print(f'peak: {source}')
  print(f'median of {_STEPS.value} steps after one warm-up; peak device memory is the process high-water '
        f'mark (n/a on CPU)\n')
  print(benchmark.format_table(rows))
  for r in rows:
    print(json.dumps(r), flush=True)


def _levers(part, out_dir):
  device = jax.devices()[0]
  peak, source = benchmark.peak_tflops(device.device_kind, device.platform, 'bfloat16', override=_PEAK.value)
  print(f'{levers.environment_line()}\npeak: {source}', flush=True)
  log = lambda line: print(line, flush=True)  # pylint: disable=unnecessary-lambda-assignment
  if part == 'hlo':
    _hlo_check()
    return
  if part == 'ladder':
    ladder, baseline = levers.LADDER, levers.BASELINE
    if _LEVERS_SMOKE.value:  # the same ladder on a model that compiles in seconds on a CPU (no GPU-only options)
      ladder = [lv for lv in ladder if 'batch_size' not in lv.change and not lv.change.get('options')]
      baseline = dataclasses.replace(baseline, preset='tiny', batch_size=8)
    levers.run_ladder(out_dir, steps=_STEPS.value, peak=peak, ladder=ladder, baseline=baseline, log=log)
  else:
    targets = levers.TARGETS
    if _LEVERS_SMOKE.value:
      small = dict(num_layers=3, max_position_embeddings=512, vocab_size=1024)
      targets = [(n, dataclasses.replace(t.apply({'model': small}), preset='tiny', batch_size=2,
                                         seq_len=min(t.seq_len, 512))) for n, t in targets]
    levers.run_targets(out_dir, steps=_STEPS.value, peak=peak, targets=targets, log=log)
  print(f'\ntables: {out_dir}/gpu_table.md, gpu_table.csv, profile.md', flush=True)


def _hlo_check():
  shapes = [('BERT-base x 128 (the ladder\'s defaults)', levers.BASELINE.apply(
      {'model': {'fused_mask': 'lengths', 'logits_backward': 'compute'}}))] + list(levers.TARGETS)
  print('\ncompiled train step (1 row, 2 layers; ModernBERT 3: one global, two local) against the model FLOPs, '
        'and its float32 matmuls\n\n| shape | HLO GFLOP | model GFLOP | ratio | float32 matmuls |\n'
        '|---|---|---|---|---|')
  for name, setting in shapes:
    r = levers.hlo_check(setting, num_layers=3 if 'Modern' in name else 2)
    dots = '<br>'.join(f'{n} × `{k}`' for k, n in r['float32_dots'].items()) or 'none'
    print(f'| {name} | {r["hlo_gflop"]:.1f} | {r["model_gflop"]:.1f} | {r["ratio"]:.3f} | {dots} |', flush=True)


def _attention_layers(batch_sizes, seq_lens):
  if _WINDOW.value <= 0 or _WINDOW.value % 2:
    raise ConfigError(f'--window={_WINDOW.value} must be a positive even number')
  rows = []
  for p in _PRESET.value:
    cfg = preset(p, norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False,
                 attention_window=_WINDOW.value, dtype=_DTYPE.value[0], attention_impl=_ATTN_IMPL.value)
    for b in batch_sizes:
      for s in seq_lens:
        for local in (False, True):
          rows.append(dict(benchmark.time_attention_layer(cfg, batch_size=b, seq_len=s, local=local,
                                                          steps=_STEPS.value), preset=p))
          print(json.dumps(rows[-1]), flush=True)
  print(f'\nforward + backward of one encoder layer, median of {_STEPS.value} calls after compilation\n')
  print(f'{jax.devices()[0].device_kind}, jax {jax.__version__}, {_DTYPE.value[0]}\n')
  print('| preset | layer | kernel | batch | seq | fwd+bwd (s) | x the shortest seq |\n|---|---|---|---|---|---|---|')
  for r in rows:
    first = next(q for q in rows if (q['preset'], q['layer'], q['batch_size']) == (r['preset'], r['layer'],
                                                                                     r['batch_size']))
    print(f'| {r["preset"]} | {r["layer"]} | {r["kernel"]} | {r["batch_size"]} | {r["seq_len"]:,} | '
          f'{r["fwd_bwd_s"]:.4f} | {r["fwd_bwd_s"] / first["fwd_bwd_s"]:.1f} |')


if __name__ == '__main__':
  cli.run(main)
