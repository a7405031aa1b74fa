"""Timing the full pretraining train step on synthetic data: step time, tokens/s, FLOPs, memory."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import jax
import numpy as np

from bert_jax import optim, sharding as shd
from bert_jax.config import MeshConfig, ModelConfig, OptimConfig
from bert_jax.train_state import PretrainingModel


def pretraining_flops_per_step(cfg: ModelConfig, batch_size: int, seq_len: int, num_predictions: int) -> float:
  """Model FLOPs of one MLM+NSP train step (forward + backward = 3x forward, matmuls only).

  Counts the encoder projections and FFN, both attention matmuls, the pooler, NSP and the MLM
  head at the `num_predictions` masked positions only (that is what the model computes).
  """
  d, i, t, v = cfg.hidden_size, cfg.intermediate_size, seq_len, cfg.vocab_size
  per_layer = 2 * t * (4 * d * d + 2 * d * i) + 4 * t * t * d
  heads = 2 * d * d + 2 * d * 2 + num_predictions * (2 * d * d + 2 * d * v)
  return 3.0 * batch_size * (cfg.num_layers * per_layer + heads)


def synthetic_batch(batch_size: int, seq_len: int, num_predictions: int, vocab_size: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return {
      'input_ids': rng.integers(5, vocab_size, (batch_size, seq_len), dtype=np.int32),
      'token_type_ids': (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch_size, 0),
      'attention_mask': np.ones((batch_size, seq_len), np.int32),
      'masked_lm_positions': np.sort(rng.integers(1, seq_len, (batch_size, num_predictions)), 1).astype(np.int32),
      'masked_lm_ids': rng.integers(5, vocab_size, (batch_size, num_predictions), dtype=np.int32),
      'masked_lm_weights': np.ones((batch_size, num_predictions), np.float32),
      'next_sentence_labels': rng.integers(0, 2, (batch_size,), dtype=np.int32),
      'nsp_weights': np.ones((batch_size,), np.float32),
  }


def benchmark_train_step(cfg: ModelConfig, *, batch_size: int, seq_len: int, num_predictions: int,
                         steps: int = 10, mesh_cfg: MeshConfig = MeshConfig()) -> dict[str, Any]:
  """Compiles and times the pretraining train step; returns the measurements."""
  mesh = shd.make_mesh(mesh_cfg)
  model = PretrainingModel(cfg, optim.make_optimizer(OptimConfig(), 1000), mesh)
  state = model.init_state()
  batch = model.global_batch(synthetic_batch(batch_size, seq_len, num_predictions, cfg.vocab_size))
  t0 = time.perf_counter()
  compiled = model.train_step.lower(state, batch, model.rest).compile()
  compile_s = time.perf_counter() - t0
  state, metrics = compiled(state, batch, model.rest)  # warm-up
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch, model.rest)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  step_s = statistics.median(times)
  flops = pretraining_flops_per_step(cfg, batch_size, seq_len, num_predictions)
  stats = jax.devices()[0].memory_stats() or {}
  mem = compiled.memory_analysis()
  compiled_bytes = None
  if mem is not None:
    compiled_bytes = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                      - mem.alias_size_in_bytes)
  return {
      'step_time_s': step_s,
      'tokens_per_s': batch_size * seq_len / step_s,
      'model_tflops_per_step': flops / 1e12,
      'model_tflop_per_s': flops / step_s / 1e12,
      'compile_s': compile_s,
      'peak_device_memory_gb': stats.get('peak_bytes_in_use', 0) / 2**30 or None,
      'compiled_memory_gb': compiled_bytes / 2**30 if compiled_bytes is not None else None,
      'host_max_rss_gb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      'loss': float(metrics['loss']),
      'step_times_s': times,
  }
