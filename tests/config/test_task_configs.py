"""HeadTaskConfig's fields are each read by named head tasks (one set on a head task that does not read it is
refused in one message); RetrievalConfig checks its own fields without the model."""

import dataclasses

import pytest

from bert_jax.config import FinetuneConfig, HeadTaskConfig, RetrievalConfig
from bert_jax.config.task_configs import HEAD_SHARED, TASK_FIELDS
from bert_jax.errors import ConfigError


def test_every_head_field_is_shared_or_placed_in_the_task_table():
  base = {f.name for f in dataclasses.fields(FinetuneConfig)}
  own = {f.name for f in dataclasses.fields(HeadTaskConfig)} - base
  unplaced = own - set(HEAD_SHARED) - set(TASK_FIELDS)
  assert not unplaced, f'place each in TASK_FIELDS (the tasks that read it) or HEAD_SHARED: {sorted(unplaced)}'
  assert not set(HEAD_SHARED) & set(TASK_FIELDS) and set(TASK_FIELDS) | set(HEAD_SHARED) <= own  # no stale names
  for name, tasks in TASK_FIELDS.items():
    assert tasks and set(tasks) <= set(HeadTaskConfig.TASKS), name
    assert set(tasks) != set(HeadTaskConfig.TASKS), f'{name} is read by every head task: it is HEAD_SHARED'


def test_a_head_field_of_another_head_task_is_named_with_the_tasks_that_read_it():
  with pytest.raises(ConfigError, match="text_column is a field of the classify, regress, multilabel, tag and qa "
                                        "tasks; this run's task is conll2003 .tagging., which does not read it"):
    FinetuneConfig(task='conll2003', text_column='sentence').check_task_fields()
  with pytest.raises(ConfigError, match=r'--config.data_dir is a field of the GLUE, conll2003, squad and squad_v2 '
                                        r"tasks; --config.doc_stride is a field of the squad, squad_v2 and qa tasks; "
                                        r"this run's task is classify \(classification\), which does not read them"):
    FinetuneConfig(task='classify', data_dir='glue', doc_stride=64).check_task_fields()


def test_fields_at_their_defaults_and_a_tasks_own_fields_pass():
  FinetuneConfig(task='sst2').check_task_fields()
  FinetuneConfig(task='retrieval', temperature=0.1, beir_dir='b', max_query_length=32).check_task_fields()
  FinetuneConfig(task='qa', max_query_length=32, text_pair_column='context', eval_fraction=0.2).check_task_fields()
  FinetuneConfig(task='squad', train_articles=3, data_dir='squad').check_task_fields()
  FinetuneConfig(task='sst2', doc_stride=128).check_task_fields()  # the default, written out
  # Only the fields named: a saved config's other values are not the user's.
  FinetuneConfig(task='sst2', doc_stride=64).check_task_fields(names=('eval_file',))
  with pytest.raises(ConfigError, match='doc_stride is a field of the squad, squad_v2 and qa tasks'):
    FinetuneConfig(task='sst2', doc_stride=64).check_task_fields(names=('doc_stride',))


@pytest.mark.parametrize('fields, message', [
    (dict(pooling='max'), "pooling must be 'mean' or 'cls'"),
    (dict(temperature=0.0), 'temperature=0.0 must be a finite number > 0'),
    (dict(learn_temperature=True, temperature=2.0), r'must lie within \[temperature_min, temperature_max\]'),
    (dict(matryoshka_dims='64,128'), 'must be strictly decreasing'),
    (dict(matryoshka_dims='64,32', matryoshka_weights='1'), '1 values for 2 matryoshka_dims'),
    (dict(query_column=' '), 'query_column must name a column'),
    (dict(max_query_length=2), 'max_query_length=2 must be at least 3'),
    (dict(loss='mse'), 'loss must be one of contrastive, margin_mse, kl'),
    (dict(loss='kl', negative_columns='negatives'), "loss='kl' distils teacher scores: set --config.score_columns"),
    (dict(loss='margin_mse', score_columns='scores'), "set --config.negative_columns"),
    (dict(score_columns='scores', negative_columns='negatives'), 'the contrastive loss takes no scores'),
    (dict(loss='kl', score_columns='scores', negative_columns='negatives', symmetric=True), 'has none'),
    (dict(loss='margin_mse', score_columns='scores', negative_columns='negatives', learn_temperature=True),
     "loss='margin_mse' reads no temperature"),
    (dict(loss='margin_mse', score_columns='scores', negative_columns='negatives', teacher_temperature=1.0),
     "teacher_temperature is read by loss='kl' only"),
    (dict(loss='kl', score_columns='scores', negative_columns='negatives', teacher_temperature=-1.0),
     'teacher_temperature=-1.0 must be a finite number > 0'),
    (dict(eval_precisions='int8,fp16'), "eval_precisions='int8,fp16': fp16 is not one of int8, uint8, binary"),
])
def test_retrieval_fields_are_checked_without_the_model(fields, message):
  with pytest.raises(ConfigError, match=message):
    RetrievalConfig(**fields)
  assert RetrievalConfig(matryoshka_dims='64,32', matryoshka_weights='1,0.5').retrieval_dims() == (64, 32)
  distilled = RetrievalConfig(loss='kl', score_columns='pos_score, neg_scores', negative_columns='negatives',
                              teacher_temperature=1.0)
  assert distilled.score_column_names() == ('pos_score', 'neg_scores')
