"""experiments/cli.py in process: a mistyped --config field is one line naming the closest field."""

import os

import pytest

from helpers import assert_one_line_error, run_main, tree_digest


@pytest.mark.parametrize('script,flag,want', [
    ('pretrain.py', '--config.optim.learnin_rate=1e-3',
     'unknown field optim.learnin_rate in --config.optim.learnin_rate; did you mean optim.learning_rate?'),
    ('pretrain.py', '--config.optm.learning_rate=1e-3',
     'unknown field optm.learning_rate in --config.optm.learning_rate; did you mean optim.learning_rate?'),
    ('finetune.py', '--config.num_train_step=5',
     'unknown field num_train_step in --config.num_train_step; did you mean num_train_steps?'),
    ('pretrain.py', '--config.zzz=1', 'unknown field zzz in --config.zzz (the config file\'s fields'),
])
def test_a_mistyped_field_is_one_clean_line(tmp_path, script, flag, want):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  result = run_main(script, f'--workdir={workdir}', flag)
  assert_one_line_error(result, want)
  assert '\\' not in result.stderr  # no escaped quotes or literal \n
  assert tree_digest(str(workdir)) == before and os.listdir(workdir) == ['notes.txt']
