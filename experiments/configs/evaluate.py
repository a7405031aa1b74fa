"""What evaluating a workdir again may set: the fields with the `evaluation` fact (bert_jax/config.py).

  python experiments/evaluate.py --workdir=DIR [--step=N] [--config.eval_file=other_dev.tsv]

Every other field is the workdir's own (its config.json); only the fields given on the command line
apply. A pretraining workdir takes eval_batch_size, max_eval_batches, log_every and mesh; a fine-tuning one all
of them but max_eval_batches (a workdir of the other kind refuses a field only one kind takes, in one line).
"""

import ml_collections

from bert_jax.config import CONFIG_TYPES, PretrainConfig, facts, kind_fields


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  del arg
  defaults = {**PretrainConfig().to_dict()}
  for config_type in CONFIG_TYPES:  # each task kind's fields
    defaults.update(config_type().to_dict())
  names = dict.fromkeys(kind_fields('evaluation') + facts(PretrainConfig, 'evaluation'))
  return ml_collections.ConfigDict({name: defaults[name] for name in names})

