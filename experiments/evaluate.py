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

import json
import os

from absl import flags
import jax

from bert_jax import files
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.finetuning import run as finetuning
from bert_jax.pretraining import run
from bert_jax.runs import curves, reporting
from bert_jax.runs.workdir import inspect

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
# The table's columns, those a result has, in this order.
_COLUMNS = ('mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss', 'sop_accuracy', 'sop_loss', 'loss',
            'mlm_baseline_accuracy', 'nsp_baseline_accuracy', 'sop_baseline_accuracy', 'num_examples')


def _outputs(workdir: str) -> dict[str, str]:
  """{'jsonl': path, 'plot': path} of the files --all_steps can write, checked before any model work.

  A given path that cannot be written is a ConfigError; a default one in a workdir that cannot be
  written (a read-only filesystem) is left out, with a warning.
  """
  out = {}
  for kind, flag, default in (('jsonl', _OUTPUT_JSONL, 'eval_all_steps.jsonl'),
                              ('plot', _OUTPUT_PLOT, 'eval_all_steps.png')):
    if flag.value:
      files.check_output(flag.value, 'file', f'--{flag.name}')
      out[kind] = flag.value
    elif files.isdir(workdir):  # a missing workdir is reported by the evaluation itself
      path = os.path.join(workdir, default)
      if files.is_remote(workdir) or os.access(workdir, os.W_OK | os.X_OK):
        files.check_output(path, 'file', f'--{flag.name} (default)')
        out[kind] = path
      else:
        reporting.log(f'warning: {workdir} is not writable: {default} is not written (give --{flag.name}=PATH)')
  return out


def _width(column: str) -> int:
  return max(len(column), 10)  # the name, or room for '-1234.5678'


def _row(result: dict, columns: list[str]) -> str:
  cells = [f'{result[c]:>{_width(c)}.4f}' if isinstance(result[c], float) else f'{result[c]:>{_width(c)}}'
           for c in columns]
  return ' '.join([f'{result["step"]:>8}'] + cells)


def _all_steps(workdir: str, overrides: dict) -> None:
  outputs = _outputs(workdir)
  columns: list[str] = []

  def print_row(result):  # rows appear as each checkpoint is evaluated
    if not columns:
      columns.extend(c for c in _COLUMNS if c in result)
      reporting.log(' '.join([f'{"step":>8}'] + [f'{c:>{_width(c)}}' for c in columns]))
    reporting.log(_row(result, columns))

  results = run.evaluate_all_checkpoints(workdir, on_result=print_row, overrides=overrides)
  if jax.process_index():
    return  # process 0 writes the files
  try:
    if 'jsonl' in outputs:
      files.write_text_atomic(outputs['jsonl'], ''.join(json.dumps(r) + '\n' for r in results))
    if 'plot' in outputs:
      curves.plot_eval_steps(results, outputs['plot'], f'{os.path.basename(os.path.abspath(workdir))}: '
                            f'held-out metrics of {len(results)} checkpoints')
  except OSError as e:  # after the whole evaluation: say which file, the table above holds the results
    raise BertJaxError(f'writing {e.filename or "an output"} failed: {e.strerror or e}; the table above has '
                       'the results') from None
  if outputs:
    reporting.log('wrote ' + ', '.join(outputs.values()))


def _overrides() -> dict:
  """The evaluation settings given on the command line (whole blocks: --config.mesh.data sets mesh)."""
  given = {name.split('.')[0] for name in cli.config_overrides()}
  values = _CONFIG.value.to_dict()
  return {name: values[name] for name in sorted(given)}


def main(_):
  overrides, kind = _overrides(), inspect(_WORKDIR.value).kind
  if kind == 'finetuning':
    given = [f'--{f.name}' for f in (_ALL_STEPS, _OUTPUT_JSONL, _OUTPUT_PLOT) if f.value]
    if given:
      raise ConfigError(f'{" and ".join(given)} apply to pretraining workdirs; a fine-tuning workdir is evaluated '
                        'at one step (--step, default the latest) of each seed')
    finetuning.print_summary(finetuning.evaluate_again(_WORKDIR.value, _STEP.value, overrides, _OUTPUT_DIR.value))
    return
  if _OUTPUT_DIR.value:
    raise ConfigError('--output_dir applies to fine-tuning workdirs; a pretraining workdir\'s evaluation goes to '
                      'stdout, with --all_steps to --output_jsonl and --output_plot')
  unknown = sorted(set(overrides) - set(run.EVALUATION_FIELDS))
  if unknown:
    raise ConfigError(f'--config.{", --config.".join(unknown)} apply to fine-tuning workdirs; a pretraining '
                      f'workdir takes {", ".join(run.EVALUATION_FIELDS)}')
  if not _ALL_STEPS.value:
    given = [f'--{f.name}' for f in (_OUTPUT_JSONL, _OUTPUT_PLOT) if f.value]
    if given:
      raise ConfigError(f'{" and ".join(given)} only apply with --all_steps')
    reporting.log(json.dumps(run.evaluate_checkpoint(_WORKDIR.value, _STEP.value, overrides)))  # process 0 only
    return
  if _STEP.value is not None:
    raise ConfigError('--all_steps evaluates every checkpoint: drop --step')
  _all_steps(_WORKDIR.value, overrides)


if __name__ == '__main__':
  cli.run(main)
