"""Pretraining: the train_and_evaluate loop and checkpoint evaluation.

Everything here is driven by a `PretrainConfig`; nothing reads flags. Order of work in
`train_and_evaluate`: validate every input (config, corpus, tokenizer, workdir) before
writing anything, take the workdir's lock, build the sharded state (fresh, or restored from
the newest good checkpoint with its data position, refused when the run's identity changed),
then train with periodic logging, evaluation and asynchronous checkpoints. SIGTERM/SIGINT save
the current step and stop (`preemption.py`); a non-finite or exploded state is never saved.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Collection, Iterator

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from bert_jax import distributed, metrics as metrics_lib, optim, preemption, sharding as shd
from bert_jax import workdir as workdir_lib
from bert_jax.data import loader as input_pipeline, prepare as pretraining_data, tokenization
from bert_jax.data.records import PreparedData
from bert_jax.checkpointing import CONFIG_FILE, Checkpointer, read_config, state_problem, write_config
from bert_jax.config import PretrainConfig, check_resume, check_resume_allow, diff_model_configs
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.pretrained import InitSource, describe_source, load_init_params
from bert_jax.train_state import PretrainingModel, summarize

FINAL_METRICS_FILE = 'final_metrics.json'


class TrainingDivergedError(BertJaxError, FloatingPointError):
  """The loss became NaN or Inf."""


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
  old = {**meta.get('config', {}), 'data_fingerprint': meta.get('data_fingerprint')}
  new = {**cfg.to_dict(), 'data_fingerprint': fingerprint}
  check_resume(old, new, _FREE_ON_RESUME, cfg.resume_allow, f'workdir {workdir}', meta.get('step'))


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


# What a continued run takes from its init_checkpoint: everything that shapes the parameters or the
# function they compute. Dropout rates, dtype and the speed switches stay the config's.
INIT_FIELDS = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
               'max_position_embeddings', 'type_vocab_size', 'initializer_range', 'layer_norm_eps',
               'pad_token_id')


def resolve_init_checkpoint(cfg: PretrainConfig, explicit_model_fields: Collection[str] = ()
                            ) -> tuple[PretrainConfig, InitSource | None]:
  """`cfg` with cfg.init_checkpoint's architecture (INIT_FIELDS) and tokenizer (as data.tokenizer).

  Args:
    cfg: the run's config.
    explicit_model_fields: model fields the user set explicitly (e.g. on the command line); one
      that disagrees with the checkpoint is refused rather than silently replaced.

  Returns:
    (the config, the source description; None without an init_checkpoint).
  """
  if not cfg.init_checkpoint:
    return cfg, None
  source = describe_source(cfg.init_checkpoint)
  theirs = {f: getattr(source.config, f) for f in INIT_FIELDS}
  clashes = [f'model.{f}={getattr(cfg.model, f)} (the checkpoint has {theirs[f]})'
             for f in INIT_FIELDS if f in explicit_model_fields and getattr(cfg.model, f) != theirs[f]]
  if clashes:
    raise ConfigError(f'init_checkpoint {cfg.init_checkpoint} fixes the architecture, but '
                      + '; '.join(clashes) + ' was given: drop those flags')
  changed = [f'{f} {getattr(cfg.model, f)} -> {theirs[f]}' for f in INIT_FIELDS if getattr(cfg.model, f) != theirs[f]]
  tokenizer = cfg.data.tokenizer or source.tokenizer_path
  if cfg.data.tokenizer and os.path.abspath(cfg.data.tokenizer) != os.path.abspath(source.tokenizer_path):
    _check_same_vocabulary(cfg.data.tokenizer, source)
  if changed:
    metrics_lib.log(f'init_checkpoint {cfg.init_checkpoint}: its architecture replaces the config\'s ('
                    + ', '.join(changed) + ')')
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **theirs),
                            data=dataclasses.replace(cfg.data, tokenizer=tokenizer))
  return cfg, source


def _check_same_vocabulary(path: str, source: InitSource) -> None:
  given, own = tokenization.load_tokenizer(path), tokenization.load_tokenizer(source.tokenizer_path)
  pieces = lambda t: [t.id_to_token(i) for i in range(t.vocab_size)]  # pylint: disable=unnecessary-lambda-assignment
  if type(given) is not type(own) or pieces(given) != pieces(own):
    raise ConfigError(f'data.tokenizer {path} ({type(given).__name__}, {given.vocab_size} tokens) is not '
                      f'the tokenizer of init_checkpoint {source.path} ({type(own).__name__}, {own.vocab_size} '
                      'tokens): its embeddings belong to that one; leave data.tokenizer empty')


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
      process_count=jax.process_count(), sync=sync, log=metrics_lib.log)
  tokenizer = tokenization.load_tokenizer(prepared.tokenizer_path)
  return prepared, input_pipeline.Vocab.from_tokenizer(tokenizer, prepared.special_ids,
                                                       cfg.data.whole_word_masking)


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


def evaluate(model: PretrainingModel, params, batches, baseline_token: int) -> dict[str, float]:
  """Held-out MLM/NSP loss and accuracy over one pass of `batches`, plus the baselines."""
  totals = None
  for local in batches:
    sums = model.eval_step(params, model.rest, model.global_batch(local), jnp.int32(baseline_token))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    raise BertJaxError('the held-out split is empty')
  totals = jax.device_get(totals)
  out = {k: float(v) for k, v in summarize(totals).items()}
  out['num_masked_tokens'] = int(totals['mlm_count'])
  out['num_examples'] = int(totals['num_sequences'])
  if not totals['nsp_count']:  # masked LM only (data.nsp=False): no NSP to report
    out = {k: v for k, v in out.items() if not k.startswith('nsp_')}
    out['loss'] = out['mlm_loss']
  return out


def _diverged(what: str, step: int, last_good: int | None) -> TrainingDivergedError:
  kept = f'the last good checkpoint (step {last_good}) is kept' if last_good else 'no checkpoint was written'
  return TrainingDivergedError(f'{what} at or before step {step}; stopping, {kept}. Lower '
                               '--config.optim.learning_rate or raise --config.optim.warmup_steps')


def _check_finite(step: int, host_metrics: list[dict[str, float]], last_good: int | None) -> None:
  for m in host_metrics:
    if not math.isfinite(m['loss']):
      raise _diverged(f'loss became {m["loss"]}', step, last_good)


def _copy_tokenizer(tokenizer_path: str, workdir: str) -> None:
  # A workdir carries its tokenizer, so fill-mask/embed/export need nothing else.
  if jax.process_index() == 0:
    tokenization.save_tokenizer(tokenization.load_tokenizer(tokenizer_path), workdir)


def train_and_evaluate(cfg: PretrainConfig, workdir: str, explicit_model_fields: Collection[str] = ()
                       ) -> dict[str, Any]:
  """Pretrains (or resumes) in `workdir` and returns the final held-out metrics.

  With cfg.init_checkpoint the run starts from that checkpoint's weights (`resolve_init_checkpoint`;
  `explicit_model_fields` as there); re-running in `workdir` resumes it like any other run.
  """
  cfg, source = resolve_init_checkpoint(cfg, explicit_model_fields)
  mesh = shd.make_mesh(cfg.mesh)
  validate_config(cfg, mesh)
  if source:
    _check_outside(workdir, source.path)
  check_workdir(workdir, cfg)
  with (workdir_lib.claim(workdir, 'pretraining', owner=jax.process_index() == 0, log=metrics_lib.log),
        preemption.Preemption() as preempt):
    with preempt.immediately('preparing the data'):
      prepared, vocab = prepare_data(cfg)
    schedule = optim.learning_rate_schedule(cfg.optim, cfg.num_train_steps)
    model = PretrainingModel(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps), mesh,
                             seed=cfg.seed, grad_accum_steps=cfg.optim.grad_accum_steps, schedule=schedule,
                             nsp=cfg.data.nsp)
    ckpt = Checkpointer(workdir, save_every=cfg.checkpoint_every, keep=cfg.keep_checkpoints)
    fingerprint = os.path.basename(os.path.normpath(prepared.dir))
    try:
      initial_eval = None
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(None, model.abstract_state, log=metrics_lib.log,
                                   check_meta=lambda meta: check_same_run(meta, cfg, fingerprint, workdir),
                                   fresh_opt_state=model.init_opt_state if _allows_optimizer(cfg) else None)
        data_position = int(meta['data_position'])
        metrics_lib.log(f'resumed from {ckpt.directory} at step {int(state["step"])} '
                        f'(data position {data_position})')
      else:
        state, data_position = _initial_state(cfg, model, source), 0
        if source:  # where the continued run starts: the held-out metrics of the loaded weights
          initial_eval = evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                                  prepared.most_frequent_token)
      write_config(workdir, cfg.to_dict())
      _copy_tokenizer(prepared.tokenizer_path, workdir)
      return _train_loop(cfg, workdir, model, state, data_position, ckpt, prepared, vocab, preempt,
                         {'data_fingerprint': fingerprint}, initial_eval)
    finally:
      ckpt.close()


def _check_outside(workdir: str, source: str) -> None:
  work, init = os.path.realpath(workdir), os.path.realpath(source)
  if work == init or work.startswith(init + os.sep):
    raise ConfigError(f'workdir {workdir} is inside init_checkpoint {source}, which is only ever read: '
                      'choose another --workdir (re-running in the same workdir resumes a run)')


def _initial_state(cfg: PretrainConfig, model: PretrainingModel, source: InitSource | None):
  """A fresh state; with a source, its encoder and the heads it has replace the random ones."""
  if source is None:
    return model.init_state()
  params, step = load_init_params(source, None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
  if not cfg.data.nsp:
    params = {k: v for k, v in params.items() if k != 'nsp'}
  loaded = sorted(params)
  fresh = [k for k in ('mlm', 'nsp') if k not in params and (k == 'mlm' or cfg.data.nsp)]
  at = f' step {step}' if step is not None else ''
  metrics_lib.log(f'initialised from {source.kind} checkpoint {source.path}{at}: loaded '
                  + ', '.join(_PART_NAMES[k] for k in loaded)
                  + (f'; fresh {", ".join(_PART_NAMES[k] for k in fresh)}' if fresh else '')
                  + '; optimizer, step and data position start fresh')
  return model.init_state(params)


_PART_NAMES = {'bert': 'encoder', 'mlm': 'MLM head (decoder tied to the word embeddings)', 'nsp': 'NSP head'}


def _train_loop(cfg, workdir, model, state, data_position, ckpt, prepared, vocab, preempt, extra_meta,
                initial_eval=None):
  start_step = int(jax.device_get(state['step']))
  total = cfg.num_train_steps
  config_dict = cfg.to_dict()
  writer = metrics_lib.MetricWriter(workdir, 'train')
  eval_writer = metrics_lib.MetricWriter(workdir, 'eval')
  train_ds = input_pipeline.PretrainingDataset(prepared, 'train')
  # This process's rows of each global batch: the block its devices hold in the batch sharding.
  block, num_blocks = distributed.process_batch_block(model.mesh)
  workers = loader_workers(cfg)
  batches = input_pipeline.PretrainingBatches(
      train_ds, global_batch_size=cfg.batch_size, seed=cfg.seed, cfg=cfg.data, vocab=vocab,
      process_index=block, process_count=num_blocks, start_position=data_position, workers=workers)
  metrics_lib.log(f'training {total - start_step} steps ({start_step} done) on {len(train_ds)} examples; '
                  f'{jax.device_count()} devices, mesh {dict(model.mesh.shape)}; input: '
                  + (f'{workers} loader process(es)' if workers else 'a loader thread'))
  progress = metrics_lib.Progress(start_step, total, cfg.batch_size * cfg.data.max_seq_length)
  packed = _PackingStats(cfg, num_blocks) if cfg.data.pack else None
  pending: list[dict[str, jax.Array]] = []
  last_good = ckpt.latest_step()
  last_eval: dict[str, float] | None = None
  step = start_step
  waited, since = 0.0, time.perf_counter()
  if initial_eval is not None:
    eval_writer.write(step, initial_eval)
    _log_eval(step, initial_eval)
    metrics_lib.write_curves(workdir)
  try:
    if preempt.stop_now(step, synced=False):  # a signal during preparation or compilation
      raise preemption.Preempted(preempt.message(step, saved=False))
    while step < total:
      t_wait = time.perf_counter()
      local_batch = next(batches)
      waited += time.perf_counter() - t_wait
      if packed:
        packed.add(local_batch)
      state, step_metrics = model.train_step(state, model.global_batch(local_batch), model.rest)
      pending.append(step_metrics)
      step += 1
      is_last = step == total
      synced = step % cfg.log_every == 0 or is_last or ckpt.manager.should_save(step)
      stop = preempt.stop_now(step, synced)
      if synced or stop:
        host = jax.device_get(pending)
        pending = []
        _check_finite(step, host, last_good)
        if step % cfg.log_every == 0 or is_last:
          # Masked LM only: the step's NSP sums are empty, its nsp_* values meaningless zeros.
          means = {k: float(np.mean([m[k] for m in host])) for k in host[0]
                   if cfg.data.nsp or not k.startswith('nsp_')}
          rate = progress.update(step)
          # The share of the wall time since the last log line spent waiting for a batch.
          now = time.perf_counter()
          input_wait, waited, since = waited / max(now - since, 1e-9), 0.0, now
          pack_means = packed.flush() if packed else {}
          writer.write(step, {**means, **{k: rate[k] for k in ('steps_per_s', 'tokens_per_s')},
                              'input_wait': input_wait, **pack_means})
          metrics_lib.log(f'step {step}/{total} | ' + metrics_lib.format_metrics(
              {k: means[k] for k in ('loss', 'mlm_accuracy', 'nsp_accuracy', 'learning_rate', 'grad_norm')
               if cfg.data.nsp or k != 'nsp_accuracy'})
              + f' | {rate["tokens_per_s"]:,.0f} tok/s | input wait {input_wait:.1%}'
              + f' | ETA {metrics_lib.format_duration(rate["eta_s"])}'
              + (f' | packed {pack_means["packed_rows"]:.1f}/{cfg.batch_size} rows, '
                 f'{pack_means["packed_fill"]:.1%} real tokens (unpacked {pack_means["unpacked_fill"]:.1%})'
                 if packed else ''))
      if step % cfg.eval_every == 0 or is_last:
        last_eval = evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                             prepared.most_frequent_token)
        eval_writer.write(step, last_eval)
        _log_eval(step, last_eval)
        metrics_lib.write_curves(workdir)  # loss, accuracy, learning rate and tokens/s so far
      if ckpt.manager.should_save(step) or is_last or stop:
        # The losses so far are finite; the parameters this step produced must be sane too.
        problem = state_problem(state['params'])
        if problem:
          raise _diverged(problem.replace('its parameters', 'the parameters'), step, last_good)
        if ckpt.save(step, state, data_position=batches.position, config=config_dict, force=True,
                     extra=extra_meta):
          last_good = step
      if stop:
        ckpt.wait()
        raise preemption.Preempted(preempt.message(step, saved=True))
  finally:
    batches.close()
    writer.close()
    eval_writer.close()
  if last_eval is None:  # resumed a finished run: nothing trained, evaluate what is there
    last_eval = evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                         prepared.most_frequent_token)
  result = {'step': step, **last_eval}
  if jax.process_index() == 0:
    with open(os.path.join(workdir, FINAL_METRICS_FILE), 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=2)
  return result


def describe_result(result: dict[str, Any]) -> str:
  """One line: held-out MLM (and NSP) accuracy beside their trivial baselines."""
  out = (f'held-out MLM accuracy {result["mlm_accuracy"]:.4f} (most-frequent-token baseline '
         f'{result["mlm_baseline_accuracy"]:.4f})')
  if 'nsp_accuracy' in result:
    out += (f', NSP accuracy {result["nsp_accuracy"]:.4f} (majority-class baseline '
            f'{result["nsp_baseline_accuracy"]:.4f})')
  return out


def _log_eval(step: int, result: dict[str, float]) -> None:
  metrics_lib.log(f'eval step {step} | ' + metrics_lib.format_metrics(
      {k: result[k] for k in ('mlm_loss', 'mlm_accuracy', 'mlm_baseline_accuracy', 'nsp_loss', 'nsp_accuracy')
       if k in result}))


class _PackingStats:
  """Packing efficiency of this process's rows since the last flush (data.pack)."""

  def __init__(self, cfg: PretrainConfig, num_blocks: int):
    self._blocks, self._local_examples = num_blocks, cfg.batch_size // num_blocks
    self._t = cfg.data.max_seq_length
    self._steps = self._rows = self._tokens = 0

  def add(self, local_batch: dict[str, np.ndarray]) -> None:
    self._steps += 1
    self._rows += local_batch['segment_ids'].shape[0]
    self._tokens += int(np.count_nonzero(local_batch['segment_ids']))

  def flush(self) -> dict[str, float]:
    """Mean global rows per batch and the fraction of real tokens, packed and unpacked."""
    steps = max(self._steps, 1)
    out = {'packed_rows': self._rows * self._blocks / steps,
           'packed_fill': self._tokens / max(self._rows * self._t, 1),
           'unpacked_fill': self._tokens / max(steps * self._local_examples * self._t, 1)}
    self._steps = self._rows = self._tokens = 0
    return out


