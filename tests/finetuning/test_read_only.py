"""A read-only fine-tuning workdir (shared, archived) is evaluated again without a write inside it: the results
go to stdout and to --output_dir when given, with one line saying the workdir is read-only."""

import json
import os
import shutil
import subprocess

import pytest

from bert_jax.errors import ConfigError
from bert_jax.finetuning import finetune_run as finetuning

from harness.digests import tmpfs, tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import FIXTURES, shared_data_or_skip


@pytest.fixture
def read_only(tmp_path):
  """The legacy fixtures (pretrain/, sst2/: a 2-step fine-tuning run) on a tmpfs remounted read-only; the cwd."""
  data = shared_data_or_skip('sst2')
  with tmpfs(tmp_path / 'rofs', '16M') as fs:
    shutil.copytree(os.path.join(FIXTURES, 'legacy'), fs, dirs_exist_ok=True)
    os.symlink(os.path.dirname(data), os.path.join(fs, 'shared_data'))  # its config's data_dir is relative
    subprocess.run(['mount', '-o', 'remount,ro', fs], check=True)
    cwd = os.getcwd()
    os.chdir(fs)
    try:
      yield fs
    finally:
      os.chdir(cwd)  # before the unmount, which a cwd inside would block


def test_a_read_only_workdir_is_evaluated_into_output_dir(read_only, tmp_path, capsys):
  before = tree_digest(read_only)
  out = tmp_path / 'out'
  result = finetuning.evaluate_again('sst2', output_dir=str(out))
  said = [l for l in capsys.readouterr().out.splitlines() if 'read-only' in l]
  assert said == [f'warning: sst2 is read-only: nothing is written there; the results go to stdout and {out}']
  with open(out / 'eval_step2.json', encoding='utf-8') as f:
    assert json.load(f)['dev_accuracy'] == result['dev_accuracy']
  assert sorted(os.listdir(out / 'seed_0' / 'eval_step2')) == ['final_metrics.json', 'predictions_dev.tsv',
                                                               'report_dev.txt']
  # An output_dir inside the read-only workdir is refused before any model work.
  with pytest.raises(ConfigError, match='is not writable'):
    finetuning.evaluate_again('sst2', output_dir='sst2/again')
  assert tree_digest(read_only) == before


def _evaluate(*args):
  # In this process (its main, output and exit code), from the cwd: the fixture's relative paths.
  return run_main('evaluate.py', *args, cwd=os.getcwd())


@pytest.mark.slow
@pytest.mark.e2e
def test_evaluate_py_on_a_read_only_workdir(read_only, tmp_path):
  before = tree_digest(read_only)
  for extra in ([], [f'--output_dir={tmp_path}/out']):  # stdout only; stdout and the directory
    r = _evaluate('--workdir=sst2', *extra)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])['step'] == 2, r.stderr[-3000:]
    assert len([l for l in r.stdout.splitlines() if l.startswith('warning: sst2 is read-only')]) == 1
  assert os.path.isfile(tmp_path / 'out' / 'eval_step2.json')
  assert_one_line_error(_evaluate('--workdir=pretrain', f'--output_dir={tmp_path}/p'),
                        '--output_dir applies to fine-tuning workdirs')
  assert tree_digest(read_only) == before
