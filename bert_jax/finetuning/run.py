"""Fine-tuning runs: every task (GLUE, CoNLL-2003, SQuAD) through the one trainer, driven by a FinetuneConfig.

`finetune(cfg, workdir)` loads the starting checkpoint (read only), featurises the task once,
then for each seed trains in `workdir/seed_<n>/` with `train.loop.fit` (resuming from its latest
checkpoint, or skipping training when it is complete), evaluates, and writes
`final_metrics.json` there and, over all seeds, in `workdir` (each metric's per-seed values,
mean and sample std). Each seed logs metrics_train.jsonl and metrics_eval.jsonl; after each
seed's evaluation `workdir/curves.png` is redrawn from them.

Several processes (jax.distributed, started by the entry points' multi-host flags) run the same
run: each featurises the whole task (fine-tuning sets are small, and this keeps every input
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
import optax

from bert_jax import distributed, sharding as shd
from bert_jax.config import FinetuneConfig, ModelConfig, OptimConfig, check_resume, check_resume_allow
from bert_jax.data.tokenization import load_tokenizer, save_tokenizer
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.files import write_json_atomic
from bert_jax.finetuning import batching
from bert_jax.finetuning.objective import Finetuning
from bert_jax.finetuning.tasks import get_task
from bert_jax.finetuning.tasks.base import EvalSet, Feature, Task
from bert_jax.interop.pretrained import PretrainedBert, load_pretrained, own_tokenizer_file
from bert_jax.model.attention import describe_attention
from bert_jax.model.heads import head_model
from bert_jax.train import optim, reporting, workdir as workdir_lib
from bert_jax.train.checkpoints import Checkpointer, read_config, write_config
from bert_jax.train.loop import Report, fit
from bert_jax.train.preemption import Preemption
from bert_jax.train.step import StepModel

FINAL_METRICS_FILE = 'final_metrics.json'


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
  if cfg.eval_every < 0 or (cfg.keep_best and cfg.eval_every <= 0):
    raise ConfigError(f'eval_every={cfg.eval_every}: give a positive number of steps between evaluations'
                      + (' (keep_best ranks the checkpoints saved at each evaluation)' if cfg.keep_best else ''))
  vocab = pretrained.tokenizer.vocab_size
  if vocab > pretrained.config.vocab_size:
    raise ConfigError(f'the tokenizer of {cfg.init_checkpoint} has {vocab} tokens but the model only '
                      f'{pretrained.config.vocab_size} embeddings')


# Fields a resumed (or re-run) fine-tuning may change freely: evaluation, logging, checkpoint cadence.
_FREE_ON_RESUME = ('log_every', 'eval_batch_size', 'checkpoint_every', 'keep_checkpoints', 'eval_only', 'eval_step',
                   'eval_every', 'keep_best',
                   'num_seeds', 'seed', 'mesh', 'resume_allow', 'eval_file', 'n_best_size', 'max_answer_length',
                   'null_score_diff_threshold', 'tune_null_threshold', 'eval_articles')


def check_same_run(saved: dict[str, Any], cfg: FinetuneConfig, where: str, step: int | None = None) -> None:
  """Refuses a workdir (or seed checkpoint) written by a fine-tuning with another identity."""
  check_resume(saved, cfg.to_dict(), _FREE_ON_RESUME, cfg.resume_allow, where, step)


def total_steps(cfg: FinetuneConfig, num_train: int) -> int:
  if cfg.max_steps > 0:
    return cfg.max_steps
  return max(1, math.ceil(cfg.num_train_epochs * math.ceil(num_train / cfg.batch_size)))


@dataclasses.dataclass
class _Run:
  """What every seed of a run shares: config, task, starting weights, features and the model."""

  cfg: FinetuneConfig
  task: Task
  pretrained: PretrainedBert
  model: StepModel
  train: list[Feature]
  evals: list[EvalSet]
  total: int
  rows_multiple: int
  block: tuple[int, int] = (0, 1)  # (index, count): the block of every batch this process feeds


# With eval_only, what the command line may set; the rest of the config is the workdir's own training config.
_EVAL_FIELDS = ('eval_only', 'eval_step', 'eval_file', 'eval_batch_size', 'num_seeds', 'seed', 'mesh', 'log_every',
                'n_best_size', 'max_answer_length', 'null_score_diff_threshold', 'tune_null_threshold',
                'eval_articles')


def finetune(cfg: FinetuneConfig, workdir: str) -> dict[str, Any]:
  """Trains (or, with eval_only, restores) every seed and returns the metrics over all seeds."""
  saved = read_config(workdir) if os.path.isdir(workdir) else None
  if cfg.eval_only:
    if saved is None or 'finetune' not in saved:
      raise ConfigError(f'eval_only: {workdir} holds no fine-tuning run to evaluate (no config.json); train first')
    # Evaluate the run as it was trained: its own config, with the evaluation fields given now.
    given = cfg.to_dict()
    cfg = FinetuneConfig.from_dict({**saved['finetune'], **{f: given[f] for f in _EVAL_FIELDS}})
  task = get_task(cfg.task)
  if not cfg.init_checkpoint:
    raise ConfigError('set --config.init_checkpoint to a Hugging Face directory or a bert_jax workdir')
  workdir_lib.check_outside(workdir, cfg.init_checkpoint, 'the starting checkpoint')
  workdir_lib.check_kind(workdir, 'finetuning')
  if saved is not None:
    check_same_run(saved['finetune'], cfg, f'workdir {workdir}')
  with (workdir_lib.claim(workdir, 'finetuning', owner=jax.process_index() == 0, log=reporting.log),
        Preemption() as preempt):
    with preempt.immediately('loading the checkpoint and featurising the task'):
      run = _prepare(cfg, task, workdir)
    if not cfg.eval_only:  # evaluation keeps the training run's config.json
      write_config(workdir, {'finetune': cfg.to_dict(), 'model': dataclasses.asdict(run.pretrained.config),
                             'task': {'name': task.name, 'kind': task.kind, 'num_labels': task.num_labels,
                                      'label_names': list(getattr(task, 'label_names', []))}})
      if jax.process_index() == 0 and not own_tokenizer_file(workdir):  # the workdir is used on its own later
        save_tokenizer(run.pretrained.tokenizer, workdir)
    per_seed = [_run_seed(run, seed, os.path.join(workdir, f'seed_{seed}'), preempt)
                for seed in range(cfg.seed, cfg.seed + cfg.num_seeds)]
  summary = summarize_seeds(per_seed, main_metric=_main_key(run))
  summary = {'task': task.name, 'init_checkpoint': cfg.init_checkpoint, **summary}
  # Training writes its results in the workdir; an evaluation again writes beside them.
  _write_json(os.path.join(workdir, _results_name(cfg, per_seed[0]['step']) + '.json' if cfg.eval_only
                           else FINAL_METRICS_FILE), summary)
  return summary


def _main_key(run: '_Run') -> str:
  return f'{run.evals[0].name}_{run.task.main_metric}'


def _results_name(cfg: FinetuneConfig, step: int) -> str:
  """Where an evaluation again puts its results: eval_step<N>, and the eval file's name when one is given."""
  stem = os.path.splitext(os.path.basename(cfg.eval_file))[0] if cfg.eval_file else ''
  return f'eval_step{step}' + (f'_{stem}' if stem else '')


