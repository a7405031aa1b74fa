"""Fine-tuning from a checkpoint, any task kind: `finetune` (train, resume, or evaluate what a rerun finds done) and
`evaluate_again` (a finished workdir's checkpoints evaluated again, beside the training results); the run is the one
fine-tuning job (`finetuning.job`), the task's part its kind's (`finetuning.kinds`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Collection

from bert_jax import files
from bert_jax.config import FinetuneConfig, kind_fields
from bert_jax.errors import ConfigError
from bert_jax.finetuning import seeds
from bert_jax.finetuning.job import FinetuningJob
from bert_jax.finetuning.kinds import kind_of
from bert_jax.runs import reporting
from bert_jax.runs.workdir import Workdir
from bert_jax.train import scaffold


def finetune(cfg: FinetuneConfig, workdir: str, explicit_model_fields: Collection[str] = ()) -> dict[str, Any]:
  """Trains every seed (or finishes, or only evaluates, what a rerun finds done) and returns the metrics
  over all seeds. A field of another task's, a missing file or column is refused first (nothing read or written)."""
  cfg.check_task_fields()
  kind_of(cfg.task).check_inputs(cfg)  # its kind's: files exist, readable, the named columns (first lines)
  return scaffold.train(FinetuningJob(cfg, explicit_model_fields), workdir)


def evaluate_again(workdir: str, step: int | None = None, overrides: dict[str, Any] | None = None,
                   output_dir: str | None = None) -> dict[str, Any]:
  """Restores each seed's checkpoint `step` (None: the latest) of a fine-tuning workdir and evaluates it.

  The config is the workdir's own with `overrides` of its evaluation fields (the `evaluation` fact:
  eval_file, eval_batch_size, seed, num_seeds, SQuAD's answer settings, ...). Results go beside the
  training ones, or under `output_dir` in the same layout: seed_<n>/eval_step<N>[_<eval file>]/
  (predictions, final_metrics.json) and eval_step<N>[_<eval file>].json over the seeds; the training
  results are never overwritten. A read-only workdir (shared, archived) is only read: no lock, and
  the results go to the caller (stdout) and `output_dir` alone.
  """
  wd = Workdir(workdir)
  saved = wd.config()
  if saved is None or 'finetune' not in saved:
    raise ConfigError(f'{workdir} holds no fine-tuning run to evaluate (no config.json); train first')
  unknown = sorted(set(overrides or {}) - set(kind_fields('evaluation')))
  if unknown:
    raise ConfigError(f'{", ".join(unknown)} cannot change when a workdir is evaluated again; its training config '
                      f'is its own (evaluation settings: {", ".join(kind_fields("evaluation"))})')
  if output_dir:
    files.check_output(output_dir, 'directory', '--output_dir')
  read_only = not files.writable(workdir)
  results = Workdir(output_dir) if output_dir else (None if read_only else wd)  # None: stdout only
  if read_only:
    reporting.log(f'warning: {workdir} is read-only: nothing is written there; the results go to stdout'
                  + (f' and {output_dir}' if output_dir else ' (give --output_dir=DIR to keep them)'))
  cfg = FinetuneConfig.from_dict({**saved['finetune'], **(overrides or {})})
  cfg.check_task_fields(names=set(overrides or {}))  # an evaluation setting of another task's is refused
  name = lambda at: _results_name(cfg, at, (overrides or {}).get('beir_dir', ''))
  def out_dir(seed: int, run_dir: str, at: int) -> str | None:  # beside the training results, never over them
    return results and os.path.join(results.seed_dir(seed) if output_dir else run_dir, name(at))
  summary = scaffold.evaluate(FinetuningJob(cfg, evaluation=True), workdir, step, out_dir, read_only=read_only,
                              on_result=lambda run, seed, result: seeds.log_result(run.main_metric, seed, result))
  if results:
    results.write_json(results.file(name(summary['step']) + '.json'), summary)
  return summary


def _evaluate_and_print(workdir: str, step: int | None, overrides: dict[str, Any], options: dict[str, Any]
                        ) -> dict[str, Any]:
  """`evaluate_again` with options['output_dir'], its summary printed (`print_summary`)."""
  result = evaluate_again(workdir, step, overrides, options.get('output_dir'))
  print_summary(result)
  return result


# A fine-tuning workdir evaluated again (`train.scaffold.evaluate_workdir`): each seed at one step.
EVALUATION = scaffold.Evaluation(
    kinds=('finetuning',), name='fine-tuning', fields=kind_fields('evaluation'), options=('output_dir',),
    scope='a fine-tuning workdir is evaluated at one step (--step, default the latest) of each seed',
    run=_evaluate_and_print)


def _results_name(cfg: FinetuneConfig, step: int, beir_dir: str = '') -> str:
  """Where an evaluation again puts its results: eval_step<N>, and the eval file's name when one is given (a
  retrieval run's: the BEIR directory given instead of its own)."""
  given = getattr(cfg, 'eval_file', '') or beir_dir.rstrip('/\\')  # a head task's eval file; retrieval has none
  stem = os.path.splitext(os.path.basename(given))[0] if given else ''
  return f'eval_step{step}' + (f'_{stem}' if stem else '')


def print_summary(result: dict[str, Any]) -> None:
  """The run's main metric in words (a classification task's beside its majority-class baseline and macro F1),
  then the whole result as one JSON line (without per-seed copies).

  Process 0 prints (`reporting.log`); the others, which hold the same result, stay silent.
  """
  main = result['main_metric']
  line = f'{result["task"]}: {main} {result[main]:.4f}'
  mean = '_mean' if main.endswith('_mean') else ''
  if mean:
    std = result[main[:-len('_mean')] + '_std']
    values = ', '.join(f'{v:.4f}' for v in result[main[:-len('_mean')] + '_per_seed'])
    line += f' ± {std:.4f} over seeds {result["seeds"]} ({values})'
  # The main metric's eval set: the longest prefix of its name with a majority baseline ('dev', 'dev_matched').
  parts = main.split('_')
  prefix = next((p for p in ('_'.join(parts[:i]) for i in range(len(parts) - 1, 0, -1))
                 if f'{p}_majority_accuracy{mean}' in result), None)
  if prefix is not None:
    line += f' (majority-class baseline {result[f"{prefix}_majority_accuracy{mean}"]:.4f}'
    if f'{prefix}_macro_f1{mean}' in result and not main.startswith(f'{prefix}_macro_f1'):
      line += f'; macro-F1 {result[f"{prefix}_macro_f1{mean}"]:.4f}'
    line += ')'
  reporting.log(line)
  reporting.log(json.dumps({k: v for k, v in result.items() if k != 'per_seed'}))
