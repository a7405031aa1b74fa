"""Times the full pretraining train step (MLM + NSP + AdamW) on synthetic data and prints a table.

  python experiments/benchmark.py --preset=base --batch_size=8 --seq_len=128 --dtype=float32

Ends with one JSON line holding the measurements (`step_time_s` is the median).
"""

import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top
import jax

from bert_jax import benchmarking, cli
from bert_jax.config import preset

_PRESET = flags.DEFINE_string('preset', 'base', 'Model preset: tiny, mini, small, medium, base, large.')
_BATCH = flags.DEFINE_integer('batch_size', 8, 'Global batch size.')
_SEQ = flags.DEFINE_integer('seq_len', 128, 'Sequence length.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_VOCAB = flags.DEFINE_integer('vocab_size', 30522, 'Vocabulary size.')
_PREDS = flags.DEFINE_integer('num_predictions', None, 'Masked positions per sequence (default 20 per 128).')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps after compilation and one warm-up step.')
_ATTN_DROPOUT = flags.DEFINE_float('attention_dropout', 0.1, 'Attention-probability dropout (0 allows '
                                   'the fused dot_product_attention path while training).')


def main(_):
  cfg = preset(_PRESET.value, vocab_size=_VOCAB.value, dtype=_DTYPE.value,
               attention_dropout=_ATTN_DROPOUT.value)
  preds = _PREDS.value or max(1, round(_SEQ.value * 20 / 128))
  r = benchmarking.benchmark_train_step(cfg, batch_size=_BATCH.value, seq_len=_SEQ.value,
                                        num_predictions=preds, steps=_STEPS.value)
  device = jax.devices()[0]
  machine = f'{device.platform} x{jax.device_count()} ({device.device_kind}); {platform.processor() or platform.machine()}, {os.cpu_count()} cores'
  rows = [('machine', machine), ('preset / dtype', f'{_PRESET.value} / {_DTYPE.value}'),
          ('batch x seq (preds)', f'{_BATCH.value} x {_SEQ.value} ({preds})'),
          ('median step time', f'{r["step_time_s"]:.3f} s'), ('tokens/s', f'{r["tokens_per_s"]:,.0f}'),
          ('model TFLOP/step', f'{r["model_tflops_per_step"]:.3f}'),
          ('model TFLOP/s', f'{r["model_tflop_per_s"]:.3f}'), ('compile time', f'{r["compile_s"]:.1f} s'),
          ('peak device memory', f'{r["peak_device_memory_gb"]:.2f} GiB' if r['peak_device_memory_gb'] else 'n/a'),
          ('compiled step memory', f'{r["compiled_memory_gb"]:.2f} GiB' if r['compiled_memory_gb'] else 'n/a'),
          ('host max RSS', f'{r["host_max_rss_gb"]:.2f} GiB')]
  width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f'{k:<{width}} | {v}')
  r.update(preset=_PRESET.value, dtype=_DTYPE.value, batch_size=_BATCH.value, seq_len=_SEQ.value,
           machine=machine)
  print(json.dumps(r), flush=True)


if __name__ == '__main__':
  cli.run(main)
