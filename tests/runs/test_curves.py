"""Run curves: drawn from metric JSONL files as a run leaves them (truncated, resumed, partial), or None."""

import json
import os

import matplotlib.image
import pytest

from bert_jax.errors import ConfigError
from bert_jax.runs import curves

from harness.digests import png_size


def _write_jsonl(path, records, tail=''):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
    f.write(tail)


def _train_records(steps, loss0=8.0, lr=True):
  return [{'step': s, 'time': 0.0, 'loss': loss0 / s, 'mlm_accuracy': s / 100, 'nsp_accuracy': 0.5 + s / 200,
           'tokens_per_s': 1000.0 + s, **({'learning_rate': 1e-3 * s} if lr else {})} for s in steps]


def test_run_curves_from_a_killed_and_resumed_run(tmp_path):
  workdir = str(tmp_path / 'run')
  # Steps 2..8 logged, killed at step 9 mid-line; resumed from step 4, logging 6 and 8 again (other values),
  # one line without a learning rate.
  train = _train_records([2, 4, 6, 8]) + _train_records([6, 8], loss0=4.0) + _train_records([10], lr=False)
  _write_jsonl(os.path.join(workdir, 'metrics_train.jsonl'), train, tail='{"step": 12, "loss": 0.')
  _write_jsonl(os.path.join(workdir, 'metrics_eval.jsonl'),
               [{'step': s, 'loss': 2.0, 'mlm_loss': 1.5, 'mlm_accuracy': 0.1, 'mlm_baseline_accuracy': 0.05,
                 'num_examples': 10} for s in (4, 8, 8)])
  records = curves.read_jsonl(os.path.join(workdir, 'metrics_train.jsonl'))
  assert len(records) == 7  # the truncated line is skipped
  steps, losses = curves.series(records, 'loss')
  assert steps.tolist() == [2, 4, 6, 8, 10] and losses.tolist() == [4.0, 2.0, 4.0 / 6, 0.5, 0.8]  # last wins
  assert curves.series(records, 'learning_rate')[0].tolist() == [2, 4, 6, 8]
  path = curves.plot_run_curves(workdir)
  assert path == os.path.join(workdir, 'curves.png')
  assert png_size(path) == (1200, 800)
  assert matplotlib.image.imread(path).shape == (800, 1200, 4)  # decodes whole
  assert 20_000 < os.path.getsize(path) < 1_000_000
  assert sorted(os.listdir(workdir)) == ['curves.png', 'metrics_eval.jsonl', 'metrics_train.jsonl']  # no .tmp


def test_run_curves_of_fine_tuning_seeds(tmp_path):
  for seed in (0, 1):
    seed_dir = str(tmp_path / f'seed_{seed}')
    _write_jsonl(os.path.join(seed_dir, 'metrics_train.jsonl'),
                 [{'step': s, 'loss': 1.0 / s, 'learning_rate': 1e-4, 'examples_per_s': 50.0} for s in (4, 8)])
    _write_jsonl(os.path.join(seed_dir, 'metrics_eval.jsonl'), [{'step': 8, 'dev_accuracy': 0.7 + seed / 10}])
  runs = curves._runs(str(tmp_path))  # pylint: disable=protected-access
  assert [label for label, _, _ in runs] == ['seed 0', 'seed 1']
  path = curves.plot_run_curves(str(tmp_path), metrics=['dev_accuracy'])
  assert png_size(path) == (1200, 800)


def test_run_curves_without_metrics_draw_nothing(tmp_path):
  assert curves.plot_run_curves(str(tmp_path / 'missing')) is None
  _write_jsonl(str(tmp_path / 'metrics_train.jsonl'), [])  # empty
  _write_jsonl(str(tmp_path / 'metrics_eval.jsonl'), [{'step': 1}], tail='{"step": 2, "lo')  # no values
  assert curves.plot_run_curves(str(tmp_path)) is None
  assert not os.path.exists(tmp_path / 'curves.png')


def test_eval_steps_plot(tmp_path):
  results = [{'step': s, 'mlm_accuracy': s / 10, 'mlm_loss': 5.0 - s / 10, 'loss': 5.5 - s / 10} for s in (4, 8)]
  path = curves.plot_eval_steps(results, str(tmp_path / 'out' / 'steps.png'), 'two checkpoints')
  assert png_size(path) == (1200, 450)
  with pytest.raises(ConfigError, match='no held-out metric'):
    curves.plot_eval_steps([{'step': 4}], str(tmp_path / 'none.png'), 'x')
  assert not os.path.exists(tmp_path / 'none.png')


def test_a_run_in_phases_marks_where_each_phase_starts(tmp_path):
  with open(tmp_path / 'config.json', 'w') as f:  # phases in any order in the file: their own `order` counts
    json.dump({'phases': {'decay': {'order': 3, 'steps': 5}, 'stable': {'order': 1, 'steps': 20},
                          'extend': {'order': 2, 'steps': 10}}}, f)
  assert curves.phase_starts(str(tmp_path)) == [(20, 'extend'), (30, 'decay')]
  assert curves.phase_starts(str(tmp_path / 'none')) == []


def test_values_per_group_plot(tmp_path):
  """A panel of one value per group is a bar chart; a panel of seeds draws each seed and its median."""
  path = curves.plot_groups(['a', 'b'], [('one each', [[0.2], [0.3]]), ('seeds', [[0.8, 0.9], []])],
                            str(tmp_path / 'out' / 'groups.png'))
  assert png_size(path) == (704, 352)  # 3.2 in per panel at 110 dpi
  assert not os.path.exists(path + '.tmp')
