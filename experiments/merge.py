"""Merges pretraining checkpoints: the (weighted) mean of their parameters, written as a new workdir.

The mean of a run's last K checkpoints:
  python experiments/merge.py --sources=/tmp/bert_mini --last=3 --workdir=/tmp/bert_mini_last3
A soup of several runs of one architecture and tokenizer (DIR: its latest checkpoint; DIR@STEP: that one),
optionally weighted:
  python experiments/merge.py --sources=/tmp/decay_a,/tmp/decay_b@900 --weights=2,1 --workdir=/tmp/soup

The result is a pretraining workdir every tool reads (evaluate.py, fill_mask.py, embed.py, export_hf.py,
--config.init_checkpoint of pretrain.py and finetune.py); it holds parameters only, so it is continued from,
not trained in. Then the held-out MLM (and NSP/SOP) accuracy of each part and of the merge, all on the first
part's held-out split and evaluated alike (a run in phases: as its phase at the merge's step), as a table, one
JSON line and the workdir's final_metrics.json (--noevaluate skips it). The same command again (a sweep's rerun,
an interrupted evaluation) finds the merge written, writes nothing and evaluates it again.
"""

import json

from absl import flags

from bert_jax.errors import ConfigError
from bert_jax.pretraining import merge, pretrain_run as pretrain
from bert_jax.runs import reporting

import cli

_SOURCES = flags.DEFINE_list('sources', None, 'Pretraining workdirs to merge, DIR or DIR@STEP, comma-separated '
                             '(one DIR with --last).', required=True)
_LAST = flags.DEFINE_integer('last', 0, 'Merge the last K checkpoints of the one --sources workdir.')
_WEIGHTS = flags.DEFINE_list('weights', None, 'A positive weight per checkpoint, in order (default: equal); '
                             'normalised to sum to 1.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The new workdir the merge is written to (absent or empty).',
                               required=True)
_EVALUATE = flags.DEFINE_bool('evaluate', True, 'Evaluate each part and the merge held-out afterwards.')


def _weights() -> list[float] | None:
  if _WEIGHTS.value is None:
    return None
  try:
    return [float(w) for w in _WEIGHTS.value]
  except ValueError:
    raise ConfigError(f'--weights must be numbers, got {",".join(_WEIGHTS.value)}') from None


def main(_):
  parts = merge.parse_parts(_SOURCES.value, _LAST.value, _weights())
  with merge.pinned(parts, _WORKDIR.value) as parts:  # a run training in a source cannot rotate them away
    record = merge.merge(parts, _WORKDIR.value)
    reporting.log(f'wrote {_WORKDIR.value}: the mean of {len(parts)} checkpoints (step {record["step"]})')
    if not _EVALUATE.value:
      return
    checkpoints = [(p.where, r['step']) for p, r in zip(parts, record['parts'])] + [(_WORKDIR.value, None)]
    results = pretrain.evaluate_in(_WORKDIR.value, checkpoints, as_step=record['step'])  # all as the merge is evaluated
  metrics = [m for m in ('mlm_accuracy', 'nsp_accuracy', 'sop_accuracy', 'mlm_loss') if m in results[0]]
  names = [f'{p["path"]}@{p["step"]}' for p in record['parts']] + ['merge']
  reporting.log('\n| checkpoint | weight | ' + ' | '.join(metrics) + ' |\n|---|---|' + '---|' * len(metrics))
  for name, weight, result in zip(names, [p['weight'] for p in record['parts']] + [1.0], results):
    reporting.log(f'| {name} | {weight:.3g} | ' + ' | '.join(f'{result[m]:.4f}' for m in metrics) + ' |')
  final = merge.write_results(_WORKDIR.value, record, results)
  reporting.log(json.dumps({'workdir': _WORKDIR.value, 'merge': results[-1], 'parts': final['parts']}))


if __name__ == '__main__':
  cli.run(main, kept=merge.KEPT)
