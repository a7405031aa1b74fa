"""Fine-tuning: one loop for every task (GLUE, CoNLL-2003, SQuAD), driven by a FinetuneConfig.

`finetune(cfg, workdir)` loads the starting checkpoint (read only), featurises the task once,
then for each seed trains in `workdir/seed_<n>/` (resuming from its latest checkpoint, or
skipping training when it is complete), evaluates, and writes `final_metrics.json` there and,
over all seeds, in `workdir` (each metric's per-seed values, mean and sample std). Each seed logs
metrics_train.jsonl and metrics_eval.jsonl; after each seed's evaluation `workdir/curves.png` is
redrawn from them.

A step's batch is a pure function of (seed, step): the order is a per-epoch permutation, so
resuming needs only the step. Batches are packed (`packing.py`) unless `pack=False`.

Several processes (jax.distributed, started by the entry points' multi-host flags) run the same
loop: each featurises the whole task (fine-tuning sets are small, and this keeps every input
decision local and identical), builds the same host batch and feeds only its block of it
(`distributed.process_batch_block`). Predictions come back replicated, so every process scores
them; process 0 alone prints and writes predictions, metrics and config.json, while all of them
save and restore the Orbax checkpoints together.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import numpy as np

from bert_jax import distributed, metrics as metrics_lib, optim, preemption, sharding as shd
from bert_jax import workdir as workdir_lib
from bert_jax.data import packing
from bert_jax.checkpointing import Checkpointer, read_config, state_problem, write_config
from bert_jax.config import FinetuneConfig, MeshConfig, ModelConfig, OptimConfig, check_resume, check_resume_allow
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.files import write_json_atomic
from bert_jax.finetune_state import FinetuneModel
from bert_jax.pretrained import PretrainedBert, load_pretrained
from bert_jax.tasks import conll, glue, squad
from bert_jax.tasks.base import EvalSet, Feature, Task

FINAL_METRICS_FILE = 'final_metrics.json'


def get_task(name: str) -> Task:
  tasks: dict[str, Task] = {**glue.TASKS, 'conll2003': conll.Conll2003(), 'squad': squad.Squad(False),
                            'squad_v2': squad.Squad(True)}
  if name not in tasks:
    raise ConfigError(f'unknown task {name!r}; choose from {", ".join(tasks)}')
  return tasks[name]


def validate_config(cfg: FinetuneConfig, pretrained: PretrainedBert, mesh) -> None:
  """Checks values that would otherwise fail deep inside featurisation or jit."""
  positions = pretrained.config.max_position_embeddings
  if cfg.max_seq_length > positions:
    raise ConfigError(f'max_seq_length={cfg.max_seq_length} exceeds the checkpoint\'s '
                      f'max_position_embeddings={positions} ({cfg.init_checkpoint})')
  if cfg.max_seq_length < 8:
    raise ConfigError(f'max_seq_length={cfg.max_seq_length} is too short')
  for name in ('batch_size', 'eval_batch_size', 'num_seeds', 'log_every', 'keep_checkpoints'):
    if getattr(cfg, name) <= 0:
      raise ConfigError(f'{name} must be positive, got {getattr(cfg, name)}')
  if not (math.isfinite(cfg.learning_rate) and cfg.learning_rate > 0):
    raise ConfigError(f'learning_rate must be a positive number, got {cfg.learning_rate}')
  if cfg.max_steps <= 0 and cfg.num_train_epochs <= 0:
    raise ConfigError('set num_train_epochs > 0 or max_steps > 0')
  if not 0 <= cfg.warmup_ratio <= 1:
    raise ConfigError(f'warmup_ratio must be in [0, 1], got {cfg.warmup_ratio}')
  if cfg.dtype not in ('float32', 'bfloat16'):
    raise ConfigError(f"dtype must be 'float32' or 'bfloat16', got {cfg.dtype!r}")
  # A batch's per-example arrays (batch_size slots) and its rows (padded: one per slot; packed: rounded
  # to rows_multiple, a multiple of the shards) are both split over the batch shards. Each process
  # feeds one block of them, and the shards are a multiple of the blocks, so this covers processes too.
  shards = shd.num_batch_shards(mesh)
  for name in ('batch_size', 'eval_batch_size'):
    if getattr(cfg, name) % shards:
      over = f' over {jax.process_count()} processes' if jax.process_count() > 1 else ''
      raise ConfigError(f'{name}={getattr(cfg, name)} must be a multiple of the {shards} batch shards (mesh data '
                        f'x fsdp{over}): every batch\'s examples and rows are split over them')
  check_resume_allow(cfg.resume_allow, cfg.to_dict())
  vocab = pretrained.tokenizer.vocab_size
  if vocab > pretrained.config.vocab_size:
    raise ConfigError(f'the tokenizer of {cfg.init_checkpoint} has {vocab} tokens but the model only '
                      f'{pretrained.config.vocab_size} embeddings')


# Fields a resumed (or re-run) fine-tuning may change freely: evaluation, logging, checkpoint cadence.
_FREE_ON_RESUME = ('log_every', 'eval_batch_size', 'checkpoint_every', 'keep_checkpoints', 'eval_only', 'eval_step',
                   'num_seeds', 'seed', 'mesh', 'resume_allow', 'eval_file', 'n_best_size', 'max_answer_length',
                   'null_score_diff_threshold', 'tune_null_threshold', 'eval_articles')


def check_same_run(saved: dict[str, Any], cfg: FinetuneConfig, where: str, step: int | None = None) -> None:
  """Refuses a workdir (or seed checkpoint) written by a fine-tuning with another identity."""
  check_resume(saved, cfg.to_dict(), _FREE_ON_RESUME, cfg.resume_allow, where, step)


def total_steps(cfg: FinetuneConfig, num_train: int) -> int:
  if cfg.max_steps > 0:
    return cfg.max_steps
  return max(1, math.ceil(cfg.num_train_epochs * math.ceil(num_train / cfg.batch_size)))


def batch_indices(cfg: FinetuneConfig, seed: int, step: int, num_train: int) -> np.ndarray:
  """The training-set indices of step `step`'s batch: a fresh permutation every epoch."""
  per_epoch = math.ceil(num_train / cfg.batch_size)
  epoch, i = divmod(step, per_epoch)
  order = (np.random.default_rng([seed, epoch]).permutation(num_train) if cfg.shuffle
           else np.arange(num_train))
  return order[i * cfg.batch_size:(i + 1) * cfg.batch_size]


