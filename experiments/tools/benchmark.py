"""The performance record: timing the full pretraining train step, FLOPs, MFU and memory.

`benchmark_grid` times the MLM+NSP+AdamW step (`pretraining.pretrain_run.pretraining_model`) on synthetic
data for every preset x dtype x batch x sequence length and returns one row each: median step
time, tokens/s, model FLOP/s (the analytic count of `pretraining_flops_per_step`), MFU against
the device's peak (`PEAK_TFLOPS`), peak device memory and compile time; optionally Hugging
Face's Flax BERT on the same batch (at the end of this file). `per_device_flops` / `hlo_flops_rows`
read the compiled step's own FLOP count per device for several mesh layouts: the scaling
evidence that sharded layouts split the work instead of replicating it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import resource
import statistics
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import sharding as shd
from bert_jax.config import MeshConfig, ModelConfig, OptimConfig
from bert_jax.errors import ConfigError
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

# Dense (no 2:4 sparsity) peak TFLOP/s per device by matmul mode, from the vendors' datasheets,
# keyed by the exact `jax.Device.device_kind`. Unknown kinds (CPUs, H100/H200 NVL, ...) give no
# MFU unless a peak is passed explicitly. TPUs list only bfloat16: float32 matmuls at jax's
# default precision run as one bfloat16 pass there.
_H100_SXM = {'bfloat16': 989.4, 'tf32': 494.7, 'float32': 66.9}
_A100 = {'bfloat16': 312.0, 'tf32': 156.0, 'float32': 19.5}
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    'NVIDIA H100 80GB HBM3': _H100_SXM,
    'NVIDIA H100 PCIe': {'bfloat16': 756.0, 'tf32': 378.0, 'float32': 51.0},
    'NVIDIA H200': _H100_SXM,  # the SXM part: the H100's chip with more memory
    'NVIDIA A100-SXM4-40GB': _A100,
    'NVIDIA A100-SXM4-80GB': _A100,
    'NVIDIA A100-PCIE-40GB': _A100,
    'NVIDIA A100 80GB PCIe': _A100,
    'TPU v4': {'bfloat16': 275.0},
    'TPU v5 lite': {'bfloat16': 197.0},  # v5e
    'TPU v5e': {'bfloat16': 197.0},
    'TPU v5': {'bfloat16': 459.0},  # v5p
    'TPU v5p': {'bfloat16': 459.0},
    'TPU v6 lite': {'bfloat16': 918.0},  # v6e (Trillium)
    'TPU v6e': {'bfloat16': 918.0},
}

# The mesh layouts (data, fsdp, tensor) of the HLO FLOP table.
HLO_LAYOUTS: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (8, 1, 1), (1, 8, 1), (4, 1, 2), (2, 2, 2))


def matmul_mode(platform: str, dtype: str, precision: Any = None) -> str | None:
  """The arithmetic the model's matmuls run in: 'bfloat16', 'tf32', 'float32' or None (no single peak).

  Float32 dots at jax's default precision use TF32 tensor cores on NVIDIA GPUs (Ampere and
  later) and one bfloat16 pass on TPUs (docs.jax.dev, "Matmul precision"); only
  `jax_default_matmul_precision='highest'` (or 'float32') asks for true float32.
  """
  if dtype == 'bfloat16':
    return 'bfloat16'
  full = str(precision).lower() in ('highest', 'float32', 'f32_f32_f32')
  if platform == 'gpu':
    return 'float32' if full else 'tf32'
  if platform == 'tpu':
    return None if full else 'bfloat16'  # 'highest' is several bf16 passes
  return 'float32'


def peak_tflops(device_kind: str, platform: str, dtype: str, *, override: float | None = None,
                precision: Any = None) -> tuple[float | None, str]:
  """(peak dense TFLOP/s per device or None, where it came from) for MFU.

  Args:
    device_kind: `jax.Device.device_kind`, e.g. 'NVIDIA H100 80GB HBM3' or 'TPU v5 lite'.
    platform: `jax.Device.platform` ('cpu', 'gpu', 'tpu').
    dtype: the model's compute dtype.
    override: a peak given by the user; wins over the table on any platform.
    precision: `jax.config.jax_default_matmul_precision` (None = jax's default).
  """
  if override:
    return float(override), f'{override:g} TFLOP/s per device (--peak_tflops)'
  mode = matmul_mode(platform, dtype, precision)
  peak = PEAK_TFLOPS.get(device_kind, {}).get(mode) if mode else None
  if peak is None:
    return None, f'no known {mode or dtype} peak for {device_kind!r}: MFU n/a (pass --peak_tflops)'
  return peak, f'{peak:g} TFLOP/s per device ({device_kind}, dense {mode})'


def pretraining_flops_per_step(cfg: ModelConfig, batch_size: int, seq_len: int, num_predictions: int) -> float:
  """Model FLOPs of one MLM+NSP train step: matmuls only, 2 FLOPs per multiply-add, backward = 2x forward.

  Per layer and token: Q, K, V and output projections (4 d^2) and the FFN (2 d i; GeGLU 3 d i)
  multiply-adds, plus QK^T and PV (2 t d; a local layer's window w: 2 (w + 1) d). Heads: the pooler and
  NSP classifier on [CLS], and the MLM transform and tied decoder at the `num_predictions` gathered
  positions only (what the model computes).
  Embedding lookups, LayerNorm, softmax, GELU, dropout, losses and the optimizer are not counted
  (so the compiled program's count is somewhat higher, see tests/test_benchmarking.py); neither
  is rematerialisation, which makes this "model" rather than "hardware" FLOPs.
  """
  d, i, t, v = cfg.hidden_size, cfg.intermediate_size, seq_len, cfg.vocab_size
  mlp = 3 * d * i if cfg.mlp == 'geglu' else 2 * d * i  # GeGLU: two input projections
  # A local layer's query meets the keys of its window (attention_window + 1 at most), a global one all t.
  layers = sum(2 * t * (4 * d * d + mlp) + 4 * t * (min(t, w + 1) if w else t) * d for w in cfg.layer_windows)
  heads = 2 * d * d + 2 * d * 2 + num_predictions * (2 * d * d + 2 * d * v)
  return 3.0 * batch_size * (layers + heads)


def default_num_predictions(seq_len: int) -> int:
  """BERT's 20 masked positions per 128 tokens."""
  return max(1, round(seq_len * 20 / 128))


def synthetic_batch(batch_size: int, seq_len: int, num_predictions: int, vocab_size: int, seed: int = 0):
  """A full-length NSP pair batch with `num_predictions` distinct masked positions per row (numpy)."""
  if not 0 < num_predictions < seq_len:
    raise ConfigError(f'num_predictions={num_predictions} must be between 1 and seq_len - 1 = {seq_len - 1}')
  rng = np.random.default_rng(seed)
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq_len), num_predictions, replace=False)
                                for _ in range(batch_size)]), 1)
  return {
      'input_ids': rng.integers(5, vocab_size, (batch_size, seq_len), dtype=np.int32),
      'token_type_ids': (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch_size, 0),
      'attention_mask': np.ones((batch_size, seq_len), np.int32),
      'masked_lm_positions': positions.astype(np.int32),
      'masked_lm_ids': rng.integers(5, vocab_size, (batch_size, num_predictions), dtype=np.int32),
      'masked_lm_weights': np.ones((batch_size, num_predictions), np.float32),
      'next_sentence_labels': rng.integers(0, 2, (batch_size,), dtype=np.int32),
      'nsp_weights': np.ones((batch_size,), np.float32),
  }


