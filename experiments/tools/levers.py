"""The accelerator table: speed levers measured one at a time on BERT-base, then the target shapes.

`run_ladder` times the pretraining train step (`benchmark.benchmark_train_step`) for a ladder of settings: a
baseline (the step first measured on a GPU, an H200 on 2026-11-27: BERT-base, 256 x 128, bfloat16, BERT's hidden
dropout, cuDNN attention with a dense mask, float32 backward matmuls for the MLM logits), then one lever per row on
top of the best setting so far. A lever that is a pure speed switch (`adopt`) is kept for the rows after it when it
is faster; a recipe change (dropout settings) is reported beside the ladder and never kept. `run_targets` times the
target shapes (BERT-large and BERT-base at 512, ModernBERT-base at 1,024 and 8,192 tokens) with every switch the
ladder adopted, read from its rows (so it runs in a process and under a time limit of its own). Rows go to
`rows.jsonl` as they finish and the tables (`gpu_table.md`, `gpu_table.csv`) are rewritten after each, so a check
stopped at its time limit keeps what it measured. `profile_breakdown` reads a jax profiler trace of the best base
step and sums device time by kind.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import glob
import io
import json
import os
import tempfile
import time
from typing import Any, Callable, Sequence

import jax

from bert_jax.config import ModelConfig, preset
from tools import benchmark


@dataclasses.dataclass(frozen=True)
class Setting:
  """One train-step configuration: a model preset with overrides, a batch, XLA compiler options."""

  preset: str
  batch_size: int
  seq_len: int
  model: tuple[tuple[str, Any], ...] = ()
  options: tuple[tuple[str, Any], ...] = ()

  def apply(self, change: dict[str, Any]) -> 'Setting':
    """This setting with `change` ({'model': {...}, 'options': {...}, 'batch_size': n, ...}) applied."""
    fields = {k: v for k, v in change.items() if k not in ('model', 'options')}
    model = dict(self.model, **change.get('model', {}))
    options = dict(self.options, **change.get('options', {}))
    return dataclasses.replace(self, model=tuple(sorted(model.items())), options=tuple(sorted(options.items())),
                               **fields)

  def config(self) -> ModelConfig:
    return preset(self.preset, **dict(self.model))


@dataclasses.dataclass(frozen=True)
class Lever:
  """A row of the ladder: `change` on top of the best setting so far; `adopt`: kept when faster."""

  name: str
  change: dict[str, Any]
  adopt: bool = True


# The step first measured on a GPU (docs/results.md, 2026-11-27, 83aed74): 474,923 tokens/s, 26.2% MFU on an H200.
BASELINE = Setting('base', 256, 128, model=tuple(sorted(dict(
    dtype='bfloat16', attention_dropout=0.0, fused_mask='dense', logits_backward='float32').items())))

# In order of expected value: the compiler first (it also shortens every later compile), then the kernels' inputs,
# the shapes, memory for speed; recipe changes last (reported, never kept).
LADDER: tuple[Lever, ...] = (
    Lever('XLA: cuBLAS instead of Triton GEMMs (xla_gpu_enable_triton_gemm=false)',
          {'options': {'xla_gpu_enable_triton_gemm': False}}),
    Lever('cuDNN gets row lengths, not a dense mask (model.fused_mask=lengths)', {'model': {'fused_mask': 'lengths'}}),
    Lever('the MLM decoder\'s backward matmuls in bfloat16, not float32 (model.logits_backward=compute)',
          {'model': {'logits_backward': 'compute'}}),
    Lever('vocabulary padded to a multiple of 128 (30,522 -> 30,592)', {'model': {'vocab_size': 30592}}),
    Lever('batch 512', {'batch_size': 512}),
    Lever('batch 1,024', {'batch_size': 1024}),
    Lever('remat dots_no_batch (recompute elementwise ops)', {'model': {'remat_policy': 'dots_no_batch'}}),
    Lever('hidden dropout off (ModernBERT\'s recipe; BERT keeps 0.1)', {'model': {'hidden_dropout': 0.0}},
          adopt=False),
    Lever('dropout masks from threefry instead of the hash', {'model': {'dropout_impl': 'threefry'}}, adopt=False),
    Lever('attention dropout 0.1 (BERT\'s recipe: the einsum path)', {'model': {'attention_dropout': 0.1}},
          adopt=False),
)

_MODERN = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False, type_vocab_size=0,
               num_layers=22, intermediate_size=1152, vocab_size=50368, max_position_embeddings=8192,
               attention_window=128, global_attention_every=3, hidden_dropout=0.0, attention_dropout=0.0,
               dtype='bfloat16')

# The target shapes, run with the ladder's adopted switches (their own batch, vocabulary and dropout).
_BERT = (('attention_dropout', 0.0), ('dtype', 'bfloat16'))
TARGETS: tuple[tuple[str, Setting], ...] = (
    ('BERT-large x 512', Setting('large', 64, 512, model=_BERT)),
    ('ModernBERT-base x 1,024 (local/global)', Setting('base', 32, 1024, model=tuple(sorted(_MODERN.items())))),
    ('BERT-base x 512', Setting('base', 64, 512, model=_BERT)),
    ('ModernBERT-base x 8,192 (local/global)', Setting('base', 4, 8192, model=tuple(sorted(_MODERN.items())))),
)

# Switches the ladder may adopt that carry over to the targets (shape and recipe fields stay the target's own).
_CARRIED = ('fused_mask', 'logits_backward', 'remat_policy', 'dropout_impl')


def measure(setting: Setting, *, steps: int, peak: float | None) -> dict[str, Any]:
  """`benchmark_train_step` of `setting` with MFU; an error (e.g. out of memory) becomes the row's `error`."""
  cfg = setting.config()
  preds = benchmark.default_num_predictions(setting.seq_len)
  row = {'preset': setting.preset, 'batch_size': setting.batch_size, 'seq_len': setting.seq_len,
         'num_predictions': preds, 'model': dict(setting.model), 'options': dict(setting.options)}
  try:
    row.update(benchmark.benchmark_train_step(cfg, batch_size=setting.batch_size, seq_len=setting.seq_len,
                                              num_predictions=preds, steps=steps,
                                              compiler_options=dict(setting.options)))
  except Exception as e:  # pylint: disable=broad-except
    row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300]}'
    return row
  row['mfu'] = row['model_tflop_per_s'] / (peak * row['num_devices']) if peak else None
  return row


