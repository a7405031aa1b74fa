"""FinetuneConfig's task fields: each field is shared or read by named tasks, and one set on a task that does not read
it is refused in one message."""

import dataclasses

import pytest

from bert_jax.config import FinetuneConfig, TrainingConfig
from bert_jax.config.finetune import SHARED_FIELDS, TASK_FIELDS, TASK_KINDS, TASKS, task_kind
from bert_jax.errors import ConfigError


def test_every_field_is_shared_or_placed_in_the_task_table():
  fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
  shared = {f.name for f in dataclasses.fields(TrainingConfig)} | set(SHARED_FIELDS)
  unplaced = fields - shared - set(TASK_FIELDS)
  assert not unplaced, f'place each in TASK_FIELDS (the tasks that read it) or SHARED_FIELDS: {sorted(unplaced)}'
  assert not shared & set(TASK_FIELDS)
  assert set(TASK_FIELDS) <= fields and set(SHARED_FIELDS) <= fields  # no stale names
  for name, tasks in TASK_FIELDS.items():
    assert tasks and set(tasks) <= set(TASKS), name
    assert set(tasks) != set(TASKS), f'{name} is read by every task: it is shared'
  assert len(TASKS) == len(set(TASKS))  # each task is of one kind
  assert {task_kind(t) for t in TASKS} == set(TASK_KINDS)


def test_a_field_of_another_task_is_named_with_the_tasks_that_read_it():
  cfg = FinetuneConfig(task='sst2', temperature=0.1, matryoshka_dims='64', beir_dir='/nonexistent')
  with pytest.raises(ConfigError) as e:
    cfg.check_task_fields()
  assert str(e.value) == ('--config.temperature, --config.matryoshka_dims and --config.beir_dir are fields of the '
                          "retrieval task; this run's task is sst2 (classification), which does not read them")
  with pytest.raises(ConfigError, match=r'--config.data_dir is a field of the GLUE, conll2003, squad and squad_v2 '
                                        r"tasks; --config.pack is a field of every task but retrieval; this run's "
                                        r'task is retrieval, which does not read them'):
    FinetuneConfig(task='retrieval', data_dir='glue/sst2', pack=False).check_task_fields()
  with pytest.raises(ConfigError, match="text_column is a field of the classify, regress, multilabel, tag and qa "
                                        "tasks; this run's task is conll2003 .tagging., which does not read it"):
    FinetuneConfig(task='conll2003', text_column='sentence').check_task_fields()
  with pytest.raises(ConfigError, match="unknown task 'sst3'"):
    FinetuneConfig(task='sst3').check_task_fields()


def test_fields_at_their_defaults_and_a_tasks_own_fields_pass():
  FinetuneConfig(task='sst2').check_task_fields()
  FinetuneConfig(task='retrieval', temperature=0.1, beir_dir='b', max_query_length=32).check_task_fields()
  FinetuneConfig(task='qa', max_query_length=32, text_pair_column='context', eval_fraction=0.2).check_task_fields()
  FinetuneConfig(task='squad', train_articles=3, data_dir='squad').check_task_fields()
  FinetuneConfig(task='sst2', temperature=0.05).check_task_fields()  # the default, written out
  # Only the fields named: a saved config's other values are not the user's.
  FinetuneConfig(task='sst2', temperature=0.1).check_task_fields(names=('eval_file',))
  with pytest.raises(ConfigError, match='beir_dir is a field of the retrieval task'):
    FinetuneConfig(task='sst2', beir_dir='b').check_task_fields(names=('beir_dir',))
