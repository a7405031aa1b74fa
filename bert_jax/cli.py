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