def _recorder(out_dir: str, log: Callable[[str], None]):
  """`record(row)`: appends the row to `rows.jsonl`, rewrites the tables from every row there, logs it."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, 'rows.jsonl')

  def record(row):
    with open(path, 'a') as f:
      f.write(json.dumps(row, default=str) + '\n')
    write_tables(read_rows(out_dir), out_dir)
    log(format_row(row))
  return record


def read_rows(out_dir: str) -> list[dict[str, Any]]:
  path = os.path.join(out_dir, 'rows.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def run_ladder(out_dir: str, *, steps: int = 10, peak: float | None = None, ladder: Sequence[Lever] = LADDER,
               baseline: Setting = BASELINE, profile: bool = True,
               log: Callable[[str], None] = print) -> Setting:
  """The baseline, one lever per row on the best setting so far, then the profile of the best; returns it."""
  record = _recorder(out_dir, log)
  best = measure(baseline, steps=steps, peak=peak)
  best_setting = baseline
  record(dict(best, check='ladder', lever='baseline (the step as first measured on a GPU)', adopted=True))
  profiled = not profile
  # The speed switches first, then the profile of the best step, then the recipe changes (a check stopped at its
  # time limit keeps the figures that matter most).
  for lever in sorted(ladder, key=lambda lv: not lv.adopt):
    if not lever.adopt and not profiled:
      profiled = _write_profile(out_dir, best, best_setting, log)
    setting = best_setting.apply(lever.change)
    row = measure(setting, steps=steps, peak=peak)
    ok = 'error' not in row and 'error' not in best
    if ok:
      row['speedup'] = row['tokens_per_s'] / best['tokens_per_s']
    row.update(check='ladder', lever=lever.name, adopted=bool(lever.adopt and ok and row['speedup'] > 1.01))
    record(row)
    if row['adopted']:
      best, best_setting = row, setting
  if not profiled:
    _write_profile(out_dir, best, best_setting, log)
  return best_setting


def _write_profile(out_dir, best, best_setting, log) -> bool:
  if 'error' not in best:
    text = format_profile(profile_step(best_setting, steps=3), best_setting)
    with open(os.path.join(out_dir, 'profile.md'), 'w') as f:
      f.write(text)
    log(text)
  return True


def adopted_switches(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The change a target takes from the ladder's rows: the last adopted row's carried switches and options."""
  kept = [r for r in rows if r.get('check') == 'ladder' and r.get('adopted') and 'error' not in r]
  if not kept:
    return {}
  return {'model': {k: v for k, v in kept[-1]['model'].items() if k in _CARRIED},
          'options': kept[-1]['options']}


def run_targets(out_dir: str, *, steps: int = 10, peak: float | None = None, targets=TARGETS,
                log: Callable[[str], None] = print) -> None:
  """Each target shape with the switches the ladder (its rows in `out_dir`) adopted."""
  change = adopted_switches(read_rows(out_dir))
  log(f'targets with the ladder\'s adopted switches: {change or "none (no ladder rows)"}')
  record = _recorder(out_dir, log)
  for name, target in targets:
    record(dict(measure(target.apply(change), steps=steps, peak=peak), check='target', lever=name, adopted=None))


