"""FinetuneConfig builds its task's config type; a field of another kind's is refused in one line naming the tasks
that read it, from Python, from a dict (a config file, a sweep) and from a saved config of the flat layout."""

import copy
import dataclasses
import pickle

import pytest

from bert_jax.config import (CONFIG_TYPES, FinetuneConfig, HeadTaskConfig, RetrievalConfig, TrainingConfig,
                             upgrade_saved)
from bert_jax.config.finetune import TASK_KINDS, TASKS, config_type, kind_fields, task_kind
from bert_jax.errors import ConfigError


def test_each_task_has_one_config_type_and_the_types_share_only_the_base():
  assert len(TASKS) == len(set(TASKS)) and {task_kind(t) for t in TASKS} == set(TASK_KINDS)
  for task in TASKS:
    assert sum(task in t.TASKS for t in CONFIG_TYPES) == 1, task
  assert config_type('retrieval') is RetrievalConfig and config_type('squad') is HeadTaskConfig
  assert config_type('toy') is FinetuneConfig  # a kind without fields of its own
  base = {f.name for f in dataclasses.fields(FinetuneConfig)}
  assert base >= {f.name for f in dataclasses.fields(TrainingConfig)} | {'task', 'train_file', 'max_seq_length'}
  own = [{f.name for f in dataclasses.fields(t)} - base for t in CONFIG_TYPES]
  # QA's question length and retrieval's query length; packed rows (several texts per row) or padded ones
  assert own[0] & own[1] == {'max_query_length', 'pack'}
  assert set(kind_fields()) == base.union(*own)


def test_finetune_config_builds_the_tasks_type_and_keeps_it_through_copies():
  cfg = FinetuneConfig(task='retrieval', pooling='cls', batch_size=8)
  assert type(cfg) is RetrievalConfig and cfg.pooling == 'cls' and cfg.batch_size == 8
  assert type(FinetuneConfig()) is HeadTaskConfig and FinetuneConfig().task == 'sst2'
  assert type(FinetuneConfig(task='toy')) is FinetuneConfig
  assert RetrievalConfig() == FinetuneConfig(task='retrieval')
  for again in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)),
                dataclasses.replace(cfg, temperature=0.1), FinetuneConfig.from_dict(cfg.to_dict())):
    assert type(again) is RetrievalConfig and again.pooling == 'cls'
  assert type(copy.deepcopy(FinetuneConfig(task='toy'))) is FinetuneConfig
  assert 'pooling' not in FinetuneConfig(task='sst2').to_dict() and 'data_dir' not in cfg.to_dict()
  with pytest.raises(ConfigError, match="task 'sst2' is configured by HeadTaskConfig, not RetrievalConfig"):
    dataclasses.replace(cfg, task='sst2')


def test_a_field_of_another_kind_is_one_line_naming_the_tasks_that_read_it():
  with pytest.raises(ConfigError) as e:
    FinetuneConfig(task='sst2', temperature=0.1, matryoshka_dims='64', beir_dir='/nonexistent')
  assert str(e.value) == ('temperature is a field of the retrieval, sparse and multivector tasks; matryoshka_dims is '
                          'a field of the retrieval task; beir_dir is a field of the retrieval, rerank, sparse and '
                          'multivector tasks; this run\'s task is sst2 (classification), which does not read them')
  with pytest.raises(ConfigError, match="pooling is a field of the retrieval task; this run's task is sst2 "
                                        r'\(classification\), which does not read it$'):
    FinetuneConfig(task='sst2', pooling='mean')  # even at its default: it is not sst2's field
  with pytest.raises(ConfigError, match="data_dir is a field of the GLUE, conll2003, squad and squad_v2 tasks; pack "
                                        "is a field of every task but rerank, sparse and multivector; this run's "
                                        'task is rerank, which does not read them'):
    FinetuneConfig.from_dict({'task': 'rerank', 'data_dir': 'glue/sst2', 'pack': False})
  with pytest.raises(ConfigError, match=r"eval_file is a field of every head task \(classification, tagging and QA\); "
                                        "this run's task is sparse, which does not read it$"):
    FinetuneConfig.from_dict({'task': 'sparse', 'eval_file': 'dev.tsv'})
  with pytest.raises(ConfigError, match=r'unknown config key\(s\): pooling_mode'):  # a typo stays a typo
    FinetuneConfig.from_dict({'task': 'retrieval', 'pooling_mode': 'cls'})
  with pytest.raises(ConfigError, match='learning_rate is now optim.learning_rate'):
    FinetuneConfig.from_dict({'task': 'sst2', 'learning_rate': 1e-5})
  with pytest.raises(ConfigError, match="unknown task 'sst3'"):
    FinetuneConfig(task='sst3').check_task_fields()


def test_a_saved_flat_config_keeps_its_own_kinds_fields():
  flat = {**HeadTaskConfig().to_dict(), **RetrievalConfig().to_dict(), 'task': 'retrieval', 'pooling': 'cls',
          'pack': True, 'eval_file': ''}  # one flat config held every kind's fields until 2026-12-07
  cfg = FinetuneConfig.from_dict(upgrade_saved({'finetune': flat})['finetune'])
  assert type(cfg) is RetrievalConfig and cfg.pooling == 'cls'
  head = FinetuneConfig.from_dict(upgrade_saved({**flat, 'task': 'rte', 'max_query_length': 40}))
  assert type(head) is HeadTaskConfig and head.max_query_length == 40 and head.task == 'rte'
  new = {'finetune': FinetuneConfig(task='sst2').to_dict()}
  assert upgrade_saved(new) is new
  # A retrieval config saved before it had `pack` (its batches were padded then) loads, packed: the same loss.
  earlier = {k: v for k, v in RetrievalConfig().to_dict().items() if k != 'pack'}
  assert FinetuneConfig.from_dict(upgrade_saved({'finetune': earlier})['finetune']).pack is True


def test_a_config_of_another_kind_with_its_task_changed_is_one_line():
  """A config file's variant made for sst2 with --config.task=retrieval (a sweep's task=retrieval): the fields are
  the other kind's throughout, so the one line says to start from a config of that task, not which 17 fields."""
  with pytest.raises(ConfigError, match="task 'retrieval' is configured by RetrievalConfig, but this config holds "
                                        "HeadTaskConfig's fields .* start from a config made for task 'retrieval'$"):
    FinetuneConfig.from_dict({**HeadTaskConfig().to_dict(), 'task': 'retrieval'})
  with pytest.raises(ConfigError, match=r'data_dir is a field of the GLUE'):  # a subclass checks with its own task
    RetrievalConfig.from_dict({'data_dir': 'x'})


def test_a_workdir_of_another_kind_is_refused_in_one_line():
  from bert_jax.config import check_resume  # pylint: disable=g-import-not-at-top
  from bert_jax.errors import CheckpointError  # pylint: disable=g-import-not-at-top
  old, new = HeadTaskConfig().to_dict(), RetrievalConfig().to_dict()
  with pytest.raises(CheckpointError, match=r'^w holds a sst2 run \(step 3\), configured by HeadTaskConfig; this '
                                            r"run's task retrieval is configured by RetrievalConfig: use a new "
                                            r'--workdir$'):
    check_resume(old, new, (), '', 'w', step=3)
  check_resume(old, HeadTaskConfig(task='rte').to_dict(), (), 'task', 'w')  # another head task: resume_allow
