"""Restores a pretraining checkpoint and prints its held-out MLM/NSP metrics as one JSON line.

  python experiments/evaluate.py --workdir=/tmp/bert_mini [--step=N]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top

from bert_jax import cli, metrics, train_lib

_WORKDIR = flags.DEFINE_string('workdir', None, 'A pretraining workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: latest).')


def main(_):
  metrics.log(json.dumps(train_lib.evaluate_checkpoint(_WORKDIR.value, _STEP.value)))  # process 0 only


if __name__ == '__main__':
  cli.run(main)
