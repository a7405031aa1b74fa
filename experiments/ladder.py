"""Pretrains each rung of an ablation ladder, fine-tunes each on each task for each seed, and tabulates them.

  python experiments/ladder.py --config=experiments/configs/ladder.py:tiny --workdir=/tmp/ladder_tiny
  python experiments/ladder.py --config=experiments/configs/ladder.py:cpu --workdir=/tmp/ladder \
      --config.seeds=5 --config.tasks.rte.overrides="num_train_epochs=5"

Writes WORKDIR/ladder_results.md (printed too), .csv and .png: one row per rung with its held-out MLM accuracy,
per task the median and range over seeds and the difference to the first rung (with a note: every seed above or
below the first rung's range, or within the seeds' spread), and wall time. The same command again skips every
finished cell and continues interrupted ones (a finished cell launched with another command, e.g. a changed
budget, is an error: use a new --workdir); a failed cell is named in the table and the others go on (exit 1
at the end). The whole ladder is checked before anything runs: a bad rung, task or seed count is one error line.

On a cluster: --launcher=slurm writes two SLURM job arrays under WORKDIR/slurm/ (the rungs' pretraining, then,
after it, every fine-tuning cell: one cell per array task) and submits them where sbatch is (--noslurm_submit:
only writes them); the same command with --gather builds the table from what the cells left, at any time.
--dry_run prints the cells' commands.
"""

import os

from absl import flags

from bert_jax.errors import ConfigError
from bert_jax.launch import cells

import cli
from tools import ladder

_CONFIG = cli.define_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'ladder.py'),
                            'Ladder config file, optionally with :VARIANT (tiny, cpu, accelerator).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where every cell\'s workdir and the results go.')
_LAUNCH = cli.define_launcher_flags()


def main(_):
  if not _WORKDIR.value:
    raise ConfigError('--workdir is required: where the cells and the results go')
  spec = ladder.Ladder.from_dict(_CONFIG.value.to_dict())
  directory = os.path.realpath(_WORKDIR.value)  # cells' commands name it: the same through any symbolic link
  pretrain, finetune = ladder.plan(spec, directory)
  cells.run([('ladder_pretrain', pretrain), ('ladder_finetune', finetune)], directory, cli.launcher(_LAUNCH),
            lambda _: ladder.tabulate(spec, pretrain, finetune, directory), root=directory, kept=ladder.KEPT)


if __name__ == '__main__':
  cli.run(main, multihost=False, kept=ladder.KEPT)
