"""Pretraining runs: train_and_evaluate, and evaluating a workdir's checkpoints.

Everything here is driven by a `PretrainConfig`; nothing reads flags. Order of work in
`train_and_evaluate`: validate every input (config, corpus, tokenizer, workdir) before
writing anything, take the workdir's lock, prepare the data, build the sharded state (fresh, or
restored from the newest good checkpoint with its data position, refused when the run's
identity changed), then `train.loop.fit` with periodic logging, evaluation and asynchronous
checkpoints. SIGTERM/SIGINT save the current step and stop; a non-finite or exploded state is
never saved.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Collection, Iterator

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import distributed, files, sharding as shd
from bert_jax.config import (
  ModelConfig,
  PretrainConfig,
  check_resume,
  check_resume_allow,
  diff_model_configs,
  upgrade_saved,
)
from bert_jax.data import loader as input_pipeline, prepare as pretraining_data, tokenization
from bert_jax.data.records import PreparedData
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError, UnusableCheckpoint
from bert_jax.interop.pretrained import workdir_config
from bert_jax.model.attention import describe_attention
from bert_jax.model.heads import BertForPreTraining
from bert_jax.pretraining import init
from bert_jax.pretraining.objective import Pretraining
from bert_jax.train import optim, reporting, workdir as workdir_lib
from bert_jax.train.checkpoints import Checkpointer, read_config, write_config
from bert_jax.train.loop import Report, fit
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel

FINAL_METRICS_FILE = 'final_metrics.json'
# What the progress and eval lines show (every metric goes to the JSONL files).
PROGRESS_KEYS = ('loss', 'mlm_accuracy', 'nsp_accuracy', 'sop_accuracy')
EVAL_KEYS = ('mlm_loss', 'mlm_accuracy', 'mlm_baseline_accuracy', 'nsp_loss', 'nsp_accuracy', 'sop_loss',
             'sop_accuracy')


def validate_config(cfg: PretrainConfig, mesh=None) -> None:
  """Checks values that would otherwise fail deep inside jit or the data pipeline."""
  m, d = cfg.model, cfg.data
  if d.max_seq_length > m.max_position_embeddings:
    of = f' of init_checkpoint {cfg.init_checkpoint}' if cfg.init_checkpoint else ''
    raise ConfigError(f'data.max_seq_length={d.max_seq_length} exceeds model.max_position_embeddings='
                      f'{m.max_position_embeddings}{of}: the model has no positions beyond that')
  if d.max_seq_length < 8:
    raise ConfigError(f'data.max_seq_length={d.max_seq_length} is too short for [CLS] A [SEP] B [SEP]')
  if not 0 < d.max_predictions_per_seq <= d.max_seq_length:
    raise ConfigError(f'data.max_predictions_per_seq={d.max_predictions_per_seq} must be in '
                      f'(0, max_seq_length={d.max_seq_length}]')
  for name in ('num_train_steps', 'batch_size', 'eval_batch_size', 'log_every', 'eval_every',
               'checkpoint_every', 'keep_checkpoints'):
    if getattr(cfg, name) <= 0:
      raise ConfigError(f'{name} must be positive, got {getattr(cfg, name)}')
  optim.validate(cfg.optim)
  check_resume_allow(cfg.resume_allow, cfg.to_dict(), extra=('data_fingerprint',))
  accum = cfg.optim.grad_accum_steps
  if accum <= 0 or cfg.batch_size % accum:
    raise ConfigError(f'batch_size={cfg.batch_size} must be a positive multiple of '
                      f'optim.grad_accum_steps={accum}')
  if mesh is not None:
    shards = shd.num_batch_shards(mesh)
    for name, size in (('batch_size', cfg.batch_size // accum), ('eval_batch_size', cfg.eval_batch_size)):
      if size % shards or size % jax.process_count():
        raise ConfigError(f'{name} (per micro-batch: {size}) must divide evenly over {shards} batch '
                          f'shards (mesh data x fsdp) and {jax.process_count()} processes')
  if d.pack:
    _validate_packing(cfg, mesh)


def _validate_packing(cfg: PretrainConfig, mesh) -> None:
  d, accum = cfg.data, cfg.optim.grad_accum_steps
  if d.pack_rows_multiple < 1 or d.max_segments_per_row < 1:
    raise ConfigError(f'data.pack_rows_multiple={d.pack_rows_multiple} and data.max_segments_per_row='
                      f'{d.max_segments_per_row} must be positive')
  if mesh is not None:
    # Every data block (process) emits a multiple of pack_rows_multiple rows; the global rows are
    # split into grad_accum_steps micro-batches, each over all batch shards.
    shards, blocks = shd.num_batch_shards(mesh), distributed.process_batch_block(mesh)[1]
    if (d.pack_rows_multiple * blocks) % (accum * shards):
      raise ConfigError(f'data.pack_rows_multiple={d.pack_rows_multiple} x {blocks} process(es) must be a '
                        f'multiple of optim.grad_accum_steps={accum} x {shards} batch shards (mesh data x '
                        'fsdp): packed rows are split over both')


# What makes a resumed run the same run: the data stream and the optimisation trajectory.
# Evaluation, logging, checkpoint cadence, mesh, worker counts and the model's speed switches may change.
_FREE_ON_RESUME = ('log_every', 'eval_every', 'eval_batch_size', 'checkpoint_every', 'keep_checkpoints',
                   'resume_allow', 'mesh', 'model', 'data.num_workers', 'data.loader_workers', 'data.cache_dir')


def check_same_run(meta: dict[str, Any], cfg: PretrainConfig, fingerprint: str, workdir: str) -> None:
  """Refuses to resume a checkpoint (its `meta`) written by a run with another identity: another
  config outside _FREE_ON_RESUME and `cfg.resume_allow`, or another data cache `fingerprint`."""
  old = {**upgrade_saved(meta.get('config', {})), 'data_fingerprint': meta.get('data_fingerprint')}
  new = {**cfg.to_dict(), 'data_fingerprint': fingerprint}
  # The same fingerprint is the same data (it covers the files' contents and the tokenizer's): the
  # paths they were read from may differ (a copied corpus, another mount point).
  same_data = ('data.train_files', 'data.eval_files', 'data.tokenizer') if old['data_fingerprint'] == fingerprint else ()
  check_resume(old, new, _FREE_ON_RESUME + same_data, cfg.resume_allow, f'workdir {workdir}', meta.get('step'))


def _allows_optimizer(cfg: PretrainConfig) -> bool:
  """Whether cfg.resume_allow lets a resume start a fresh optimizer state ('optim' or an optim.* field)."""
  return any(n.strip() == 'optim' or n.strip().startswith('optim.') for n in cfg.resume_allow.split(','))


def check_workdir(workdir: str, cfg: PretrainConfig) -> None:
  """Refuses a workdir of another kind, or whose checkpoints belong to a different architecture."""
  workdir_lib.check_kind(workdir, 'pretraining')
  saved = read_config(workdir)
  if saved is None:
    return
  diffs = diff_model_configs(saved.get('model', {}), cfg.model)
  if diffs:
    raise CheckpointError(f'workdir {workdir} holds checkpoints of another model ({"; ".join(diffs)}); '
                          'use a new --workdir or the same model config')


def pretraining_model(model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh, *, objective: str = 'nsp',
                      grad_accum_steps: int = 1, schedule=None, rules=shd.LOGICAL_AXIS_RULES) -> StepModel:
  """BertForPreTraining under the pretraining objective (`objective` as data.objective: the two-way
  head for 'nsp' and 'sop'), as a StepModel."""
  head = objective != 'none'
  return StepModel(lambda rngs: BertForPreTraining(model_cfg, rngs=rngs, nsp_head=head), Pretraining(objective),
                   tx, mesh, grad_accum_steps=grad_accum_steps, schedule=schedule, rules=rules)


def build_model(cfg: PretrainConfig, mesh) -> StepModel:
  """The run's model: `pretraining_model` with its optimizer, schedule and accumulation."""
  return pretraining_model(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps), mesh,
                           objective=cfg.data.objective,
                           grad_accum_steps=cfg.optim.grad_accum_steps,
                           schedule=optim.learning_rate_schedule(cfg.optim, cfg.num_train_steps),
                           rules=shd.rules(cfg.mesh.rules))


