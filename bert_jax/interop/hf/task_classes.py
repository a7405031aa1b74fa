"""What a fine-tuned model's export says of its task, for every Hugging Face family: the transformers class of
each head kind (`<Family>ForSequenceClassification`, ...), the head it has, and config.json's task keys (id2label,
label2id, problem_type, finetuning_task). `families.bert` and `bert_layout` (DistilBERT, ELECTRA,
RoBERTa/XLM-R) both read it."""

from __future__ import annotations

from typing import Any

from bert_jax.errors import CheckpointError

TASK_HEADS = ('classifier', 'qa_outputs')
# Our head kind (heads.HEAD_KINDS) -> the class name after the family's stem ('Bert', 'DistilBert', ...).
CLASS_SUFFIXES = {'classification': 'ForSequenceClassification', 'regression': 'ForSequenceClassification',
                  'multilabel': 'ForSequenceClassification', 'token': 'ForTokenClassification',
                  'span': 'ForQuestionAnswering'}
# Our head kind -> the parameter group holding its head.
TASK_HEAD = {'classification': 'classifier', 'regression': 'classifier', 'multilabel': 'classifier',
             'token': 'classifier', 'span': 'qa_outputs'}
# A sequence head's kind <-> transformers' config.problem_type (which picks the loss and the pipeline's function).
PROBLEM_TYPES = {'classification': 'single_label_classification', 'regression': 'regression',
                 'multilabel': 'multi_label_classification'}


def check_task(task: dict[str, Any] | None, heads: set) -> int:
  """The task head's number of labels (2 without one); CheckpointError when task and heads disagree."""
  task_heads = heads & set(TASK_HEADS)
  if task is None:
    if task_heads:
      raise CheckpointError(f'params hold the task head {", ".join(sorted(task_heads))} but no task was given '
                            "(task={'kind', 'num_labels', 'label_names'}); nothing written")
    return 2
  kind = task.get('kind')
  if kind not in CLASS_SUFFIXES:
    raise CheckpointError(f'task kind {kind!r} is not one of {", ".join(CLASS_SUFFIXES)}; nothing written')
  if heads != {TASK_HEAD[kind]}:
    raise CheckpointError(f'a {kind} model has the head {TASK_HEAD[kind]!r} only, but params hold '
                          f'{", ".join(sorted(heads)) or "none"}; nothing written')
  num_labels = 2 if kind == 'span' else int(task['num_labels'])
  names = list(task.get('label_names') or [])
  if names and len(names) != num_labels:
    raise CheckpointError(f'task has {num_labels} labels but {len(names)} label names; nothing written')
  return num_labels


def task_config(task: dict[str, Any]) -> dict[str, Any]:
  """config.json's task keys: finetuning_task, id2label / label2id (not for QA: transformers' default 2
  outputs), problem_type for a sequence head."""
  config = {}
  if task.get('name'):
    config['finetuning_task'] = task['name']
  if task['kind'] != 'span':
    names = list(task.get('label_names') or []) or [f'LABEL_{i}' for i in range(int(task['num_labels']))]
    config['id2label'] = {str(i): name for i, name in enumerate(names)}
    config['label2id'] = {name: i for i, name in enumerate(names)}
  if task['kind'] in PROBLEM_TYPES:
    config['problem_type'] = PROBLEM_TYPES[task['kind']]
  return config