def _workdir_model(workdir: str, mesh=None) -> tuple[PretrainConfig, PretrainingModel]:
  """A pretraining workdir's config (its config.json) and the model it describes, on `mesh` (default
  the workdir's own mesh config)."""
  kind = workdir_lib.kind_of(workdir)
  if kind not in (None, 'pretraining'):
    hint = (' (evaluate it with its finetune_*.py and --config.eval_only=True)' if kind == 'finetuning' else '')
    raise CheckpointError(f'{workdir} is a {kind} directory, not a pretraining workdir{hint}')
  saved = read_config(workdir)
  if saved is None:
    raise CheckpointError(f'{os.path.join(workdir, CONFIG_FILE)} is missing: not a complete pretraining '
                          'workdir (run experiments/pretrain.py --workdir=... first)')
  cfg = PretrainConfig.from_dict(saved)
  mesh = mesh or shd.make_mesh(cfg.mesh)
  model = PretrainingModel(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps), mesh,
                           seed=cfg.seed, nsp=cfg.data.nsp)
  return cfg, model


def restore_workdir(workdir: str, step: int | None = None, mesh=None):
  """Rebuilds a pretraining workdir's model from its config.json and restores `step` (latest when None).

  Args:
    workdir: a pretraining workdir.
    step: checkpoint step; latest when None.
    mesh: where to restore; the workdir's own mesh config when None.

  Returns:
    (config, PretrainingModel, {'params': ...} (the optimizer state is not read), checkpoint meta).
  """
  cfg, model = _workdir_model(workdir, mesh)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    state, meta = ckpt.restore(step, model.abstract_state, log=metrics_lib.log, params_only=True)
  finally:
    ckpt.close()
  return cfg, model, state, meta