def prepare_data(cfg: PretrainConfig) -> tuple[PreparedData, input_pipeline.Vocab]:
  """Prepares (or reuses) the run's data, every process building its share of the units.

  Returns:
    The prepared cache and what masking needs of its tokenizer.
  """

  def sync(failed: bool) -> bool:  # a barrier that also tells whether any process failed
    if jax.process_count() == 1:
      return failed
    return bool(np.any(multihost_utils.process_allgather(np.int32(failed))))

  prepared = pretraining_data.prepare_pretraining_data(
      cfg.data, vocab_size=cfg.model.vocab_size, seed=cfg.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), sync=sync, log=reporting.log)
  tokenizer = tokenization.load_tokenizer(prepared.tokenizer_path)
  return prepared, input_pipeline.Vocab.from_tokenizer(tokenizer, prepared.special_ids, cfg.data.masking)


def _eval_iter(cfg: PretrainConfig, prepared, vocab, mesh) -> Iterator[dict[str, np.ndarray]]:
  dataset = input_pipeline.PretrainingDataset(prepared, 'eval')
  block, num_blocks = distributed.process_batch_block(mesh)
  return input_pipeline.eval_batches(dataset, batch_size=cfg.eval_batch_size, seed=cfg.seed, cfg=cfg.data,
                                     vocab=vocab, process_index=block, process_count=num_blocks)


