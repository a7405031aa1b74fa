"""Restores pretraining checkpoints and evaluates them held-out (MLM/NSP loss and accuracy).

One checkpoint (default the latest), printed as one JSON line; the workdir is only read:
  python experiments/evaluate.py --workdir=/tmp/bert_mini [--step=N]

Every checkpoint of the workdir, oldest first (the model and data are built once): a table on
stdout, one JSON line per step in <workdir>/eval_all_steps.jsonl and the metrics against step in
<workdir>/eval_all_steps.png:
  python experiments/evaluate.py --workdir=/tmp/bert_mini --all_steps \
    [--output_jsonl=/tmp/steps.jsonl] [--output_plot=/tmp/steps.png]
The checkpoints are only read; a read-only workdir gets the table and a warning instead of the
default files (give --output_jsonl/--output_plot elsewhere to keep them).
"""

import json
import os

from absl import flags
import jax

from bert_jax import files
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.pretraining import run
from bert_jax.train import curves, reporting

import cli

_WORKDIR = flags.DEFINE_string('workdir', None, 'A pretraining workdir.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: latest).')
_ALL_STEPS = flags.DEFINE_bool('all_steps', False, 'Evaluate every checkpoint: a table, a JSONL and a plot.')
_OUTPUT_JSONL = flags.DEFINE_string('output_jsonl', None,
                                    'With --all_steps: the JSONL to write (default <workdir>/eval_all_steps.jsonl).')
_OUTPUT_PLOT = flags.DEFINE_string('output_plot', None,
                                   'With --all_steps: the PNG to write (default <workdir>/eval_all_steps.png).')
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
    elif os.path.isdir(workdir):  # a missing workdir is reported by the evaluation itself
      path = os.path.join(workdir, default)
      if os.access(workdir, os.W_OK | os.X_OK):
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


def _all_steps(workdir: str) -> None:
  outputs = _outputs(workdir)
  columns: list[str] = []

  def print_row(result):  # rows appear as each checkpoint is evaluated
    if not columns:
      columns.extend(c for c in _COLUMNS if c in result)
      reporting.log(' '.join([f'{"step":>8}'] + [f'{c:>{_width(c)}}' for c in columns]))
    reporting.log(_row(result, columns))

  results = run.evaluate_all_checkpoints(workdir, on_result=print_row)
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


def main(_):
  if not _ALL_STEPS.value:
    given = [f'--{f.name}' for f in (_OUTPUT_JSONL, _OUTPUT_PLOT) if f.value]
    if given:
      raise ConfigError(f'{" and ".join(given)} only apply with --all_steps')
    reporting.log(json.dumps(run.evaluate_checkpoint(_WORKDIR.value, _STEP.value)))  # process 0 only
    return
  if _STEP.value is not None:
    raise ConfigError('--all_steps evaluates every checkpoint: drop --step')
  _all_steps(_WORKDIR.value)


if __name__ == '__main__':
  cli.run(main)
