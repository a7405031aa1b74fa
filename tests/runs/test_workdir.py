"""The Workdir type: its layout, what kind of directory a path is, configs of earlier versions, and
remote (gs://) paths reaching Orbax as they were given."""

import json
import os
import sys
import types

import pytest

from bert_jax.config import FinetuneConfig, PretrainConfig
from bert_jax.runs import checkpoints
from bert_jax.runs.workdir import Workdir

from helpers import FIXTURES


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
