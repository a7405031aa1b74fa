"""Pretrains BERT (masked LM + next-sentence prediction); re-running in the same workdir resumes.

  python experiments/pretrain.py --workdir=/tmp/bert_mini
  python experiments/pretrain.py --workdir=DIR --config=experiments/configs/pretrain.py:base \
      --config.optim.learning_rate=2e-4
  # Continue from published or earlier weights (an HF directory or a bert_jax workdir, only read):
  python experiments/pretrain.py --workdir=DIR --config.init_checkpoint=PATH

Ends by printing one JSON line with the held-out metrics.
"""

import json
import os

from absl import flags

from bert_jax.config import PretrainConfig

import cli

_CONFIG = cli.define_config(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'pretrain.py'),
    'Experiment config file, optionally with :VARIANT.', schema=PretrainConfig)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, logs and metrics go.', required=True)


def main(_):
  # jax, flax and orbax take seconds to import: only after the flags and the config are checked.
  from bert_jax.pretraining import pretrain_run as pretrain  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import reporting  # pylint: disable=g-import-not-at-top
  cfg = PretrainConfig.from_dict(_CONFIG.value.to_dict())
  # Model flags given explicitly must agree with an init_checkpoint's architecture.
  result = pretrain.train_and_evaluate(cfg, _WORKDIR.value, explicit_model_fields=cli.config_overrides('model.'))
  reporting.log(pretrain.describe_result(result))  # process 0 only, like all progress output
  reporting.log(json.dumps(result))


if __name__ == '__main__':
  cli.run(main)
