"""Overrides as text: FIELD=VALUE shell words, each set by its field's type, the result checked against its class."""

import pytest
from ml_collections import ConfigDict

from bert_jax.config import FinetuneConfig, apply_overrides, parse_overrides
from bert_jax.errors import ConfigError


def test_words_are_split_as_a_shell_splits_them():
  assert parse_overrides('w', "a.b=1 data.train_files='/my data/x.txt' c=") == (
      ('a.b', '1'), ('data.train_files', '/my data/x.txt'), ('c', ''))
  for text, pattern in (('objective', "w: 'objective' is not FIELD=VALUE"), ('--a=1', 'is not FIELD=VALUE'),
                        ("a='/my data", 'w: No closing quotation')):
    with pytest.raises(ConfigError, match=pattern):
      parse_overrides('w', text)


def test_each_value_takes_its_fields_type_and_the_config_is_checked():
  cfg = ConfigDict(FinetuneConfig().to_dict())
  apply_overrides(cfg, (('num_train_steps', '40'), ('optim.learning_rate', '1e-3'), ('shuffle', 'false')),
                  FinetuneConfig, 'task')
  assert (cfg.num_train_steps, cfg.optim.learning_rate, cfg.shuffle) == (40, 1e-3, False)
  for override, pattern in ((('num_train_steps', 'many'), "task: num_train_steps='many' is not a int"),
                            (('shuffle', 'maybe'), "shuffle='maybe' is not a bool"),
                            (('optim.lr', '1'), 'task: the config has no field optim.lr'),
                            (('learning_rate', '1'), r'no field learning_rate \(it is now optim.learning_rate\)'),
                            (('optim', '1'), 'optim is not a single value'),
                            (('num_train_steps', '-5'), 'task: num_train_steps must be >= 0')):
    with pytest.raises(ConfigError, match=pattern):
      apply_overrides(ConfigDict(FinetuneConfig().to_dict()), (override,), FinetuneConfig, 'task')
