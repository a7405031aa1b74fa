"""A fine-tuning run's config: `FinetuneConfig` (the shared training block, the task and its data)."""

from __future__ import annotations

import dataclasses

from bert_jax.config.fields import _f
from bert_jax.config.model import ModelConfig
from bert_jax.config.training import OptimConfig, TrainingConfig
from bert_jax.errors import ConfigError


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
  # 'tag', 'qa'
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
  # classify / regress: your own CSV, TSV, JSONL or Parquet files, by column names (finetuning.tasks.files)
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

  def __post_init__(self):
    super().__post_init__()
    if self.max_seq_length < 8:
      raise ConfigError(f'max_seq_length={self.max_seq_length} must be at least 8')
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ConfigError(f'eval_fraction={self.eval_fraction} must be in [0, 1)')
    if self.num_seeds <= 0:
      raise ConfigError(f'num_seeds must be positive, got {self.num_seeds}')
