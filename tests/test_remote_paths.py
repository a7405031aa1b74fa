"""gs:// and s3:// paths need an optional install (setup.cfg extras gcs, s3): without it, one error line naming
the install command, before any work; with it, the check lets them through. The package is removed by a
patched import (sys.modules[name] = None), so the tests hold whether or not it is installed here."""

import os
import sys
import types

import pytest

from bert_jax import files
from bert_jax.data import readers
from bert_jax.errors import ConfigError
from bert_jax.runs.checkpoints import Checkpointer

from helpers import assert_one_line_error, run_main, tree_digest


@pytest.fixture
def missing(monkeypatch):
  for name in ('gcsfs', 's3fs'):
    monkeypatch.setitem(sys.modules, name, None)  # `import gcsfs` raises ImportError


def test_a_remote_path_without_its_package_is_one_line(missing):
  with pytest.raises(ConfigError, match=r'--workdir gs://b/run is on gs://, which needs the gcsfs package: '
                     r'python3 -m pip install -e "\.\[gcs\]"'):
    files.check_remote('gs://b/run', '--workdir')
  with pytest.raises(ConfigError, match=r'needs the s3fs package: python3 -m pip install -e "\.\[s3\]"'):
    files.check_remote('/local/a.txt,s3://b/corpus/*.txt', 'corpus')
  for local in ('/tmp/run', 'relative/run', 'file:///tmp/run', 'memory://x', 'notgs://x'):
    files.check_remote(local, 'path')  # no package needed
  with pytest.raises(ConfigError, match='gcsfs'):  # the library's own entry points check too
    Checkpointer('gs://b/run', read_only=True)
  with pytest.raises(ConfigError, match='s3fs'):
    readers.resolve_files('s3://b/corpus.txt')


def test_with_the_package_installed_the_check_passes(monkeypatch):
  monkeypatch.setitem(sys.modules, 'gcsfs', types.ModuleType('gcsfs'))
  files.check_remote('gs://b/run', '--workdir')


def test_entry_points_say_it_before_any_work(missing, tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'keep.txt').write_text('a user file')
  before = tree_digest(tmp_path)
  for argv, pattern in (
      (['pretrain.py', '--workdir=gs://bucket/run', '--config=experiments/configs/pretrain.py:tiny'],
       '--workdir gs://bucket/run is on gs://'),
      (['pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
        '--config.data.train_files=s3://bucket/corpus.txt'], '--config.data.train_files s3://bucket/corpus.txt'),
      (['evaluate.py', '--workdir=gs://bucket/run'], 'pip install -e ".[gcs]"'),
      (['merge.py', '--sources=gs://bucket/a,gs://bucket/b', f'--workdir={tmp_path}/m'], 'needs the gcsfs package'),
  ):
    assert_one_line_error(run_main(*argv), pattern)
  assert tree_digest(tmp_path) == before and sorted(os.listdir(tmp_path)) == ['run']