@dataclasses.dataclass
class Timing:
  """A compiled step and how long it took."""

  compiled: Any
  compile_s: float
  step_times_s: list[float]
  loss: float

  @property
  def step_time_s(self) -> float:
    return statistics.median(self.step_times_s)


def time_step(step_fn, state, *args, steps: int, compiler_options: dict[str, Any] | None = None) -> Timing:
  """Compiles `step_fn(state, *args) -> (state, metrics)`, runs one warm-up step, then times `steps` steps.

  The state is donated and rebound each step; each timed step waits for its outputs. `compiler_options`: XLA
  options of this compilation alone (e.g. {'xla_gpu_enable_triton_gemm': False}).
  """
  t0 = time.perf_counter()
  compiled = step_fn.lower(state, *args).compile(compiler_options=compiler_options or None)
  compile_s = time.perf_counter() - t0
  state, metrics = jax.block_until_ready(compiled(state, *args))
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = jax.block_until_ready(compiled(state, *args))
    times.append(time.perf_counter() - t0)
  return Timing(compiled, compile_s, times, float(metrics['loss']))


def time_attention_layer(cfg: ModelConfig, *, batch_size: int, seq_len: int, local: bool, steps: int) -> dict:
  """Forward + backward of one encoder layer of `cfg` (rotary: ModernBERT's), global or local (its window, the
  blockwise path): median seconds of `steps` calls after compilation, one device, no dropout."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax.model import attention, encoder, layers  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(cfg, hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=seq_len)
  layer = encoder.EncoderLayer(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  x_btd = jax.random.normal(jax.random.key(1), (batch_size, seq_len, cfg.hidden_size), jnp.float32)
  positions = jnp.broadcast_to(jnp.arange(seq_len), (batch_size, seq_len))
  rope = layers.rotary_tables(positions, cfg.head_dim, cfg.rope_theta) if cfg.position_embedding == 'rotary' else None
  valid = jnp.ones((batch_size, seq_len), jnp.int32)
  mask = (attention.band_mask(cfg.attention_window, seq_len, valid) if local
          else encoder.attention_mask_b11s(valid))

  def loss(params, x_btd):
    return jnp.sum(nnx.merge(graphdef, params, rest)(x_btd, mask, rope, deterministic=True) ** 2)

  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  t0 = time.perf_counter()
  jax.block_until_ready(step(params, x_btd))
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, x_btd))
    times.append(time.perf_counter() - t0)
  kernel = attention.choose_attention(cfg, layer.attention.platform, training=False,
                                      seq_len=cfg.attention_window // 2 if local else seq_len)
  kernel = {'cudnn': 'cudnn', 'xla': 'einsum' if local else 'xla', 'einsum': 'einsum'}[kernel]
  return {'layer': f'local (window {cfg.attention_window})' if local else 'global', 'kernel': kernel,
          'seq_len': seq_len,
          'batch_size': batch_size, 'fwd_bwd_s': statistics.median(times), 'compile_s': compile_s}


def _check_shape(cfg: ModelConfig, batch_size: int, seq_len: int, mesh) -> None:
  if seq_len > cfg.max_position_embeddings:
    raise ConfigError(f'seq_len={seq_len} exceeds model.max_position_embeddings={cfg.max_position_embeddings}')
  if batch_size % shd.num_batch_shards(mesh):
    raise ConfigError(f'batch_size={batch_size} is not divisible by the {shd.num_batch_shards(mesh)} batch '
                      f'shards of the mesh')


def _train_step_inputs(cfg: ModelConfig, batch_size: int, seq_len: int, num_predictions: int,
                       mesh_cfg: MeshConfig, devices):
  """(mesh, pretraining model, its initial state, a synthetic global batch on the mesh)."""
  mesh = shd.make_mesh(mesh_cfg, devices)
  _check_shape(cfg, batch_size, seq_len, mesh)
  model = pretraining_model(cfg, optim.make_optimizer(OptimConfig(), 1000), mesh)
  batch = model.global_batch(synthetic_batch(batch_size, seq_len, num_predictions, cfg.vocab_size))
  return mesh, model, model.init_state(), batch


def compiled_train_step(cfg: ModelConfig, *, batch_size: int, seq_len: int, num_predictions: int,
                        compiler_options: dict[str, Any] | None = None, mesh_cfg: MeshConfig = MeshConfig(),
                        devices: Sequence[jax.Device] | None = None):
  """(compiled step, initial state, the step's other arguments): `step(state, *args) -> (state, metrics)`."""
  _, model, state, batch = _train_step_inputs(cfg, batch_size, seq_len, num_predictions, mesh_cfg, devices)
  compiled = model.train_step.lower(state, batch, model.rest).compile(compiler_options=compiler_options or None)
  return compiled, state, (batch, model.rest)


def benchmark_train_step(cfg: ModelConfig, *, batch_size: int, seq_len: int, num_predictions: int,
                         steps: int = 10, mesh_cfg: MeshConfig = MeshConfig(),
                         devices: Sequence[jax.Device] | None = None,
                         compiler_options: dict[str, Any] | None = None) -> dict[str, Any]:
  """Compiles and times the pretraining train step on a synthetic batch; returns the measurements.

  Everything the model does is decided by `cfg` (dtype, attention kernel, remat, scan), so new
  ModelConfig options flow through unchanged; `compiler_options` are XLA options of this compilation.
  """
  mesh, model, state, batch = _train_step_inputs(cfg, batch_size, seq_len, num_predictions, mesh_cfg, devices)
  timing = time_step(model.train_step, state, batch, model.rest, steps=steps, compiler_options=compiler_options)
  flops = pretraining_flops_per_step(cfg, batch_size, seq_len, num_predictions)
  peaks = [(d.memory_stats() or {}).get('peak_bytes_in_use') for d in mesh.devices.flat]
  mem = timing.compiled.memory_analysis()
  compiled_bytes = None
  if mem is not None:
    compiled_bytes = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                      - mem.alias_size_in_bytes)
  step_s = timing.step_time_s
  return {
      'step_time_s': step_s,
      'tokens_per_s': batch_size * seq_len / step_s,
      'model_tflops_per_step': flops / 1e12,
      'model_tflop_per_s': flops / step_s / 1e12,
      'compile_s': timing.compile_s,
      # The allocator's high-water mark since the process started (max over devices); None where
      # the backend keeps no statistics (CPU).
      'peak_device_memory_gb': max(peaks) / 2**30 if all(peaks) else None,
      # XLA's own estimate for this step (arguments + outputs + temporaries - donated), per device.
      'compiled_memory_gb': compiled_bytes / 2**30 if compiled_bytes is not None else None,
      'host_max_rss_gb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      'loss': timing.loss,
      'num_devices': mesh.size,
      'step_times_s': timing.step_times_s,
  }


