"""One Orbax CheckpointManager for the whole training state.

A checkpoint holds two items: `state` (params, optimizer state, step, RNG key — arrays,
restored straight into their target shardings) and `meta` (JSON: data-iterator position,
step and the run's config, so a checkpoint directory describes itself). The config is also
written once as `workdir/config.json`, beside the checkpoints.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bert_jax.errors import CheckpointError
from bert_jax.files import write_json_atomic

CONFIG_FILE = 'config.json'


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def read_config(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def write_config(workdir: str, config: dict[str, Any]) -> None:
  """Writes workdir/config.json atomically (process 0)."""
  if jax.process_index() == 0:
    write_json_atomic(os.path.join(workdir, CONFIG_FILE), config, sort_keys=True)


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


class Checkpointer:
  """Saves every `save_every` steps (asynchronously) and keeps the latest `keep`."""

  def __init__(self, workdir: str, *, save_every: int = 1, keep: int = 3, read_only: bool = False):
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(max(1, save_every)),
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        enable_async_checkpointing=True,
        create=not read_only,
        read_only=read_only,
    )
    self.directory = checkpoint_dir(workdir)
    # Handlers named up front so metadata (for shape checks) is readable before any restore.
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, *, data_position: int, config: dict[str, Any],
           force: bool = False) -> bool:
    """Starts an async save if the policy (or `force`) says so; returns whether it did."""
    meta = {'step': int(step), 'data_position': int(data_position), 'config': config}
    return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                           meta=ocp.args.JsonSave(meta)), force=force)

  def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores `step` (latest when None) into the shapes/shardings of `abstract_state`.

    Raises:
      CheckpointError: no such step, or a tensor's shape differs from the model's.
    """
    steps = self.all_steps()
    if step is None:
      step = self.latest_step()
    if step is None or step not in steps:
      raise CheckpointError(f'no checkpoint for step {step} in {self.directory}; available: {steps or "none"}')
    self._check_shapes(step, abstract_state)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored['state'], restored['meta']

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    # Orbax's own error on a shape mismatch is long and unspecific: name the tensor instead.
    # Parameters are nested dicts, so their paths compare as '/'-joined key names.
    try:
      saved = self.manager.item_metadata(step)['state']['params']
    except Exception:  # pylint: disable=broad-except
      return  # no readable metadata: let restore report
    saved_shapes = {_path_name(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(
        saved, is_leaf=lambda x: hasattr(x, 'shape'))[0]}
    wanted = {_path_name(p): tuple(np.shape(v)) for p, v in
              jax.tree_util.tree_flatten_with_path(abstract_state['params'])[0]}
    for name, want in wanted.items():
      if name not in saved_shapes:
        raise CheckpointError(f'checkpoint step {step} in {self.directory} has no parameter {name}: it was '
                              'written by a different model')
      if saved_shapes[name] != want:
        raise CheckpointError(f'checkpoint step {step} parameter {name} has shape {saved_shapes[name]} but '
                              f'the model expects {want}: it was written by a different model')
    extra = sorted(set(saved_shapes) - set(wanted))
    if extra:
      raise CheckpointError(f'checkpoint step {step} has parameters the model lacks ({", ".join(extra[:3])}'
                            f'{"..." if len(extra) > 3 else ""}): it was written by a different model')

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