def format_row(r: dict[str, Any]) -> str:
  cells = _cells(r)
  return ' | '.join(f'{k}={v}' for k, v in cells.items() if v != '')


_HEAD = ('check', 'lever or shape', 'preset', 'batch × seq', 'step (ms)', 'tokens/s', 'model TFLOP/s', 'MFU',
         '× before', 'kept', 'compiled mem (GiB)', 'peak mem (GiB)', 'compile (s)', 'input wait')


def _cells(r: dict[str, Any]) -> dict[str, str]:
  err = r.get('error')

  def num(fmt, k):
    return '' if err or r.get(k) is None else format(r[k], fmt)
  return dict(zip(_HEAD, (
      r.get('check', ''), r.get('lever', ''), r['preset'], f'{r["batch_size"]} × {r["seq_len"]}',
      '' if err else f'{r["step_time_s"] * 1e3:.1f}', err or num(',.0f', 'tokens_per_s'),
      num('.1f', 'model_tflop_per_s'), '' if err or r.get('mfu') is None else f'{r["mfu"]:.1%}',
      num('.3f', 'speedup'), {True: 'yes', False: 'no', None: ''}[r.get('adopted')],
      num('.2f', 'compiled_memory_gb'), num('.2f', 'peak_device_memory_gb'), num('.1f', 'compile_s'),
      '' if err else '0 (batch on device)')))


def write_tables(rows: Sequence[dict[str, Any]], out_dir: str) -> None:
  """`gpu_table.md` (Markdown, for docs/results.md as is) and `gpu_table.csv` (the same cells, raw numbers)."""
  lines = ['| ' + ' | '.join(_HEAD) + ' |', '|' + '---|' * len(_HEAD)]
  lines += ['| ' + ' | '.join(_cells(r).values()) + ' |' for r in rows]
  with open(os.path.join(out_dir, 'gpu_table.md'), 'w') as f:
    f.write(environment_line() + '\n\n' + '\n'.join(lines) + '\n')
  keys = ('check', 'lever', 'preset', 'batch_size', 'seq_len', 'step_time_s', 'tokens_per_s', 'model_tflop_per_s',
          'mfu', 'speedup', 'adopted', 'compiled_memory_gb', 'peak_device_memory_gb', 'compile_s', 'error')
  buf = io.StringIO()
  writer = csv.DictWriter(buf, keys, extrasaction='ignore')
  writer.writeheader()
  writer.writerows(rows)
  with open(os.path.join(out_dir, 'gpu_table.csv'), 'w') as f:
    f.write(buf.getvalue())


def environment_line() -> str:
  """Device, its count and the software: jax, jaxlib, the backend's platform version (CUDA / cuDNN on GPU)."""
  d = jax.devices()[0]
  version = getattr(d.client, 'platform_version', '?')
  import jaxlib  # pylint: disable=g-import-not-at-top
  return (f'{d.device_kind} x{jax.device_count()} ({d.platform}); jax {jax.__version__}, jaxlib {jaxlib.__version__}; '
          f'backend: {" ".join(str(version).split())}')


# Kernel names -> kinds, first match wins (lower-case substrings). XLA names its kernels after the fusion they
# run (loop_*, input_reduce_*, gemm_fusion_*); cuBLAS / CUTLASS / cuDNN kernels keep their libraries' names.
KINDS = (
    ('attention (cuDNN)', ('sdpa', 'fmha', 'flash', 'cudnn')),
    ('matmul', ('gemm', 'cublas', 'cutlass', 'xmma', 'nvjet', 'matmul', 'dot', 'sm90_', 'sm80_', 'ynn_')),
    ('reduction (norms, softmax, losses)', ('reduce', 'reduction')),
    ('copy / transpose', ('copy', 'transpose', 'memcpy', 'memset', 'concatenate', 'slice')),
    ('scatter / gather (embeddings, MLM positions)', ('scatter', 'gather', 'dynamic')),
    ('elementwise fusion (activations, dropout, optimizer)', ('fusion', 'loop_', 'convert', 'multiply', 'add')),
)


def classify(name: str) -> str:
  low = name.lower()
  for kind, keys in KINDS:
    if any(k in low for k in keys):
      return kind
  return 'other'