def benchmark_grid(configs: dict[str, ModelConfig], batch_sizes: Sequence[int], seq_lens: Sequence[int], *,
                   num_predictions: int | None = None, steps: int = 10, peak_override: float | None = None,
                   compare_hf: bool = False) -> list[dict[str, Any]]:
  """One row per (config, batch size, sequence length): `benchmark_train_step` plus MFU and, with
  `compare_hf`, Hugging Face Flax BERT's time on the same batch and our speed-up over it.

  Args:
    configs: name (e.g. 'base/bfloat16') -> ModelConfig, in table order.
    num_predictions: masked positions per sequence; None = 20 per 128 tokens.
    peak_override: peak TFLOP/s per device for MFU, instead of the `PEAK_TFLOPS` table.
  """
  if compare_hf:
    require_transformers()  # fail before any timing
  device = jax.devices()[0]
  rows = []
  for name, cfg in configs.items():
    peak, peak_source = peak_tflops(device.device_kind, device.platform, cfg.dtype, override=peak_override,
                                    precision=jax.config.jax_default_matmul_precision)
    for batch_size in batch_sizes:
      for seq_len in seq_lens:
        preds = num_predictions or default_num_predictions(seq_len)
        r = benchmark_train_step(cfg, batch_size=batch_size, seq_len=seq_len, num_predictions=preds,
                                 steps=steps)
        r.update(config=name, dtype=cfg.dtype, batch_size=batch_size, seq_len=seq_len, num_predictions=preds,
                 peak_tflops_per_device=peak, peak_source=peak_source,
                 mfu=r['model_tflop_per_s'] / (peak * r['num_devices']) if peak else None)
        if compare_hf:
          hf = benchmark_hf_train_step(cfg, synthetic_batch(batch_size, seq_len, preds,
                                                                             cfg.vocab_size), steps=steps)
          r.update({f'hf_{k}': v for k, v in hf.items()})
          r['speedup_vs_hf'] = r['tokens_per_s'] / hf['tokens_per_s']
        rows.append(r)
  return rows


