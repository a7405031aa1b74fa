"""The run scaffold (`train.scaffold`) with a toy Job: a linear model on synthetic batches, no BERT, no data files.

What every kind of run gets from the scaffold: the workdir claimed (one run at a time), the init decision
(scratch, then resume after an interruption), fit, the final evaluation, final_metrics.json, and a signal
turned into a save and the preemption exit code.
"""

import json
import os
import signal

from flax import nnx
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import sharding as shd
from bert_jax.config import TrainingConfig
from bert_jax.errors import ConfigError, Preempted
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.runs.workdir import Workdir
from bert_jax.train import scaffold
from bert_jax.train.loop import Report
from bert_jax.train.preemption import EXIT_CODE
from bert_jax.train.step import StepModel

ROWS, FEATURES = 8, 4
TRUE_W = np.arange(1, FEATURES + 1, dtype=np.float32)[:, None] / FEATURES


class _Squared:
  """The toy objective: squared error of a linear map."""

  terms = ('task',)
  couples_rows = False

  def forward(self, module, batch, *, deterministic):
    del deterministic
    return module(batch['x'])[:, 0]

  def sums(self, outputs, batch):
    return {'task_loss_sum': jnp.sum(jnp.square(outputs - batch['y'])), 'task_count': jnp.float32(batch['y'].shape[0])}

  def counts(self, batch):
    return {'task': jnp.float32(batch['y'].shape[0])}

  def summarize(self, sums):
    return {'loss': sums['task_loss_sum'] / jnp.maximum(sums['task_count'], 1.0)}


def _batch(position: int) -> dict[str, np.ndarray]:
  """The batch at a data position: the same every time it is read (a resume reads on where it stopped)."""
  x = np.random.default_rng(position).normal(size=(ROWS, FEATURES)).astype(np.float32)
  return {'input_ids': np.zeros((ROWS, 2), np.int32), 'x': x, 'y': (x @ TRUE_W)[:, 0]}


class _Batches:
  """Synthetic batches from `position` on; `sigterm_at` sends this process SIGTERM when that batch is read."""

  def __init__(self, position: int, sigterm_at: int | None):
    self.position, self.sigterm_at = position, sigterm_at
    self.last_sizes = {'rows': ROWS, 'row_tokens': 2 * ROWS, 'real_tokens': 2 * ROWS, 'examples': ROWS}

  def __next__(self):
    batch = _batch(self.position)
    self.position += 1
    if self.position == self.sigterm_at:
      os.kill(os.getpid(), signal.SIGTERM)
    return batch


class ToyJob:
  """A `train.scaffold.Job`: the scaffold's whole contract, in the fewest lines."""

  kind = 'pretraining'  # a workdir of checkpoints/ with no model config: what `inspect` calls pretraining
  preparing = 'preparing the toy data'

  def __init__(self, cfg: TrainingConfig, sigterm_at: int | None = None):
    self.cfg, self.sigterm_at = cfg, sigterm_at

  def validate(self, mesh, workdir: Workdir) -> None:
    scaffold.check_batch_sizes(self.cfg, mesh)

  def prepare(self, mesh, workdir: Workdir) -> scaffold.Prepared:
    cfg = self.cfg
    model = StepModel(lambda rngs: nnx.Linear(FEATURES, 1, rngs=rngs), _Squared(), optax.sgd(0.1), mesh)
    held_out = _batch(10_000)

    def evaluate(params, step, output_dir):
      del step, output_dir
      w, b = np.asarray(params['kernel']), np.asarray(params['bias'])
      return {'loss': float(np.mean(np.square(held_out['x'] @ w + b - held_out['y'][:, None])))}

    return scaffold.Prepared(
        cfg=cfg, stages=(scaffold.Stage(cfg.num_train_steps, model),), main_metric='loss', tokenizer=_Tokenizer(),
        saved_config=cfg.to_dict(), run_dirs=((cfg.seed, workdir.path),),
        batches=lambda seed, position, step: _Batches(position, self.sigterm_at), evaluate=evaluate,
        check_meta=lambda meta, run_dir: None, report=lambda seed, run_dir: Report(run_dir, eval_keys=('loss',)),
        results=lambda per_run, wall_s: {k: v for k, v in per_run[0].items() if k != 'train_wall_s'})


class _Tokenizer:
  def save(self, directory):
    with open(os.path.join(directory, 'tokenizer.json'), 'w', encoding='utf-8') as f:
      f.write('{}')


def _cfg(**fields) -> TrainingConfig:
  return TrainingConfig(**{'num_train_steps': 6, 'batch_size': ROWS, 'eval_batch_size': ROWS, 'log_every': 2,
                           'eval_every': 0, 'checkpoint_every': 2, **fields})


