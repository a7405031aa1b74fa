"""A fine-tuning run's config: `FinetuneConfig`, the fields every task kind shares (the training block, the task,
its training file and lengths); each kind's own fields are its config type's (`config.task_configs`).

`FinetuneConfig(task=..., **fields)` builds the config type of its task: `FinetuneConfig(task='retrieval',
pooling='cls')` is a `RetrievalConfig`, `FinetuneConfig(task='sst2')` a `HeadTaskConfig`, and a field of another
kind's is refused in one line naming the tasks that read it, like an unknown key. A kind with no fields of its own
runs on `FinetuneConfig` itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection

from bert_jax.config.fields import _f
from bert_jax.config.model_config import ModelConfig
from bert_jax.config.training import OptimConfig, TrainingConfig, _from_dict
from bert_jax.errors import ConfigError

# The tasks (`FinetuneConfig.task`) of each kind. GLUE_TASKS, CoNLL-2003 and SQuAD read the files of a data_dir;
# classify, regress, multilabel, tag and qa read your own files by their columns (finetuning.tasks);
# retrieval trains a bi-encoder on pairs (finetuning.retrieval); rerank a cross-encoder on labelled or scored pairs
# (finetuning.rerank).
GLUE_TASKS = ('cola', 'sst2', 'mrpc', 'qqp', 'stsb', 'mnli', 'qnli', 'rte', 'wnli')
TASK_KINDS = {
    'classification': GLUE_TASKS + ('classify', 'regress', 'multilabel'),
    'tagging': ('conll2003', 'tag'),
    'qa': ('squad', 'squad_v2', 'qa'),
    'retrieval': ('retrieval',),
    'rerank': ('rerank',),
    'sparse': ('sparse',),
    'multivector': ('multivector',),
}
TASKS = tuple(t for tasks in TASK_KINDS.values() for t in tasks)
HEAD_TASKS = TASK_KINDS['classification'] + TASK_KINDS['tagging'] + TASK_KINDS['qa']  # a head on the encoder


def _finetuning_optim() -> OptimConfig:
  # Hugging Face Trainer's defaults: Adam epsilon 1e-8, a warmup of 10% of the steps.
  return OptimConfig(learning_rate=5e-5, warmup_steps=0, warmup_ratio=0.1, eps=1e-8)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(TrainingConfig):
  """A fine-tuning run: the shared training block, the task and its training file.

  The model's architecture is its init_checkpoint's (required); `model` sets how it is computed
  (dtype, attention kernel, rematerialisation) and, when given, its dropout rates.
  """

  optim: OptimConfig = _f(factory=_finetuning_optim)
  # Each seed trains in its own seed_<n>/: seed and num_seeds may change when a workdir is run again.
  seed: int = _f(0, free=True, evaluation=True)
  num_seeds: int = _f(1, free=True, evaluation=True)  # seeds seed .. seed + num_seeds - 1, and their mean +- std
  num_train_steps: int = 0
  num_train_epochs: float = 3.0
  log_every: int = _f(25, free=True, evaluation=True)
  eval_every: int = _f(0, free=True)
  checkpoint_every: int = _f(0, free=True)
  keep_checkpoints: int = _f(1, free=True)
  model: ModelConfig = _f(factory=ModelConfig)
  # a GLUE task name, 'conll2003', 'squad', 'squad_v2', or your own files: 'classify', 'regress', 'multilabel',
  # 'tag', 'qa'; 'retrieval': a bi-encoder on pairs (finetuning.retrieval); 'rerank': a cross-encoder
  # (finetuning.rerank); 'sparse': a SPLADE encoder on pairs (finetuning.sparse); 'multivector': a ColBERT-style
  # multi-vector encoder (finetuning.multivector)
  task: str = 'sst2'
  train_file: str = _f('', path=True)  # overrides the task's file in data_dir; classify/regress: required
  max_seq_length: int = 128
  max_train_samples: int = 0  # > 0: the first N training examples in file order
  shuffle: bool = True  # reshuffle the training set every epoch

  def __new__(cls, *args, **kwargs):
    """FinetuneConfig(task=..., ...) is its task's config type (`config_type`); a field of another kind's is one
    ConfigError line. A config type's own class (RetrievalConfig(...)) is built as it is."""
    if cls is FinetuneConfig and not args:
      cls = config_type(kwargs.get('task', 'sst2'))
      check_fields(cls, kwargs.get('task', 'sst2'), kwargs)
    return super().__new__(cls)

  def __getnewargs_ex__(self):
    return (), {'task': self.task}  # copy and pickle rebuild the same type

  def __post_init__(self):
    super().__post_init__()
    if config_type(self.task) is not type(self):
      raise ConfigError(f'task {self.task!r} is configured by {config_type(self.task).__name__}, not '
                        f'{type(self).__name__}: build it as FinetuneConfig(task={self.task!r}, ...)')
    if self.max_seq_length < 8:
      raise ConfigError(f'max_seq_length={self.max_seq_length} must be at least 8')
    if self.num_seeds <= 0:
      raise ConfigError(f'num_seeds must be positive, got {self.num_seeds}')

  @classmethod
  def from_dict(cls, d: dict[str, Any]):
    """The config type of d['task'] (FinetuneConfig.from_dict) or `cls` built from a (nested) dict; a field of
    another kind's is one line naming the tasks that read it, any other unknown key names the valid ones."""
    task = d.get('task', cls.__dataclass_fields__['task'].default)
    if cls is FinetuneConfig:
      cls = config_type(task)
    check_fields(cls, task, d)
    return _from_dict(cls, dict(d), prefix='')

  @classmethod
  def readers(cls, name: str) -> tuple[str, ...]:
    """The tasks of this config type that read its field `name` (all of them, unless a type says otherwise)."""
    del name
    return getattr(cls, 'TASKS', ())

  def check_task_fields(self, names: Collection[str] | None = None) -> None:
    """ConfigError for a field of this kind's that this run's task does not read (a head-task kind's fields are
    read by some of its tasks: `HeadTaskConfig`); an unknown task is named with the known ones. Called when a
    run starts; `names`: check only these fields (evaluating a workdir again: the ones given); None all."""
    del names
    task_kind(self.task)


