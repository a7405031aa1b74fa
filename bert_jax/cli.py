"""Shared start-up for the absl entry points in experiments/: one-line errors, runtime setup.

The library itself reads no flags; entry points parse them and call into it through here.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, logging

from bert_jax.errors import BertJaxError


def run(main: Callable[[list[str]], None], allow_args: bool = False) -> None:
  """`absl.app.run(main)`, turning a BertJaxError into 'error: ...' on stderr and exit code 1.

  Args:
    main: gets absl's argv (program name, then any non-flag arguments).
    allow_args: pass non-flag arguments on to `main` instead of rejecting them as a usage error.
  """

  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)  # progress goes to stdout; absl INFO is noise here
    if len(argv) > 1 and not allow_args:
      raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    try:
      main(argv)
    except BertJaxError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(1)

  app.run(wrapped)


def finetune_main(config_file: str) -> None:
  """The whole main of experiments/finetune_*.py: --config (default `config_file`) and --workdir flags,
  `finetune_lib.finetune`, then the summary line and one JSON line on stdout."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top

  config = config_flags.DEFINE_config_file('config', config_file, 'Experiment config file with the task as :VARIANT.')
  workdir = flags.DEFINE_string('workdir', None, 'Where checkpoints, predictions and metrics go.', required=True)

  def main(_):
    result = finetune_lib.finetune(FinetuneConfig.from_dict(config.value.to_dict()), workdir.value)
    finetune_lib.print_summary(result)

  run(main)
