"""Evaluates a workdir's checkpoints again, pretraining or fine-tuning; the training results are never touched.

Pretraining: held-out MLM/NSP loss and accuracy of one checkpoint (default the latest), printed as
one JSON line; the workdir is only read:
  python experiments/evaluate.py --workdir=/tmp/bert_mini [--step=N]

Every checkpoint of a pretraining workdir, oldest first (the model and data are built once): a
table on stdout, one JSON line per step in <workdir>/eval_all_steps.jsonl and the metrics against
step in <workdir>/eval_all_steps.png (an unusable checkpoint is named and skipped):
  python experiments/evaluate.py --workdir=/tmp/bert_mini --all_steps \
    [--output_jsonl=/tmp/steps.jsonl] [--output_plot=/tmp/steps.png]
A read-only workdir gets the table and a warning instead of the default files.

Fine-tuning: each seed's checkpoint (default the latest) on the dev set(s), or another file;
results and predictions go beside the training ones (seed_<n>/eval_step<N>[_<file>]/ and
eval_step<N>[_<file>].json), the main metric and one JSON line on stdout:
  python experiments/evaluate.py --workdir=/tmp/sst2 [--step=N] [--config.eval_file=PATH] [--config.num_seeds=3]
--output_dir=DIR puts them in DIR instead (the same layout); a read-only workdir is only read: the
results go to stdout (and --output_dir), with one line saying so.

Only the evaluation settings (experiments/configs/evaluate.py) may be given; the rest is the workdir's.
"""

import os

from absl import flags

import cli

_CONFIG = cli.define_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'evaluate.py'),
                            'The evaluation settings (give --config.FIELD to change one).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'A pretraining or fine-tuning workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: latest).')
_ALL_STEPS = flags.DEFINE_bool('all_steps', False, 'Evaluate every checkpoint: a table, a JSONL and a plot.')
_OUTPUT_JSONL = flags.DEFINE_string('output_jsonl', None,
                                    'With --all_steps: the JSONL to write (default <workdir>/eval_all_steps.jsonl).')
_OUTPUT_PLOT = flags.DEFINE_string('output_plot', None,
                                   'With --all_steps: the PNG to write (default <workdir>/eval_all_steps.png).')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Fine-tuning: the directory the results and predictions go '
                                  'to (default: beside the training ones, in the workdir).')
def _overrides() -> dict:
  """The evaluation settings given on the command line (whole blocks: --config.mesh.data sets mesh)."""
  given = {name.split('.')[0] for name in cli.config_overrides()}
  values = _CONFIG.value.to_dict()
  return {name: values[name] for name in sorted(given)}


def main(_):
  # jax, flax and orbax take seconds to import: only after the flags and the config are checked.
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top
  from bert_jax.pretraining import evaluation as pretraining  # pylint: disable=g-import-not-at-top
  from bert_jax.train import scaffold  # pylint: disable=g-import-not-at-top
  # The workdir's kind picks its evaluation (train.scaffold.evaluate_workdir), which refuses another kind's options;
  # the first of the evaluations also answers for a directory of no known kind.
  evaluations = (pretraining.EVALUATION, finetuning.EVALUATION)
  options = {f.name: f.value for f in (_ALL_STEPS, _OUTPUT_JSONL, _OUTPUT_PLOT, _OUTPUT_DIR)}
  scaffold.evaluate_workdir(_WORKDIR.value, evaluations, _STEP.value, _overrides(), options)


if __name__ == '__main__':
  cli.run(main)
