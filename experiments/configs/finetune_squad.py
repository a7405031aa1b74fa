"""SQuAD v1.1 / v2.0 extractive question answering (start/end span head, official EM/F1).

  python experiments/finetune_squad.py --config=experiments/configs/finetune_squad.py:squad \
      --workdir=/tmp/squad --config.init_checkpoint=PATH --config.data_dir=../shared/data/squad-v1.1

Windows of 384 tokens whose consecutive windows overlap by doc_stride=128 tokens (the Hugging Face
run_qa convention), questions cut to 64 tokens, n-best 20, answers up to 30 tokens.
Only dev-v1.1.json is staged, so without --config.train_file (or a train-v1.1.json in data_dir)
the dev set is split by article in file order: the first `train_articles` (40) train, the last
`eval_articles` (8) evaluate. With a train file: --config.train_file=.../train-v1.1.json
--config.eval_file=.../dev-v1.1.json.
Variants: squad (v1.1; 1 epoch x 16, lr 1e-4: the README results budget), squad_v2 (v2.0 files
train-v2.0.json / dev-v2.0.json in data_dir; 2 epochs, lr 5e-5; no-answer threshold tuned on dev).
"""

import os

from experiments.configs.finetune_common import SHARED_DATA, base_config


def get_config(arg: str = ''):
  variant = arg or 'squad'
  if variant == 'squad':
    return base_config('squad', os.path.join(SHARED_DATA, 'squad-v1.1'), max_seq_length=384, batch_size=16,
                       learning_rate=1e-4, num_train_epochs=1.0, eval_batch_size=32)
  if variant == 'squad_v2':
    return base_config('squad_v2', os.path.join(SHARED_DATA, 'squad-v2.0'), max_seq_length=384, batch_size=16,
                       learning_rate=5e-5, num_train_epochs=2.0, eval_batch_size=32)
  raise ValueError(f'unknown finetune_squad variant {variant!r}: squad, squad_v2')
