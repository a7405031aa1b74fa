"""Identity checks: which model fields a starting checkpoint sets (`from_checkpoint`) and how a checkpoint's
architecture differs from the config's (`architecture_diffs`); whether a resumed run is the run its checkpoint
holds (`config_diffs`, `check_resume`, paths compared as the files they name) and what `resume_allow` names
(`check_resume_allow`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bert_jax.config.fields import facts
from bert_jax.config.finetune import config_type, kind_fields
from bert_jax.config.model_config import ModelConfig
from bert_jax.config.pretrain import PretrainConfig
from bert_jax.errors import CheckpointError, ConfigError


def from_checkpoint(how: str) -> tuple[str, ...]:
  """The ModelConfig fields a starting checkpoint sets: 'fixed' (it shapes the parameters or the function
  they compute) or 'default' (its value unless given)."""
  return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata['checkpoint'] == how)


def architecture_diffs(saved: dict[str, Any], current: ModelConfig) -> list[str]:
  """'field: saved (checkpoint) vs current (config)' for each field fixed by a checkpoint that differs."""
  return [f'{name}: {saved[name]} (checkpoint) vs {getattr(current, name)} (config)'
          for name in from_checkpoint('fixed') if name in saved and saved[name] != getattr(current, name)]


def _same_paths(a: Any, b: Any) -> bool:
  """Whether two path values (comma-separated lists of local paths, globs or URLs) name the same paths."""
  if not (isinstance(a, str) and isinstance(b, str)):
    return a == b
  # pylint: disable-next=unnecessary-lambda-assignment
  norm = lambda v: [p.strip() if '://' in p else os.path.realpath(p.strip())
                    for p in v.split(',') if p.strip()]
  return norm(a) == norm(b)


def config_diffs(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...], prefix: str = '') -> list[str]:
  """'name: old -> new' for every leaf that differs, skipping names (or sections) in `free` and
  fields the old config lacks (added since it was written). Paths (fields with the `path` fact)
  compare resolved: 'data/x', './data/x' and its absolute form are the same."""
  out = []
  for key in sorted(set(old) | set(new)):
    name = prefix + key
    if name in free or key not in old or old[key] is None:
      continue
    a, b = old[key], new.get(key)
    if isinstance(a, dict) and isinstance(b, dict) and (a or not b):  # {} -> {...} (phases added) differs
      out += config_diffs(a, b, free, name + '.')
    elif a != b and not (name in _PATHS and _same_paths(a, b)):
      out.append(f'{name}: {a!r} -> {b!r}')
  return out


def _field_names(config: dict[str, Any], prefix: str = '') -> list[str]:
  out = []
  for key, value in config.items():
    out.append(prefix + key)
    if isinstance(value, dict):
      out += _field_names(value, prefix + key + '.')
  return out


def check_resume_allow(resume_allow: str, config: dict[str, Any], extra: tuple[str, ...] = ()) -> None:
  """ConfigError naming every comma-separated entry of `resume_allow` that is neither a field nor a
  section of `config` (nor one of `extra`): a misspelt name would otherwise allow nothing, silently."""
  known = set(_field_names(config)) | set(extra)
  unknown = [n.strip() for n in resume_allow.split(',') if n.strip() and n.strip() not in known]
  if unknown:
    sections = sorted(k for k, v in config.items() if isinstance(v, dict))
    raise ConfigError(f'resume_allow names no config field: {", ".join(unknown)}; give fields as in '
                      f'--config.X (e.g. num_train_steps, optim.learning_rate) or sections ({", ".join(sections)})')


def check_resume(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...], resume_allow: str,
                 where: str, step: int | None = None) -> None:
  """Refuses to resume `old` (a checkpoint's config) as `new` when fields outside `free` and the
  comma-separated `resume_allow` differ; the message names each field with its old and new value (and
  the checkpoint's `step`)."""
  if isinstance(old.get('task'), str) and isinstance(new.get('task'), str) and \
      config_type(old['task']) is not config_type(new['task']):  # another kind's fields throughout: one line
    at = f' (step {step})' if step is not None else ''
    raise CheckpointError(f'{where} holds a {old["task"]} run{at}, configured by {config_type(old["task"]).__name__}; '
                          f'this run\'s task {new["task"]} is configured by {config_type(new["task"]).__name__}: '
                          'use a new --workdir')
  allowed = tuple(name.strip() for name in resume_allow.split(',') if name.strip())
  diffs = config_diffs(old, new, free + allowed)
  if diffs:
    at = f' (step {step})' if step is not None else ''
    raise CheckpointError(f'{where} holds another run{at}: ' + '; '.join(diffs)
                          + '. Use a new --workdir, or allow the change with --config.resume_allow='
                          + ','.join(d.split(':')[0] for d in diffs))


_PATHS = frozenset(facts(PretrainConfig, 'path') + kind_fields('path'))
