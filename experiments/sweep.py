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

A search instead of a grid (Optuna: TPE, median pruning on the evaluations the trials write; pip install -e ".[hpo]"):

  python experiments/sweep.py --search=optuna --trials=12 --output_dir=DIR \
      --space="config.optim.learning_rate=log:1e-5:1e-3 config.optim.warmup_ratio=float:0:0.2" \
      -- python experiments/finetune.py --config=experiments/configs/finetune.py:sst2 --workdir=DIR/{name} \
      --config.eval_every=50

The study is DIR/optuna_journal.log; trials are DIR/trial_001 ...; re-running the command continues it (a trial cut
short resumes with its parameters, none runs twice). As a SLURM array, one trial per task on a shared filesystem:
sbatch --array=1-12 --wrap "python experiments/sweep.py --search=optuna --trials=12 --output_dir=DIR --space=... \
--trial=\$SLURM_ARRAY_TASK_ID -- python experiments/finetune.py ...", then --gather for the table and search.png.

On a cluster: --launcher=slurm writes one SLURM job array (a run per array task; OUTPUT_DIR/slurm/) and submits it
(--noslurm_submit: only writes it); the same command with --gather then builds the table from the finished runs,
naming those without results yet. --slurm_sbatch="--partition=gpu --gpus=1" or --slurm_template=FILE give the
resources (experiments/launch/array.sbatch is the template).
"""

from __future__ import annotations

import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.config import CONFIG_TYPES, FinetuneConfig, PretrainConfig
from bert_jax.errors import ConfigError
from bert_jax.launch import cells, optuna_search as search

import cli
from tools import sweep

_GRID = flags.DEFINE_string('grid', None, 'key=v1,v2,... entries as shell words (quote a value with spaces), '
                            'e.g. "config.optim.learning_rate=1e-4,5e-5 config.num_train_epochs=2,3".')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where sweep_results.{csv,md} go; default: the common '
                                  'parent directory of the run workdirs.')
_METRIC = flags.DEFINE_string('metric', None, 'Metric that marks the best run; default: the runs\' '
                              'main_metric.')
_MODE = flags.DEFINE_string('mode', 'max', 'max or min: whether a larger or smaller --metric is better.')
_SEARCH = flags.DEFINE_enum('search', 'grid', ['grid', 'optuna'], 'grid: every point of --grid; optuna: --trials '
                             'trials drawn from --space.')
_SPACE = flags.DEFINE_string('space', None, 'optuna: key=log:LOW:HIGH, float:LOW:HIGH, int:LOW:HIGH or choice:a,b '
                             'entries as shell words, e.g. "config.optim.learning_rate=log:1e-5:1e-3".')
_TRIALS = flags.DEFINE_integer('trials', 12, 'optuna: the number of trials.')
_TRIAL = flags.DEFINE_integer('trial', 0, 'optuna: run only this trial (1..--trials; a SLURM array task\'s '
                              '$SLURM_ARRAY_TASK_ID); 0 all, one after another.')
_LAUNCH = cli.define_launcher_flags('run')
_COMMAND: list[str] = []  # the argv after '--', split off before absl parses the flags


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f'unexpected arguments {" ".join(argv[1:])!r}: the command to sweep goes after "--"')
  if _SEARCH.value == 'optuna':
    return _optuna()
  if _GRID.value is None:
    raise ConfigError('--grid is required, e.g. --grid="config.optim.learning_rate=1e-4,5e-5"')
  if _MODE.value not in ('max', 'min'):
    raise ConfigError(f'--mode must be max or min, not {_MODE.value!r}')
  runs = sweep.plan(sweep.parse_grid(_GRID.value), _COMMAND)
  output_dir = _OUTPUT_DIR.value or sweep.default_output_dir(runs)
  cells.run([('sweep', runs)], output_dir, cli.launcher(_LAUNCH),
            lambda gather: sweep.tabulate(runs, output_dir, _METRIC.value, _MODE.value, gather), noun='runs')


def _optuna():
  if _GRID.value is not None:
    raise ConfigError('--search=optuna draws from --space: drop --grid')
  if _TRIALS.value < 1 or not 0 <= _TRIAL.value <= _TRIALS.value:
    raise ConfigError(f'--trials={_TRIALS.value} must be >= 1 and --trial={_TRIAL.value} in 0..--trials')
  launch = cli.launcher(_LAUNCH)
  if launch['launcher'] != 'local' or launch['dry_run']:
    raise ConfigError('--search=optuna runs its trials here (a SLURM array task: --trial=$SLURM_ARRAY_TASK_ID); '
                      '--launcher=slurm and --dry_run are for grids')
  space = search.parse_space(_SPACE.value)
  search.check_fields(space, [PretrainConfig, FinetuneConfig, *CONFIG_TYPES])
  if not _COMMAND:
    raise ConfigError('no command after "--": e.g. sweep.py --search=optuna ... -- python experiments/finetune.py '
                      '--workdir=DIR/{name}')
  search.trial_cell(_COMMAND, space, {p.key: p.low if p.kind != 'choice' else p.choices[0] for p in space}, 1)
  output_dir = _OUTPUT_DIR.value or os.path.dirname(os.path.abspath(cells.workdir_of(_COMMAND)))
  study = search.open_study(output_dir, space, _COMMAND, _METRIC.value, _MODE.value)
  try:
    if not launch['gather']:
      search.search(study, _TRIALS.value, _COMMAND, space, _METRIC.value, [_TRIAL.value] if _TRIAL.value else None)
  finally:
    rows = search.rows(study, space)
    if rows:
      paths = sweep.write_tables(rows, output_dir, study.user_attrs.get('metric'), _MODE.value)
      with files.open(paths[0], encoding='utf-8') as f:
        print(f'\n{f.read()}', flush=True)
      shown = [p for p in paths if p.endswith(('.md', '.csv'))]
      if any(r['metrics'] for r in rows):
        shown.append(search.plot(study, space, os.path.join(output_dir, 'search.png')))
      print(f'results: {", ".join(shown)}', flush=True)


if __name__ == '__main__':
  if '--' in sys.argv:  # the command to sweep: split off before absl parses the flags
    _COMMAND.extend(sys.argv[sys.argv.index('--') + 1:])
    sys.argv = sys.argv[:sys.argv.index('--')]
  cli.run(main, allow_args=True, multihost=False)  # the cells are the runs: this process starts no jax