def loader_workers(cfg: PretrainConfig) -> int:
  """data.loader_workers, with -1 resolved: none on CPU (its cores train), else one per local
  accelerator up to half the host's cores."""
  if cfg.data.loader_workers >= 0:
    return cfg.data.loader_workers
  if jax.default_backend() == 'cpu':
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


def _copy_tokenizer(tokenizer_path: str, workdir: str) -> None:
  # A workdir carries its tokenizer, so fill-mask/embed/export need nothing else.
  if jax.process_index() == 0:
    tokenization.save_tokenizer(tokenization.load_tokenizer(tokenizer_path), workdir)


def train_and_evaluate(cfg: PretrainConfig, workdir: str, explicit_model_fields: Collection[str] = ()
                       ) -> dict[str, Any]:
  """Pretrains (or resumes) in `workdir` and returns the final held-out metrics.

  With cfg.init_checkpoint the run starts from that checkpoint's weights (`init.resolve_init_checkpoint`;
  `explicit_model_fields` as there); re-running in `workdir` resumes it like any other run.
  """
  start = time.monotonic()
  cfg, source = init.resolve_init_checkpoint(cfg, explicit_model_fields)
  mesh = shd.make_mesh(cfg.mesh)
  validate_config(cfg, mesh)
  if source:
    workdir_lib.check_outside(workdir, source.path, 'init_checkpoint')
  check_workdir(workdir, cfg)
  with (workdir_lib.claim(workdir, 'pretraining', owner=jax.process_index() == 0, log=reporting.log),
        Preemption() as preempt):
    with preempt.immediately('preparing the data'):
      prepared, vocab = prepare_data(cfg)
    reporting.log(describe_attention(cfg.model))
    model = build_model(cfg, mesh)
    ckpt = Checkpointer(workdir, save_every=cfg.checkpoint_every, keep=cfg.keep_checkpoints)
    fingerprint = os.path.basename(os.path.normpath(prepared.dir))
    try:
      resumed = ckpt.latest_step() is not None
      if resumed:
        state, meta = ckpt.restore(None, model.abstract_state, log=reporting.log,
                                   check_meta=lambda meta: check_same_run(meta, cfg, fingerprint, workdir),
                                   fresh_opt_state=model.init_opt_state if _allows_optimizer(cfg) else None)
        data_position = int(meta['data_position'])
        reporting.log(f'resumed from {ckpt.directory} at step {int(state["step"])} (data position {data_position})')
      else:
        state = model.init_state(init.initial_params(cfg, source) if source else None, seed=cfg.seed)
        data_position = 0
      write_config(workdir, cfg.to_dict())
      _copy_tokenizer(prepared.tokenizer_path, workdir)
      held_out = lambda params, step: evaluate(model, params, _eval_iter(cfg, prepared, vocab, mesh),  # pylint: disable=unnecessary-lambda-assignment
                                               prepared.most_frequent_token)
      result = fit(model, state, _train_batches(cfg, prepared, vocab, mesh, data_position, int(state['step'])),
                   total_steps=cfg.num_train_steps, ckpt=ckpt, preempt=preempt,
                   report=reporting_of(workdir), log_every=cfg.log_every, checkpoint_config=cfg.to_dict(),
                   checkpoint_extra={'data_fingerprint': fingerprint}, evaluate=held_out,
                   eval_every=cfg.eval_every, eval_first=source is not None and not resumed)
    finally:
      ckpt.close()
    last_eval = result.last_eval or held_out(result.state['params'], result.step)  # a finished run resumed
  final = {'step': result.step, **last_eval}
  if result.stats.get('train_steps'):  # what this invocation trained (a finished run resumed trains nothing)
    final.update(result.stats, wall_s=time.monotonic() - start)  # wall_s: data preparation and evaluation too
  if jax.process_index() == 0:
    files.write_json_atomic(os.path.join(workdir, FINAL_METRICS_FILE), final)
  return final


