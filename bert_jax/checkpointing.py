"""One Orbax CheckpointManager for the whole training state.

A checkpoint holds two items: `state` (params, optimizer state, step, RNG key — arrays,
restored straight into their target shardings) and `meta` (JSON: data-iterator position,
step and the run's config, so a checkpoint directory describes itself). The config is also
written as `workdir/config.json`, beside the checkpoints (earlier versions kept in
config_history.jsonl).

Faults: `restore(None, ...)` uses the newest checkpoint that reads back and holds a sane state
(finite, not exploded); one that does not is reported in one line and moved to
`workdir/corrupt_checkpoints/` (never deleted). An explicit step stays strict. Temporary
directories of saves killed mid-way are removed when the manager starts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import workdir as workdir_lib
from bert_jax.errors import CheckpointError, CheckpointWriteError
from bert_jax.files import WRITE_FAILURES

CONFIG_FILE = workdir_lib.CONFIG_FILE
CORRUPT_DIR = 'corrupt_checkpoints'
# A parameter beyond this magnitude means training blew up (BERT's stay within ~10-100):
# such a state evaluates to NaN even when every value is still finite.
EXPLODED = 1e6


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def read_config(workdir: str) -> dict[str, Any] | None:
  """workdir/config.json, None when absent; CheckpointError when unreadable."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise CheckpointError(f'{path} is unreadable ({type(e).__name__}: {_first_line(e)}); '
                          'restore it from config_history.jsonl or the checkpoints\' meta, or use a new '
                          'workdir') from None
  if not isinstance(saved, dict):
    raise CheckpointError(f'{path} is not a JSON object')
  return saved


def write_config(workdir: str, config: dict[str, Any]) -> None:
  """Writes workdir/config.json atomically (process 0), keeping a different earlier one in the history."""
  if jax.process_index() == 0:
    workdir_lib.write_config(workdir, config)


@jax.jit
def _finite_and_max(tree) -> tuple[jax.Array, jax.Array]:
  leaves = jax.tree.leaves(tree)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
  biggest = jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))
  return finite, biggest


def state_problem(params: Any) -> str | None:
  """Why `params` must not be saved or resumed (non-finite or exploded), or None when sane."""
  finite, biggest = jax.device_get(_finite_and_max(params))
  if not finite:
    return 'its parameters contain NaN or Inf'
  if biggest > EXPLODED:
    return f'its parameters exploded (largest magnitude {float(biggest):.3g} > {EXPLODED:g})'
  return None


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


