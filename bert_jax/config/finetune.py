"""A fine-tuning run's config: `FinetuneConfig` (the shared training block, the task and its data)."""

from __future__ import annotations

import dataclasses
import math
from typing import Collection

from bert_jax.config.fields import _f
from bert_jax.config.model_config import ModelConfig
from bert_jax.config.training import OptimConfig, TrainingConfig
from bert_jax.errors import ConfigError

# The tasks (`FinetuneConfig.task`) of each kind. GLUE_TASKS, CoNLL-2003 and SQuAD read the files of a data_dir;
# classify, regress, multilabel, tag and qa read your own files by their columns (finetuning.tasks);
# retrieval trains a bi-encoder on pairs (finetuning.retrieval).
GLUE_TASKS = ('cola', 'sst2', 'mrpc', 'qqp', 'stsb', 'mnli', 'qnli', 'rte', 'wnli')
TASK_KINDS = {
    'classification': GLUE_TASKS + ('classify', 'regress', 'multilabel'),
    'tagging': ('conll2003', 'tag'),
    'qa': ('squad', 'squad_v2', 'qa'),
    'retrieval': ('retrieval',),
}
TASKS = tuple(t for tasks in TASK_KINDS.values() for t in tasks)


def _finetuning_optim() -> OptimConfig:
  # Hugging Face Trainer's defaults: Adam epsilon 1e-8, a warmup of 10% of the steps.
  return OptimConfig(learning_rate=5e-5, warmup_steps=0, warmup_ratio=0.1, eps=1e-8)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(TrainingConfig):
  """A fine-tuning run: the shared training block, the task and its data.

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
  # 'tag', 'qa'; 'retrieval': a bi-encoder on pairs (finetuning.retrieval)
  task: str = 'sst2'
  data_dir: str = _f('', path=True)
  train_file: str = _f('', path=True)  # overrides the task's file in data_dir; classify/regress: required
  eval_file: str = _f('', free=True, path=True, evaluation=True)
  max_seq_length: int = 128
  max_train_samples: int = 0  # > 0: the first N training examples in file order
  shuffle: bool = True  # reshuffle the training set every epoch
  # Packs several examples into each row (per-example attention, restarted positions);
  # the same function as padding each one, with no compute spent on padding.
  pack: bool = True
  # classify / regress: your own CSV, TSV, JSONL or Parquet files, by column names (finetuning.tasks.own_data)
  text_column: str = 'text'  # the default also reads a 'sentence' column
  text_pair_column: str = ''  # the second text of a pair; '' single texts
  label_column: str = 'label'
  # classify / multilabel / tag: the labels in order, comma-separated; '' the training file's, sorted
  label_names: str = ''
  eval_fraction: float = 0.1  # without eval_file: this share of the training file's rows is held out ...
  split_seed: int = 0  # ... drawn with this seed
  # SQuAD
  doc_stride: int = 128  # overlap in tokens between consecutive windows (HF run_qa convention)
  max_query_length: int = 64
  n_best_size: int = _f(20, free=True, evaluation=True)
  max_answer_length: int = _f(30, free=True, evaluation=True)
  null_score_diff_threshold: float = _f(0.0, free=True, evaluation=True)  # SQuAD 2.0: no answer above this
  tune_null_threshold: bool = _f(True, free=True, evaluation=True)  # SQuAD 2.0: also report the best threshold
  train_articles: int = 40  # without a train file: the first N articles of dev-v1.1.json train
  eval_articles: int = _f(8, free=True, evaluation=True)  # ... and the last N evaluate
  # retrieval: a bi-encoder trained contrastively (InfoNCE over the global batch) on pairs from train_file, by
  # columns; passages are cut to max_seq_length tokens, queries to max_query_length (embedding/)
  pooling: str = 'mean'  # 'mean' or 'cls'; embeddings are normalised
  temperature: float = 0.05  # fixed, or the learned one's initial value
  learn_temperature: bool = False
  temperature_min: float = 0.01  # the learned temperature's bounds
  temperature_max: float = 1.0
  symmetric: bool = False  # also passage -> query
  matryoshka_dims: str = ''  # e.g. '384,256,128,64': the loss at each leading size, evaluated at each
  matryoshka_weights: str = ''  # one per dim, comma-separated; '' equal
  query_column: str = 'query'
  positive_column: str = 'positive'
  negative_columns: str = ''  # comma-separated hard-negative columns (JSONL/Parquet: a column may hold a list)
  beir_dir: str = _f('', free=True, path=True, evaluation=True)  # corpus.jsonl, queries.jsonl, qrels/<split>.tsv
  beir_split: str = _f('test', free=True, evaluation=True)
  # Scored pairs (STS): also report Spearman's correlation of the embeddings' cosine with the gold scores.
  sts_file: str = _f('', free=True, path=True, evaluation=True)
  sts_columns: str = _f('sentence1,sentence2,score', free=True, evaluation=True)

  def __post_init__(self):
    super().__post_init__()
    if self.max_seq_length < 8:
      raise ConfigError(f'max_seq_length={self.max_seq_length} must be at least 8')
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ConfigError(f'eval_fraction={self.eval_fraction} must be in [0, 1)')
    if self.num_seeds <= 0:
      raise ConfigError(f'num_seeds must be positive, got {self.num_seeds}')
    if self.task == 'retrieval':
      self._check_retrieval()

  def check_task_fields(self, names: Collection[str] | None = None) -> None:
    """ConfigError naming each task-specific field (`TASK_FIELDS`) set to other than its default on a task that
    does not read it. Called when a run starts; a saved config (a workdir's config.json) is not checked when it
    loads. `names`: check only these fields (evaluating a workdir again: the ones given); None all."""
    kind = task_kind(self.task)
    defaults = FinetuneConfig()
    unread: dict[tuple[str, ...], list[str]] = {}  # the tasks that read them -> the fields set
    for name, tasks in TASK_FIELDS.items():
      if names is not None and name not in names or self.task in tasks:
        continue
      if getattr(self, name) != getattr(defaults, name):
        unread.setdefault(tasks, []).append(f'--config.{name}')
    if unread:
      parts = [f'{_words(flags)} {"is a field" if len(flags) == 1 else "are fields"} of {_readers(tasks)}'
               for tasks, flags in unread.items()]
      one = sum(map(len, unread.values())) == 1
      raise ConfigError(f'{"; ".join(parts)}; this run\'s task is {self.task}'
                        + (f' ({kind})' if kind != self.task else '')
                        + f', which does not read {"it" if one else "them"}')

  def _check_retrieval(self) -> None:
    """The retrieval fields' mesh- and model-free checks (the dims against the model: `finetuning.retrieval`)."""
    if self.pooling not in ('mean', 'cls'):
      raise ConfigError(f"pooling must be 'mean' or 'cls', got {self.pooling!r}")
    for name in ('temperature',) + (('temperature_min', 'temperature_max') if self.learn_temperature else ()):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise ConfigError(f'{name}={value} must be a finite number > 0')
    if self.learn_temperature and not self.temperature_min <= self.temperature <= self.temperature_max:
      raise ConfigError(f'temperature={self.temperature} must lie within [temperature_min, temperature_max] = '
                        f'[{self.temperature_min}, {self.temperature_max}] when learn_temperature is set')
    dims, weights = self.retrieval_dims(), self.retrieval_weights()
    if any(a <= b for a, b in zip(dims, dims[1:])):
      raise ConfigError(f'matryoshka_dims={self.matryoshka_dims!r} must be strictly decreasing (largest first)')
    if weights and len(weights) != len(dims):
      raise ConfigError(f'matryoshka_weights has {len(weights)} values for {len(dims)} matryoshka_dims')
    for name in ('query_column', 'positive_column'):
      if not getattr(self, name).strip():
        raise ConfigError(f'{name} must name a column')
    if self.max_query_length < 3:
      raise ConfigError(f'max_query_length={self.max_query_length} must be at least 3')

  def retrieval_dims(self) -> tuple[int, ...]:
    """matryoshka_dims as integers (ConfigError when they are not positive integers)."""
    return _int_list('matryoshka_dims', self.matryoshka_dims)

  def retrieval_weights(self) -> tuple[float, ...]:
    try:
      weights = tuple(float(w) for w in self.matryoshka_weights.split(',') if w.strip())
    except ValueError:
      raise ConfigError(f'matryoshka_weights={self.matryoshka_weights!r} must be numbers separated by commas') from None
    if any(not math.isfinite(w) or w < 0 for w in weights):
      raise ConfigError(f'matryoshka_weights={self.matryoshka_weights!r} must be finite numbers >= 0')
    return weights

  def negative_column_names(self) -> tuple[str, ...]:
    return tuple(c.strip() for c in self.negative_columns.split(',') if c.strip())


# Which tasks read each task-specific field of FinetuneConfig (the groups its comments name): a field set to other
# than its default on a task that does not read it is refused (`check_task_fields`), not silently ignored. Every
# field is here or shared (TrainingConfig's and SHARED_FIELDS: every task reads them); tests/config/test_finetune.py
# fails on a field in neither, so a new field is placed here.
SHARED_FIELDS = ('model', 'num_seeds', 'task', 'train_file', 'max_seq_length', 'max_train_samples', 'shuffle')
_SHIPPED = GLUE_TASKS + ('conll2003', 'squad', 'squad_v2')  # the files of a data_dir
_OWN_FILES = ('classify', 'regress', 'multilabel', 'tag', 'qa')  # your files, by columns
_QA = TASK_KINDS['qa']
_RETRIEVAL = ('pooling', 'temperature', 'learn_temperature', 'temperature_min', 'temperature_max', 'symmetric',
              'matryoshka_dims', 'matryoshka_weights', 'query_column', 'positive_column', 'negative_columns',
              'beir_dir', 'beir_split', 'sts_file', 'sts_columns')
TASK_FIELDS = {
    # the task's files: retrieval evaluates on beir_dir and batches pairs unpacked
    'data_dir': _SHIPPED,
    'eval_file': _SHIPPED + _OWN_FILES,
    'pack': _SHIPPED + _OWN_FILES,
    # your own files (classify / regress / multilabel, tag, qa): columns, labels, the held-out split
    'text_column': _OWN_FILES,
    'text_pair_column': ('classify', 'regress', 'multilabel', 'qa'),
    'label_column': _OWN_FILES,
    'label_names': ('classify', 'multilabel', 'tag'),
    'eval_fraction': _OWN_FILES,
    'split_seed': _OWN_FILES,
    # QA (SQuAD, own-data qa); max_query_length also cuts retrieval's queries
    'doc_stride': _QA,
    'max_query_length': _QA + ('retrieval',),
    'n_best_size': _QA,
    'max_answer_length': _QA,
    'null_score_diff_threshold': _QA,
    'tune_null_threshold': _QA,
    'train_articles': ('squad', 'squad_v2'),
    'eval_articles': ('squad', 'squad_v2'),
    # retrieval
    **{name: ('retrieval',) for name in _RETRIEVAL},
}


def task_kind(task: str) -> str:
  """The kind of task `task` (a TASK_KINDS key); ConfigError naming the tasks for an unknown one."""
  for kind, tasks in TASK_KINDS.items():
    if task in tasks:
      return kind
  raise ConfigError(f'unknown task {task!r}; choose from {", ".join(TASKS)}')


def _readers(tasks: Collection[str]) -> str:
  """'the retrieval task', 'the GLUE, conll2003, squad and squad_v2 tasks', 'every task but retrieval'."""
  others = [t for t in TASKS if t not in tasks]
  if len(others) <= 2:
    return 'every task but ' + _words(others)
  names = (['GLUE'] if set(GLUE_TASKS) <= set(tasks) else []) + [t for t in tasks if t not in GLUE_TASKS]
  return f'the {_words(names)} task{"s" if len(tasks) > 1 else ""}'


def _words(names: list[str]) -> str:
  return names[0] if len(names) == 1 else f'{", ".join(names[:-1])} and {names[-1]}'


def _int_list(name: str, text: str) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in text.split(',') if v.strip())
  except ValueError:
    raise ConfigError(f'{name}={text!r} must be positive integers separated by commas') from None
  if any(v < 1 for v in values):
    raise ConfigError(f'{name}={text!r} must be positive integers separated by commas')
  return values
