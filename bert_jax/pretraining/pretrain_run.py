"""Pretraining: what a pretraining run brings to the one scaffold (`train.scaffold`), and evaluating its checkpoints.

Everything here is driven by a `PretrainConfig`; nothing reads flags. `train_and_evaluate` resolves
the starting checkpoint, then `train.scaffold.train` runs a `PretrainingJob`: the corpus prepared (or
its cache reused), BertForPreTraining under the masked-LM (+ NSP/SOP) objective, the loader's
batches from a data position, and the held-out evaluation with its baselines. A resumed run must
be the same run: the same config outside the fields free on resume, and the same data (the
prepared cache's fingerprint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Collection, Iterator

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import distributed, hardware, sharding as shd
from bert_jax.config import (DataConfig, ModelConfig, OptimConfig, PretrainConfig, architecture_diffs, facts,
                             upgrade_saved)
from bert_jax.data import loader as input_pipeline, mixture, prepare as pretraining_data, tokenization
from bert_jax.data.mixture import Mixture
from bert_jax.data.records import PreparedData
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError, UnusableCheckpoint
from bert_jax.interop.pretrained import Source
from bert_jax.model.attention import describe_attention
from bert_jax.model.heads import BertForPreTraining
from bert_jax.pretraining import init
from bert_jax.pretraining.objective import Pretraining
from bert_jax.runs import reporting
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.runs.workdir import CONFIG_FILE, Workdir, checkpoint_dir, inspect
from bert_jax.train import optim, scaffold
from bert_jax.train.loop import Report
from bert_jax.train.step import StepModel, reused

# What the progress and eval lines show (every metric goes to the JSONL files).
PROGRESS_KEYS = ('loss', 'mlm_accuracy', 'nsp_accuracy', 'sop_accuracy')
EVAL_KEYS = ('mlm_loss', 'mlm_accuracy', 'mlm_baseline_accuracy', 'nsp_loss', 'nsp_accuracy', 'sop_loss',
             'sop_accuracy')


def validate_config(cfg: PretrainConfig, mesh) -> None:
  """What needs the model or the mesh (the config checked the rest when it was built)."""
  scaffold.check_sequence_length(cfg, 'data.max_seq_length', cfg.data.max_seq_length, cfg.model)
  scaffold.check_batch_sizes(cfg, mesh)
  d, accum = cfg.data, cfg.optim.grad_accum_steps
  if d.pack:
    # Every data block (process) emits a multiple of pack_rows_multiple rows; the global rows are
    # split into grad_accum_steps micro-batches, each over all batch shards.
    shards, blocks = shd.num_batch_shards(mesh), distributed.process_batch_block(mesh)[1]
    if (d.pack_rows_multiple * blocks) % (accum * shards):
      raise ConfigError(f'data.pack_rows_multiple={d.pack_rows_multiple} x {blocks} process(es) must be a '
                        f'multiple of optim.grad_accum_steps={accum} x {shards} batch shards (mesh data x '
                        'fsdp): packed rows are split over both')


# Files whose contents the data fingerprint covers (the `fingerprinted` fact): read from elsewhere, the same data.
FINGERPRINTED = facts(PretrainConfig, 'fingerprinted')


def check_same_run(meta: dict[str, Any], cfg: PretrainConfig, fingerprint: str, where: str) -> None:
  """Refuses to resume a checkpoint (its `meta`) written by a run with another identity: another
  config outside the fields free on resume and `cfg.resume_allow`, or another data cache `fingerprint`."""
  old = {'phases': {}, **upgrade_saved(meta.get('config', {})), 'data_fingerprint': meta.get('data_fingerprint')}
  # The same fingerprint is the same data (it covers the files' contents and the tokenizer's): the
  # paths they were read from (the `fingerprinted` fact) may differ (a copied corpus, another mount point).
  same_data = FINGERPRINTED if old['data_fingerprint'] == fingerprint else ()
  try:
    scaffold.check_same_run(old, cfg, where, meta.get('step'), more_free=same_data,
                            extra_new={'data_fingerprint': fingerprint})
  except CheckpointError as e:
    if old['data_fingerprint'] == fingerprint or 'data_fingerprint' in cfg.resume_allow:
      raise
    raise CheckpointError(f'{e} (data_fingerprint: the prepared training data differs: another corpus or '
                          'tokenizer, or a cache of an earlier bert_jax, whose preparation changed: since 2026-11 '
                          'WordPiece treats special-token strings in the text as text; resuming on the new data '
                          'continues the run on other examples)') from None


def check_workdir(workdir: Workdir, cfg: PretrainConfig) -> None:
  """Refuses a workdir whose checkpoints belong to a different architecture (a merge: `workdir.check_kind`)."""
  saved = workdir.config()
  if saved is None:
    return
  diffs = architecture_diffs(saved.get('model', {}), cfg.model)
  if diffs:
    raise CheckpointError(f'workdir {workdir.path} holds checkpoints of another model ({"; ".join(diffs)}); '
                          'use a new --workdir or the same model config')


def pretraining_model(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, *, objective: str = 'nsp',
                      grad_accum_steps: int = 1, schedule=None, rules=shd.LOGICAL_AXIS_RULES) -> StepModel:
  """BertForPreTraining under the pretraining objective (`objective` as data.objective: the two-way
  head for 'nsp' and 'sop'), as a StepModel."""
  head, platform = objective != 'none', hardware.resolve(mesh=mesh)
  return StepModel(lambda rngs: BertForPreTraining(model_cfg, rngs=rngs, nsp_head=head, platform=platform),
                   Pretraining(objective), tx, mesh, grad_accum_steps=grad_accum_steps, schedule=schedule, rules=rules)


def build_model(cfg: PretrainConfig, mesh, total_steps: int) -> StepModel:
  """The run's model: `pretraining_model` with its optimizer, schedule (from the plan: a WSD decay from the first
  decay phase, if any, and each phase's peak) and accumulation."""
  return _run_model(cfg.model, cfg.optim, total_steps, cfg.plan.decay_start, cfg.plan.lr_levels, cfg.data.objective,
                    cfg.mesh.rules, mesh)


