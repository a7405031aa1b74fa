"""Configs saved by earlier versions (a workdir's config.json, a checkpoint's meta) in today's field names
(`upgrade_saved`), the fields renamed or removed since (`RENAMED`, `REMOVED`: `from_dict` names them), and saved
metrics in today's scale (`upgrade_metrics`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any


# Fine-tuning fields of earlier versions (one flat block): where they went, and the two that became a tool.
RENAMED = {'learning_rate': 'optim.learning_rate', 'adam_eps': 'optim.eps', 'weight_decay': 'optim.weight_decay',
           'clip_norm': 'optim.clip_norm', 'warmup_ratio': 'optim.warmup_ratio', 'max_steps': 'num_train_steps',
           'dtype': 'model.dtype'}
REMOVED = {'eval_only': 'evaluate a workdir again with experiments/evaluate.py --workdir=DIR',
           'eval_step': 'evaluate one checkpoint with experiments/evaluate.py --workdir=DIR --step=N'}


def upgrade_saved(config: dict[str, Any]) -> dict[str, Any]:
  """A saved config (config.json, a checkpoint's meta) in today's field names; a new dict when it changes.

  Pretraining: data.nsp became data.objective and data.whole_word_masking data.masking. Fine-tuning
  (config.json's 'finetune' block, or a checkpoint's config): the flat fields of RENAMED moved into
  the shared blocks, eval_only/eval_step went to experiments/evaluate.py, config.json's
  top-level 'model' (the starting checkpoint's architecture) became the config's own `model`, and the
  fields of other task kinds than the run's (one flat config held them all) are dropped.
  """
  if isinstance(config.get('resume_allow'), str):  # the fields it names, renamed too
    renamed = _rename_list(config['resume_allow'], {**RENAMED, **_PRETRAINING_RENAMED})
    config = config if renamed == config['resume_allow'] else {**config, 'resume_allow': renamed}
  if 'finetune' in config:
    finetune = _upgrade_finetune(config['finetune'])
    if 'model' in config:  # the starting checkpoint's architecture, with the run's dtype (a flat field then)
      finetune = {**finetune, 'model': {**config['model'], **finetune.get('model', {})}}
    elif finetune is config['finetune']:
      return config
    return {k: v for k, v in {**config, 'finetune': finetune}.items() if k != 'model'}
  if 'task' in config and 'data' not in config:  # a fine-tuning checkpoint's config
    return _upgrade_finetune(config)
  data = config.get('data')
  if not isinstance(data, dict) or not {'nsp', 'whole_word_masking'} & set(data):
    return config
  data = dict(data)
  if 'nsp' in data:
    data.setdefault('objective', 'nsp' if data.pop('nsp') else 'none')
  if 'whole_word_masking' in data:
    data.setdefault('masking', 'whole_word' if data.pop('whole_word_masking') else 'token')
  return {**config, 'data': data}


_PRETRAINING_RENAMED = {'data.nsp': 'data.objective', 'data.whole_word_masking': 'data.masking'}


def _rename_list(names: str, renamed: dict[str, str]) -> str:
  """A comma-separated list of field names with the renamed ones in today's names."""
  return ','.join(renamed.get(n.strip(), n.strip()) for n in names.split(',') if n.strip())


def _upgrade_finetune(flat: dict[str, Any]) -> dict[str, Any]:
  flat = _own_kind_fields(flat)
  if isinstance(flat.get('resume_allow'), str) and _rename_list(flat['resume_allow'], RENAMED) != flat['resume_allow']:
    flat = {**flat, 'resume_allow': _rename_list(flat['resume_allow'], RENAMED)}
  if not (set(RENAMED) | set(REMOVED)) & set(flat):
    return flat
  out = {k: v for k, v in flat.items() if k not in RENAMED and k not in REMOVED}
  for old, new in RENAMED.items():
    if old in flat:
      section, name = new.split('.') if '.' in new else ('', new)
      if section:
        out[section] = {**out.get(section, {}), name: flat[old]}
      else:
        out[name] = flat[old]
  if 'optim' in out:  # the warmup was a ratio then: no fixed number of steps
    out['optim'] = {'warmup_steps': 0, **out['optim']}
  return out


def _own_kind_fields(flat: dict[str, Any]) -> dict[str, Any]:
  """A saved fine-tuning config without the fields of other task kinds' config types: until 2026-12-07 one flat
  config held every kind's fields (those of other kinds at their defaults, or ignored)."""
  from bert_jax.config.finetune import config_type, kind_fields  # pylint: disable=g-import-not-at-top
  own = {f.name for f in dataclasses.fields(config_type(flat.get('task', 'sst2')))}
  other = [k for k in flat if k not in own and k in kind_fields()]
  return {k: v for k, v in flat.items() if k not in other} if other else flat


# Metrics: every score is a fraction in [0, 1]. SQuAD's EM/F1 (and own-file QA's) were percents, the official
# scripts' scale, until 2026-11-28; results and checkpoint metas written since carry METRIC_SCALE, and what was
# written before is read in today's scale, so tables, keep_best and resumed runs never mix the two.
METRIC_SCALE = {'metric_scale': 'fraction'}
_PERCENT_TASKS = frozenset({'squad', 'squad_v2', 'qa'})
_PERCENT_METRIC = re.compile(r'(?:^|_)(?:exact_match|exact|f1)(?:_mean|_std|_per_seed)?$')


def upgrade_metrics(metrics: dict[str, Any], task: Any) -> dict[str, Any]:
  """`metrics` (final_metrics.json, a checkpoint's held-out metrics) in today's scale; a new dict when it changes.

  Args:
    metrics: as written; one with METRIC_SCALE's key is today's already.
    task: the run's task name (or the saved task block, {'name': ...}).
  """
  name = task.get('name') if isinstance(task, dict) else task
  if name not in _PERCENT_TASKS or 'metric_scale' in metrics:
    return metrics
  out = {k: _fraction(v) if _PERCENT_METRIC.search(k) else v for k, v in metrics.items()}
  if isinstance(metrics.get('per_seed'), list):  # several seeds: each seed's own metrics too
    out['per_seed'] = [upgrade_metrics(r, name) if isinstance(r, dict) else r for r in metrics['per_seed']]
  return out


def _fraction(value: Any) -> Any:
  if isinstance(value, list):
    return [_fraction(v) for v in value]
  return value / 100.0 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
