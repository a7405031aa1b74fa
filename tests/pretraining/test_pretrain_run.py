"""The pretraining loop end to end: metrics and checkpoints written, evaluation restores,
bitwise resume after kill -9, NaN stops without touching the last good checkpoint, and a
workdir of another model is refused untouched."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess

import jax
import numpy as np
import pytest

from bert_jax import config
from bert_jax.errors import CheckpointError
from bert_jax.pretraining import pretrain_run as pretraining
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train.loop import TrainingDivergedError

from harness.digests import restore_pretraining_state
from harness.entry_points import run_main
from harness.inputs import REPO, tiny_pretrain_config as tiny_config
from harness.processes import pretrain_flags, pretrain_subprocess


def _snapshot(workdir):
  """Every file under workdir with its bytes (to prove nothing was changed)."""
  out = {}
  for root, _, files in os.walk(workdir):
    for f in files:
      with open(os.path.join(root, f), 'rb') as fh:
        out[os.path.relpath(os.path.join(root, f), workdir)] = fh.read()
  return out


@pytest.mark.slow
def test_train_evaluate_and_restore(small_corpus, tmp_path):
  workdir = str(tmp_path / 'run')
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'))
  result = pretraining.train_and_evaluate(cfg, workdir)
  for key in ('step', 'mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss', 'mlm_baseline_accuracy'):
    assert key in result
  assert result['step'] == 6 and result['num_examples'] > 0
  assert Checkpointer(workdir, read_only=True).all_steps() == [2, 4, 6]
  lines = [json.loads(l) for l in open(os.path.join(workdir, 'metrics_train.jsonl'))]
  assert [l['step'] for l in lines] == [2, 4, 6]
  assert {'loss', 'mlm_accuracy', 'nsp_accuracy', 'learning_rate', 'grad_norm', 'tokens_per_s'} <= set(lines[0])
  assert os.listdir(os.path.join(workdir, 'tb', 'train'))
  assert os.path.exists(os.path.join(workdir, 'tokenizer.model'))  # a workdir is self-contained
  # Restoring the final checkpoint reproduces the run's final evaluation exactly.
  evaluated = pretraining.evaluate_checkpoint(workdir)
  assert evaluated['step'] == 6
  for key in ('mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss'):
    assert evaluated[key] == pytest.approx(result[key], abs=1e-6)
  assert pretraining.evaluate_checkpoint(workdir, step=2)['step'] == 2
  # Every checkpoint with one model: each step's result is exactly that of its own restore.
  every = pretraining.evaluate_all_checkpoints(workdir)
  assert [r['step'] for r in every] == [2, 4, 6]
  assert every[0] == pretraining.evaluate_checkpoint(workdir, step=2) and every[-1] == evaluated
  assert os.path.getsize(os.path.join(workdir, 'curves.png')) > 10_000  # drawn when training ended
  # Re-running a finished workdir resumes at the end: no training, same metrics.
  again = pretraining.train_and_evaluate(cfg, workdir)
  assert again['mlm_loss'] == pytest.approx(result['mlm_loss'], abs=1e-6)


# Kill -9 ourselves right after the save call of step 30 (its async write in flight).
_KILL_AFTER_SAVE_30 = """
import os, signal
from bert_jax.runs import checkpoints as checkpointing
save = checkpointing.Checkpointer.save
def killing_save(self, step, *a, **k):
  out = save(self, step, *a, **k)
  if step == 30:
    os.kill(os.getpid(), signal.SIGKILL)
  return out
checkpointing.Checkpointer.save = killing_save
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_resume_after_kill_9_is_bitwise(straight_pretraining, small_corpus, tmp_path):
  cache = str(tmp_path / 'cache')
  straight, resumed = straight_pretraining, str(tmp_path / 'resumed')
  # The kill -9 needs a process of its own; the resume runs in this one (the same command line, through run_main),
  # as did the uninterrupted run it is compared with (a shared fixture: the same flags and corpus).
  r = subprocess.run(pretrain_subprocess(small_corpus, cache, resumed, 40, _KILL_AFTER_SAVE_30), cwd=REPO,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
  steps_at_kill = Checkpointer(resumed, read_only=True).all_steps()
  assert steps_at_kill and max(steps_at_kill) in (10, 20, 30), steps_at_kill
  r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, resumed, 40))
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'resumed from' in r.stdout
  cfg = config.PretrainConfig.from_dict(json.load(open(os.path.join(straight, 'config.json'))))
  a, meta_a = restore_pretraining_state(straight, cfg, 40)
  b, meta_b = restore_pretraining_state(resumed, cfg, 40)
  assert meta_a['data_position'] == meta_b['data_position'] == 40
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)  # bitwise: params, both Adam moments, step, rng