def _optim_config(cfg: FinetuneConfig, warmup: int) -> OptimConfig:
  return OptimConfig(learning_rate=cfg.learning_rate, warmup_steps=warmup, weight_decay=cfg.weight_decay,
                     eps=cfg.adam_eps, clip_norm=cfg.clip_norm)


def finetuning_model(model_cfg: ModelConfig, kind: str, num_labels: int, tx: optax.GradientTransformation, mesh,
                     schedule=None, rules=shd.LOGICAL_AXIS_RULES) -> StepModel:
  """The head model of `kind` under its fine-tuning objective, as a StepModel (one for every seed)."""
  return StepModel(lambda rngs: head_model(kind, model_cfg, num_labels, rngs=rngs), Finetuning(kind), tx, mesh,
                   schedule=schedule, state_rng=lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                   rules=rules)


def _prepare(cfg: FinetuneConfig, task: Task, workdir: str) -> _Run:
  """Loads the starting weights, featurises the task and builds the model every seed shares.

  A workdir that holds a tokenizer (saved when its training started) featurises with it; training
  refuses a starting checkpoint whose tokenizer is no longer that one.
  """
  loaded = load_pretrained(cfg.init_checkpoint, None if cfg.init_checkpoint_step < 0 else cfg.init_checkpoint_step)
  tokenizer, own = loaded.tokenizer, own_tokenizer_file(workdir)
  if own:
    tokenizer = load_tokenizer(own)
    if not cfg.eval_only and tokenizer.identity() != loaded.tokenizer.identity():
      raise ConfigError(f'the tokenizer of the starting checkpoint {cfg.init_checkpoint} is not the one this run '
                        f'was fine-tuned with ({own}): that path now holds another model. Restore it, or use a new '
                        '--workdir')
  pretrained = dataclasses.replace(loaded, tokenizer=tokenizer,
                                   config=dataclasses.replace(loaded.config, dtype=cfg.dtype))
  mesh = shd.make_mesh(cfg.mesh)
  validate_config(cfg, pretrained, mesh)
  t0 = time.time()
  train = [] if cfg.eval_only else task.train_features(cfg, pretrained.tokenizer)
  evals = task.eval_sets(cfg, pretrained.tokenizer)
  reporting.log(f'{task.name}: {len(train)} training features, eval '
                + ', '.join(f'{e.name} {len(e.features)}' for e in evals)
                + f' (featurised in {time.time() - t0:.1f}s)')
  if not cfg.eval_only and not train:
    raise BertJaxError(f'{task.name}: no training examples')
  total = total_steps(cfg, len(train)) if train else 0
  ocfg = _optim_config(cfg, math.ceil(cfg.warmup_ratio * total))
  reporting.log(describe_attention(pretrained.config))
  model = finetuning_model(pretrained.config, task.kind, task.num_labels, optim.make_optimizer(ocfg, max(total, 1)),
                           mesh, schedule=optim.learning_rate_schedule(ocfg, max(total, 1)),
                           rules=shd.rules(cfg.mesh.rules))
  return _Run(cfg, task, pretrained, model, train, evals, total, rows_multiple=2 * shd.num_batch_shards(mesh),
              block=distributed.process_batch_block(mesh))


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


