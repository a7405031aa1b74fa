"""The field-fact helper: a config field declared with `_f` carries the facts the runs need about it as dataclass
metadata (free on resume, free on a branch, a path, fixed by a checkpoint, an evaluation setting, shaping the
prepared records, covered by the data fingerprint, what a branch shares before its branch point), read with `facts`; `_block` is the
config block (a nested dataclass) a field holds."""

from __future__ import annotations

import dataclasses
from typing import Any


def _f(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, free: bool = False,
       path: bool = False, checkpoint: str = '', evaluation: bool = False, branch: bool = False,
       records: bool = False, fingerprinted: bool = False, layout: bool = False) -> Any:
  """A config field with the facts the runs need about it (its `metadata`, read with `facts`).

  Args:
    default / factory: the field's default (value, or a function making it).
    free: a resumed run may change it (evaluation, logging, checkpoint cadence, mesh, workers, speed).
    path: it names files (comma-separated lists too): it compares as the files it names.
    checkpoint: how a starting checkpoint (init_checkpoint) sets it: 'fixed' (it shapes the
      parameters or the function they compute: the checkpoint's value, a clashing explicit one is
      an error), 'default' (the checkpoint's unless given explicitly); '' the config's.
    evaluation: evaluating a workdir again may set it (experiments/evaluate.py --config.X).
    branch: a branch run (branch_from) may change it beside the fields free on resume: what comes after its
      branch point (phases, the run's length, the schedule's decay) and where it branches from.
    records: it shapes the prepared records (a DataConfig field): part of the cache's fingerprint.
    fingerprinted: it names files whose contents the data fingerprint covers: with the same fingerprint, a
      resumed run may read them from other paths.
    layout: what a pretraining stage trains on (its data stream, batch, length, masking, positions): a branch
      must share it with the run it continues up to its branch point (`phases.Phase.layout`).
  """
  return dataclasses.field(default=default, default_factory=factory,
                           metadata=dict(free=free, path=path, checkpoint=checkpoint, evaluation=evaluation,
                                         branch=branch, records=records, fingerprinted=fingerprinted,
                                         layout=layout))


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
