"""The task kinds: the one extension point of everything fine-tuned from a checkpoint.

A task kind runs one or more `FinetuneConfig.task` names in the one fine-tuning job (`finetuning.job`), configured by
its config type (`config.task_configs`: its own fields; none of its own: FinetuneConfig): it checks its input files
before anything loads, checks the config against its model, reads its data, builds its model under its objective and evaluates it. A new kind is one
module with a class of the `TaskKind` shape and one row of `KINDS` (and, with fields of its own, a config type and its
row of `config.task_configs.CONFIG_TYPES`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from bert_jax.config import FinetuneConfig, ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.finetuning import head_tasks, multivector, rerank, retrieval, sparse


class Run(Protocol):
  """A kind's prepared run: its model and what reads it (made whole in `TaskKind.prepare`)."""

  total_steps: int
  model: Any  # train.step.StepModel
  main_metric: str
  eval_first: bool  # evaluate the starting checkpoint (step 0) before training

  def batches(self, seed: int, position: int, step: int) -> Any: ...  # train.loop.Batches
  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]: ...
  def report(self, seed: int, run_dir: str, workdir) -> Any: ...  # train.loop.Report
  def done(self, seed: int, run_dir: str, result: dict[str, Any], workdir) -> None: ...
  def results(self, per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]: ...
  def saved_config(self) -> dict[str, Any]: ...  # the workdir's config.json: {'finetune': ..., 'task': ...}
  # Optional: starting_weights(params) -> the starting checkpoint's subtrees its model takes (default: {'bert'}).


class TaskKind(Protocol):
  """One kind of fine-tuning task, made for one job (`evaluation`: only evaluating a workdir's checkpoints)."""

  preparing: str  # what the scaffold says it is doing while `prepare` runs

  @staticmethod
  def runs(task: str) -> bool: ...  # whether this kind runs FinetuneConfig.task `task`

  @staticmethod
  def check_inputs(cfg: FinetuneConfig) -> None: ...  # its files exist, can be read, have the named columns

  def __init__(self, cfg: FinetuneConfig, evaluation: bool = False): ...  # ConfigError for what it cannot run
  def check(self, cfg: FinetuneConfig, mesh) -> None: ...  # the config against its model and the mesh
  def read(self, cfg: FinetuneConfig, saved: dict[str, Any] | None) -> None: ...  # data read before the weights
  def prepare(self, cfg: FinetuneConfig, tokenizer, mesh) -> Run: ...

  @staticmethod
  def plan(cfg: FinetuneConfig, model: ModelConfig, notes: list[str]) -> tuple[str, Callable[[], Any]]: ...


# One row per kind.
KINDS: tuple[type, ...] = (
    head_tasks.HeadTasks,
    retrieval.Retrieval,
    rerank.Rerank,
    sparse.Sparse,
    multivector.MultiVector,
)


def kind_of(task: str) -> type:
  """The kind that runs FinetuneConfig.task `task`; ConfigError naming the tasks for an unknown one."""
  for kind in KINDS:
    if kind.runs(task):
      return kind
  from bert_jax.config.finetune import TASKS  # pylint: disable=g-import-not-at-top
  raise ConfigError(f'unknown task {task!r}; choose from {", ".join(TASKS)}')
