"""Runs a command once per point of a hyperparameter grid and tabulates the runs' final metrics.

  python experiments/sweep.py --grid="config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3" \
      -- python experiments/finetune.py --config=experiments/configs/finetune.py:rte \
      --workdir=DIR/{name} --config.init_checkpoint=PATH

Every run appends `--key=value` for each grid key (last key varies fastest) to the command after `--`,
with `{name}` (required, e.g. `learning_rate=1e-4,num_train_epochs=2`) and `{index}` (1-based) filled
in. Runs whose workdir already holds final_metrics.json are skipped, so re-running continues an
interrupted sweep (a finished run launched with another command is an error: .NAME.command.json beside its
workdir records what it ran). The results go to OUTPUT_DIR/sweep_results.csv and .md (the markdown table is also
printed); the sweep exits 1 if any run failed. `--dry_run` prints one shell-quoted command per line
(the runs not yet done) and runs nothing.

On a cluster: --launcher=slurm writes one SLURM job array (a run per array task; OUTPUT_DIR/slurm/) and submits it
(--noslurm_submit: only writes it); the same command with --gather then builds the table from the finished runs,
naming those without results yet. --slurm_sbatch="--partition=gpu --gpus=1" or --slurm_template=FILE give the
resources (experiments/launch/array.sbatch is the template).
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import flags

from bert_jax.errors import BertJaxError, ConfigError

import cli
from tools import launch, sweep

_GRID = flags.DEFINE_string('grid', None, 'key=v1,v2,... entries as shell words (quote a value with spaces), '
                            'e.g. "config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3".')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print one shell-quoted command per pending run; run nothing.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where sweep_results.{csv,md} go; default: the common '
                                  'parent directory of the run workdirs.')
_METRIC = flags.DEFINE_string('metric', None, 'Metric that marks the best run; default: the runs\' '
                              'main_metric.')
_MODE = flags.DEFINE_string('mode', 'max', 'max or min: whether a larger or smaller --metric is better.')

_LAUNCH = cli.define_launcher_flags()

_COMMAND: list[str] = []  # the argv after '--', split off before absl parses the flags


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
  """(sweep's own argv, command after the first '--' or None when there is no '--')."""
  if '--' not in argv:
    return argv, None
  i = argv.index('--')
  return argv[:i], argv[i + 1:]


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f'unexpected arguments {" ".join(argv[1:])!r}: the command to sweep goes after "--"')
  if _GRID.value is None:
    raise ConfigError('--grid is required, e.g. --grid="config.optim.learning_rate=1e-4,5e-5"')
  if _MODE.value not in ('max', 'min'):
    raise ConfigError(f'--mode must be max or min, not {_MODE.value!r}')
  runs = sweep.plan(sweep.parse_grid(_GRID.value), _COMMAND)
  sweep.check_finished([(r.name, r.argv, r.workdir) for r in runs])
  if _DRY_RUN.value:
    pending = [r for r in runs if not r.is_done()]
    if len(pending) < len(runs):
      print(f'# {len(runs) - len(pending)} of {len(runs)} runs already done, not listed', file=sys.stderr)
    for run in pending:
      print(shlex.join(run.argv), flush=True)
    return

  output_dir = _OUTPUT_DIR.value or sweep.default_output_dir(runs)
  if _LAUNCH['launcher'].value == 'slurm' and not _LAUNCH['gather'].value:
    launch.launch(os.path.join(output_dir, 'slurm'), [('sweep', [(r.argv, r.workdir) for r in runs])],
                  **{k: _LAUNCH[k].value for k in ('template', 'sbatch', 'submit')})
    return
  failed = [] if _LAUNCH['gather'].value else sweep.execute(runs)
  rows = sweep.collect(runs, missing=sweep.STATUS_MISSING if _LAUNCH['gather'].value else sweep.STATUS_FAILED)
  metric = sweep.ranking_metric(rows, _METRIC.value)
  _, md_path = sweep.write_tables(rows, output_dir, metric, _MODE.value)
  with open(md_path, encoding='utf-8') as f:
    print(f'\n{f.read()}', flush=True)
  print(f'results: {md_path} and {os.path.splitext(md_path)[0]}.csv', flush=True)
  have = sorted({m for r in rows for m in r['metrics']})
  if metric and have and metric not in have:
    raise ConfigError(f'metric {metric!r} is in no run\'s {sweep.FINAL_METRICS_FILE} (have: {", ".join(have)})')
  if failed:
    raise BertJaxError(f'{len(failed)} of {len(runs)} runs failed: {", ".join(r.name for r in failed)}')
  missing = [r['name'] for r in rows if r['status'] == sweep.STATUS_MISSING]
  if missing:
    print(f'{len(missing)} of {len(runs)} runs have no results yet: {", ".join(missing)}', flush=True)



if __name__ == '__main__':
  sys.argv, command = split_command(sys.argv)
  _COMMAND.extend(command or [])
  cli.run(main, allow_args=True)
