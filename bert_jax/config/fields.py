"""The field-fact helper: a config field declared with `_f` carries the facts the runs need about it as dataclass
metadata (free on resume, a path, fixed by a checkpoint, an evaluation setting), read with `facts`; `_block` is the
config block (a nested dataclass) a field holds."""

from __future__ import annotations

import dataclasses
from typing import Any


def _f(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, free: bool = False,
       path: bool = False, checkpoint: str = '', evaluation: bool = False) -> Any:
  """A config field with the facts the runs need about it (its `metadata`, read with `facts`).

  Args:
    default / factory: the field's default (value, or a function making it).
    free: a resumed run may change it (evaluation, logging, checkpoint cadence, mesh, workers, speed).
    path: it names files (comma-separated lists too): it compares as the files it names.
    checkpoint: how a starting checkpoint (init_checkpoint) sets it: 'fixed' (it shapes the
      parameters or the function they compute: the checkpoint's value, a clashing explicit one is
      an error), 'default' (the checkpoint's unless given explicitly); '' the config's.
    evaluation: evaluating a workdir again may set it (experiments/evaluate.py --config.X).
  """
  return dataclasses.field(default=default, default_factory=factory,
                           metadata=dict(free=free, path=path, checkpoint=checkpoint, evaluation=evaluation))


def facts(cls, fact: str, prefix: str = '') -> tuple[str, ...]:
  """The dotted names of `cls`'s fields (nested blocks too) whose metadata `fact` is true (or equal to a
  non-empty string), e.g. facts(PretrainConfig, 'free') -> ('log_every', ..., 'data.cache_dir')."""
  out = []
  for f in dataclasses.fields(cls):
    sub = _block(f)
    if f.metadata.get(fact):
      out.append(prefix + f.name)
    elif sub is not None:
      out += facts(sub, fact, prefix + f.name + '.')
  return tuple(out)


def _block(f: dataclasses.Field) -> type | None:
  """The config block (a dataclass) a field holds, or None for a plain value."""
  default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
  return type(default) if dataclasses.is_dataclass(default) else None