def _params(workdir: str, step: int | None = None):
  model = StepModel(lambda rngs: nnx.Linear(FEATURES, 1, rngs=rngs), _Squared(), optax.sgd(0.1),
                    shd.make_mesh(_cfg().mesh))
  params, at = scaffold.restore_for_evaluation(workdir, model, step)
  return {k: np.asarray(v) for k, v in params.items()}, at


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """(workdir, result) of the toy run trained at once from scratch."""
  workdir = str(tmp_path_factory.mktemp('toy') / 'once')
  return workdir, scaffold.train(ToyJob(_cfg()), workdir)


def test_from_scratch_fits_evaluates_and_writes_results(uninterrupted):
  workdir, result = uninterrupted
  assert result['step'] == result['train_steps'] == result['train_steps_this_invocation'] == 6
  with open(os.path.join(workdir, 'final_metrics.json'), encoding='utf-8') as f:
    assert json.load(f) == result  # written last, from what the job's results made of the run's
  params, at = _params(workdir)
  assert at == 6 and result['loss'] == pytest.approx(_held_out_loss(params))  # the final evaluation is step 6's
  assert result['loss'] < _held_out_loss({'kernel': np.zeros((FEATURES, 1)), 'bias': np.zeros(1)})  # it learnt
  assert Workdir(workdir).config() is not None and os.path.isfile(os.path.join(workdir, 'tokenizer.json'))
  assert not os.path.exists(os.path.join(workdir, '.lock'))  # the claim ends with the run


def _held_out_loss(params) -> float:
  held_out = _batch(10_000)
  return float(np.mean(np.square(held_out['x'] @ params['kernel'] + params['bias'] - held_out['y'][:, None])))


def test_sigterm_saves_exits_and_the_rerun_resumes_bitwise(tmp_path, uninterrupted, capsys):
  workdir = str(tmp_path / 'run')
  with pytest.raises(Preempted, match=f'SIGTERM received: saved step 3.*exit code {EXIT_CODE}'):
    scaffold.train(ToyJob(_cfg(), sigterm_at=3), workdir)
  assert Checkpointer(workdir, read_only=True).latest_step() == 3
  assert not os.path.exists(os.path.join(workdir, 'final_metrics.json'))  # results only when the run ends
  capsys.readouterr()
  result = scaffold.train(ToyJob(_cfg()), workdir)  # the same command again: resumes at step 3
  assert 'resumed from' in capsys.readouterr().out and result['train_steps_this_invocation'] == 3
  ours, theirs = _params(workdir)[0], _params(uninterrupted[0])[0]
  assert all(np.array_equal(ours[k], theirs[k]) for k in ours)  # the data position and state continued exactly
  assert result['loss'] == uninterrupted[1]['loss']


def test_a_claimed_workdir_refuses_a_second_run(tmp_path):
  workdir = str(tmp_path / 'run')
  with Workdir(workdir).claim('pretraining'):
    with pytest.raises(ConfigError, match='in use by'):
      scaffold.train(ToyJob(_cfg()), workdir)
  with Workdir(workdir).claim('finetuning'):
    pass  # an empty workdir is still anyone's
  os.makedirs(os.path.join(workdir, 'seed_0'))
  with pytest.raises(ConfigError, match='is a finetuning directory'):  # a workdir of another kind: nothing written
    scaffold.train(ToyJob(_cfg()), workdir)


def _evaluations(calls):
  """Two toy kinds of evaluation: 'pretraining' (also a directory of no known kind) and 'finetuning'."""
  def evaluation(kinds, name, fields, options, scope):
    return scaffold.Evaluation(kinds, name, fields, options, scope,
                               run=lambda *args: calls.append((name, *args)) or name)
  return (evaluation(('pretraining', 'merge', None), 'pretraining', ('eval_batch_size',), ('all_steps', 'output_plot'),
                     'pretraining scope'),
          evaluation(('finetuning',), 'fine-tuning', ('eval_batch_size', 'eval_file'), ('output_dir',),
                     'fine-tuning scope'))


def _finetuning_workdir(tmp_path):
  """A directory `inspect` calls a fine-tuning workdir (its config.json has a 'finetune' block)."""
  finetuned = tmp_path / 'ft'
  finetuned.mkdir()
  (finetuned / 'config.json').write_text(json.dumps({'finetune': {}}))
  return finetuned


def test_evaluate_workdir_picks_the_evaluation_of_the_workdirs_kind(tmp_path):
  finetuned = _finetuning_workdir(tmp_path)
  calls = []
  evaluations = _evaluations(calls)
  result = scaffold.evaluate_workdir(str(finetuned), evaluations, 3, {'eval_file': 'x'}, {'output_dir': 'o'})
  assert result == 'fine-tuning'
  # A directory of no known kind goes to the first evaluation; options not given (false) are left out.
  assert scaffold.evaluate_workdir(str(tmp_path / 'new'), evaluations, None, {},
                                   {'all_steps': True, 'output_dir': None}) == 'pretraining'
  assert calls == [('fine-tuning', str(finetuned), 3, {'eval_file': 'x'}, {'output_dir': 'o'}),
                   ('pretraining', str(tmp_path / 'new'), None, {}, {'all_steps': True})]


