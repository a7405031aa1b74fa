"""Experiment tracking where users already look: Weights & Biases and MLflow, beside the JSONL and TensorBoard files.

`start(cfg.tracking, ...)` gives a `Tracker` for one run directory (a fine-tuning seed is a run of its own): the
run's name and config when it starts, its train and held-out metrics per step, its final metrics and curves.png at
its end. Each service is imported only when chosen, and each is configured the way it documents: W&B by
WANDB_MODE (offline: files only) and WANDB_DIR, MLflow by MLFLOW_TRACKING_URI (a file store or a server). A run
continued after a preemption continues the same tracked run (its ids are kept in `tracking.json`). Process 0 only.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any, Protocol

import jax

from bert_jax import files
from bert_jax.config.training import tracking_services
from bert_jax.errors import ConfigError

IDS_FILE = 'tracking.json'  # in the run directory: the tracked runs' ids, to continue them on resume


class Tracker(Protocol):
  def log(self, step: int, metrics: dict[str, float], split: str) -> None:
    """`split`'s ('train' or 'eval') metrics at `step`."""

  def finish(self, summary: dict[str, Any] | None, images: dict[str, str]) -> None:
    """The run's final metrics (None: it stops to continue later) and pictures {name: png path}."""


_PACKAGES = {'wandb': ('wandb', 'wandb'), 'mlflow': ('mlflow', 'mlflow-skinny (or mlflow)')}  # module, pip name


def check(services: str) -> None:
  """ConfigError when a chosen service's package is not installed (before a run writes anything)."""
  for service in tracking_services(services):
    module, package = _PACKAGES[service]
    if importlib.util.find_spec(module) is None:
      raise ConfigError(f'tracking={services!r}: {service} is not installed: pip install {package} '
                        f'(or pip install -e ".[tracking]")')


def start(services: str, *, project: str, run_name: str, config: dict[str, Any], run_dir: str) -> Tracker:
  """A tracker sending to each service of a `tracking` field (checked by the config; none: one that does
  nothing)."""
  chosen = tracking_services(services)
  if not chosen or jax.process_index() != 0:
    return _Trackers([])
  ids = _read_ids(run_dir)
  trackers = [_SERVICES[s](project, run_name, config, run_dir, ids.get(s)) for s in chosen]
  files.write_json_atomic(os.path.join(run_dir, IDS_FILE), {s: t.run_id for s, t in zip(chosen, trackers)})
  return _Trackers(trackers)


def _read_ids(run_dir: str) -> dict[str, str]:
  try:
    with files.open(os.path.join(run_dir, IDS_FILE), encoding='utf-8') as f:
      ids = json.load(f)
    return ids if isinstance(ids, dict) else {}
  except (OSError, ValueError):
    return {}


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class _Trackers:
  def __init__(self, trackers: list):
    self.trackers = trackers

  def log(self, step: int, metrics: dict[str, float], split: str) -> None:
    for t in self.trackers:
      t.log(step, _numbers(metrics), split)

  def finish(self, summary: dict[str, Any] | None, images: dict[str, str]) -> None:
    for t in self.trackers:
      t.finish(summary and _numbers(summary), {k: p for k, p in images.items() if files.isfile(p)})


class _Wandb:
  """A W&B run (wandb.init; its files under the run directory unless WANDB_DIR says otherwise)."""

  def __init__(self, project: str, name: str, config: dict[str, Any], run_dir: str, run_id: str | None):
    import wandb  # pylint: disable=g-import-not-at-top  # only when chosen
    self._wandb = wandb
    self.run = wandb.init(project=project, name=name, config=config, id=run_id, resume='allow',
                          dir=os.environ.get('WANDB_DIR') or run_dir, reinit='create_new')
    self.run_id = self.run.id

  def log(self, step: int, metrics: dict[str, float], split: str) -> None:
    self.run.log({f'{split}/{k}': v for k, v in metrics.items()}, step=step)

  def finish(self, summary: dict[str, float] | None, images: dict[str, str]) -> None:
    if summary is not None:
      self.run.summary.update({f'final/{k}': v for k, v in summary.items()})
    if images:
      self.run.log({k: self._wandb.Image(p) for k, p in images.items()})
    self.run.finish(exit_code=0 if summary is not None else 75)


class _Mlflow:
  """An MLflow run (MLFLOW_TRACKING_URI: a file store, a database or a server), in experiment `project`."""

  def __init__(self, project: str, name: str, config: dict[str, Any], run_dir: str, run_id: str | None):
    del run_dir
    from mlflow import tracking  # pylint: disable=g-import-not-at-top  # only when chosen
    self.client = tracking.MlflowClient()
    if run_id is None:
      experiment = self.client.get_experiment_by_name(project)
      experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
      run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
      for key, value in _flat(config).items():
        self.client.log_param(run_id, key, str(value)[:500])  # MLflow's limit on a value's length
    else:
      self.client.update_run(run_id, status='RUNNING')
    self.run_id = run_id

  def log(self, step: int, metrics: dict[str, float], split: str) -> None:
    for k, v in metrics.items():
      self.client.log_metric(self.run_id, f'{split}/{k}', v, step=step)

  def finish(self, summary: dict[str, float] | None, images: dict[str, str]) -> None:
    for k, v in (summary or {}).items():
      self.client.log_metric(self.run_id, f'final/{k}', v)
    for path in images.values():
      self.client.log_artifact(self.run_id, path)
    self.client.set_terminated(self.run_id, status='FINISHED' if summary is not None else 'KILLED')


def _flat(config: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in config.items():
    out.update(_flat(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


_SERVICES = {'wandb': _Wandb, 'mlflow': _Mlflow}