def _run_seed(run: _Run, seed: int, seed_dir: str, preempt: Preemption) -> dict[str, Any]:
  """Trains seed `seed` (or restores it, with eval_only), evaluates it and writes its results."""
  cfg, model = run.cfg, run.model
  best_metric = _main_key(run) if cfg.keep_best else None
  ckpt = Checkpointer(seed_dir, save_every=cfg.eval_every if cfg.keep_best else cfg.checkpoint_every or max(run.total, 1),
                      keep=cfg.keep_checkpoints, read_only=cfg.eval_only, best_metric=best_metric)
  try:
    if cfg.eval_only:
      if ckpt.latest_step() is None:
        raise CheckpointError(f'eval_only: no checkpoint in {ckpt.directory}; train first')
      state, meta = ckpt.restore(None if cfg.eval_step < 0 else cfg.eval_step, model.abstract_state,
                                 log=reporting.log, params_only=True)
      step = int(meta['step'])
      out_dir = os.path.join(seed_dir, _results_name(cfg, step))  # beside the training results, never over them
      result = {'seed': seed, 'step': step, **_evaluate(run, state['params'], out_dir)}
      _write_json(os.path.join(out_dir, FINAL_METRICS_FILE), result)
      _log_result(run, seed, result)
      return result
    if ckpt.latest_step() is not None:
      state, meta = ckpt.restore(None, model.abstract_state, log=reporting.log,
                                 check_meta=lambda meta: check_same_run(meta['config'], cfg, seed_dir, meta['step']))
      reporting.log(f'seed {seed}: resumed from {ckpt.directory} at step {int(state["step"])}')
    else:
      state = model.init_state({'bert': run.pretrained.params['bert']}, seed)
    start = int(jax.device_get(state['step']))
    reporting.log(f'seed {seed}: training {run.total - start} of {run.total} steps, batch {cfg.batch_size}, '
                  f'{len(run.train)} features, {"packed" if cfg.pack else "padded"} rows')
    batches = batching.TrainBatches(run.train, run.task.kind, batch_size=cfg.batch_size,
                                    row_length=cfg.max_seq_length, pack=cfg.pack, rows_multiple=run.rows_multiple,
                                    seed=seed, shuffle=cfg.shuffle, start=start, block=run.block)
    # Evaluated every eval_every steps and at the last; the last (unless the best is kept) writes predictions.
    last_dir = seed_dir if not cfg.keep_best else None
    held_out = lambda params, step: _evaluate(run, params, last_dir if step == run.total else None)  # pylint: disable=unnecessary-lambda-assignment
    fitted = fit(model, state, batches, total_steps=run.total, ckpt=ckpt, preempt=preempt,
                 report=Report(seed_dir, label=f'seed {seed}: ', eval_keys=(_main_key(run), 'eval_wall_s'),
                               curves_dir=os.path.dirname(seed_dir), curves_metrics=_curve_metrics(run),
                               divergence_hint='Lower --config.learning_rate'),
                 log_every=cfg.log_every, checkpoint_config=cfg.to_dict(), evaluate=held_out,
                 eval_every=cfg.eval_every)
    ckpt.wait()
    result = {'seed': seed, 'step': fitted.step, **fitted.stats, **(fitted.last_eval or {})}
    if fitted.last_eval is None:  # a finished run resumed: nothing trained, evaluate what is there
      result.update(_evaluate(run, fitted.state['params'], seed_dir))
    if cfg.keep_best:
      best = ckpt.best_step(best_metric)
      state, _ = ckpt.restore(best, model.abstract_state, log=reporting.log, params_only=True)
      result.update({'best_step': best, **_evaluate(run, state['params'], seed_dir)})
    _write_json(os.path.join(seed_dir, FINAL_METRICS_FILE), result)
    # Every seed's train curves and held-out main metric(s) so far, in workdir/curves.png.
    reporting.write_curves(os.path.dirname(seed_dir), metrics=_curve_metrics(run))
    _log_result(run, seed, result)
    return result
  finally:
    ckpt.close()


