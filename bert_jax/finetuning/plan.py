"""What a new fine-tuning run of a config will train, read without loading weights (experiments' --print_config).

The model of a fine-tuning run is its starting checkpoint's: `plan` reads init_checkpoint's config (no weights)
for the architecture, with the --config.model.* fields given (how it is computed, its dropout) on top, as the run
does. The task's head needs its label count: a task of your own files takes it from label_names, else from the
training file's labels (read here, as the run reads them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection

from bert_jax.config import FinetuneConfig
from bert_jax.errors import BertJaxError
from bert_jax.finetuning import kinds
from bert_jax.interop.pretrained import NO_INIT_CHECKPOINT, describe


@dataclasses.dataclass(frozen=True)
class Plan:
  """A config as its run will train it.

  cfg: the config with the model the run computes (the starting checkpoint's architecture).
  build: makes the run's model (to count its parameters abstractly); None when it cannot be known here.
  what: the model in words ('encoder + classification head, sst2; 2 labels').
  notes: lines to show beside the config (where its model comes from, what could not be read).
  """

  cfg: FinetuneConfig
  build: Callable[[], Any] | None
  what: str
  notes: tuple[str, ...]


def plan(cfg: FinetuneConfig, explicit_model_fields: Collection[str] = ()) -> Plan:
  """The Plan of a new run of `cfg`; what cannot be read (a missing checkpoint or training file) becomes a note."""
  notes = []
  try:
    cfg.check_task_fields()
  except BertJaxError as e:
    notes.append(f'the run refuses this config: {e}')
  if not cfg.init_checkpoint:
    notes.append(f'model: the starting checkpoint\'s, and none is set: {NO_INIT_CHECKPOINT}; the model '
                 'fields above are the config\'s defaults, not a run\'s')
    return Plan(cfg, None, 'unknown without init_checkpoint', tuple(notes))
  try:
    source = describe(cfg.init_checkpoint, 'init_checkpoint', log=lambda _: None)
    model = source.model_config(cfg.model, explicit_model_fields, log=lambda _: None)
  except BertJaxError as e:
    notes.append(f'model: init_checkpoint\'s, which cannot be read: {e}; the model fields above are the config\'s '
                 'defaults, not a run\'s')
    return Plan(cfg, None, 'unknown: init_checkpoint cannot be read', tuple(notes))
  notes.append(f'model: the architecture of init_checkpoint {cfg.init_checkpoint} (read from its config; no weights '
               'loaded), with the --config.model.* fields given')
  cfg = dataclasses.replace(cfg, model=model)
  what, build = kinds.kind_of(cfg.task).plan(cfg, model, notes)
  return Plan(cfg, build, what, tuple(notes))
