"""GLUE-style sentence / sentence-pair classification and regression (STS-B).

  python experiments/finetune_glue.py --config=experiments/configs/finetune_glue.py:sst2 \
      --workdir=/tmp/sst2 --config.init_checkpoint=PATH --config.data_dir=../shared/data/sst2

The variant is the task: sst2, rte (the budgets of the README results table, on all-MiniLM-L6-v2
when init_checkpoint is not given), sst2_full (all 67k sentences), cola, mrpc, mnli, qnli, qqp,
stsb, wnli (standard BERT settings: seq 128, batch 32, lr 2e-5, 3 epochs; GLUE files in data_dir).
Five seeds with mean and std: --config.num_seeds=5. Evaluate a trained workdir again:
--config.eval_only=True [--config.eval_step=N].
"""

import os

from experiments.configs.finetune_common import SHARED_DATA, base_config

GLUE_TASKS = ('cola', 'mrpc', 'mnli', 'qnli', 'qqp', 'stsb', 'wnli')


def get_config(arg: str = ''):
  variant = arg or 'sst2'
  if variant == 'sst2':  # 300 steps x 32 on the first 9,600 sentences
    return base_config('sst2', os.path.join(SHARED_DATA, 'sst2'), max_seq_length=64, batch_size=32,
                       learning_rate=1e-4, num_train_epochs=1.0, max_train_samples=9600)
  if variant == 'sst2_full':
    return base_config('sst2', os.path.join(SHARED_DATA, 'sst2'), max_seq_length=64, batch_size=32,
                       learning_rate=5e-5, num_train_epochs=3.0)
  if variant == 'rte':  # 3 epochs x 16 on all 2,490 pairs
    return base_config('rte', os.path.join(SHARED_DATA, 'rte'), max_seq_length=128, batch_size=16,
                       learning_rate=5e-5, num_train_epochs=3.0)
  if variant in GLUE_TASKS:
    return base_config(variant, os.path.join(SHARED_DATA, variant), max_seq_length=128, batch_size=32,
                       learning_rate=2e-5, num_train_epochs=3.0)
  raise ValueError(f'unknown finetune_glue variant {variant!r}: sst2, sst2_full, rte, ' + ', '.join(GLUE_TASKS))