def _gib(x):
  return f'{x:.2f} GiB' if x else 'n/a'


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """A markdown table of `benchmark_grid` rows."""
  hf = any('speedup_vs_hf' in r for r in rows)
  head = ['config', 'batch × seq (preds)', 'median step time', 'tokens/s', 'model TFLOP/s', 'MFU',
          'peak device mem', 'compiled step mem', 'compile']
  head += ['HF Flax tokens/s', 'ours ÷ HF'] if hf else []
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    cells = [r['config'], f'{r["batch_size"]} × {r["seq_len"]} ({r["num_predictions"]})',
             f'{r["step_time_s"] * 1e3:.1f} ms', f'{r["tokens_per_s"]:,.0f}', f'{r["model_tflop_per_s"]:.3f}',
             f'{r["mfu"]:.2%}' if r['mfu'] is not None else 'n/a', _gib(r['peak_device_memory_gb']),
             _gib(r['compiled_memory_gb']), f'{r["compile_s"]:.1f} s']
    if hf:
      cells += [f'{r["hf_tokens_per_s"]:,.0f}', f'{r["speedup_vs_hf"]:.2f}×'] if 'speedup_vs_hf' in r else ['', '']
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def lowered_train_step(model_cfg: ModelConfig, mesh_cfg: MeshConfig, batch_size: int, seq_len: int,
                       num_predictions: int, devices: Sequence[jax.Device] | None = None):
  """The pretraining train step lowered for abstract state and batch (nothing is allocated)."""
  mesh = shd.make_mesh(mesh_cfg, devices)
  _check_shape(model_cfg, batch_size, seq_len, mesh)
  model = pretraining_model(model_cfg, optim.make_optimizer(OptimConfig(), 1000), mesh)
  sharding = shd.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
           for k, v in synthetic_batch(batch_size, seq_len, num_predictions, model_cfg.vocab_size).items()}
  return model.train_step.lower(model.abstract_state, batch, model.rest)


