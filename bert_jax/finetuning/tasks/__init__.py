"""Fine-tuning tasks: readers, featurisers, metrics and prediction writers.

Each task module (glue, conll, squad; own_data: your own CSV/TSV/JSONL/Parquet by columns; tagging: your own tagged
words; answering: your own questions) turns its files into `Feature`s for the head tasks' kind (`finetuning.head_tasks`) and
scores the per-feature logits it gets back. See `base.Task`. `inputs.check_inputs` looks at the files a run will
read (they exist, the named columns are there) before the run loads its starting checkpoint.
"""

from bert_jax.errors import ConfigError
from bert_jax.finetuning.tasks import answering, conll, glue, own_data, squad, tagging
from bert_jax.finetuning.tasks.base import Task


def _tasks() -> dict[str, Task]:
  return {**glue.TASKS, 'conll2003': conll.Conll2003(), 'squad': squad.Squad(False), 'squad_v2': squad.Squad(True),
          **{n: own_data.FileTask(n, kind) for n, kind in own_data.TASKS.items()},
          'tag': tagging.TagTask(), 'qa': answering.AnswerTask()}


def task_names() -> tuple[str, ...]:
  """Every name `get_task` knows (retrieval, the other FinetuneConfig.task, is finetuning.retrieval's job)."""
  return tuple(_tasks())


def get_task(name: str) -> Task:
  """The task of a FinetuneConfig.task name: a GLUE task, 'conll2003', 'squad', 'squad_v2', or 'classify' /
  'regress' / 'tag' / 'qa' (the config's own files; a new task each call, as it learns its labels from them)."""
  tasks = _tasks()
  if name not in tasks:
    raise ConfigError(f'unknown task {name!r}; choose from {", ".join(tasks)}')
  return tasks[name]
