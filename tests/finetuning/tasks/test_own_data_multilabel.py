"""Multi-label classification on your own files (finetuning/tasks/own_data.py, kind 'multilabel'): a set of labels per
row, read from lists, JSON in a cell or comma-separated text; multi-hot features; the sigmoid loss
(finetuning/head_objective.py); fine-tuned in process, predicted and exported as a multi-label transformers model."""

import json

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.errors import DataError
from bert_jax.finetuning import batching
from bert_jax.finetuning import head_objective as objective
from bert_jax.finetuning.tasks import get_task, own_data
from harness.inputs import finetune_config
from harness.numerics import tolerance

_ROWS = [('The battery lasts all day and the screen is sharp', ['battery', 'screen']),
         ('The screen cracked in a week', ['screen']),
         ('Battery drains fast', ['battery']),
         ('Shipping was quick', []),
         ('Great screen, weak battery, slow shipping', ['battery', 'screen', 'shipping'])]


def _jsonl(path, rows):
  path.write_text(''.join(json.dumps({'text': t, 'label': l}) + '\n' for t, l in rows), encoding='utf-8')
  return str(path)


def test_label_sets_from_lists_json_cells_and_commas(tmp_path):
  csv_path = tmp_path / 'rows.csv'
  csv_path.write_text('text,label\n"a","[""x"", ""y""]"\n"b","y, z"\n"c",\n', encoding='utf-8')
  rows = own_data.read_rows(str(csv_path), own_data.Columns(), 'multilabel')
  assert [r.label for r in rows] == [('x', 'y'), ('y', 'z'), ()]
  rows = own_data.read_rows(_jsonl(tmp_path / 'rows.jsonl', _ROWS), own_data.Columns(), 'multilabel')
  assert [r.label for r in rows] == [tuple(l) for _, l in _ROWS]


@pytest.mark.parametrize('label,pattern', [({'x': 1}, 'needs a list of labels'), (['x', ''], 'a label must be'),
                                           ('[x, y', 'start like a JSON list')])
def test_bad_label_sets_are_one_error(tmp_path, label, pattern):
  path = tmp_path / 'bad.jsonl'
  path.write_text(json.dumps({'text': 'a', 'label': label}) + '\n', encoding='utf-8')
  with pytest.raises(DataError, match=rf'bad\.jsonl:1: .*{pattern}'):
    own_data.read_rows(str(path), own_data.Columns(), 'multilabel')


def test_features_are_multi_hot_and_the_loss_is_the_mean_sigmoid_cross_entropy(tmp_path, wordpiece):
  task = get_task('multilabel')
  cfg = finetune_config(task='multilabel', train_file=_jsonl(tmp_path / 't.jsonl', _ROWS),
                        eval_file=_jsonl(tmp_path / 'd.jsonl', _ROWS[:2]), max_seq_length=32)
  features = task.train_features(cfg, wordpiece)
  assert task.label_names == ['battery', 'screen', 'shipping'] and task.main_metric == 'micro_f1'
  np.testing.assert_array_equal(np.stack([f.label for f in features]),
                                [[1, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
  batch = batching.make_batch(features[:3], 'multilabel', batch_size=4, row_length=32, pack=False)
  assert batch['labels'].shape == (4, 3) and batch['labels'].dtype == np.float32
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
  expected = np.mean(optax.sigmoid_binary_cross_entropy(logits[:3], batch['labels'][:3]), axis=-1).mean()
  np.testing.assert_allclose(objective.task_loss('multilabel', logits, batch), expected, rtol=tolerance(np.float32, 9))
  (dev,) = task.eval_sets(cfg, wordpiece)
  perfect = [np.where(f.label > 0, 5.0, -5.0) for f in dev.features]  # logits agreeing with the gold sets
  assert task.evaluate(dev, perfect, None) == {'micro_f1': 1.0, 'macro_f1': 2 / 3, 'subset_accuracy': 1.0}


@pytest.mark.slow
def test_own_label_sets_fine_tune_predict_and_export(tiny_checkpoint, tmp_path):
  """Trained in process; predict.py names every label above one half with its sigmoid, and the exported model is
  a transformers multi-label classifier whose pipeline gives the same probabilities."""
  transformers = pytest.importorskip('transformers')
  from harness.entry_points import finetune_own_file, run_main  # pylint: disable=g-import-not-at-top
  workdir, export = tmp_path / 'work', tmp_path / 'hf'
  result = finetune_own_file('multilabel', workdir, tiny_checkpoint, _jsonl(tmp_path / 'train.jsonl', _ROWS * 4))
  assert result['main_metric'] == 'dev_micro_f1'
  names = ['battery', 'screen', 'shipping']
  with open(workdir / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task'] == {'name': 'multilabel', 'kind': 'multilabel', 'num_labels': 3, 'label_names': names}
  texts = [t for t, _ in _ROWS]
  to_predict = tmp_path / 'new.jsonl'
  to_predict.write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts), encoding='utf-8')
  predicted = run_main('predict.py', f'--workdir={workdir}', f'--input={to_predict}')
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  ours = [json.loads(line) for line in predicted.stdout.strip().splitlines()]
  assert all(o['labels'] == [n for n in names if o['probabilities'][n] > 0.5] for o in ours)
  exported = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={export}')
  assert exported.returncode == 0, exported.stderr[-3000:]
  config = transformers.AutoConfig.from_pretrained(str(export))
  assert config.problem_type == 'multi_label_classification' and config.id2label == dict(enumerate(names))
  theirs = transformers.pipeline('text-classification', model=str(export), top_k=None)(texts)
  for o, scores in zip(ours, theirs):
    close = tolerance(np.float32, 64, depth=2)  # torch against XLA: the tiny checkpoint's widest sums, 2 layers
    assert all(abs(s['score'] - o['probabilities'][s['label']]) <= close for s in scores), (scores, o)