_DOT = re.compile(r'stablehlo\.dot_general .*: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)')


def float32_dots(lowered_text: str) -> collections.Counter:
  """Matmuls of a lowered program (StableHLO, before the backend's own type changes) with a float32 operand:
  '(lhs, rhs) -> out' -> count. A bfloat16 step should list only the ones it means to run in float32."""
  found = collections.Counter()
  for m in _DOT.finditer(lowered_text):
    if 'xf32>' in m.group(1) or 'xf32>' in m.group(2):
      found[f'({m.group(1)}, {m.group(2)}) -> {m.group(3)}'] += 1
  return found


def per_device_flops(model_cfg: ModelConfig, mesh_cfg: MeshConfig, batch_size: int, seq_len: int,
                     num_predictions: int, devices: Sequence[jax.Device] | None = None) -> float:
  """FLOPs of one device's share of the compiled train step (`Compiled.cost_analysis()`).

  The SPMD-partitioned executable is the program each device runs, so its count is per device;
  1-device and n-device counts of the same step compare directly. Compiles only: the state and
  batch are abstract (nothing is allocated). Counts everything XLA computes (elementwise ops,
  dropout's random bits, the optimizer), not just matmuls.

  Args:
    devices: the devices to lay the mesh over (default all); e.g. `jax.devices()[:1]` for 1 device.
  """
  lowered = lowered_train_step(model_cfg, mesh_cfg, batch_size, seq_len, num_predictions, devices)
  # The count is read off the optimised, partitioned HLO; the backend's (LLVM) optimisation level
  # only changes machine code, not that count, and level 0 compiles about twice as fast on CPU.
  cost = lowered.compile(compiler_options={'xla_backend_optimization_level': 0}).cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per executable
    cost = cost[0]
  if not cost or 'flops' not in cost:
    raise ConfigError(f'the {jax.devices()[0].platform} backend gives no cost analysis')
  return float(cost['flops'])


