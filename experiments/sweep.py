"""Runs a command once per point of a hyperparameter grid and tabulates the runs' final metrics.

  python experiments/sweep.py --grid="config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3" \
      -- python experiments/finetune.py --config=experiments/configs/finetune.py:rte \
      --workdir=DIR/{name} --config.init_checkpoint=PATH

Every run appends `--key=value` for each grid key (last key varies fastest) to the command after `--`,
with `{name}` (required, e.g. `learning_rate=1e-4,num_train_epochs=2`) and `{index}` (1-based) filled
in. Runs whose workdir already holds final_metrics.json are skipped, so re-running continues an
interrupted sweep (a finished run launched with another command is an error: .NAME.command.json beside its
workdir records what it ran; bert_jax/launch/cells.py judges every run). The results go to OUTPUT_DIR/sweep_results.csv
and .md (the markdown table is also printed); the sweep exits 1 if any run failed. `--dry_run` prints one
shell-quoted command per line (the runs not yet done) and runs nothing.

On a cluster: --launcher=slurm writes one SLURM job array (a run per array task; OUTPUT_DIR/slurm/) and submits it
(--noslurm_submit: only writes it); the same command with --gather then builds the table from the finished runs,
naming those without results yet. --slurm_sbatch="--partition=gpu --gpus=1" or --slurm_template=FILE give the
resources (experiments/launch/array.sbatch is the template).
"""

from __future__ import annotations

import sys

from absl import flags

from bert_jax.errors import ConfigError
from bert_jax.launch import cells

import cli
from tools import sweep

_GRID = flags.DEFINE_string('grid', None, 'key=v1,v2,... entries as shell words (quote a value with spaces), '
                            'e.g. "config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3".')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where sweep_results.{csv,md} go; default: the common '
                                  'parent directory of the run workdirs.')
_METRIC = flags.DEFINE_string('metric', None, 'Metric that marks the best run; default: the runs\' '
                              'main_metric.')
_MODE = flags.DEFINE_string('mode', 'max', 'max or min: whether a larger or smaller --metric is better.')
_LAUNCH = cli.define_launcher_flags('run')
_COMMAND: list[str] = []  # the argv after '--', split off before absl parses the flags


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f'unexpected arguments {" ".join(argv[1:])!r}: the command to sweep goes after "--"')
  if _GRID.value is None:
    raise ConfigError('--grid is required, e.g. --grid="config.optim.learning_rate=1e-4,5e-5"')
  if _MODE.value not in ('max', 'min'):
    raise ConfigError(f'--mode must be max or min, not {_MODE.value!r}')
  runs = sweep.plan(sweep.parse_grid(_GRID.value), _COMMAND)
  output_dir = _OUTPUT_DIR.value or sweep.default_output_dir(runs)
  cells.run([('sweep', runs)], output_dir, cli.launcher(_LAUNCH),
            lambda gather: sweep.tabulate(runs, output_dir, _METRIC.value, _MODE.value, gather), noun='runs')


if __name__ == '__main__':
  if '--' in sys.argv:  # the command to sweep: split off before absl parses the flags
    _COMMAND.extend(sys.argv[sys.argv.index('--') + 1:])
    sys.argv = sys.argv[:sys.argv.index('--')]
  cli.run(main, allow_args=True, multihost=False)  # the cells are the runs: this process starts no jax