def config_type(task: str) -> type:
  """The config type of FinetuneConfig.task `task` (`task_configs.CONFIG_TYPES`); FinetuneConfig itself for a task
  no config type claims (a kind with no fields of its own, or an unknown task, refused when the run starts)."""
  from bert_jax.config import task_configs  # pylint: disable=g-import-not-at-top  # the types extend this class
  return next((t for t in task_configs.CONFIG_TYPES if task in t.TASKS), FinetuneConfig)


def kind_fields(fact: str = '') -> tuple[str, ...]:
  """Every config type's fields (those whose metadata `fact` is set, when given), in order: what a saved
  fine-tuning config, or evaluating one again, may name."""
  from bert_jax.config import task_configs  # pylint: disable=g-import-not-at-top
  from bert_jax.config.fields import facts  # pylint: disable=g-import-not-at-top
  out = {}
  for t in (FinetuneConfig,) + task_configs.CONFIG_TYPES:
    out.update(dict.fromkeys(facts(t, fact) if fact else (f.name for f in dataclasses.fields(t))))
  return tuple(out)


def foreign_field(name: str, task: str) -> str | None:
  """'the retrieval task' when `name` is a field of another config type's and not of `task`'s (the tasks that
  read it); None otherwise."""
  if name in {f.name for f in dataclasses.fields(config_type(task))}:
    return None
  return field_readers(name)


def field_readers(name: str) -> str | None:
  """'the retrieval task': the tasks whose config types have the field `name` (None: no task kind's field)."""
  from bert_jax.config import task_configs  # pylint: disable=g-import-not-at-top
  readers = [x for t in task_configs.CONFIG_TYPES if name in {f.name for f in dataclasses.fields(t)}
             for x in t.readers(name)]
  return _readers(readers) if readers else None


def check_fields(cls: type, task: str, given: Collection[str]) -> None:
  """One ConfigError line for the fields in `given` that are another kind's config type's, not `cls`'s: 'pooling
  is a field of the retrieval task; this run's task is sst2 (classification), which does not read it'."""
  own = {f.name for f in dataclasses.fields(cls)}
  unread: dict[str, list[str]] = {}  # the tasks that read them -> the fields given
  for name in given:
    readers = None if name in own else foreign_field(name, task)
    if readers:
      unread.setdefault(readers, []).append(name)
  if unread and task not in TASKS:  # not a kind's field: it names none of the types' tasks
    task_kind(task)
  from bert_jax.config import task_configs  # pylint: disable=g-import-not-at-top
  whole = [t for t in task_configs.CONFIG_TYPES if t is not cls and len(_own_fields(t)) > 1
           and _own_fields(t) <= set(given)]
  if whole:  # every field of another type: a config made for a task of another kind, its task changed
    raise ConfigError(f'task {task!r} is configured by {cls.__name__}, but this config holds {whole[0].__name__}\'s '
                      f'fields (a config made for {_words(list(whole[0].TASKS))}): start from a config made for '
                      f'task {task!r}')
  if unread:
    raise ConfigError(unread_fields(unread, task))


def unread_fields(unread: dict[str, list[str]], task: str) -> str:
  """'a and b are fields of the retrieval task; c is a field of ...; this run's task is T (kind), which does not
  read them', from {readers: [field names]}."""
  parts = [f'{_words(names)} {"is a field" if len(names) == 1 else "are fields"} of {readers}'
           for readers, names in unread.items()]
  one = sum(map(len, unread.values())) == 1
  return f'{"; ".join(parts)}; this run\'s task is {_task_words(task)}, which does not read {"it" if one else "them"}'


def _own_fields(config_type_: type) -> set[str]:
  """The fields a config type adds to FinetuneConfig's."""
  return {f.name for f in dataclasses.fields(config_type_)} - {f.name for f in dataclasses.fields(FinetuneConfig)}


def task_kind(task: str) -> str:
  """The kind of task `task` (a TASK_KINDS key); ConfigError naming the tasks for an unknown one."""
  for kind, tasks in TASK_KINDS.items():
    if task in tasks:
      return kind
  raise ConfigError(f'unknown task {task!r}; choose from {", ".join(TASKS)}')


def _task_words(task: str) -> str:
  kind = next((k for k, tasks in TASK_KINDS.items() if task in tasks), task)
  return task + (f' ({kind})' if kind != task else '')


def _readers(tasks: Collection[str]) -> str:
  """'every head task (classification, tagging and QA)' for the head tasks; else the shorter of the tasks named
  ('the retrieval task', 'the GLUE, conll2003, squad and squad_v2 tasks') and 'every task but retrieval'."""
  others = [t for t in TASKS if t not in tasks]
  if set(tasks) == set(HEAD_TASKS):  # the head tasks' own fields: one name however many kinds there are
    return 'every head task (classification, tagging and QA)'
  names = (['GLUE'] if set(GLUE_TASKS) <= set(tasks) else []) + [t for t in tasks if t not in GLUE_TASKS]
  if len(others) <= 2 or len(others) < len(names):  # the shorter of the two lists
    return 'every task but ' + _words(others)
  return f'the {_words(names)} task{"s" if len(tasks) > 1 else ""}'


def _words(names: list[str]) -> str:
  return names[0] if len(names) == 1 else f'{", ".join(names[:-1])} and {names[-1]}'
