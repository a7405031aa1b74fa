"""Workdirs written by an earlier bert_jax (tests/fixtures/legacy, built by 01d6c6b) still work with this one:
predict, export, fill-mask, evaluate, evaluate again, and serve as init_checkpoint. The fixtures use relative
paths, so each test runs the entry points from a copy of the fixture folder (in this process: their main, output
and exit code, as a command would give them)."""

import json
import os
import shutil

import pytest

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import FIXTURES, REPO, minilm_dir_or_skip, shared_data_or_skip, write_small_corpus

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture
def legacy(tmp_path):
  """A copy of the legacy fixtures (pretrain/, sst2/) with their corpus and shared_data beside them."""
  root = tmp_path / 'legacy'
  shutil.copytree(os.path.join(FIXTURES, 'legacy'), root)
  write_small_corpus(root)  # corpus.txt: the pretraining run's data.train_files
  os.symlink(os.path.dirname(shared_data_or_skip('sst2')), root / 'shared_data')
  return root


def _run(root, script, *args):
  return run_main(script, *args, cwd=root)


def test_predict_reads_an_old_workdir_with_one_warning(legacy):
  before = tree_digest(legacy / 'sst2')
  r = _run(legacy, 'predict.py', '--workdir=sst2', '--text=A gripping, funny film.')
  assert r.returncode == 0, r.stderr[-3000:]
  warnings = [l for l in r.stderr.splitlines() if l.startswith('warning:')]
  assert len(warnings) == 1 and 'holds no tokenizer of its own' in warnings[0] and 'pretrain' in warnings[0]
  assert json.loads(r.stdout.strip().splitlines()[-1])['label'] in ('0', '1')
  assert tree_digest(legacy / 'sst2') == before
  # Its starting checkpoint replaced by another model: refused in one line instead of NaN probabilities.
  os.rename(legacy / 'pretrain', legacy / 'pretrain.orig')
  os.symlink(minilm_dir_or_skip(), legacy / 'pretrain')  # 30,522 WordPiece tokens for the model's 300 rows
  assert_one_line_error(_run(legacy, 'predict.py', '--workdir=sst2', '--text=A film.'), 'now holds another model')
  os.remove(legacy / 'pretrain')
  assert_one_line_error(_run(legacy, 'predict.py', '--workdir=sst2', '--text=A film.'), 'is gone')
  assert tree_digest(legacy / 'sst2') == before


def test_old_workdirs_export_fill_masks_and_evaluate(legacy, tmp_path):
  before = {d: tree_digest(legacy / d) for d in ('pretrain', 'sst2')}
  r = _run(legacy, 'export_hf.py', '--checkpoint=sst2', f'--output={tmp_path / "hf_sst2"}')
  assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])['task'] == 'sst2', r.stderr[-3000:]
  r = _run(legacy, 'export_hf.py', '--checkpoint=pretrain', f'--output={tmp_path / "hf_pretrain"}')
  assert r.returncode == 0, r.stderr[-3000:]
  r = _run(legacy, 'fill_mask.py', '--checkpoint=pretrain', '--text=the [MASK] of the song')
  assert r.returncode == 0 and r.stdout.startswith('[MASK] 1: '), r.stderr[-3000:]
  r = _run(legacy, 'evaluate.py', '--workdir=pretrain')
  assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])['step'] == 2, r.stderr[-3000:]
  assert {d: tree_digest(legacy / d) for d in ('pretrain', 'sst2')} == before


def test_old_workdirs_evaluate_again_and_start_new_runs(legacy):
  r = _run(legacy, 'evaluate.py', '--workdir=sst2')
  assert r.returncode == 0, r.stderr[-3000:]
  with open(legacy / 'sst2' / 'eval_step2.json', encoding='utf-8') as f:
    with open(legacy / 'sst2' / 'final_metrics.json', encoding='utf-8') as g:
      assert json.load(f)['dev_accuracy'] == json.load(g)['dev_accuracy']  # the same weights, the same tokenizer
  r = _run(legacy, 'finetune.py', '--workdir=sst2_again', f'--config={REPO}/experiments/configs/finetune.py:sst2',
           '--config.init_checkpoint=pretrain', '--config.data_dir=shared_data/sst2', '--config.num_train_steps=2',
           '--config.max_train_samples=32', '--config.max_seq_length=32')
  assert r.returncode == 0, r.stderr[-3000:]
  # From the fine-tuned encoder, with what fine-tuning gained from the shared schema: LAMB, accumulation.
  r = _run(legacy, 'finetune.py', '--workdir=sst2_from_sst2', f'--config={REPO}/experiments/configs/finetune.py:sst2',
           '--config.init_checkpoint=sst2', '--config.data_dir=shared_data/sst2', '--config.num_train_steps=2',
           '--config.max_train_samples=32', '--config.max_seq_length=32', '--config.optim.name=lamb',
           '--config.optim.grad_accum_steps=2')
  assert r.returncode == 0, r.stderr[-3000:]
  with open(legacy / 'sst2_from_sst2' / 'config.json', encoding='utf-8') as f:
    saved = json.load(f)['finetune']
  assert (saved['optim']['name'], saved['optim']['grad_accum_steps'], saved['model']['hidden_size']) == ('lamb', 2, 32)
  r = _run(legacy, 'pretrain.py', '--workdir=from_sst2', f'--config={REPO}/experiments/configs/pretrain.py:tiny',
           '--config.init_checkpoint=sst2', '--config.data.train_files=corpus.txt', '--config.data.cache_dir=cache',
           '--config.data.eval_fraction=0.4', '--config.num_train_steps=2')
  assert r.returncode == 0, r.stderr[-3000:]
  assert 'initialised from finetuning checkpoint sst2 step 2' in r.stdout
