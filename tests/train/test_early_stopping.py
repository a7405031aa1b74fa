"""Early stopping (train.early_stopping, fit, the scaffold): Keras's patience count, kept in checkpoints; a run
that stops early reports where and why, keeps its best checkpoint and is finished when started again."""

import json

import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.train.early_stopping import EarlyStopping

from harness.entry_points import assert_one_line_error, run_main


def _run(stopper, values):
  """The step each value is evaluated at (10, 20, ...) and whether the run stops there."""
  return [stopper.update(10 * (i + 1), {stopper.metric: v, 'other': 0.0}) for i, v in enumerate(values)]


def test_patience_counts_evaluations_without_an_improvement_above_min_delta():
  stopper = EarlyStopping('dev_accuracy', patience=2, min_delta=0.01)
  assert _run(stopper, [0.5, 0.7, 0.705, 0.709]) == [False, False, False, True]  # +0.005, +0.009: not above 0.01
  assert (stopper.best, stopper.best_step, stopper.stopped_at) == (0.7, 20, 40)
  assert stopper.result() == {'stopped_early': True, 'stop_step': 40, 'stop_reason': (
      'dev_accuracy did not improve by more than 0.01 for 2 evaluations (best 0.7000 at step 20)')}
  loss = EarlyStopping('dev_loss', patience=1)  # a loss improves downwards
  assert _run(loss, [2.0, 1.5, 1.6]) == [False, False, True] and loss.best == 1.5
  again = EarlyStopping('dev_accuracy', patience=2, min_delta=0.01)
  half = EarlyStopping('dev_accuracy', patience=2, min_delta=0.01)
  _run(half, [0.5, 0.7, 0.705])
  again.restore({'early_stopping': half.state()})  # as from a checkpoint's meta: the count goes on
  assert again.update(40, {"dev_accuracy": 0.709}) and again.stopped_at == 40
  fresh = EarlyStopping('dev_f1', patience=2)
  fresh.restore({'early_stopping': half.state()})  # another metric's count is not this one's
  assert fresh.wait == 0 and fresh.best is None
  with pytest.raises(BertJaxError, match="early_stopping_metric='dev_f1' is not among the evaluation's metrics: "
                                         'dev_accuracy, other'):
    EarlyStopping('dev_f1', patience=1).update(10, {'dev_accuracy': 0.5, 'other': 1, 'note': 'x'})


def test_bad_early_stopping_settings_are_refused():
  with pytest.raises(ConfigError, match='must be >= 0'):
    FinetuneConfig(early_stopping_patience=-1)
  with pytest.raises(ConfigError, match='must be >= 0'):
    FinetuneConfig(early_stopping_patience=2, early_stopping_min_delta=-0.1)
  with pytest.raises(ConfigError, match='early stopping counts evaluations'):
    FinetuneConfig(early_stopping_patience=2, eval_every=0)
  assert FinetuneConfig(early_stopping_patience=2, eval_every=5).keep_best  # it keeps the best checkpoint


_ROWS = ['text,label'] + [f'{w} film number {i},{lab}' for i in range(12)
                          for w, lab in (('great', 'positive'), ('awful', 'negative'))]


@pytest.mark.slow
def test_a_run_stops_early_keeps_its_best_and_is_finished_when_started_again(tiny_checkpoint, tmp_path):
  train = tmp_path / 'train.csv'
  train.write_text('\n'.join(_ROWS) + '\n', encoding='utf-8')
  argv = ['--config=experiments/configs/finetune.py:classify', f'--workdir={tmp_path / "run"}',
          f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={train}', '--config.batch_size=8',
          '--config.max_seq_length=16', '--config.num_train_steps=40', '--config.eval_every=1',
          '--config.early_stopping_patience=2', '--config.early_stopping_min_delta=1.0']  # accuracy never beats that
  first = run_main('finetune.py', *argv)
  assert first.returncode == 0, first.stderr[-3000:]
  result = json.loads(first.stdout.strip().splitlines()[-1])
  assert (result['stopped_early'], result['stop_step'], result['step'], result['best_step']) == (True, 3, 3, 1)
  assert 'for 2 evaluations (best' in result['stop_reason'] and 'stopping early at step 3' in first.stdout
  again = run_main('finetune.py', *argv)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'stopped early at step 3 before' in again.stdout and 'training' not in again.stdout.split('stopped early')[1]
  rerun = json.loads(again.stdout.strip().splitlines()[-1])
  assert {k: rerun[k] for k in ('stop_step', 'best_step', 'dev_accuracy')} == \
      {k: result[k] for k in ('stop_step', 'best_step', 'dev_accuracy')}
  bad = run_main('finetune.py', *argv[:-2], '--config.early_stopping_patience=-1', f'--workdir={tmp_path / "bad"}')
  assert_one_line_error(bad, 'early_stopping_patience (-1)')
