"""The one fine-tuning job: what a fine-tuning run of any task kind brings to the run scaffold (`train.scaffold`).

`FinetuningJob` describes the starting checkpoint (its architecture and tokenizer), asks the config's task kind
(`finetuning.kinds`) to check the config, read its data and build its run, and trains each seed in
`workdir/seed_<n>/` (a run directory of the scaffold: resumed from its latest checkpoint, or evaluated only when
complete). Each seed logs metrics_train.jsonl and metrics_eval.jsonl and writes its final_metrics.json; the
workdir's holds every metric's per-seed values, mean and sample std (`seeds`).

Several processes (jax.distributed, started by the entry points' multi-host flags) run the same run: each reads
the whole task (fine-tuning sets are small, and this keeps every input decision local and identical), builds the
same host batch and feeds only its block of it (`distributed.process_batch_block`). Predictions come back
replicated, so every process scores them; process 0 alone prints and writes predictions, metrics and config.json,
while all of them save and restore the Orbax checkpoints together.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection

from bert_jax.config import FinetuneConfig, upgrade_saved
from bert_jax.data.tokenization import load_tokenizer
from bert_jax.errors import ConfigError
from bert_jax.finetuning import kinds, seeds
from bert_jax.interop.pretrained import NO_INIT_CHECKPOINT, describe, finetuning_tokenizer
from bert_jax.runs.workdir import Workdir
from bert_jax.train import scaffold


class FinetuningJob:
  """A fine-tuning run for the scaffold (`train.scaffold.Job`): one run directory per seed.

  Args:
    cfg: the run's config.
    explicit_model_fields: model fields the user set (as pretraining's); the rest of the model
      (its architecture, and its dropout unless given) is the starting checkpoint's.
    evaluation: only evaluate the workdir's checkpoints again; the starting checkpoint is not read
      (cfg.model is the one the run was fine-tuned with).
  """

  kind = 'finetuning'

  def __init__(self, cfg: FinetuneConfig, explicit_model_fields: Collection[str] = (), *, evaluation: bool = False):
    self.task = kinds.kind_of(cfg.task)(cfg, evaluation)
    self.preparing = self.task.preparing  # what the scaffold says while `prepare` runs
    if not evaluation and not cfg.init_checkpoint:
      raise ConfigError(NO_INIT_CHECKPOINT)
    self.cfg, self._evaluation, self._explicit_model_fields = cfg, evaluation, explicit_model_fields
    self._inputs_of: dict[str, _Inputs] = {}

  def validate(self, mesh, workdir: Workdir) -> None:
    self._inputs(mesh, workdir)

  def _inputs(self, mesh, workdir: Workdir) -> _Inputs:
    """The starting checkpoint, the config with its architecture, the tokenizer and the task's data, checked; read
    once per workdir (`validate` then `prepare`: the starting checkpoint is described, and its lines printed, once)."""
    if workdir.path in self._inputs_of:
      return self._inputs_of[workdir.path]
    cfg, source = self.cfg, None
    if not self._evaluation:  # the starting checkpoint sets the architecture
      source = describe(cfg.init_checkpoint, 'init_checkpoint')
      source.check_weights()
      cfg = dataclasses.replace(cfg, model=source.model_config(cfg.model, self._explicit_model_fields))
    self.task.check(cfg, mesh)
    saved = workdir.config()
    if saved is not None and not self._evaluation:
      scaffold.check_same_run(saved['finetune'], cfg, f'workdir {workdir.path}')
    tokenizer = self._tokenizer(cfg, source, workdir, saved)
    vocab = tokenizer.vocab_size
    if vocab > cfg.model.vocab_size:
      raise ConfigError(f'the tokenizer of {cfg.init_checkpoint} has {vocab} tokens but the model only '
                        f'{cfg.model.vocab_size} embeddings')
    self.task.read(cfg, saved)
    self._inputs_of[workdir.path] = _Inputs(cfg, source, tokenizer)
    return self._inputs_of[workdir.path]

  def _tokenizer(self, cfg: FinetuneConfig, source, workdir: Workdir, saved: dict[str, Any] | None):
    """The workdir's own tokenizer when it holds one (refused for training when the starting checkpoint's
    is no longer that one), else the starting checkpoint's."""
    if self._evaluation:
      return finetuning_tokenizer(workdir, saved)
    theirs, own = source.tokenizer(), workdir.tokenizer_file()
    if own is None:
      return theirs
    tokenizer = load_tokenizer(own)
    if tokenizer.identity() != theirs.identity():
      raise ConfigError(f'the tokenizer of the starting checkpoint {cfg.init_checkpoint} is not the one this run '
                        f'was fine-tuned with ({own}): that path now holds another model. Restore it, or use a new '
                        '--workdir')
    return tokenizer

  def prepare(self, mesh, workdir: Workdir) -> scaffold.Prepared:
    inputs = self._inputs(mesh, workdir)
    cfg = inputs.cfg
    # The task's data first (featurised, read): a bad row is reported before the starting weights are read.
    run = self.task.prepare(cfg, inputs.tokenizer, mesh)
    params = None
    if inputs.source is not None:
      params, _ = inputs.source.params(None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
    return scaffold.Prepared(
        cfg=cfg, stages=(scaffold.Stage(run.total_steps, run.model),), main_metric=run.main_metric,
        tokenizer=inputs.tokenizer, saved_config=run.saved_config(), run_dirs=seeds.run_dirs(cfg, workdir),
        batches=run.batches, evaluate=run.evaluate,
        check_meta=lambda meta, run_dir: scaffold.check_same_run(upgrade_saved(meta['config']), cfg, run_dir,
                                                                 meta['step']),
        report=lambda seed, run_dir: run.report(seed, run_dir, workdir),
        results=run.results, run_done=lambda seed, run_dir, result: run.done(seed, run_dir, result, workdir),
        weights=None if params is None else (lambda: _starting_weights(run, params)),
        eval_first=run.eval_first and params is not None)


def _starting_weights(run, params: dict[str, Any]) -> dict[str, Any]:
  """What a run's model takes from the starting checkpoint: the encoder, or what its `starting_weights` chooses
  (the sparse kind: the masked-LM head too)."""
  choose = getattr(run, 'starting_weights', None)
  return choose(params) if choose else {'bert': params['bert']}


@dataclasses.dataclass(frozen=True)
class _Inputs:
  """What a fine-tuning run starts from, checked: its config (the starting checkpoint's architecture), that
  checkpoint (None when evaluating again) and the tokenizer."""

  cfg: FinetuneConfig
  source: Any
  tokenizer: Any
