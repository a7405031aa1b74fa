"""Evaluating a pretraining workdir again, as `train.pretrain.evaluate_workdir` asks of a kind (`EVALUATION`).

One checkpoint (default the latest): its held-out metrics as one JSON line. Every checkpoint (`all_steps`),
oldest first: a table on stdout as each is evaluated, one JSON line per step in <workdir>/eval_all_steps.jsonl
and the metrics against step in <workdir>/eval_all_steps.png (or `output_jsonl`, `output_plot`); a read-only
workdir gets the table and a warning instead of the default files. The workdir is only read (no claim): the
checkpoints by `pretrain.evaluate_checkpoints`, which prepares the data after the first restore.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from bert_jax import files
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.pretraining import pretrain_run as pretrain
from bert_jax.runs import reporting
from bert_jax.train import scaffold

# The table's columns, those a result has, in this order.
COLUMNS = ('mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss', 'sop_accuracy', 'sop_loss', 'loss',
           'mlm_baseline_accuracy', 'nsp_baseline_accuracy', 'sop_baseline_accuracy', 'num_examples')


def evaluate_again(workdir: str, step: int | None, overrides: dict[str, Any], options: dict[str, Any]) -> Any:
  """One checkpoint's held-out metrics (one JSON line), or with options['all_steps'] every checkpoint's (a table,
  a JSONL and a plot); checked before any model work."""
  if not options.get('all_steps'):
    given = [f'--{name}' for name in ('output_jsonl', 'output_plot') if options.get(name)]
    if given:
      raise ConfigError(f'{" and ".join(given)} only apply with --all_steps')
    result = pretrain.evaluate_checkpoint(workdir, step, overrides)
    reporting.log(json.dumps(result))  # process 0 only
    return result
  if step is not None:
    raise ConfigError('--all_steps evaluates every checkpoint: drop --step')
  return _all_steps(workdir, overrides, options)


def _outputs(workdir: str, options: dict[str, Any]) -> dict[str, str]:
  """{'jsonl': path, 'plot': path} of the files all_steps can write, checked before any model work.

  A given path that cannot be written is a ConfigError; a default one in a workdir that cannot be
  written (a read-only filesystem) is left out, with a warning.
  """
  out = {}
  for kind, flag, default in (('jsonl', 'output_jsonl', 'eval_all_steps.jsonl'),
                              ('plot', 'output_plot', 'eval_all_steps.png')):
    if options.get(flag):
      files.check_output(options[flag], 'file', f'--{flag}')
      out[kind] = options[flag]
    elif files.isdir(workdir):  # a missing workdir is reported by the evaluation itself
      path = os.path.join(workdir, default)
      if files.writable(workdir):
        files.check_output(path, 'file', f'--{flag} (default)')
        out[kind] = path
      else:
        reporting.log(f'warning: {workdir} is not writable: {default} is not written (give --{flag}=PATH)')
  return out


def _width(column: str) -> int:
  return max(len(column), 10)  # the name, or room for '-1234.5678'


def _row(result: dict[str, Any], columns: list[str]) -> str:
  cells = [f'{result[c]:>{_width(c)}.4f}' if isinstance(result[c], float) else f'{result[c]:>{_width(c)}}'
           for c in columns]
  return ' '.join([f'{result["step"]:>8}'] + cells)


def _all_steps(workdir: str, overrides: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
  """Every checkpoint's held-out metrics: a row as each is evaluated, then the JSONL and the plot (process 0)."""
  outputs = _outputs(workdir, options)
  columns: list[str] = []

  def print_row(result):  # rows appear as each checkpoint is evaluated
    if not columns:
      columns.extend(c for c in COLUMNS if c in result)
      reporting.log(' '.join([f'{"step":>8}'] + [f'{c:>{_width(c)}}' for c in columns]))
    reporting.log(_row(result, columns))

  results = pretrain.evaluate_all_checkpoints(workdir, on_result=print_row, overrides=overrides)
  if jax.process_index():
    return results  # process 0 writes the files
  try:
    if 'jsonl' in outputs:
      files.write_text_atomic(outputs['jsonl'], ''.join(json.dumps(r) + '\n' for r in results))
    if 'plot' in outputs:
      from bert_jax.runs import curves  # pylint: disable=g-import-not-at-top  # matplotlib: only when plotting
      curves.plot_eval_steps(results, outputs['plot'], f'{os.path.basename(os.path.abspath(workdir))}: '
                             f'held-out metrics of {len(results)} checkpoints')
  except OSError as e:  # after the whole evaluation: say which file, the table above holds the results
    raise BertJaxError(f'writing {e.filename or "an output"} failed: {e.strerror or e}; the table above has '
                       'the results') from None
  if outputs:
    reporting.log('wrote ' + ', '.join(outputs.values()))
  return results


# A pretraining workdir (a merge among them) evaluated again; it also answers for a directory of no known kind
# (new, empty, a file), which `pretrain.evaluate_checkpoint` refuses with the way to train one.
EVALUATION = scaffold.Evaluation(
    kinds=('pretraining', 'merge', None), name='pretraining', fields=pretrain.EVALUATION_FIELDS,
    options=('all_steps', 'output_jsonl', 'output_plot'),
    scope=('a pretraining workdir\'s evaluation goes to stdout, with --all_steps to --output_jsonl and '
           '--output_plot'),
    run=evaluate_again)