def profile_breakdown(trace_dir: str, steps: int) -> dict[str, Any]:
  """Device time per step by kernel kind from a jax profiler trace (`jax.profiler.ProfileData`).

  Sums the events of the device planes ('/device:GPU:0', ...; on CPU the host's XLA threads), per kind and for the
  20 longest kernels; `busy_ms` is their total per step (overlapping streams counted once each). On GPU only the
  stream lines count (the plane's other lines summarise the same time per XLA module and op).
  """
  paths = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)
  if not paths:
    return {'error': f'no trace written under {trace_dir}'}
  data = jax.profiler.ProfileData.from_file(paths[0])
  by_kind: dict[str, float] = collections.Counter()
  by_name: dict[str, float] = collections.Counter()
  planes = [p for p in data.planes if p.name.startswith('/device:')]
  lines = [line for p in planes for line in p.lines]
  if not planes:  # a CPU run: XLA's own threads of the host plane
    planes = [p for p in data.planes if p.name.startswith('/host:CPU')]
    lines = [line for p in planes for line in p.lines if 'xla' in line.name.lower()]
  streams = [line for line in lines if 'stream' in line.name.lower()]
  for line in streams or lines:
    for ev in line.events:
      by_kind[classify(ev.name)] += ev.duration_ns / 1e6 / steps
      by_name[ev.name] += ev.duration_ns / 1e6 / steps
  return {'planes': [p.name for p in planes], 'lines': sorted({line.name for line in streams or lines}),
          'busy_ms': sum(by_kind.values()), 'by_kind': dict(by_kind.most_common()),
          'top': dict(by_name.most_common(20))}


def profile_step(setting: Setting, *, steps: int = 3) -> dict[str, Any]:
  """Traces `steps` train steps of `setting` after compilation and one warm-up; `profile_breakdown` of them."""
  cfg = setting.config()
  preds = benchmark.default_num_predictions(setting.seq_len)
  trace_dir = tempfile.mkdtemp(prefix='bert_jax_trace_')
  step, state, args = benchmark.compiled_train_step(cfg, batch_size=setting.batch_size, seq_len=setting.seq_len,
                                                    num_predictions=preds, compiler_options=dict(setting.options))
  state, _ = jax.block_until_ready(step(state, *args))
  t0 = time.perf_counter()
  jax.profiler.start_trace(trace_dir)
  for _ in range(steps):
    state, _ = step(state, *args)
  jax.block_until_ready(state)
  jax.profiler.stop_trace()
  result = profile_breakdown(trace_dir, steps)
  result['wall_ms'] = (time.perf_counter() - t0) * 1e3 / steps
  return result


def format_profile(p: dict[str, Any], setting: Setting) -> str:
  """The profile as Markdown: device time per step by kind, then the longest kernels."""
  if 'error' in p:
    return f'profile: {p["error"]}\n'
  head = (f'Profile of the best base step ({setting.preset}, {setting.batch_size} x {setting.seq_len}, '
          f'{dict(setting.model)}, options {dict(setting.options)}): {p["wall_ms"]:.1f} ms wall per traced step '
          f'(the tracer adds some), {p["busy_ms"]:.1f} ms of kernels on {", ".join(p["planes"])} '
          f'(lines: {", ".join(p["lines"][:8])}{" ..." if len(p["lines"]) > 8 else ""}).\n\n')
  lines = ['| kind | ms per step | share of kernel time |', '|---|---|---|']
  lines += [f'| {k} | {v:.2f} | {v / p["busy_ms"]:.1%} |' for k, v in p['by_kind'].items()]
  lines += ['', '| longest kernels | ms per step | kind |', '|---|---|---|']
  lines += [f'| `{k[:90]}` | {v:.2f} | {classify(k)} |' for k, v in p['top'].items()]
  return head + '\n'.join(lines) + '\n'


def hlo_check(setting: Setting, *, num_layers: int | None = None, batch_size: int = 1) -> dict[str, Any]:
  """What a device-free machine can check of a setting's train step: XLA's FLOP count of the compiled step
  (`cost_analysis`) against the model's (`pretraining_flops_per_step`; > 1.1 means wasted matmuls), and the
  float32 matmuls of the lowered program (a bfloat16 step should have only those it means). `num_layers` and
  `batch_size` shrink the compile; the ratio is per layer and per row."""
  setting = dataclasses.replace(setting.apply({'model': {'num_layers': num_layers}} if num_layers else {}),
                                batch_size=batch_size)
  cfg = setting.config()
  preds = benchmark.default_num_predictions(setting.seq_len)
  lowered = benchmark.lowered_train_step(cfg, benchmark.MeshConfig(1, 1, 1), batch_size, setting.seq_len, preds,
                                         jax.devices()[:1])
  cost = lowered.compile(compiler_options={'xla_backend_optimization_level': 0}).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  model = benchmark.pretraining_flops_per_step(cfg, batch_size, setting.seq_len, preds)
  return {'preset': setting.preset, 'num_layers': cfg.num_layers, 'seq_len': setting.seq_len,
          'hlo_gflop': cost['flops'] / 1e9, 'model_gflop': model / 1e9, 'ratio': cost['flops'] / model,
          'float32_dots': dict(benchmark.float32_dots(lowered.as_text()))}
