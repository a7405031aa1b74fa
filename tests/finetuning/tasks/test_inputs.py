"""bert_jax.finetuning.tasks.inputs: every task's files checked from their first lines (exist, readable, the named
columns present) with the readers' own messages, before a run loads anything."""

from __future__ import annotations

import json
import os

import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning.kinds import kind_of
from bert_jax.finetuning.tasks.inputs import column_names

from harness.inputs import shared_data_or_skip


def check_inputs(cfg):
  """What `finetune` checks first: the run's kind's `check_inputs`."""
  kind_of(cfg.task).check_inputs(cfg)


def _write(tmp_path, name: str, text: str) -> str:
  path = tmp_path / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding='utf-8')
  return str(path)


def _refused(cfg, pattern: str, error=DataError) -> None:
  with pytest.raises(error, match=pattern):
    check_inputs(cfg)


def test_own_files_need_their_named_columns(tmp_path):
  train = _write(tmp_path, 'train.csv', 'review,label\n"Good, really",pos\nBad,neg\n')
  check_inputs(FinetuneConfig(task='classify', train_file=train, text_column='review'))
  _refused(FinetuneConfig(task='classify', train_file=train), r"train.csv:1: no column 'text'; the file has "
           r"'review', 'label' \(set --config.text_column")
  _refused(FinetuneConfig(task='regress', train_file=train, text_column='review', label_column='score'),
           "no column 'score'")
  _refused(FinetuneConfig(task='classify', train_file=train, text_column='review', text_pair_column='answer'),
           "no column 'answer'")
  # The eval file too, and the default text column's fallback ('sentence').
  dev = _write(tmp_path, 'dev.tsv', 'sentence\tlabel\nFine\tpos\n')
  check_inputs(FinetuneConfig(task='classify', train_file=dev, eval_file=dev))
  _refused(FinetuneConfig(task='classify', train_file=dev, eval_file=train), "dev|train.csv:1: no column 'text'")
  _refused(FinetuneConfig(task='multilabel', train_file=''), 'task multilabel reads your files: set '
           '--config.train_file')
  _refused(FinetuneConfig(task='classify', train_file=str(tmp_path / 'none.csv')), 'data file .*none.csv does not '
           'exist')
  _refused(FinetuneConfig(task='classify', train_file=_write(tmp_path, 'x.txt', 'a\n')), 'unknown file type')
  _refused(FinetuneConfig(task='classify', train_file=_write(tmp_path, 'empty.csv', '\n\n')), 'empty.csv is empty')
  os.mkdir(tmp_path / 'folder.csv')
  _refused(FinetuneConfig(task='classify', train_file=str(tmp_path / 'folder.csv')), 'is a directory, not a regular '
           'file')


def test_only_the_start_is_read(tmp_path):
  """A bad row further down is the task reader's to report when the run reads the whole file."""
  rows = _write(tmp_path, 'rows.jsonl', json.dumps({'text': 'a', 'label': 'x'}) + '\nnot json\n')
  check_inputs(FinetuneConfig(task='classify', train_file=rows))
  assert column_names(rows) == ['text', 'label']
  assert column_names(_write(tmp_path, 'q.csv', '"a\nb",c\n1,2\n')) == ['a\nb', 'c']  # a quoted header cell
  with pytest.raises(DataError, match=r'bad\.jsonl:2: not JSON'):  # as tables.records says it
    column_names(_write(tmp_path, 'bad.jsonl', '\nnot json\n'))
  with pytest.raises(DataError, match=r'latin1.tsv:1:4: not UTF-8 text \(byte 0xe9'):
    column_names(_latin1(tmp_path))


def _latin1(tmp_path) -> str:
  path = tmp_path / 'latin1.tsv'
  path.write_bytes('caf\xe9\tlabel\n'.encode('latin-1'))
  return str(path)


def test_tagging_and_qa_files(tmp_path):
  tagged = _write(tmp_path, 'tags.jsonl', json.dumps({'tokens': ['Paris'], 'ner': ['B-LOC']}) + '\n')
  check_inputs(FinetuneConfig(task='tag', train_file=tagged, label_column='ner'))
  _refused(FinetuneConfig(task='tag', train_file=tagged), "no column 'label'")
  check_inputs(FinetuneConfig(task='tag', train_file=_write(tmp_path, 'tags.conll', 'Paris B-LOC\n')))
  _refused(FinetuneConfig(task='tag', train_file=str(tmp_path / 'none.conll')), 'none.conll does not exist')
  questions = _write(tmp_path, 'qa.csv', 'question,passage,answers\nWho?,Ann did.,Ann\n')
  check_inputs(FinetuneConfig(task='qa', train_file=questions, text_pair_column='passage'))
  _refused(FinetuneConfig(task='qa', train_file=questions), "no column 'context'")
  _refused(FinetuneConfig(task='qa', train_file=str(tmp_path / 'dev.json')), 'SQuAD file .*dev.json does not exist')


