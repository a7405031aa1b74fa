"""The Workdir type: its layout, what kind of directory a path is, configs of earlier versions, and
remote (gs://) paths reaching Orbax as they were given."""

import json
import os
import sys
import types

import pytest

from bert_jax.config import FinetuneConfig, PretrainConfig
from bert_jax.runs import checkpoints
from bert_jax.errors import ConfigError, DataError
from bert_jax.runs.workdir import Workdir, inspect

from harness.inputs import FIXTURES


def test_layout_and_kind(tmp_path):
  wd = Workdir(str(tmp_path / 'run'))
  assert wd.kind is None and wd.seeds() == [] and wd.config() is None and wd.tokenizer_file() is None
  os.makedirs(wd.seed_dir(3))
  os.makedirs(wd.seed_dir(0))
  os.makedirs(os.path.join(wd.path, 'seed_x'))  # not a seed
  assert wd.seeds() == [0, 3] and wd.kind == 'finetuning'
  assert wd.checkpoints == os.path.join(os.path.abspath(wd.path), 'checkpoints')
  wd.write_results({'a': 1})
  with open(os.path.join(wd.path, 'final_metrics.json'), encoding='utf-8') as f:
    assert json.load(f) == {'a': 1}
  pre = Workdir(str(tmp_path / 'pre'))
  os.makedirs(pre.path)
  pre.write_config(PretrainConfig().to_dict())
  assert pre.kind == 'pretraining' and PretrainConfig.from_dict(pre.config()) == PretrainConfig()


def test_inspect_says_what_a_path_is_once_and_refuses_in_one_wording(tmp_path):
  def made(name, *entries, config=None):
    path = tmp_path / name
    path.mkdir()
    for entry in entries:
      (path / entry).mkdir() if '.' not in entry else (path / entry).write_text('{}')
    if config is not None:
      (path / 'config.json').write_text(json.dumps(config))
    return str(path)
  (tmp_path / 'a_file').write_text('x')
  cases = {
      str(tmp_path / 'absent'): (None, False, False), str(tmp_path / 'a_file'): (None, True, False),
      made('empty'): (None, True, True), made('unknown', 'notes.txt'): (None, True, True),
      made('pre', 'checkpoints', config=PretrainConfig().to_dict()): ('pretraining', True, True),
      made('killed_before_config', 'checkpoints'): ('pretraining', True, True),
      made('merged', 'checkpoints', 'merge.json', config=PretrainConfig().to_dict()): ('merge', True, True),
      made('tuned', 'seed_0', config={'finetune': {}, 'task': {}}): ('finetuning', True, True),
      made('seeds_only', 'seed_3'): ('finetuning', True, True),
      made('hf', 'model.safetensors', config={'model_type': 'bert'}): ('export', True, True),
      made('bad_json', 'checkpoints'): ('pretraining', True, True),
  }
  (tmp_path / 'bad_json' / 'config.json').write_text('{not json')  # unreadable: decided by what it holds
  for path, (kind, exists, is_dir) in cases.items():
    found = inspect(path)
    assert (found.kind, found.exists, found.is_dir) == (kind, exists, is_dir), path
    assert Workdir(path).kind == kind
  assert inspect(str(tmp_path / 'pre')).saved == PretrainConfig().to_dict()
  assert inspect(str(tmp_path / 'merged')).trained and not inspect(str(tmp_path / 'tuned')).trained
  assert inspect(str(tmp_path / 'tuned')).require('finetuning').kind == 'finetuning'
  assert inspect(str(tmp_path / 'absent')).require(None, 'pretraining').kind is None
  with pytest.raises(ConfigError, match=r'^merge source .*/hf is a Hugging Face directory, not a pretraining '
                     r'workdir or a merge of checkpoints; give a run$'):
    inspect(str(tmp_path / 'hf')).require('pretraining', 'merge', what='merge source', hint='give a run')
  with pytest.raises(ConfigError, match=r'/a_file is a file, not a fine-tuning workdir$'):
    inspect(str(tmp_path / 'a_file')).require('finetuning')
  with pytest.raises(ConfigError, match=r'/empty is a directory of no known kind, not a pretraining workdir$'):
    inspect(str(tmp_path / 'empty')).require('pretraining')
  with pytest.raises(ConfigError, match=r'/a_file is a file, not a new or empty directory$'):
    inspect(str(tmp_path / 'a_file')).require(None)
  odd = made('config_is_a_directory', 'checkpoints')
  os.makedirs(os.path.join(odd, 'config.json'))  # decided by what it holds; reading it: refused
  assert inspect(odd).kind == 'pretraining'
  with pytest.raises(DataError, match='config.json is a directory, not a regular file'):
    Workdir(odd).config()