@dataclasses.dataclass
class _Run:
  cfg: FinetuneConfig
  task: Task
  pretrained: PretrainedBert
  model: FinetuneModel
  train: list[Feature]
  evals: list[EvalSet]
  total: int
  rows_multiple: int
  block: tuple[int, int] = (0, 1)  # (index, count): the block of every batch this process feeds
  schedule: Any = None  # step -> learning rate, the optimizer's (logged beside the loss)

  def batch(self, features: list[Feature], batch_size: int) -> tuple[dict[str, jax.Array], dict[str, np.ndarray]]:
    """(the global batch for the jitted steps, the whole host batch it came from).

    Every process builds the same host batch from the same features and feeds its block of it.
    """
    host = packing.make_batch(features, self.task.kind, batch_size=batch_size, row_length=self.cfg.max_seq_length,
                              pack=self.cfg.pack, rows_multiple=self.rows_multiple)
    return self.model.global_batch(process_block(host, *self.block)), host


def process_block(host: dict[str, np.ndarray], index: int, count: int) -> dict[str, np.ndarray]:
  """Block `index` of `count` of every array's leading axis (rows [R, ...] or example slots [E]).

  The blocks of all processes, in order, are the whole host batch, as
  `jax.make_array_from_process_local_data` assembles them.
  """
  if count == 1:
    return host
  out = {}
  for k, v in host.items():
    if len(v) % count:
      raise ValueError(f'{k} has {len(v)} rows, which do not split into {count} process blocks')
    size = len(v) // count
    out[k] = v[index * size:(index + 1) * size]
  return out


def finetune(cfg: FinetuneConfig, workdir: str) -> dict[str, Any]:
  """Trains (or, with eval_only, restores) every seed and returns the metrics over all seeds."""
  task = get_task(cfg.task)
  if not cfg.init_checkpoint:
    raise ConfigError('set --config.init_checkpoint to a Hugging Face directory or a bert_jax workdir')
  init = os.path.abspath(cfg.init_checkpoint)
  work = os.path.abspath(workdir)
  if work == init or work.startswith(init + os.sep):
    raise ConfigError(f'workdir {workdir} is inside the starting checkpoint {cfg.init_checkpoint}; '
                      'fine-tuning never writes there: choose another --workdir')
  workdir_lib.check_kind(workdir, 'finetuning')
  saved = read_config(workdir)
  if saved is not None:
    check_same_run(saved['finetune'], cfg, f'workdir {workdir}')
  with workdir_lib.claim(workdir, 'finetuning', owner=jax.process_index() == 0, log=metrics_lib.log):
    return _finetune(cfg, workdir, task)


