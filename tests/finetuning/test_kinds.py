"""The task kinds are the one extension point: a toy kind, one class here and one row of `kinds.KINDS`, trains,
checkpoints and resumes in the one fine-tuning job with nothing else changed."""

import json
import os
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError
from bert_jax.finetuning import head_tasks, kinds, retrieval, seeds
from bert_jax.finetuning.job import FinetuningJob
from bert_jax.model.encoder import BertEncoder
from bert_jax.train import scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel

TEXTS = ['one', 'one two', 'one two three', 'one two three four', 'a b', 'a b c d e', 'x', 'x y z']


class _LengthHead(nnx.Module):
  """The encoder, and the number of words read off its [CLS] vector."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.bert = BertEncoder(cfg, rngs=rngs)
    self.out = nnx.Linear(cfg.hidden_size, 1, rngs=rngs)

  def __call__(self, batch, *, deterministic: bool):
    seq, _ = self.bert(batch['input_ids'], jnp.zeros_like(batch['input_ids']), batch['attention_mask'],
                       deterministic=deterministic)
    return self.out(seq[:, 0].astype(jnp.float32))[:, 0]


class _Squares:
  terms, couples_rows = ('toy',), False

  def forward(self, module, batch, *, deterministic):
    return module(batch, deterministic=deterministic)

  def sums(self, outputs, batch):
    w = batch['weights']
    return {'toy_loss_sum': jnp.sum(w * (outputs - batch['words']) ** 2), 'toy_count': jnp.sum(w)}

  def counts(self, batch):
    return {'toy': jnp.sum(batch['weights'])}

  def summarize(self, sums):
    return {'loss': sums['toy_loss_sum'] / jnp.maximum(sums['toy_count'], 1.0)}

  def eval_sums(self, outputs, batch, aux):
    del aux
    return self.sums(outputs, batch)

  def embed(self, module, batch, *, deterministic):
    raise NotImplementedError

  def head(self, module, embeddings):
    raise NotImplementedError


class _Batches:
  def __init__(self, host, start):
    self.host, self.position, self.last_sizes = host, start, None

  def __next__(self):
    self.position += 1
    self.last_sizes = {'rows': 8, 'examples': 8, 'row_tokens': int(self.host['attention_mask'].size),
                       'real_tokens': int(self.host['attention_mask'].sum())}
    return self.host

  def close(self):
    pass


class _Run:
  eval_first, main_metric = True, 'eval_mse'

  def __init__(self, cfg, tokenizer, mesh):
    self.cfg, self.total_steps = cfg, cfg.num_train_steps
    rows = [tokenizer.encode_inputs(t, None, max_length=8)[0] for t in TEXTS]
    ids = np.full((8, 8), tokenizer.pad_id, np.int32)
    for i, r in enumerate(rows):
      ids[i, :len(r)] = r
    self.host = {'input_ids': ids, 'attention_mask': (ids != tokenizer.pad_id).astype(np.int32),
                 'words': np.array([len(t.split()) for t in TEXTS], np.float32), 'weights': np.ones(8, np.float32)}
    self.model = StepModel(lambda rngs: _LengthHead(cfg.model, rngs=rngs), _Squares(), optax.sgd(0.01), mesh,
                           state_rng=lambda seed: jax.random.PRNGKey(seed))

  def batches(self, seed, position, step):
    del seed, step
    return _Batches(self.host, position)

  def evaluate(self, params, step, output_dir):
    del step, output_dir
    sums = self.model.eval_step(params, self.model.rest, self.model.global_batch(self.host), None)
    return {'eval_mse': float(sums['toy_loss_sum'] / sums['toy_count']), 'eval_wall_s': 0.0}

  def report(self, seed, run_dir, workdir):
    return Report(run_dir, label=f'seed {seed}: ', eval_keys=('eval_mse',), curves_dir=workdir.path,
                  curves_metrics=['eval_mse'])

  def done(self, seed, run_dir, result, workdir):
    del seed
    workdir.write_results(result, run_dir)

  def results(self, per_run, wall_s):
    del wall_s
    return {'task': 'toy', **seeds.summarize(per_run, self.main_metric)}

  def saved_config(self):
    return {'finetune': self.cfg.to_dict(), 'task': {'name': 'toy', 'kind': 'toy', 'num_labels': 0,
                                                     'label_names': []}}


class Toy:
  """A task kind of this test's: the number of words of a text, regressed from [CLS]."""

  preparing = 'reading the toy texts'

  @staticmethod
  def runs(task: str) -> bool:
    return task == 'toy'

  @staticmethod
  def check_inputs(cfg):
    del cfg  # its texts are this module's

  def __init__(self, cfg, evaluation: bool = False):
    del cfg
    self.evaluation, self.read_with = evaluation, None

  def check(self, cfg, mesh):
    scaffold.check_batch_sizes(cfg, mesh)

  def read(self, cfg, saved: dict[str, Any] | None):
    del cfg
    self.read_with = saved

  def prepare(self, cfg, tokenizer, mesh):
    return _Run(cfg, tokenizer, mesh)

  @staticmethod
  def plan(cfg, model, notes):
    del cfg, notes
    return 'encoder + word count', lambda: _LengthHead(model, rngs=nnx.Rngs(0))


def test_every_task_name_has_one_kind():
  from bert_jax.config.finetune import TASKS  # pylint: disable=g-import-not-at-top
  for task in TASKS:
    assert sum(k.runs(task) for k in kinds.KINDS) == 1, task
  assert kinds.kind_of('retrieval') is retrieval.Retrieval and kinds.kind_of('sst2') is head_tasks.HeadTasks
  with pytest.raises(ConfigError, match="unknown task 'toy'"):
    kinds.kind_of('toy')


@pytest.mark.slow
def test_a_new_kind_is_one_class_and_one_row(tiny_checkpoint, tmp_path, monkeypatch):
  monkeypatch.setattr(kinds, 'KINDS', kinds.KINDS + (Toy,))  # the one row
  cfg = FinetuneConfig(task='toy', init_checkpoint=tiny_checkpoint, num_train_steps=3, batch_size=8,
                       eval_batch_size=8, checkpoint_every=2, eval_every=0, max_seq_length=8)
  job = FinetuningJob(cfg)
  assert isinstance(job.task, Toy) and job.preparing == 'reading the toy texts'
  result = scaffold.train(job, str(tmp_path / 'run'))
  assert result['task'] == 'toy' and result['step'] == 3 and np.isfinite(result['eval_mse'])
  first = [json.loads(l) for l in open(os.path.join(tmp_path, 'run', 'seed_0', 'metrics_eval.jsonl'))]
  assert first[0]['step'] == 0 and first[-1]['eval_mse'] < first[0]['eval_mse']  # the starting encoder, then trained
  with open(os.path.join(tmp_path, 'run', 'config.json'), encoding='utf-8') as f:
    assert json.load(f)['task']['kind'] == 'toy'
  again = FinetuningJob(cfg)
  assert scaffold.train(again, str(tmp_path / 'run'))['eval_mse'] == result['eval_mse']  # finished: found done
  assert again.task.read_with['task']['name'] == 'toy'  # the kind read the workdir's saved config
