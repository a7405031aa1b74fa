"""CoNLL-2003 named entity recognition (token classification, entity-level F1 as conlleval).

  python experiments/finetune_ner.py --config=experiments/configs/finetune_ner.py:conll2003 \
      --workdir=/tmp/conll --config.init_checkpoint=PATH --config.data_dir=../shared/data/conll2003

Variants: conll2003 (the README results budget: first 4,000 training sentences, 1 epoch x 32,
seq 128, lr 1e-4), conll2003_full (all 14,041 sentences, 3 epochs, lr 5e-5). Reports dev (testa)
and test (testb) and writes predictions in CoNLL column format (word gold pred) per seed.
"""

import os

from experiments.configs.finetune_common import SHARED_DATA, base_config


def get_config(arg: str = ''):
  variant = arg or 'conll2003'
  data = os.path.join(SHARED_DATA, 'conll2003')
  if variant == 'conll2003':
    return base_config('conll2003', data, max_seq_length=128, batch_size=32, learning_rate=1e-4,
                       num_train_epochs=1.0, max_train_samples=4000)
  if variant == 'conll2003_full':
    return base_config('conll2003', data, max_seq_length=128, batch_size=32, learning_rate=5e-5,
                       num_train_epochs=3.0)
  raise ValueError(f'unknown finetune_ner variant {variant!r}: conll2003, conll2003_full')