@reused  # a run of the same model, optimizer, schedule and mesh in this process reuses its steps
def _run_model(model_cfg: ModelConfig, optim_cfg: OptimConfig, total_steps: int, decay_start: int | None, levels,
               objective: str, rules: str, mesh) -> StepModel:
  return pretraining_model(model_cfg, optim.make_optimizer(optim_cfg, total_steps, decay_start, levels), mesh,
                           objective=objective, grad_accum_steps=optim_cfg.grad_accum_steps,
                           schedule=optim.learning_rate_schedule(optim_cfg, total_steps, decay_start, levels),
                           rules=shd.rules(rules))


def prepare_data(cfg: PretrainConfig) -> tuple[PreparedData | Mixture, input_pipeline.Vocab]:
  """Prepares (or reuses) the run's data, every process building its share of the units: one cache, or one
  per corpus of a mixture (data.train_weights), the first corpus's tokenizer tokenizing the others.

  Returns:
    The prepared cache (or `mixture.Mixture`) and what masking needs of its tokenizer.
  """
  if cfg.data.train_weights:
    parts, names = [], []
    for files, _ in cfg.data.mixture():
      data = dataclasses.replace(cfg.data, train_files=files, train_weights='',
                                 tokenizer=cfg.data.tokenizer or (parts[0].tokenizer_path if parts else ''))
      parts.append(prepare_data(dataclasses.replace(cfg, data=data))[0])
      names.append(files)
    prepared = Mixture(tuple(parts), tuple(share for _, share in cfg.data.mixture()), tuple(names))
    tokenizer = tokenization.load_tokenizer(prepared.tokenizer_path)
    return prepared, input_pipeline.Vocab.from_tokenizer(tokenizer, prepared.special_ids, cfg.data.masking)

  def sync(failed: bool) -> bool:  # a barrier that also tells whether any process failed
    if jax.process_count() == 1:
      return failed
    return bool(np.any(multihost_utils.process_allgather(np.int32(failed))))

  prepared = pretraining_data.prepare_pretraining_data(
      cfg.data, vocab_size=cfg.model.vocab_size, seed=cfg.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), sync=sync, log=reporting.log)
  tokenizer = tokenization.load_tokenizer(prepared.tokenizer_path)
  return prepared, input_pipeline.Vocab.from_tokenizer(tokenizer, prepared.special_ids, cfg.data.masking)


