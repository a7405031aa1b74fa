"""What a new fine-tuning run of a config will train, read without loading weights (experiments' --print_config).

The model of a fine-tuning run is its starting checkpoint's: `plan` reads init_checkpoint's config (no weights)
for the architecture, with the --config.model.* fields given (how it is computed, its dropout) on top, as the run
does. The task's head needs its label count: a task of your own files takes it from label_names, else from the
training file's labels (read here, as the run reads them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection

from flax import nnx

from bert_jax.config import FinetuneConfig
from bert_jax.model.biencoder import BiEncoder, ContrastiveSpec
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.tasks import get_task
from bert_jax.interop.pretrained import NO_INIT_CHECKPOINT, describe
from bert_jax.model import heads
from bert_jax.model.encoder import BertEncoder


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
  if cfg.task == 'retrieval':
    spec = ContrastiveSpec.of(cfg)
    return Plan(cfg, lambda: BiEncoder(model, spec, rngs=nnx.Rngs(0)),
                f'encoder, {cfg.pooling} pooling: a bi-encoder, retrieval', tuple(notes))
  task = get_task(cfg.task)
  num_labels = _num_labels(task, cfg, notes)
  if num_labels is None:
    return Plan(cfg, lambda: BertEncoder(model, rngs=nnx.Rngs(0)),
                f'encoder only; the {task.kind} head adds {model.hidden_size + 1:,} per label, {cfg.task}',
                tuple(notes))
  labels = f'; {num_labels} labels' if task.kind in ('classification', 'multilabel', 'token') else ''
  return Plan(cfg, lambda: heads.head_model(task.kind, model, num_labels, rngs=nnx.Rngs(0)),
              f'encoder + {task.kind} head, {cfg.task}{labels}', tuple(notes))


def _num_labels(task, cfg: FinetuneConfig, notes: list[str]) -> int | None:
  """The task's label count: its own, label_names', or the training file's (None, with a note, when unreadable)."""
  if not hasattr(task, 'planned_label_names'):  # a task whose labels are its own (GLUE, CoNLL-2003, SQuAD, qa)
    return task.num_labels
  if task.kind == 'regression':
    return 1
  if not cfg.label_names and not cfg.train_file:
    notes.append('labels: the training file\'s, and none is set (--config.train_file)')
    return None
  try:
    names = task.planned_label_names(cfg)
  except BertJaxError as e:
    notes.append(f'labels: the training file\'s, which cannot be read: {e}')
    return None
  notes.append(f'labels: {", ".join(names)} ({"label_names" if cfg.label_names else "the training file"})')
  return len(names)
