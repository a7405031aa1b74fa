"""What evaluating a workdir again may set: the fields with the `evaluation` fact (bert_jax/config.py).

  python experiments/evaluate.py --workdir=DIR [--step=N] [--config.eval_file=other_dev.tsv]

Every other field is the workdir's own (its config.json); only the fields given on the command line
apply. A pretraining workdir takes eval_batch_size, log_every and mesh; a fine-tuning one all of them.
"""

import ml_collections

from bert_jax.config import FinetuneConfig, facts


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  del arg
  defaults = FinetuneConfig().to_dict()
  return ml_collections.ConfigDict({name: defaults[name] for name in facts(FinetuneConfig, 'evaluation')})

