"""Shared start-up for the absl entry points in experiments/: one-line errors, runtime setup.

The library itself reads no flags; entry points parse them and call into it through here.
Every entry point gets the multi-host flags below: `run` starts `jax.distributed` from them
(see bert_jax/distributed.py) before `main` touches jax.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags, logging

from bert_jax import distributed, preemption
from bert_jax.errors import BertJaxError, ConfigError

_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', distributed.MODES,
    'Multi-process start-up: auto = when --coordinator_address is given or a SLURM/TPU multi-process '
    'launcher is detected; on = always (jax detects what is not given, e.g. on Cloud TPU pods); off = never.')
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0 (a free port there), the same for all processes.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes in a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, in [0, --num_processes).')
_LOCAL_DEVICE_IDS = flags.DEFINE_list(
    'local_device_ids', None, 'Accelerator ids this process drives (one process per GPU); default all.')
_MULTIHOST_FLAGS = (_DISTRIBUTED, _COORDINATOR_ADDRESS, _NUM_PROCESSES, _PROCESS_ID, _LOCAL_DEVICE_IDS)


def run(main: Callable[[list[str]], None], allow_args: bool = False) -> None:
  """`absl.app.run(main)`, turning a BertJaxError into 'error: ...' on stderr and exit code 1
  (a preemption into 'preempted: ...' and preemption.EXIT_CODE).

  Args:
    main: gets absl's argv (program name, then any non-flag arguments).
    allow_args: pass non-flag arguments on to `main` instead of rejecting them as a usage error.
  """

  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)  # progress goes to stdout; absl INFO is noise here
    if len(argv) > 1 and not allow_args:
      raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    try:
      _initialize_distributed()
      main(argv)
    except preemption.Preempted as e:
      print(f'preempted: {e}', file=sys.stderr, flush=True)
      sys.exit(preemption.EXIT_CODE)
    except BertJaxError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(1)

  for holder in _MULTIHOST_FLAGS:  # --help of every entry point lists them beside its own flags
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
  app.run(wrapped)


def _initialize_distributed() -> None:
  # Before main: jax.distributed must start before anything initializes a jax backend.
  ids = _LOCAL_DEVICE_IDS.value
  try:
    ids = None if ids is None else [int(i) for i in ids]
  except ValueError:
    raise ConfigError(f'--local_device_ids takes comma-separated integers, got {",".join(ids)!r}') from None
  distributed.initialize(_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value, ids,
                         mode=_DISTRIBUTED.value)


def finetune_main(config_file: str) -> None:
  """The whole main of experiments/finetune_*.py: --config (default `config_file`) and --workdir flags,
  `finetune_lib.finetune`, then the summary line and one JSON line on stdout."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top

  config = config_flags.DEFINE_config_file('config', config_file, 'Experiment config file with the task as :VARIANT.')
  workdir = flags.DEFINE_string('workdir', None, 'Where checkpoints, predictions and metrics go.', required=True)

  def main(_):
    result = finetune_lib.finetune(FinetuneConfig.from_dict(config.value.to_dict()), workdir.value)
    finetune_lib.print_summary(result)

  run(main)