class Checkpointer:
  """Saves every `save_every` steps (asynchronously) and keeps the latest `keep`."""

  def __init__(self, workdir: str, *, save_every: int = 1, keep: int = 3, read_only: bool = False):
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(max(1, save_every)),
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        enable_async_checkpointing=True,
        cleanup_tmp_directories=not read_only,  # saves killed mid-way leave *.orbax-checkpoint-tmp-*
        create=not read_only,
        read_only=read_only,
    )
    self.directory = checkpoint_dir(workdir)
    self.read_only = read_only
    # Handlers named up front so metadata (for shape checks) is readable before any restore.
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, *, data_position: int, config: dict[str, Any],
           force: bool = False, extra: dict[str, Any] | None = None) -> bool:
    """Starts an async save if the policy (or `force`) says so; returns whether it did."""
    meta = {'step': int(step), 'data_position': int(data_position), 'config': config, **(extra or {})}
    with self._write_errors():  # the previous async save's error surfaces here
      if force or self.manager.should_save(step):
        self._check_free_space()
      return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             meta=ocp.args.JsonSave(meta)), force=force)

  def _check_free_space(self) -> None:
    """Refuses a save that cannot fit, before Orbax starts one.

    A save that runs out of space mid-way fails inside tensorstore's write threads, which
    print tracebacks of their own; checking first keeps the failure to our one line. The
    need is the newest checkpoint's size on disk plus 10%; before the first checkpoint there
    is no reliable size (in memory the state is larger than on disk), so none is checked. All
    processes decide together, so none starts a collective save the others skip. Remote
    paths (gs://) are not checked. Space taken by others during the save still fails there.
    """
    enough = True
    self.manager.wait_until_finished()  # the save in flight (Orbax's save would wait for it anyway)
    latest = self.manager.latest_step()
    if '://' not in self.directory and latest is not None:
      need = 1.1 * _disk_bytes(os.path.join(self.directory, str(latest)))
      fs = os.statvfs(self.directory)
      enough = fs.f_bavail * fs.f_frsize >= need
    if jax.process_count() > 1:
      enough = bool(np.all(multihost_utils.process_allgather(np.array(enough))))
    if not enough:
      raise OSError(errno.ENOSPC, 'No space left on device')

  @contextlib.contextmanager
  def _write_errors(self):
    """A full disk or a read-only filesystem while saving: one line, naming the checkpoint that is kept."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  # tensorstore reports ENOSPC as ValueError
      text = str(e)
      reason = next((r for r in WRITE_FAILURES if r in text), None)
      if reason is None and not (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)):
        raise
      try:
        kept = self.manager.reload() or self.manager.latest_step()
      except Exception:  # pylint: disable=broad-except
        kept = None
      raise CheckpointWriteError(f'saving a checkpoint in {self.directory} failed: {reason or e.strerror}; the last '
                            f'complete checkpoint (step {kept}) is kept. Free space (or fix the filesystem) and run '
                            'the same command again to resume') from None

  def restore(self, step: int | None, abstract_state: Any,
              log: Callable[[str], None] = print) -> tuple[Any, dict[str, Any]]:
    """Restores `step` into the shapes/shardings of `abstract_state`; None: the newest good one.

    With step None a checkpoint that fails to read, or holds a non-finite or exploded state, is
    reported through `log`, moved to workdir/corrupt_checkpoints/ (not when read_only) and the
    next older one is tried.

    Raises:
      CheckpointError: no such step; a tensor's shape differs from the model's; an explicit
        step that is unreadable or insane; or no good checkpoint is left.
    """
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise CheckpointError(f'no checkpoint for step {step} in {self.directory}; available: {steps or "none"}')
      restored, problem = self._try_restore(step, abstract_state)
      if problem:
        raise CheckpointError(f'checkpoint step {step} in {self.directory} is unusable: {problem}')
      return restored
    if not steps:
      raise CheckpointError(f'no checkpoint in {self.directory}')
    bad = []
    for candidate in sorted(steps, reverse=True):
      restored, problem = self._try_restore(candidate, abstract_state)
      if not problem:
        if bad:
          log(f'resuming from step {candidate}, the newest good checkpoint')
        return restored
      bad.append(candidate)
      where = self._move_aside(candidate)
      log(f'warning: checkpoint step {candidate} is unusable: {problem}; '
          + (f'moved to {where}' if where else 'skipped (read-only)'))
    raise CheckpointError(f'no usable checkpoint in {self.directory} (steps {bad} are unusable, see above); '
                          'start a new --workdir or restore a checkpoint from a backup')

  def _try_restore(self, step: int, abstract_state: Any) -> tuple[Any, str | None]:
    # A shape mismatch is the user's model, not a corrupt file: it raises instead of falling back.
    self._check_shapes(step, abstract_state)
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
      problem = state_problem(restored['state']['params'])
      result = (restored['state'], restored['meta'])
    except Exception as e:  # pylint: disable=broad-except  # Orbax/tensorstore raise many kinds
      problem = f'it cannot be read ({type(e).__name__}: {_first_line(e)})'
      result = None
    if jax.process_count() > 1:  # every process must fall back together
      failed = multihost_utils.process_allgather(np.int32(problem is not None))
      if np.any(failed) and problem is None:
        problem = 'another process cannot read it'
    return result, problem

  def _move_aside(self, step: int) -> str | None:
    if self.read_only:
      return None
    target = os.path.join(os.path.dirname(self.directory), CORRUPT_DIR, f'{step}-{int(time.time())}')
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.replace(os.path.join(self.directory, str(step)), target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'bert_jax moved checkpoint {step} aside')
    self.manager.reload()
    return target

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    # Orbax's own error on a shape mismatch is long and unspecific: name the tensor instead.
    # Parameters are nested dicts, so their paths compare as '/'-joined key names.
    try:
      saved = self.manager.item_metadata(step)['state']['params']
    except Exception:  # pylint: disable=broad-except
      return  # no readable metadata: let the restore report it
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
    with self._write_errors():
      self.manager.wait_until_finished()

  def close(self) -> None:
    with self._write_errors():
      self.manager.wait_until_finished()
    self.manager.close()


def _disk_bytes(directory: str) -> int:
  """Bytes of the files under `directory` (0 when it is gone)."""
  total = 0
  for root, _, files in os.walk(directory):
    for name in files:
      with contextlib.suppress(OSError):
        total += os.path.getsize(os.path.join(root, name))
  return total


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return (text.splitlines()[0] if text else '')[:200]