def prepare_phase_data(cfg: PretrainConfig, log: bool = False
                       ) -> dict[DataConfig, tuple[PreparedData | Mixture, input_pipeline.Vocab]]:
  """`prepare_data` of each data config of the plan's stages (`cfg.plan`), in order, keyed by it: stages that
  share a data config share a cache, and a tokenizer trained for the first phase tokenizes every later one (the
  same ids in every phase)."""
  data, trained = {}, None
  for phase in cfg.plan.stages:
    if phase.cfg.data not in data:
      if log:
        mix = ', '.join(f'{share:.0%} {files}' for files, share in phase.cfg.data.mixture())
        reporting.log(f'{phase.label}: data at max_seq_length={phase.cfg.data.max_seq_length}'
                      + (f', a mixture of {mix}' if mix else ''))
      own = phase.cfg
      if trained and not own.data.tokenizer:
        own = dataclasses.replace(own, data=dataclasses.replace(own.data, tokenizer=trained))
      data[phase.cfg.data] = prepare_data(own)
      trained = trained or data[phase.cfg.data][0].tokenizer_path
  return data


def _eval_iter(cfg: PretrainConfig, prepared, vocab, mesh) -> Iterator[dict[str, np.ndarray]]:
  dataset = mixture.open_split(prepared, 'eval', shared_eval=bool(cfg.data.eval_files))
  block, num_blocks = distributed.process_batch_block(mesh)
  return input_pipeline.eval_batches(dataset, batch_size=cfg.eval_batch_size, seed=cfg.seed, cfg=cfg.data,
                                     vocab=vocab, process_index=block, process_count=num_blocks,
                                     max_rows=cfg.max_eval_batches * cfg.eval_batch_size)