def test_shipped_tasks_check_their_folders(tmp_path):
  _refused(FinetuneConfig(task='sst2', data_dir=str(tmp_path / 'nowhere')), 'GLUE file .*train.tsv does not exist; '
           'set data_dir')
  _write(tmp_path / 'rte', 'train.tsv', 'index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n')
  _write(tmp_path / 'rte', 'dev.tsv', 'index\tsentence1\tlabel\n0\ta\tentailment\n')
  _refused(FinetuneConfig(task='rte', data_dir=str(tmp_path / 'rte')), r'dev.tsv: the header lacks column\(s\) '
           'sentence2')
  _write(tmp_path / 'cola', 'train.tsv', 'src\t1\n')  # no header: columns by position
  _refused(FinetuneConfig(task='cola', data_dir=str(tmp_path / 'cola')), 'train.tsv:1: 2 tab-separated column')
  _refused(FinetuneConfig(task='conll2003', data_dir=str(tmp_path)), 'CoNLL file .*eng.train does not exist')
  _refused(FinetuneConfig(task='squad_v2', data_dir=str(tmp_path)), 'SQuAD file .*dev-v2.0.json does not exist')
  for task, folder in (('sst2', 'sst2'), ('rte', 'rte'), ('conll2003', 'conll2003'), ('squad', 'squad-v1.1')):
    check_inputs(FinetuneConfig(task=task, data_dir=shared_data_or_skip(folder)))


def test_retrieval_pairs_beir_set_and_sts_file(tmp_path):
  pairs = _write(tmp_path, 'pairs.jsonl', json.dumps({'query': 'q', 'positive': 'p', 'negative': 'n'}) + '\n')
  beir = tmp_path / 'beir'
  for name in ('corpus.jsonl', 'queries.jsonl', 'qrels/test.tsv'):
    _write(beir, name, 'x\n')
  ok = dict(task='retrieval', train_file=pairs, beir_dir=str(beir))
  check_inputs(FinetuneConfig(**ok, negative_columns='negative'))
  _refused(FinetuneConfig(**ok, negative_columns='hard'), r"pairs.jsonl:1: no column 'hard'; the file has 'query', "
           "'positive', 'negative'")
  _refused(FinetuneConfig(**{**ok, 'beir_dir': str(tmp_path / 'nobeir')}), 'BEIR directory .*nobeir does not exist')
  _refused(FinetuneConfig(**ok, beir_split='dev'), "qrels file of beir_split='dev' .*dev.tsv does not exist")
  _refused(FinetuneConfig(**{**ok, 'beir_dir': ''}), 'set --config.beir_dir', ConfigError)
  sts = _write(tmp_path, 'sts.csv', 'a,b,score\nx,y,1\n')
  check_inputs(FinetuneConfig(**ok, sts_file=sts, sts_columns='a,b,score'))
  _refused(FinetuneConfig(**ok, sts_file=sts), "sts.csv:1: no column 'sentence1'.*--config.sts_columns")


def test_remote_paths_are_left_to_their_readers():
  check_inputs(FinetuneConfig(task='classify', train_file='gs://bucket/train.csv'))
  check_inputs(FinetuneConfig(task='sst2', data_dir='gs://bucket/sst2'))  # nothing opened: no network needed


def test_the_config_knows_every_task_by_its_kind():
  """The head tasks' config type names every task the head tasks' registry has, and no other."""
  from bert_jax.config import HeadTaskConfig  # pylint: disable=g-import-not-at-top
  from bert_jax.config.finetune import task_kind  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.tasks import get_task, task_names  # pylint: disable=g-import-not-at-top
  assert set(task_names()) == set(HeadTaskConfig.TASKS)
  heads = {'classification': {'classification', 'regression', 'multilabel'}, 'tagging': {'token'}, 'qa': {'span'}}
  for name in task_names():
    assert get_task(name).kind in heads[task_kind(name)], name