def hlo_flops_rows(model_cfg: ModelConfig, batch_size: int, seq_len: int, num_predictions: int,
                   layouts: Sequence[tuple[int, int, int]] = HLO_LAYOUTS) -> list[dict[str, Any]]:
  """Per-device compiled FLOPs for each (data, fsdp, tensor) layout against the 1-device program.

  `ratio` = per-device / 1-device FLOPs; the ideal split is 1/n, so `overhead` = ratio * n - 1 is
  the work done beyond an even split (replicated or extra compute). Layouts needing more devices
  than exist, or that do not divide the batch, are skipped (with the reason).
  """
  one = per_device_flops(model_cfg, MeshConfig(1, 1, 1), batch_size, seq_len, num_predictions,
                         devices=jax.devices()[:1])
  rows = []
  for layout in layouts:
    n = int(np.prod(layout))
    row = {'layout': '×'.join(map(str, layout)), 'devices': n, 'ideal_ratio': 1 / n}
    if n > jax.device_count():
      row['skipped'] = f'needs {n} devices, {jax.device_count()} available'
    elif batch_size % (layout[0] * layout[1]):
      row['skipped'] = f'batch_size={batch_size} does not split {layout[0] * layout[1]} ways'
    else:
      flops = one if n == 1 else per_device_flops(model_cfg, MeshConfig(*layout), batch_size, seq_len,
                                                  num_predictions, devices=jax.devices()[:n])
      row.update(flops_per_device=flops, ratio=flops / one, overhead=flops * n / one - 1)
    rows.append(row)
  return rows


def format_hlo_table(rows: Sequence[dict[str, Any]]) -> str:
  """A markdown table of `hlo_flops_rows`."""
  lines = ['| mesh data×fsdp×tensor | devices | GFLOP per device | ÷ 1-device | ideal 1/n | work beyond 1/n |',
           '|---|---|---|---|---|---|']
  for r in rows:
    if 'skipped' in r:
      lines.append(f'| {r["layout"]} | {r["devices"]} | skipped: {r["skipped"]} | | | |')
    else:
      lines.append(f'| {r["layout"]} | {r["devices"]} | {r["flops_per_device"] / 1e9:.4f} | {r["ratio"]:.4f} '
                   f'| {r["ideal_ratio"]:.4f} | {r["overhead"]:+.1%} |')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------
# The baseline of --compare_hf: Hugging Face's FlaxBertForPreTraining train step (transformers 4.57.6,
# the last release with Flax BERT), on the same batch with the same optimizer.

HF_VERSION = '4.57.6'
INSTALL_HINT = (f'python3 -m venv --system-site-packages /tmp/hfvenv && /tmp/hfvenv/bin/pip install '
                f'transformers=={HF_VERSION}, then run the benchmark with /tmp/hfvenv/bin/python3')