def _optim_config(cfg: FinetuneConfig, warmup: int) -> OptimConfig:
  return OptimConfig(learning_rate=cfg.learning_rate, warmup_steps=warmup, weight_decay=cfg.weight_decay,
                     eps=cfg.adam_eps, clip_norm=cfg.clip_norm)


def restore_encoder(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
  """The encoder ('bert': embeddings, layers, pooler) of a fine-tuning workdir's first seed, at
  checkpoint `step` (latest when None), as host arrays; the workdir is only read.

  Returns:
    ({'bert': params}, the checkpoint step).
  """
  saved = read_config(workdir)
  if saved is None or 'finetune' not in saved:
    raise CheckpointError(f'{workdir} is not a complete fine-tuning workdir (no config.json)')
  cfg = FinetuneConfig.from_dict(saved['finetune'])
  task = saved['task']
  model = FinetuneModel(ModelConfig.from_saved(saved['model']), task['kind'], task['num_labels'],
                        optim.make_optimizer(_optim_config(cfg, 0), 1),
                        shd.make_mesh(MeshConfig(), jax.devices()[:1]))
  seed_dir = os.path.join(workdir, f'seed_{cfg.seed}')
  ckpt = Checkpointer(seed_dir, read_only=True)
  try:
    if ckpt.latest_step() is None:
      raise CheckpointError(f'{workdir}: no checkpoint in {ckpt.directory} (the fine-tuning run never saved)')
    state, meta = ckpt.restore(step, model.abstract_state, log=metrics_lib.log, params_only=True)
  finally:
    ckpt.close()
  return {'bert': jax.device_get(state['params']['bert'])}, int(meta['step'])


def _finetune(cfg: FinetuneConfig, workdir: str, task: Task) -> dict[str, Any]:
  pretrained = load_pretrained(cfg.init_checkpoint, None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
  mesh = shd.make_mesh(cfg.mesh)
  validate_config(cfg, pretrained, mesh)
  block = distributed.process_batch_block(mesh)
  t0 = time.time()
  train = [] if cfg.eval_only else task.train_features(cfg, pretrained.tokenizer)
  evals = task.eval_sets(cfg, pretrained.tokenizer)
  metrics_lib.log(f'{task.name}: {len(train)} training features, eval '
                  + ', '.join(f'{e.name} {len(e.features)}' for e in evals)
                  + f' (featurised in {time.time() - t0:.1f}s)')
  if not cfg.eval_only and not train:
    raise BertJaxError(f'{task.name}: no training examples')
  total = total_steps(cfg, len(train)) if train else 0
  warmup = math.ceil(cfg.warmup_ratio * total)
  ocfg = _optim_config(cfg, warmup)
  model_cfg = dataclasses.replace(pretrained.config, dtype=cfg.dtype)
  model = FinetuneModel(model_cfg, task.kind, task.num_labels, optim.make_optimizer(ocfg, max(total, 1)), mesh)
  run = _Run(cfg, task, pretrained, model, train, evals, total, rows_multiple=2 * shd.num_batch_shards(mesh),
             block=block, schedule=optim.learning_rate_schedule(ocfg, max(total, 1)))
  if not cfg.eval_only:  # evaluation keeps the training run's config.json
    write_config(workdir, {'finetune': cfg.to_dict(), 'model': dataclasses.asdict(model_cfg),
                           'task': {'name': task.name, 'kind': task.kind, 'num_labels': task.num_labels}})
  per_seed = []
  for seed in range(cfg.seed, cfg.seed + cfg.num_seeds):
    seed_dir = os.path.join(workdir, f'seed_{seed}')
    result = _run_seed(run, seed, seed_dir)
    _write_json(os.path.join(seed_dir, FINAL_METRICS_FILE), result)
    per_seed.append(result)
    # Every seed's train curves and held-out main metric(s) so far, in workdir/curves.png.
    metrics_lib.write_curves(workdir, metrics=[f'{e.name}_{task.main_metric}' for e in evals])
  summary = summarize_seeds(per_seed, main_metric=f'{evals[0].name}_{task.main_metric}')
  summary = {'task': task.name, 'init_checkpoint': cfg.init_checkpoint, **summary}
  _write_json(os.path.join(workdir, FINAL_METRICS_FILE), summary)
  return summary


def summarize_seeds(per_seed: list[dict[str, Any]], main_metric: str) -> dict[str, Any]:
  """One seed: its metrics. Several: `<name>_mean`, `<name>_std` (sample std) and the per-seed values."""
  if len(per_seed) == 1:
    return {'main_metric': main_metric, **per_seed[0]}
  out: dict[str, Any] = {'main_metric': f'{main_metric}_mean', 'seeds': [r['seed'] for r in per_seed],
                         'step': per_seed[0]['step']}
  for name, value in per_seed[0].items():
    if name in ('seed', 'step', 'train_steps') or isinstance(value, (dict, list, str, bool)):
      continue
    values = [float(r[name]) for r in per_seed]
    out[f'{name}_mean'] = float(np.mean(values))
    out[f'{name}_std'] = float(np.std(values, ddof=1))
    out[f'{name}_per_seed'] = values
  out['per_seed'] = per_seed
  return out


def _write_json(path: str, obj: Any) -> None:
  if jax.process_index() == 0:
    write_json_atomic(path, obj)


def _run_seed(run: _Run, seed: int, seed_dir: str) -> dict[str, Any]:
  cfg, model = run.cfg, run.model
  ckpt = Checkpointer(seed_dir, save_every=cfg.checkpoint_every or max(run.total, 1), keep=cfg.keep_checkpoints,
                      read_only=cfg.eval_only)
  try:
    if cfg.eval_only:
      if ckpt.latest_step() is None:
        raise CheckpointError(f'eval_only: no checkpoint in {ckpt.directory}; train first')
      state, meta = ckpt.restore(None if cfg.eval_step < 0 else cfg.eval_step, model.abstract_state,
                                 log=metrics_lib.log, params_only=True)
      state['step'] = meta['step']
      train_stats = {}
    else:
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(None, model.abstract_state, log=metrics_lib.log,
                                   check_meta=lambda meta: check_same_run(meta['config'], cfg, seed_dir,
                                                                          meta['step']))
        metrics_lib.log(f'seed {seed}: resumed from {ckpt.directory} at step {int(state["step"])}')
      else:
        state = model.init_state(run.pretrained.params['bert'], seed)
      state, train_stats = _train(run, seed, seed_dir, state, ckpt)
    step = int(jax.device_get(state['step']))
    result = {'seed': seed, 'step': step, **train_stats}
    t0 = time.time()
    held_out = {}
    for eval_set in run.evals:
      logits = predict(run, state['params'], eval_set.features)
      # Every process has all the logits and scores them; process 0 alone writes the predictions.
      scores = run.task.evaluate(eval_set, logits, seed_dir if jax.process_index() == 0 else None)
      held_out.update({f'{eval_set.name}_{k}': v for k, v in scores.items()})
    result.update(held_out)
    result['eval_wall_s'] = time.time() - t0
    _write_eval_metrics(seed_dir, step, held_out)
    main = f'{run.evals[0].name}_{run.task.main_metric}'
    metrics_lib.log(f'seed {seed} step {step}: {main} {result[main]:.4f} '
                    f'(eval {metrics_lib.format_duration(result["eval_wall_s"])})')
    return result
  finally:
    ckpt.close()


def _write_eval_metrics(seed_dir: str, step: int, scores: dict[str, Any]) -> None:
  """Appends the held-out scores (the numbers among them) to seed_dir/metrics_eval.jsonl and TensorBoard."""
  writer = metrics_lib.MetricWriter(seed_dir, 'eval')
  try:
    writer.write(step, {k: v for k, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
  finally:
    writer.close()


def _train(run: _Run, seed: int, seed_dir: str, state, ckpt: Checkpointer):
  """Trains from `state` to run.total. Losses are checked at every sync (log and save steps) and the
  parameters before every save; SIGTERM/SIGINT save the current step and raise Preempted."""
  cfg, model = run.cfg, run.model
  start = int(jax.device_get(state['step']))
  writer = metrics_lib.MetricWriter(seed_dir, 'train')
  progress = metrics_lib.Progress(start, run.total, cfg.batch_size)
  config_dict = cfg.to_dict()
  metrics_lib.log(f'seed {seed}: training {run.total - start} of {run.total} steps, batch {cfg.batch_size}, '
                  f'{len(run.train)} features, {"packed" if cfg.pack else "padded"} rows')
  pending, real_tokens, row_tokens = [], 0, 0
  window_steps = window_tokens = 0  # since the last log line: its tokens/s
  last_good = ckpt.latest_step()
  t0 = time.time()
  try:
    with preemption.Preemption() as preempt:
      if preempt.stop_now(start, synced=False):  # a signal during featurisation or compilation
        raise preemption.Preempted(preempt.message(start, saved=False))
      for step in range(start, run.total):
        features = [run.train[i] for i in batch_indices(cfg, seed, step, len(run.train))]
        batch, host = run.batch(features, cfg.batch_size)
        real_tokens += sum(len(f) for f in features)
        row_tokens += host['input_ids'].size
        window_steps, window_tokens = window_steps + 1, window_tokens + host['input_ids'].size
        state, step_metrics = model.train_step(state, batch, model.rest)
        pending.append(step_metrics)
        done = step + 1
        log_now = done % cfg.log_every == 0 or done == run.total
        save_now = ckpt.manager.should_save(done) or done == run.total
        stop = preempt.stop_now(done, synced=log_now or save_now)
        if log_now or save_now or stop:
          host = jax.device_get(pending)
          pending = []
          losses = [float(m['loss']) for m in host]
          if not all(math.isfinite(x) for x in losses):
            raise _diverged(seed, f'the loss became {[x for x in losses if not math.isfinite(x)][0]}', done,
                            last_good)
          if log_now:
            rate = progress.update(done)
            writer.write(done, {'loss': float(np.mean(losses)),
                                'grad_norm': float(np.mean([m['grad_norm'] for m in host])),
                                'learning_rate': float(run.schedule(done - 1)),  # that of the last step
                                'examples_per_s': rate['tokens_per_s'],
                                'tokens_per_s': rate['steps_per_s'] * window_tokens / window_steps})
            window_steps = window_tokens = 0
            metrics_lib.log(f'seed {seed} step {done}/{run.total} | loss {np.mean(losses):.4f} | '
                            f'{rate["tokens_per_s"]:.1f} ex/s | elapsed '
                            f'{metrics_lib.format_duration(time.time() - t0)} | ETA '
                            f'{metrics_lib.format_duration(rate["eta_s"])}')
        if save_now or stop:
          problem = state_problem(state['params'])
          if problem:
            raise _diverged(seed, problem.replace('its parameters', 'the parameters'), done, last_good)
          if ckpt.save(done, state, data_position=done, config=config_dict, force=True):
            last_good = done
        if stop:
          ckpt.wait()
          raise preemption.Preempted(f'seed {seed}: ' + preempt.message(done, saved=True))
    jax.block_until_ready(state)
  finally:
    writer.close()
  wall = time.time() - t0
  stats = {'train_steps': run.total - start, 'train_wall_s': wall}
  if row_tokens:
    stats['train_padding_fraction'] = 1 - real_tokens / row_tokens
  return state, stats


def _diverged(seed: int, what: str, step: int, last_good: int | None) -> BertJaxError:
  kept = f'the last good checkpoint (step {last_good}) is kept' if last_good else 'nothing was saved'
  return BertJaxError(f'seed {seed}: {what} at or before step {step}; stopping, {kept}. Lower '
                      '--config.learning_rate')


def predict(run: _Run, params, features: list[Feature]) -> list[np.ndarray]:
  """Logits for each feature, in order (see tasks.base for the shapes), on every process."""
  out: list[np.ndarray] = []
  size = run.cfg.eval_batch_size
  for i in range(0, len(features), size):
    chunk = features[i:i + size]
    batch, host = run.batch(chunk, size)
    logits = np.asarray(jax.device_get(run.model.predict_step(params, run.model.rest, batch)))
    if run.task.kind in ('classification', 'regression'):
      out.extend(logits[:len(chunk)])
    else:
      out.extend(packing.rows_of_examples(logits, host, len(chunk)))
  return out


def print_summary(result: dict[str, Any]) -> None:
  """The run's main metric in words, then the whole result as one JSON line (without per-seed copies).

  Process 0 prints (`metrics.log`); the others, which hold the same result, stay silent.
  """
  main = result['main_metric']
  line = f'{result["task"]}: {main} {result[main]:.4f}'
  if main.endswith('_mean'):
    std = result[main[:-len('_mean')] + '_std']
    values = ', '.join(f'{v:.4f}' for v in result[main[:-len('_mean')] + '_per_seed'])
    line += f' ± {std:.4f} over seeds {result["seeds"]} ({values})'
  metrics_lib.log(line)
  metrics_lib.log(json.dumps({k: v for k, v in result.items() if k != 'per_seed'}))