def loader_workers(cfg: PretrainConfig, mesh=None) -> int:
  """data.loader_workers, with -1 resolved: none on CPU (its cores train: `mesh`'s devices, else jax's default
  ones), else one per local accelerator up to half the host's cores."""
  if cfg.data.loader_workers >= 0:
    return cfg.data.loader_workers
  if hardware.resolve(mesh=mesh) == 'cpu':
    return 0
  return max(1, min(jax.local_device_count(), (os.cpu_count() or 2) // 2))


def evaluate(model: StepModel, params, batches, baseline_token: int) -> dict[str, float]:
  """Held-out MLM/NSP loss and accuracy over one pass of `batches`, plus the baselines."""
  totals = None
  for local in batches:
    sums = model.eval_step(params, model.rest, model.global_batch(local), jnp.int32(baseline_token))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    raise BertJaxError('the held-out split is empty')
  totals = jax.device_get(totals)
  out = {k: float(v) for k, v in model.objective.summarize(totals).items()}
  out['num_masked_tokens'] = int(totals['mlm_count'])
  out['num_examples'] = int(totals['num_sequences'])
  return out


# What a branch run may change of the run it continues (beside the fields free on resume; the `branch` fact):
# its phases and length, and the decay of its schedule; the data fingerprint covers every phase's records.
BRANCH_FREE = facts(PretrainConfig, 'branch') + ('data_fingerprint',)


class PretrainingJob:
  """A pretraining run for the scaffold (`train.scaffold.Job`): one run directory, the workdir itself.

  Args:
    cfg: the run's config (its starting checkpoint resolved: `init.resolve_init_checkpoint`).
    source: that starting checkpoint, or None.
  """

  kind = 'pretraining'
  preparing = 'preparing the data'

  def __init__(self, cfg: PretrainConfig, source: Source | None):
    self.cfg, self._source = cfg, source

  def validate(self, mesh, workdir: Workdir) -> None:
    for phase in self.cfg.plan.stages:
      try:
        validate_config(phase.cfg, mesh)
      except ConfigError as e:
        raise ConfigError(f'{phase.label}: {e}' if self.cfg.phases else str(e)) from None
    check_workdir(workdir, self.cfg)
    if self.cfg.branch_from and workdir.config() is None:  # a branch that has not started yet
      self._check_branch_point()

  def prepare(self, mesh, workdir: Workdir) -> scaffold.Prepared:
    cfg, source = self.cfg, self._source
    run = _PreparedRun(cfg, mesh)
    branch = None
    if cfg.branch_from:  # another run's checkpoint, continued (the scaffold's second init choice)
      branch = scaffold.Branch(cfg.branch_from, None if cfg.branch_step < 0 else cfg.branch_step, run.check_branch)
    return scaffold.Prepared(
        cfg=cfg, stages=run.stages(), main_metric='mlm_accuracy', tokenizer=run.tokenizer,
        saved_config=cfg.to_dict(), run_dirs=((cfg.seed, workdir.path),), batches=run.batches,
        evaluate=run.evaluate, check_meta=run.check_meta, report=lambda seed, run_dir: reporting_of(run_dir),
        results=_results, checkpoint_extra={'data_fingerprint': run.fingerprint},
        eval_first=source is not None,  # the starting weights' held-out metrics, before step 1
        branch=branch, weights=(lambda: init.initial_params(cfg, source)) if source else None)

  def _check_branch_point(self) -> None:
    """Refuses a branch_from that is no pretraining workdir, lacks the step, or is at or past this run's end
    (reading its meta only: before anything is written)."""
    cfg = self.cfg
    found = inspect(cfg.branch_from)
    if not found.is_dir:  # a typo'd path is no workdir of another kind
      state = 'is a file' if found.exists else 'does not exist'
      raise ConfigError(f'branch_from {cfg.branch_from} {state}: give the workdir of the pretraining run to branch '
                        'from')
    if not found.trained:
      raise ConfigError(f'branch_from {cfg.branch_from} is not a pretraining workdir')
    if found.kind == 'merge':
      raise ConfigError(f'branch_from {cfg.branch_from} is a merge (parameters only, no optimizer state): start '
                        f'from it with --config.init_checkpoint={cfg.branch_from}')
    ckpt = Checkpointer(cfg.branch_from, read_only=True)
    try:
      step = int(ckpt.meta(None if cfg.branch_step < 0 else cfg.branch_step)['step'])
    finally:
      ckpt.close()
    if cfg.plan.total_steps and step >= cfg.plan.total_steps:
      raise ConfigError(f'branch_from {cfg.branch_from} step {step} is not before this run\'s end '
                        f'({cfg.plan.total_steps} steps): nothing would train')


class _PreparedRun:
  """A pretraining run's prepared data and built models (made whole in `__init__`), and what reads them."""

  def __init__(self, cfg: PretrainConfig, mesh):
    self.cfg = cfg
    plan = cfg.plan
    if plan.phased:
      reporting.log(plan.describe())
    # The records of each stage's data config (its sequence length, files), keyed by it: one cache each.
    self.data = {key: (prepared, vocab, mixture.open_split(prepared, 'train'))
                 for key, (prepared, vocab) in prepare_phase_data(cfg, log=plan.phased).items()}
    self.prepared, self.vocab, self.train_set = self.data[plan.stages[0].cfg.data]
    self.tokenizer = tokenization.load_tokenizer(self.prepared.tokenizer_path)
    def of_run(name: Callable[[Any], str]) -> str:  # the run's data: each stage's cache, in order
      caches = [name(self.data[p.cfg.data][0]) for p in plan.stages]
      return caches[0] if len(set(caches)) == 1 else hashlib.sha256('+'.join(caches).encode()).hexdigest()[:16]
    self.fingerprint = of_run(mixture.fingerprint)
    # What checkpoints of earlier versions call the same data (when its files are where they were then).
    self.legacy_fingerprint = of_run(mixture.legacy_fingerprint)
    self.total_steps = cfg.total_steps(len(self.train_set))
    reporting.log(describe_attention(cfg.model, hardware.resolve(mesh=mesh)))
    # One model per model config of the plan's stages, keyed by it: a phase that changes the model's function
    # (RoPE theta) gets its own step. The first is the first phase's (without phases, the run's).
    self.models = {}
    for phase in plan.stages:
      if phase.cfg.model not in self.models:
        self.models[phase.cfg.model] = build_model(dataclasses.replace(cfg, model=phase.cfg.model), mesh,
                                                   self.total_steps)
    self.model = self.models[plan.stages[0].cfg.model]

  def stages(self) -> tuple[scaffold.Stage, ...]:
    plan = self.cfg.plan
    if not plan.phased:
      return (scaffold.Stage(self.total_steps, self.model),)
    return tuple(scaffold.Stage(p.end, self.models[p.cfg.model], f'{p.label}: ', {'phase': p.index},
                                evaluate_at_end=not p.ramp) for p in plan.stages)

  def check_meta(self, meta: dict[str, Any], run_dir: str) -> None:
    check_same_run(self._current(meta), self.cfg, self.fingerprint, f'workdir {run_dir}')

  def _current(self, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with an earlier version's name of this run's data replaced by today's (the same contents)."""
    if meta.get('data_fingerprint') == self.legacy_fingerprint:
      return {**meta, 'data_fingerprint': self.fingerprint}
    return meta

  def check_branch(self, meta: dict[str, Any]) -> None:
    """The other run is this one up to its checkpoint: the same config but for what a branch may change."""
    meta = self._current(meta)
    old = {**upgrade_saved(meta.get('config', {})), 'data_fingerprint': meta.get('data_fingerprint')}
    where = f'branch_from {self.cfg.branch_from}'
    scaffold.check_same_run(old, self.cfg, where, meta.get('step'), more_free=BRANCH_FREE,
                            extra_new={'data_fingerprint': self.fingerprint})
    # Up to the branch point the two runs must be laid out alike: the data stream and the schedules continue.
    step = int(meta['step'])
    theirs = PretrainConfig.from_dict({k: v for k, v in old.items() if k != 'data_fingerprint'})
    if not self.cfg.plan.same_prefix(theirs.plan, step):
      raise CheckpointError(f'{where} step {step}: its phases up to that step differ from this run\'s (lengths, batch '
                            'sizes, data or model settings): a branch changes only what comes after its branch point')

  def batches(self, seed: int, position: int, step: int):
    mesh = self.model.mesh
    plan = self.cfg.plan
    phase = plan.at(step)
    cfg, (_, vocab, train_set) = phase.cfg, self.data[phase.cfg.data]
    # This process's rows of each global batch: the block its devices hold in the batch sharding.
    block, num_blocks = distributed.process_batch_block(mesh)
    workers = loader_workers(cfg, mesh)
    end = phase.end if plan.phased else self.total_steps
    at = f'{phase.label}: ' if plan.phased else ''
    reporting.log(f'{at}training {end - step} steps ({step} done) on {len(train_set)} examples; '
                  f'{jax.device_count()} devices, mesh {dict(mesh.shape)}; input: '
                  + (f'{workers} loader process(es)' if workers else 'a loader thread'))
    # A phase's data is read from the stream position of the examples the run consumed before it, and its
    # mask-rate schedule runs over the phase.
    return input_pipeline.PretrainingBatches(
        train_set, global_batch_size=cfg.batch_size, seed=seed, cfg=cfg.data, vocab=vocab,
        process_index=block, process_count=num_blocks, start_position=position, workers=workers,
        total_steps=phase.schedule_steps if plan.phased else self.total_steps,
        first_batch=phase.start, first_example=phase.first_example, schedule_start=phase.schedule_start)

  def evaluate(self, params, step: int, output_dir: str | None) -> dict[str, Any]:
    del output_dir  # held-out metrics only: no predictions to write
    phase = self.cfg.plan.before(step)  # the stage that trained these parameters: its data and model
    prepared, vocab, _ = self.data[phase.cfg.data]
    return evaluate(self.models[phase.cfg.model], params, _eval_iter(phase.cfg, prepared, vocab, self.model.mesh),
                    prepared.most_frequent_token)


def _results(per_run: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
  """The workdir's final metrics: its one run's, with the training statistics of this invocation when it trained."""
  result = dict(per_run[0])
  del result['seed']
  stats = {k: result.pop(k) for k in ('train_steps', 'train_steps_this_invocation', 'train_wall_s',
                                      'train_padding_fraction') if k in result}
  final = {**result}
  if stats.get('train_steps_this_invocation'):  # a finished run resumed trains nothing: no stats then
    final.update(stats, wall_s=wall_s)  # wall_s: data preparation and evaluation too
  return final


def train_and_evaluate(cfg: PretrainConfig, workdir: str, explicit_model_fields: Collection[str] = ()
                       ) -> dict[str, Any]:
  """Pretrains (or resumes) in `workdir` and returns the final held-out metrics.

  With cfg.init_checkpoint the run starts from that checkpoint's weights (`init.resolve_init_checkpoint`;
  `explicit_model_fields` as there); re-running in `workdir` resumes it like any other run.
  """
  cfg, source = init.resolve_init_checkpoint(cfg, explicit_model_fields)
  return scaffold.train(PretrainingJob(cfg, source), workdir)


def reporting_of(workdir: str) -> Report:
  return Report(workdir, progress_keys=PROGRESS_KEYS, eval_keys=EVAL_KEYS, curves_dir=workdir,
                divergence_hint='Lower --config.optim.learning_rate or raise --config.optim.warmup_steps')


def describe_result(result: dict[str, Any]) -> str:
  """One line: held-out MLM (and NSP or SOP) accuracy beside their trivial baselines."""
  out = (f'held-out MLM accuracy {result["mlm_accuracy"]:.4f} (most-frequent-token baseline '
         f'{result["mlm_baseline_accuracy"]:.4f})')
  for task in ('nsp', 'sop'):
    if f'{task}_accuracy' in result:
      out += (f', {task.upper()} accuracy {result[f"{task}_accuracy"]:.4f} (majority-class baseline '
              f'{result[f"{task}_baseline_accuracy"]:.4f})')
  return out


# What evaluating a pretraining workdir again may change (the `evaluation` fact of its fields).
EVALUATION_FIELDS = facts(PretrainConfig, 'evaluation')


def _workdir_model(workdir: str, overrides: dict[str, Any] | None = None) -> tuple[PretrainConfig, StepModel]:
  """A pretraining workdir's config (its config.json, with `overrides` of EVALUATION_FIELDS) and the model it
  describes."""
  wd, kind = Workdir(workdir), inspect(workdir).kind
  if kind not in (None, 'pretraining', 'merge'):
    hint = ' (evaluate it with experiments/evaluate.py, which reads either kind)' if kind == 'finetuning' else ''
    raise CheckpointError(f'{workdir} is a {kind} directory, not a pretraining workdir{hint}')
  saved = wd.config()  # the held-out data is the cache's: no tokenizer is read
  if saved is None:
    raise CheckpointError(f'{wd.file(CONFIG_FILE)} is missing: not a pretraining workdir (run experiments/pretrain.py '
                          f'--workdir={workdir} first)')
  cfg = PretrainConfig.from_dict({**saved, **(overrides or {})})
  mesh = shd.make_mesh(cfg.mesh)
  validate_config(cfg, mesh)
  return cfg, build_model(cfg, mesh, max(cfg.plan.total_steps, 1))  # the schedule's length is never used here


def evaluate_checkpoint(workdir: str, step: int | None = None, overrides: dict[str, Any] | None = None
                        ) -> dict[str, Any]:
  """Restores `step` (latest when None) from a pretraining workdir and evaluates it held-out."""
  return evaluate_checkpoints(workdir, [step], overrides=overrides)[0]


def evaluate_all_checkpoints(workdir: str, on_result: Callable[[dict[str, Any]], None] | None = None,
                             overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
  """Evaluates every checkpoint of a pretraining workdir held-out, oldest first; the workdir is only read.

  The model, the data and the compiled evaluation are built once; each step's result is what
  `evaluate_checkpoint(workdir, step)` returns.

  Args:
    workdir: a pretraining workdir.
    on_result: called with each step's result as soon as it is evaluated (e.g. to print a row).

  Returns:
    One result per readable checkpoint step: {'step', mlm_loss, mlm_accuracy, nsp_* (with NSP), ...};
    an unusable checkpoint is named in one warning line and skipped.

  Raises:
    CheckpointError: not a pretraining workdir, or no usable checkpoint.
  """
  return evaluate_checkpoints(workdir, None, on_result, overrides)


def evaluate_checkpoints(workdir: str, steps: list[int | None] | None,
                         on_result: Callable[[dict[str, Any]], None] | None = None,
                         overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
  """Held-out metrics of `steps` of a workdir (None in the list: the latest; `steps` None: all, skipping
  the unusable ones with a warning), reading parameters only; the model and data are built once."""
  if steps is None:
    ckpt = Checkpointer(workdir, read_only=True)
    try:
      steps = sorted(ckpt.all_steps())
    finally:
      ckpt.close()
    if not steps:
      raise CheckpointError(f'no checkpoint in {ckpt.directory}')
    return evaluate_in(workdir, [(workdir, s) for s in steps], on_result, overrides, skip_unusable=True)
  return evaluate_in(workdir, [(workdir, s) for s in steps], on_result, overrides)


def evaluate_in(workdir: str, checkpoints: list[tuple[str, int | None]],
                on_result: Callable[[dict[str, Any]], None] | None = None,
                overrides: dict[str, Any] | None = None, skip_unusable: bool = False,
                as_step: int | None = None) -> list[dict[str, Any]]:
  """Held-out metrics, on `workdir`'s held-out split and model, of each (pretraining workdir, step) checkpoint
  of that architecture (e.g. the parts of a merge beside it); with `skip_unusable`, an unusable one is named in
  a warning and skipped. A run in phases evaluates each checkpoint as the phase that trained it (its data,
  masking rate and RoPE theta), or every one as the phase of step `as_step` (one yardstick for a merge's parts)."""
  cfg, model = _workdir_model(workdir, overrides)
  data, models = None, {}
  results, unusable = [], []
  for directory, step in checkpoints:
    ckpt = Checkpointer(directory, read_only=True)
    try:
      state, meta = ckpt.restore(step, model.abstract_state, log=reporting.log, params_only=True)
    except UnusableCheckpoint as e:
      if not skip_unusable:
        raise
      reporting.log(f'warning: {e}; skipped')
      unusable.append(step)
      continue
    finally:
      ckpt.close()
    if data is None:  # after the first restore: a bad workdir fails before data work
      data = prepare_phase_data(cfg)
    # The phase that trained the checkpoint: its held-out data and model (RoPE theta); one phase without phases.
    phase = cfg.plan.before(int(meta['step']) if as_step is None else as_step)
    if phase.cfg.model not in models:
      same = phase.cfg.model == cfg.model
      models[phase.cfg.model] = model if same else build_model(dataclasses.replace(cfg, model=phase.cfg.model),
                                                               model.mesh, max(cfg.plan.total_steps, 1))
    prepared, vocab = data[phase.cfg.data]
    results.append({'step': int(meta['step']),
                    **evaluate(models[phase.cfg.model], state['params'], _eval_iter(phase.cfg, prepared, vocab, model.mesh),
                               prepared.most_frequent_token)})
    del state  # one checkpoint's arrays in memory at a time
    if on_result:
      on_result(results[-1])
  if not results:
    raise CheckpointError(f'no usable checkpoint in {checkpoint_dir(workdir)}: steps {unusable} are unusable '
                          '(see above)')
  return results