def reporting_of(workdir: str) -> Report:
  return Report(workdir, progress_keys=PROGRESS_KEYS, eval_keys=EVAL_KEYS, curves_dir=workdir,
                divergence_hint='Lower --config.optim.learning_rate or raise --config.optim.warmup_steps')


def _train_batches(cfg: PretrainConfig, prepared, vocab, mesh, data_position: int, step: int):
  train_ds = input_pipeline.PretrainingDataset(prepared, 'train')
  # This process's rows of each global batch: the block its devices hold in the batch sharding.
  block, num_blocks = distributed.process_batch_block(mesh)
  workers = loader_workers(cfg)
  reporting.log(f'training {cfg.num_train_steps - step} steps ({step} done) on {len(train_ds)} examples; '
                f'{jax.device_count()} devices, mesh {dict(mesh.shape)}; input: '
                + (f'{workers} loader process(es)' if workers else 'a loader thread'))
  return input_pipeline.PretrainingBatches(
      train_ds, global_batch_size=cfg.batch_size, seed=cfg.seed, cfg=cfg.data, vocab=vocab,
      process_index=block, process_count=num_blocks, start_position=data_position, workers=workers,
      total_steps=cfg.num_train_steps)


def describe_result(result: dict[str, Any]) -> str:
  """One line: held-out MLM (and NSP or SOP) accuracy beside their trivial baselines."""
  out = (f'held-out MLM accuracy {result["mlm_accuracy"]:.4f} (most-frequent-token baseline '
         f'{result["mlm_baseline_accuracy"]:.4f})')
  for task in ('nsp', 'sop'):
    if f'{task}_accuracy' in result:
      out += (f', {task.upper()} accuracy {result[f"{task}_accuracy"]:.4f} (majority-class baseline '
              f'{result[f"{task}_baseline_accuracy"]:.4f})')
  return out


def _workdir_model(workdir: str) -> tuple[PretrainConfig, StepModel]:
  """A pretraining workdir's config (its config.json) and the model it describes, on its own mesh config."""
  kind = workdir_lib.kind_of(workdir)
  if kind not in (None, 'pretraining'):
    hint = (' (evaluate it with experiments/finetune.py and --config.eval_only=True)' if kind == 'finetuning'
            else '')
    raise CheckpointError(f'{workdir} is a {kind} directory, not a pretraining workdir{hint}')
  cfg = workdir_config(workdir)
  validate_config(cfg, shd.make_mesh(cfg.mesh))
  return cfg, build_model(cfg, shd.make_mesh(cfg.mesh))


def evaluate_checkpoint(workdir: str, step: int | None = None) -> dict[str, Any]:
  """Restores `step` (latest when None) from a pretraining workdir and evaluates it held-out."""
  return evaluate_checkpoints(workdir, [step])[0]


def evaluate_all_checkpoints(workdir: str, on_result: Callable[[dict[str, Any]], None] | None = None
                             ) -> list[dict[str, Any]]:
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
  return evaluate_checkpoints(workdir, None, on_result)


def evaluate_checkpoints(workdir: str, steps: list[int | None] | None,
                         on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
  """Held-out metrics of `steps` of a workdir (None in the list: the latest; `steps` None: all, skipping
  the unusable ones with a warning), reading parameters only; the model and data are built once."""
  cfg, model = _workdir_model(workdir)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    every = steps is None
    if every:
      steps = sorted(ckpt.all_steps())
      if not steps:
        raise CheckpointError(f'no checkpoint in {ckpt.directory}')
    prepared = vocab = None
    results, unusable = [], []
    for step in steps:
      try:
        state, meta = ckpt.restore(step, model.abstract_state, log=reporting.log, params_only=True)
      except UnusableCheckpoint as e:
        if not every:
          raise
        reporting.log(f'warning: {e}; skipped')
        unusable.append(step)
        continue
      if prepared is None:  # after the first restore: a bad workdir fails before data work
        prepared, vocab = prepare_data(cfg)
      results.append({'step': int(meta['step']),
                      **evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                                 prepared.most_frequent_token)})
      del state  # one checkpoint's arrays in memory at a time
      if on_result:
        on_result(results[-1])
  finally:
    ckpt.close()
  if not results:
    raise CheckpointError(f'no usable checkpoint in {ckpt.directory}: steps {unusable} are unusable (see above)')
  return results