def _copy_of_the_shared_run(pretrained_run, tmp_path):
  """(workdir, config) of a copy of the shared tiny run (it is read-only), its data cache in tmp_path too."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(pretrained_run.workdir, workdir)
  cache = str(tmp_path / 'cache')
  return workdir, dataclasses.replace(pretrained_run.cfg, data=dataclasses.replace(pretrained_run.cfg.data,
                                                                                   cache_dir=cache))


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_last_good_checkpoint(pretrained_run, tmp_path):
  workdir, cfg = _copy_of_the_shared_run(pretrained_run, tmp_path)  # 4 steps
  before = _snapshot(os.path.join(workdir, 'checkpoints'))
  bad = dataclasses.replace(cfg, num_train_steps=10, optim=config.OptimConfig(learning_rate=1e30, warmup_steps=0),
                            resume_allow='num_train_steps,optim')
  with pytest.raises(TrainingDivergedError, match='last good checkpoint \\(step 4\\) is kept'):
    pretraining.train_and_evaluate(bad, workdir)
  after = _snapshot(os.path.join(workdir, 'checkpoints'))
  assert after == before


@pytest.mark.slow
def test_workdir_of_another_model_is_refused_untouched(pretrained_run, tmp_path):
  workdir, cfg = _copy_of_the_shared_run(pretrained_run, tmp_path)
  before = _snapshot(workdir)
  other = dataclasses.replace(cfg, model=config.preset('tiny', vocab_size=1000, hidden_size=32))
  with pytest.raises(CheckpointError, match=r'hidden_size: 64 \(checkpoint\) vs 32 \(config\)'):
    pretraining.train_and_evaluate(other, workdir)
  assert _snapshot(workdir) == before


@pytest.mark.slow
def test_sop_span_and_schedule_run_reports_sop_and_resumes(small_corpus, tmp_path):
  workdir = str(tmp_path / 'run')
  data = dataclasses.replace(tiny_config(small_corpus, '').data, cache_dir=str(tmp_path / 'cache'), objective='sop',
                             masking='span', masked_lm_prob=0.3, masked_lm_prob_end=0.15, max_predictions_per_seq=0)
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'), data=data, num_train_steps=4)
  result = pretraining.train_and_evaluate(cfg, workdir)
  assert {'sop_accuracy', 'sop_loss', 'sop_baseline_accuracy'} <= set(result)
  assert not [k for k in result if k.startswith('nsp')]
  assert result['loss'] == pytest.approx(result['mlm_loss'] + result['sop_loss'], rel=1e-6)
  lines = [json.loads(l) for l in open(os.path.join(workdir, 'metrics_train.jsonl'))]
  assert all('sop_accuracy' in l and 'nsp_accuracy' not in l for l in lines)
  state, _ = restore_pretraining_state(workdir, cfg)
  assert set(state['params']) == {'bert', 'mlm', 'nsp'}  # SOP trains the two-way head
  more = pretraining.train_and_evaluate(dataclasses.replace(cfg, num_train_steps=6, resume_allow='num_train_steps'),
                                       workdir)
  assert more['step'] == 6


@pytest.mark.slow
def test_mlm_only_run_has_no_nsp_head_and_restores(small_corpus, tmp_path):
  from bert_jax.interop.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  data = dataclasses.replace(tiny_config(small_corpus, '').data, cache_dir=str(tmp_path / 'cache'), objective='none')
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'), data=data, num_train_steps=4)
  result = pretraining.train_and_evaluate(cfg, workdir)
  assert result['num_examples'] > 0 and result['loss'] == result['mlm_loss']
  assert not [k for k in result if k.startswith('nsp')]
  lines = [json.loads(l) for l in open(os.path.join(workdir, 'metrics_train.jsonl'))]
  assert lines and not [k for l in lines for k in l if k.startswith('nsp')]  # no meaningless NSP zeros
  assert os.path.exists(os.path.join(workdir, 'curves.png'))
  state, _ = restore_pretraining_state(workdir, cfg)
  assert set(state['params']) == {'bert', 'mlm'}  # no NSP head
  assert pretraining.evaluate_checkpoint(workdir)['mlm_accuracy'] == pytest.approx(result['mlm_accuracy'], abs=1e-6)
  assert load_pretrained(workdir).has_mlm_head  # fill-mask reads it