def test_configs_of_earlier_versions_load_as_the_new_schema():
  wd = Workdir(os.path.join(FIXTURES, 'legacy', 'sst2'))  # written by 01d6c6b: flat fine-tuning fields
  with open(wd.file('config.json'), encoding='utf-8') as f:
    raw = json.load(f)
  assert raw['finetune']['learning_rate'] == 1e-4 and raw['finetune']['max_steps'] == 2 and 'model' in raw
  cfg = FinetuneConfig.from_dict(wd.config()['finetune'])
  assert (cfg.optim.learning_rate, cfg.optim.eps, cfg.optim.warmup_ratio, cfg.optim.warmup_steps) == (1e-4, 1e-8, 0.1, 0)
  assert cfg.num_train_steps == 2 and cfg.model.hidden_size == 32 and cfg.model.vocab_size == 300
  assert wd.kind == 'finetuning' and wd.seeds() == [0] and wd.tokenizer_file() is None  # it kept none
  assert Workdir(os.path.join(FIXTURES, 'legacy', 'pretrain')).tokenizer_file().endswith('tokenizer.model')


def test_a_remote_workdir_reaches_orbax_unchanged(monkeypatch):
  assert Workdir('gs://bucket/runs/a').checkpoints == 'gs://bucket/runs/a/checkpoints'
  seen = []

  class Stop(Exception):
    pass

  def manager(directory, **_):
    seen.append(directory)
    raise Stop
  monkeypatch.setattr(checkpoints.ocp, 'CheckpointManager', manager)
  monkeypatch.setitem(sys.modules, 'gcsfs', types.ModuleType('gcsfs'))  # the [gcs] extra, as if installed
  with pytest.raises(Stop):
    checkpoints.Checkpointer('gs://bucket/runs/a')
  assert seen == ['gs://bucket/runs/a/checkpoints']  # not os.path.abspath'd into ./gs:/bucket/...


def test_results_of_an_earlier_versions_squad_run_read_in_todays_scale(tmp_path):
  """final_metrics.json of SQuAD runs written in percents (before every metric became a fraction) read as
  fractions, seeds and v2.0's HasAns/NoAns included; thresholds, counts and other tasks' F1 untouched."""
  old = {'task': 'squad_v2', 'main_metric': 'eval_f1_mean', 'eval_f1_mean': 50.0, 'eval_f1_std': 2.0,
         'eval_f1_per_seed': [48.0, 52.0], 'eval_HasAns_exact_mean': 40.0, 'eval_best_f1_thresh_mean': -1.5,
         'eval_total_mean': 5.0, 'per_seed': [{'seed': 0, 'eval_f1': 48.0}, {'seed': 1, 'eval_f1': 52.0}]}
  wd = Workdir(str(tmp_path))
  wd.write_results(old)
  got = wd.results()
  assert got['eval_f1_mean'] == 0.5 and got['eval_f1_std'] == 0.02 and got['eval_f1_per_seed'] == [0.48, 0.52]
  assert got['eval_HasAns_exact_mean'] == 0.4 and [r['eval_f1'] for r in got['per_seed']] == [0.48, 0.52]
  assert (got['eval_best_f1_thresh_mean'], got['eval_total_mean'], got['main_metric']) == (-1.5, 5.0, 'eval_f1_mean')
  today = {**old, 'eval_f1_mean': 0.5, 'metric_scale': 'fraction'}
  wd.write_results(today)
  assert wd.results() == today
  mrpc = {'task': 'mrpc', 'main_metric': 'dev_f1', 'dev_f1': 0.81}
  wd.write_results(mrpc)
  assert wd.results() == mrpc
