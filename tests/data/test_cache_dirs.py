"""Where prepared corpora go (bert_jax/data/cache_identity.py `cache_dirs`): the user's cache directory by
default, and a corpus that an earlier version prepared in data/cache is found there, not prepared again."""

import dataclasses
import os

from bert_jax.data import cache_identity, prepare
from harness.inputs import SMALL_VOCAB, small_data_config


def test_the_default_is_the_user_cache_directory(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'data', 'cache')
  monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's data/cache, then the working directory's
  assert cache_identity.cache_dirs('') == [str(tmp_path / 'xdg' / 'bert_jax'), checkout, os.path.join('data', 'cache')]
  monkeypatch.chdir(os.path.dirname(os.path.dirname(checkout)))  # in the checkout the two earlier places are one
  assert cache_identity.cache_dirs('') == [str(tmp_path / 'xdg' / 'bert_jax'), checkout]
  monkeypatch.delenv('XDG_CACHE_HOME')
  assert cache_identity.cache_dirs('')[0] == os.path.join(os.path.expanduser('~'), '.cache', 'bert_jax')
  assert cache_identity.cache_dirs('/corpora/cache') == ['/corpora/cache']  # a given directory is the only one


def test_a_cache_of_the_earlier_default_place_is_reused(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  cfg = small_data_config(str(tmp_path))
  earlier = prepare.prepare_pretraining_data(dataclasses.replace(cfg, cache_dir='data/cache'),
                                             vocab_size=SMALL_VOCAB, seed=0)
  logged = []
  again = prepare.prepare_pretraining_data(dataclasses.replace(cfg, cache_dir=''), vocab_size=SMALL_VOCAB, seed=0,
                                           log=logged.append)
  assert again.dir == earlier.dir == os.path.join('data', 'cache', os.path.basename(earlier.dir))
  assert logged == [f'prepared data: reusing {earlier.dir}'] and not (tmp_path / 'xdg').exists()
  fresh = prepare.prepare_pretraining_data(dataclasses.replace(cfg, cache_dir=''), vocab_size=SMALL_VOCAB, seed=1)
  assert os.path.dirname(fresh.dir) == str(tmp_path / 'xdg' / 'bert_jax')  # new data: the user's cache directory
