"""Cached in-batch negatives (GradCache) against the plain contrastive step at the same global batch: a table.

  python experiments/benchmark_gradcache.py --batch_size=256 --micro_batch_size=32
  python experiments/benchmark_gradcache.py --batch_size=4096 --micro_batch_size=64 --steps=0
  python experiments/benchmark_gradcache.py --batch_size=64 --micro_batch_size=16 --dtype=bfloat16

The retrieval task's train step (bert_jax.embedding: InfoNCE of every query against every passage of the global
batch, AdamW) of an all-MiniLM-L6-v2-shaped encoder (6 layers, hidden 384; random weights, synthetic token ids), one
device: once plain (the whole batch's activations alive at once) and once through GradCache with micro-batches of
--micro_batch_size (`optim.grad_accum_steps`). Per row: XLA's memory of the compiled step (arguments + outputs +
temporaries - donated: what the device must hold), compile time and the median step time of --steps steps after one
warm-up (--steps=0: compile only, for batches whose plain step would not fit). Then one JSON line per row.
"""

import dataclasses
import json
import platform
import time

from absl import flags
import jax
import numpy as np

from bert_jax import sharding
from bert_jax.config import FinetuneConfig, MeshConfig, ModelConfig, OptimConfig, preset
from bert_jax.finetuning.retrieval import retrieval_model
from bert_jax.errors import ConfigError

import cli
from tools import benchmark

_BATCH = flags.DEFINE_integer('batch_size', 256, 'Global batch (query, passage) pairs.')
_MICRO = flags.DEFINE_integer('micro_batch_size', 32, 'GradCache micro-batch rows; must divide --batch_size.')
_QUERY_LEN = flags.DEFINE_integer('query_len', 32, 'Query tokens.')
_PASSAGE_LEN = flags.DEFINE_integer('passage_len', 128, 'Passage tokens.')
_STEPS = flags.DEFINE_integer('steps', 3, 'Timed steps after compilation and one warm-up (0: compile only).')
_PRESET = flags.DEFINE_string('preset', '', 'A model preset (tiny, mini, ...) instead of the MiniLM shape.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                           'Compute dtype (model.dtype; parameters and optimizer stay float32).')

MINILM = ModelConfig(vocab_size=30522, num_layers=6, hidden_size=384, num_heads=12, intermediate_size=1536)
HEADER = ('| step | global batch | micro-batch | compiled memory | compile | step time | pairs/s |\n'
          '|---|---|---|---|---|---|---|')


def _batch(rows: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  batch = {}
  for side, length in (('query', _QUERY_LEN.value), ('passage', _PASSAGE_LEN.value)):
    batch[f'{side}_input_ids'] = rng.integers(1000, MINILM.vocab_size, (rows, length), dtype=np.int32)
    batch[f'{side}_attention_mask'] = np.ones((rows, length), np.int32)
  batch['passage_ids'] = np.arange(rows, dtype=np.int32)
  batch['weights'] = np.ones(rows, np.float32)
  return batch


def measure(micro_batches: int) -> dict:
  """Compiles (and times) the retrieval step with `micro_batches` per step (1: the plain step)."""
  model_cfg = preset(_PRESET.value, vocab_size=MINILM.vocab_size) if _PRESET.value else MINILM
  model_cfg = dataclasses.replace(model_cfg, dtype=_DTYPE.value)
  cfg = FinetuneConfig(task='retrieval', model=model_cfg, batch_size=_BATCH.value,
                       optim=OptimConfig(grad_accum_steps=micro_batches))
  mesh = sharding.make_mesh(MeshConfig(), jax.devices()[:1])
  model = retrieval_model(cfg, mesh, total_steps=100)
  state = model.init_state(seed=0)
  batch = model.global_batch(_batch(_BATCH.value))
  if _STEPS.value:
    timing = benchmark.time_step(model.train_step, state, batch, model.rest, steps=_STEPS.value)
    compiled, compile_s, step_s = timing.compiled, timing.compile_s, timing.step_time_s
  else:
    t0 = time.perf_counter()
    compiled = model.train_step.lower(state, batch, model.rest).compile()
    compile_s, step_s = time.perf_counter() - t0, None
  mem = compiled.memory_analysis()
  used = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
  return {'step': 'GradCache' if micro_batches > 1 else 'plain', 'dtype': _DTYPE.value, 'batch_size': _BATCH.value,
          'micro_batch_size': _BATCH.value // micro_batches, 'compiled_memory_gib': used / 2**30,
          'temp_gib': mem.temp_size_in_bytes / 2**30, 'compile_s': compile_s, 'step_time_s': step_s,
          'pairs_per_s': _BATCH.value / step_s if step_s else None}


def main(_):
  if _MICRO.value < 1 or _BATCH.value % _MICRO.value:
    raise ConfigError(f'--micro_batch_size={_MICRO.value} must divide --batch_size={_BATCH.value}')
  shape = _PRESET.value or 'MiniLM-shaped'
  print(f'{jax.devices()[0].device_kind}, {platform.processor() or platform.machine()}, jax {jax.__version__}; '
        f'{shape}, {_DTYPE.value}, queries {_QUERY_LEN.value} / passages {_PASSAGE_LEN.value} tokens', flush=True)
  rows = [measure(1), measure(_BATCH.value // _MICRO.value)]
  print(HEADER)
  for r in rows:
    timed = r['step_time_s'] is not None
    print(f'| {r["step"]} | {r["batch_size"]} | {r["micro_batch_size"]} | {r["compiled_memory_gib"]:.2f} GiB | '
          f'{r["compile_s"]:.1f} s | ' + (f'{r["step_time_s"]:.2f} s | {r["pairs_per_s"]:.1f} |' if timed else
                                          '(not run) | |'))
  for r in rows:
    print(json.dumps(r))


if __name__ == '__main__':
  cli.run(main, multihost=False)