def evaluate_checkpoint(workdir: str, step: int | None = None) -> dict[str, Any]:
  """Restores `step` (latest when None) from a pretraining workdir and evaluates it held-out."""
  cfg, model, state, meta = restore_workdir(workdir, step)
  validate_config(cfg, model.mesh)
  prepared, vocab = prepare_data(cfg)
  result = evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                    prepared.most_frequent_token)
  return {'step': int(meta['step']), **result}


def evaluate_all_checkpoints(workdir: str, on_result: Callable[[dict[str, Any]], None] | None = None
                             ) -> list[dict[str, Any]]:
  """Evaluates every checkpoint of a pretraining workdir held-out, oldest first; the workdir is only read.

  The model, the data and the compiled evaluation are built once; each step's result is what
  `evaluate_checkpoint(workdir, step)` returns.

  Args:
    workdir: a pretraining workdir.
    on_result: called with each step's result as soon as it is evaluated (e.g. to print a row).

  Returns:
    One result per checkpoint step: {'step', mlm_loss, mlm_accuracy, nsp_* (with NSP), ...}.

  Raises:
    CheckpointError: not a pretraining workdir, no checkpoint, or a checkpoint that is unusable.
  """
  cfg, model = _workdir_model(workdir)
  validate_config(cfg, model.mesh)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    steps = sorted(ckpt.all_steps())
    if not steps:
      raise CheckpointError(f'no checkpoint in {ckpt.directory}')
    prepared, vocab = prepare_data(cfg)
    results = []
    for step in steps:
      state, meta = ckpt.restore(step, model.abstract_state, log=metrics_lib.log, params_only=True)
      results.append({'step': int(meta['step']),
                      **evaluate(model, state['params'], _eval_iter(cfg, prepared, vocab, model.mesh),
                                 prepared.most_frequent_token)})
      del state  # one checkpoint's arrays in memory at a time
      if on_result:
        on_result(results[-1])
  finally:
    ckpt.close()
  return results