def _evaluate(run: _Run, params, output_dir: str | None) -> dict[str, Any]:
  """Every eval set's metrics ('<set>_<metric>') and eval_wall_s; predictions written to `output_dir` if given."""
  t0, held_out = time.time(), {}
  for eval_set in run.evals:
    logits = predict(run, params, eval_set.features)
    # Every process has all the logits and scores them; process 0 alone writes the predictions.
    scores = run.task.evaluate(eval_set, logits, output_dir if jax.process_index() == 0 else None)
    held_out.update({f'{eval_set.name}_{k}': v for k, v in scores.items()})
  return {**held_out, 'eval_wall_s': time.time() - t0}


def _curve_metrics(run: _Run) -> list[str]:
  return [f'{e.name}_{run.task.main_metric}' for e in run.evals]


def _log_result(run: _Run, seed: int, result: dict[str, Any]) -> None:
  main = _main_key(run)
  best = f' (best step {result["best_step"]})' if 'best_step' in result else ''
  reporting.log(f'seed {seed} step {result["step"]}: {main} {result[main]:.4f}{best} '
                f'(eval {reporting.format_duration(result["eval_wall_s"])})')


def predict(run: _Run, params, features: list[Feature]) -> list[np.ndarray]:
  """Logits for each feature, in order (see tasks.base for the shapes), on every process."""
  out: list[np.ndarray] = []
  size = run.cfg.eval_batch_size
  for i in range(0, len(features), size):
    chunk = features[i:i + size]
    host = batching.make_batch(chunk, run.task.kind, batch_size=size, row_length=run.cfg.max_seq_length,
                               pack=run.cfg.pack, rows_multiple=run.rows_multiple)
    batch = run.model.global_batch(batching.process_block(host, *run.block))
    logits = np.asarray(jax.device_get(run.model.predict_step(params, run.model.rest, batch)))
    if run.task.kind in ('classification', 'regression'):
      out.extend(logits[:len(chunk)])
    else:
      out.extend(batching.rows_of_examples(logits, host, len(chunk)))
  return out


def print_summary(result: dict[str, Any]) -> None:
  """The run's main metric in words, then the whole result as one JSON line (without per-seed copies).

  Process 0 prints (`reporting.log`); the others, which hold the same result, stay silent.
  """
  main = result['main_metric']
  line = f'{result["task"]}: {main} {result[main]:.4f}'
  if main.endswith('_mean'):
    std = result[main[:-len('_mean')] + '_std']
    values = ', '.join(f'{v:.4f}' for v in result[main[:-len('_mean')] + '_per_seed'])
    line += f' ± {std:.4f} over seeds {result["seeds"]} ({values})'
  reporting.log(line)
  reporting.log(json.dumps({k: v for k, v in result.items() if k != 'per_seed'}))
