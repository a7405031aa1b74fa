"""Fine-tuning tasks: readers, featurisers, metrics and prediction writers.

Each task module (glue, conll, squad) turns its files into `Feature`s for the shared loop in
`finetuning.run` and scores the per-feature logits it gets back. See `base.Task`.
"""

from bert_jax.errors import ConfigError
from bert_jax.finetuning.tasks import conll, glue, squad
from bert_jax.finetuning.tasks.base import Task


def get_task(name: str) -> Task:
  """The task of a FinetuneConfig.task name: a GLUE task, 'conll2003', 'squad' or 'squad_v2'."""
  tasks: dict[str, Task] = {**glue.TASKS, 'conll2003': conll.Conll2003(), 'squad': squad.Squad(False),
                            'squad_v2': squad.Squad(True)}
  if name not in tasks:
    raise ConfigError(f'unknown task {name!r}; choose from {", ".join(tasks)}')
  return tasks[name]