def require_transformers():
  """(BertConfig, FlaxBertForPreTraining) from an installed transformers with Flax BERT, or a ConfigError."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    found = 'none'
  else:
    found = transformers.__version__  # any release with Flax BERT will do; 4.57.6 is the one tested
    try:
      from transformers import BertConfig, FlaxBertForPreTraining  # pylint: disable=g-import-not-at-top
      return BertConfig, FlaxBertForPreTraining
    except ImportError:
      pass
  raise ConfigError(f'--compare_hf needs transformers=={HF_VERSION} (the last release with Flax BERT; '
                    f'found {found}): {INSTALL_HINT}')


def hf_bert_config(cfg: ModelConfig):
  """The transformers BertConfig of our ModelConfig (exact GELU, BERT's LayerNorm eps)."""
  bert_config, _ = require_transformers()
  return bert_config(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act='gelu',
      hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
      max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
      initializer_range=cfg.initializer_range, layer_norm_eps=cfg.layer_norm_eps)


def hf_labels(batch: dict[str, np.ndarray]) -> np.ndarray:
  """HF's MLM labels [B, T]: the masked ids at `masked_lm_positions`, -100 (ignored) elsewhere."""
  b, t = batch['input_ids'].shape
  labels_bt = np.full((b, t), -100, np.int32)
  rows, cols = np.nonzero(batch['masked_lm_weights'] > 0)
  labels_bt[rows, batch['masked_lm_positions'][rows, cols]] = batch['masked_lm_ids'][rows, cols]
  return labels_bt


def make_train_step(model, tx: optax.GradientTransformation):
  """A jitted, donating `step(state, batch) -> (state, {'loss'})` for an HF Flax BERT model.

  The loss is HF's pretraining objective: mean cross-entropy over the labelled positions of the
  [B, T, V] logits plus the NSP cross-entropy (float32).
  """
  def loss_fn(params, batch, key):
    out = model(batch['input_ids'], batch['attention_mask'], batch['token_type_ids'], params=params,
                dropout_rng=key, train=True)
    labels_bt = batch['labels']
    mask_bt = (labels_bt != -100).astype(jnp.float32)
    xent_bt = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits.astype(jnp.float32), jnp.where(labels_bt == -100, 0, labels_bt))
    mlm = jnp.sum(xent_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32), batch['next_sentence_labels']).mean()
    return mlm + nsp

  def step(state, batch):
    key = jax.random.fold_in(state['rng'], state['step'])  # fresh dropout key per step
    loss, grads = jax.value_and_grad(loss_fn)(state['params'], batch, key)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    new_state = {'step': state['step'] + 1, 'params': optax.apply_updates(state['params'], updates),
                 'opt_state': opt_state, 'rng': state['rng']}
    return new_state, {'loss': loss}

  return jax.jit(step, donate_argnums=(0,))


def benchmark_hf_train_step(cfg: ModelConfig, batch: dict[str, np.ndarray], *, steps: int = 10,
                            mesh_cfg: MeshConfig = MeshConfig()) -> dict[str, Any]:
  """Times HF's FlaxBertForPreTraining train step on `batch` (a `synthetic_batch`)."""
  _, flax_bert = require_transformers()
  model = flax_bert(hf_bert_config(cfg), dtype=jnp.dtype(cfg.dtype), _do_init=False)
  mesh = shd.make_mesh(mesh_cfg)
  tx = optim.make_optimizer(OptimConfig(), 1000)
  repl = shd.replicated(mesh)
  params = jax.jit(model.init_weights, static_argnums=1, out_shardings=repl)(jax.random.PRNGKey(0), (1, 1))
  state = jax.jit(lambda p: {'step': jnp.zeros((), jnp.int32), 'params': p, 'opt_state': tx.init(p),
                             'rng': jax.random.PRNGKey(1)}, out_shardings=repl)(params)
  del params
  hf_batch = {k: batch[k] for k in ('input_ids', 'attention_mask', 'token_type_ids', 'next_sentence_labels')}
  hf_batch['labels'] = hf_labels(batch)
  timing = time_step(make_train_step(model, tx), state, shd.global_batch(hf_batch, mesh),
                                  steps=steps)
  b, t = batch['input_ids'].shape
  return {'step_time_s': timing.step_time_s, 'tokens_per_s': b * t / timing.step_time_s,
          'compile_s': timing.compile_s, 'loss': timing.loss, 'step_times_s': timing.step_times_s,
          'transformers_version': _transformers_version()}


def _transformers_version() -> str:
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.__version__