def test_evaluate_workdir_refuses_another_kinds_options_and_fields(tmp_path):
  finetuned = _finetuning_workdir(tmp_path)
  calls = []
  evaluations = _evaluations(calls)
  with pytest.raises(ConfigError, match='^--all_steps and --output_plot apply to pretraining workdirs; fine-tuning '
                     'scope$'):
    scaffold.evaluate_workdir(str(finetuned), evaluations, options={'all_steps': True, 'output_plot': 'p'})
  with pytest.raises(ConfigError, match='^--output_dir applies to fine-tuning workdirs; pretraining scope$'):
    scaffold.evaluate_workdir(str(tmp_path), evaluations, options={'output_dir': 'o'})
  with pytest.raises(ConfigError, match='^--config.eval_file apply to fine-tuning workdirs; a pretraining workdir '
                     'takes eval_batch_size$'):
    scaffold.evaluate_workdir(str(tmp_path), evaluations, overrides={'eval_file': 'x', 'eval_batch_size': 8})
  assert not calls


@pytest.mark.slow  # W&B starts its service process (seconds)
def test_tracking_sends_the_run_to_wandb_and_mlflow_and_a_resume_continues_it(tmp_path, monkeypatch):
  """runs/tracking.py through the scaffold: W&B's offline files and an MLflow file store get the config, the train
  and held-out metrics per step and the final ones; preempted and run again, it is the same tracked run."""
  pytest.importorskip('wandb')
  mlflow_tracking = pytest.importorskip('mlflow.tracking')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path / 'wandb_files'))
  monkeypatch.setenv('MLFLOW_TRACKING_URI', (tmp_path / 'mlruns').as_uri())
  monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')  # MLflow 3 keeps file stores behind this switch
  (tmp_path / 'wandb_files').mkdir()
  workdir = str(tmp_path / 'run')
  cfg = _cfg(tracking='wandb,mlflow', run_name='toy', eval_every=2)
  with pytest.raises(Preempted):
    scaffold.train(ToyJob(cfg, sigterm_at=3), workdir)
  result = scaffold.train(ToyJob(cfg), workdir)
  with open(os.path.join(workdir, 'tracking.json'), encoding='utf-8') as f:
    ids = json.load(f)
  client = mlflow_tracking.MlflowClient()
  (experiment,) = [e for e in client.search_experiments() if e.name == 'bert_jax']
  (tracked,) = client.search_runs([experiment.experiment_id])  # one run across the preemption
  assert tracked.info.run_id == ids['mlflow'] and tracked.info.run_name == 'toy'
  assert tracked.info.status == 'FINISHED' and tracked.data.params['num_train_steps'] == '6'
  assert [m.step for m in client.get_metric_history(ids['mlflow'], 'train/loss')] == [2, 4, 6]  # before and after
  assert tracked.data.metrics['final/loss'] == pytest.approx(result['loss'])
  assert tracked.data.metrics['eval/loss'] == pytest.approx(result['loss'])
  runs = sorted(d for d in os.listdir(tmp_path / 'wandb_files' / 'wandb') if d.startswith('offline-run-'))
  assert len(runs) == 2 and all(d.endswith(ids['wandb']) for d in runs)  # both invocations: one W&B run id
  # W&B's offline store is its binary run file, whose records hold the keys as written (no reader of it ships in
  # the wandb package any more): the preempted invocation logged steps and no final metrics, the second both.
  logged = [(tmp_path / 'wandb_files' / 'wandb' / d / f'run-{ids["wandb"]}.wandb').read_bytes() for d in runs]
  assert [b.count(b'final/loss') for b in logged] == [0, 1] and all(b'train/loss' in b and b'eval/loss' in b
                                                                     for b in logged)
  assert b'num_train_steps' in logged[0] and b'toy' in logged[0]  # the config and the run's name


def test_an_unknown_or_missing_tracking_service_is_one_error(tmp_path, monkeypatch):
  with pytest.raises(ConfigError, match="tracking='tensorboard': tensorboard is not one of wandb, mlflow"):
    _cfg(tracking='tensorboard')
  from bert_jax.runs import tracking  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tracking.importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(ConfigError, match=r"tracking='wandb': wandb is not installed: pip install wandb"):
    scaffold.train(ToyJob(_cfg(tracking='wandb')), str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')  # refused before anything is written
