"""One Orbax CheckpointManager for the whole training state.

A checkpoint holds two items: `state` (params, optimizer state, step, RNG key — arrays,
restored straight into their target shardings) and `meta` (JSON: data-iterator position,
step and the run's config, so a checkpoint directory describes itself). The workdir's own
files (config.json, ...) are `runs.workdir`'s.

Faults: `restore(None, ...)` uses the newest checkpoint that reads back and holds a sane state
(finite, not exploded); one that does not is reported in one line and moved to
`workdir/corrupt_checkpoints/` (never deleted). An explicit step stays strict. Temporary
directories of saves killed mid-way are removed when the manager starts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import sys
import time
from typing import Any, Callable

from etils import epath
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import files, hardware
from bert_jax.config.migration import METRIC_SCALE, upgrade_metrics
from bert_jax.errors import CheckpointError, CheckpointGone, CheckpointWriteError, UnusableCheckpoint
from bert_jax.files import WRITE_FAILURES, check_remote
from bert_jax.runs import workdir as workdir_lib

CORRUPT_DIR = 'corrupt_checkpoints'
# A parameter beyond this magnitude means training blew up (BERT's stay within ~10-100):
# such a state evaluates to NaN even when every value is still finite.
EXPLODED = 1e6


@jax.jit
def _largest_magnitude(tree) -> jax.Array:
  """The largest |value| of every leaf, inf when any value is NaN or infinite (a NaN counts as inf: XLA's CPU
  reductions drop NaN from a max). One reduction a leaf: a check of isfinite beside it compiled a second one (each
  run compiles this program once per parameter layout, before its first save)."""
  return jnp.max(jnp.stack([jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x))).astype(jnp.float32)
                            for x in jax.tree.leaves(tree)]))


def state_problem(params: Any) -> str | None:
  """Why `params` must not be saved or resumed (non-finite or exploded), or None when sane."""
  biggest = jax.device_get(_largest_magnitude(params))
  if not np.isfinite(biggest):
    return 'its parameters contain NaN or Inf'
  if biggest > EXPLODED:
    return f'its parameters exploded (largest magnitude {float(biggest):.3g} > {EXPLODED:g})'
  return None


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{'/'-joined path: shape} of every array (or array metadata) in `tree`."""
  return {_path_name(p): tuple(np.shape(v) if not hasattr(v, 'shape') else v.shape)
          for p, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))[0]}


def _agree(problem: str | None) -> str | None:
  """`problem`, or one for every process when another process has one: all fall back together."""
  if jax.process_count() > 1:
    failed = multihost_utils.process_allgather(np.int32(problem is not None))
    if np.any(failed) and problem is None:
      return 'another process cannot read it'
  return problem


def _whole_array_host_copies() -> None:
  """On the CPU backend, saves copy each replicated array to the host whole, not in replica-parallel slices.

  Orbax's replica-parallel save splits a replicated array's device-to-host copy into one slice per replica, for
  accelerators that each have their own link to the host (Orbax turns it off for GPUs itself, by JAX_PLATFORMS).
  CPU devices are host memory already: the slices are only a jitted slicing op per replica and array, and a save
  takes several times as long (the figures: docs/results.md; the test suite's runs save a checkpoint every few
  steps). The values written are the same; every version reads both.
  Orbax's one switch is a field of its registered jax.Array handler: where a version names it otherwise, saves
  keep Orbax's default (slower, never wrong).
  """
  if hardware.resolve() != 'cpu':
    return
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if hasattr(handler, '_use_replica_parallel'):
    handler._use_replica_parallel = False  # pylint: disable=protected-access


def _quiet_closed_loop_callbacks() -> None:
  """Drops the late reports of reads a failed restore abandoned; passes on anything else.

  When one array of a restore (or save) fails, Orbax stops waiting and closes its event loop while
  tensorstore still completes the other reads in flight. Each of them is then reported on its own,
  hundreds to thousands of tracebacks for one failure that the checkpointer already reports in one
  line: through sys.unraisablehook ("Exception ignored in: <coroutine ...>", "Event loop is
  closed") and through asyncio's logger ("Task/Future exception was never retrieved", "Task was
  destroyed but it is pending").
  """
  previous = sys.unraisablehook
  if getattr(previous, 'bert_jax_quiet', False):
    return

  def hook(unraisable):
    if not _abandoned_read(unraisable.exc_value, unraisable.object):
      previous(unraisable)

  hook.bert_jax_quiet = True
  sys.unraisablehook = hook
  logging.getLogger('asyncio').addFilter(_report_of_other_failure)


def _abandoned_read(exc: BaseException | None, origin: Any = None) -> bool:
  """Whether an exception reported late (unraisable or never retrieved) comes from Orbax/tensorstore I/O."""
  if isinstance(exc, RuntimeError) and str(exc) in ('Event loop is closed', 'coroutine ignored GeneratorExit'):
    return True
  code = getattr(origin, 'cr_code', None) or getattr(getattr(origin, 'get_coro', lambda: None)(), 'cr_code', None)
  if code is not None and any(m in code.co_filename for m in ('orbax', 'tensorstore')):
    return True
  return exc is not None and any(m in str(exc) for m in ('tensorstore', 'DATA_LOSS', 'OCDBT', 'zarr'))


def _report_of_other_failure(record: logging.LogRecord) -> bool:
  """False for asyncio's reports of checkpoint reads that failed or were left pending after a restore gave up."""
  text = record.getMessage()
  if not text.startswith(('Task exception was never retrieved', 'Future exception was never retrieved',
                          'Task was destroyed but it is pending')):
    return True
  exc = record.exc_info[1] if record.exc_info else getattr(record, 'exception', None)
  if exc is None and isinstance(record.args, dict):
    exc = record.args.get('exception')
  return not (_abandoned_read(exc) or any(m in text for m in ('orbax', 'tensorstore', 'DATA_LOSS')))


class _KeepStep:
  """An Orbax preservation policy that keeps one step, which the Checkpointer sets (the best so far).

  Orbax's BestN ranks the metrics it holds in memory, and it holds none for the checkpoints of an
  earlier process: after a resume the best checkpoint looked metric-less and was deleted. The best
  step is instead read back from the checkpoints' own meta (their 'eval'), which every version wrote.
  """

  def __init__(self, step: int | None = None):
    self.step = step

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    del context
    return [c.step == self.step for c in checkpoints]


class Checkpointer:
  """Saves every `save_every` steps (asynchronously) and keeps the latest `keep`; with `best_metric`,
  also the checkpoint with the highest value of that held-out metric (given to `save` as `metrics`),
  across any number of interruptions."""

  def __init__(self, workdir: str, *, save_every: int = 1, keep: int = 3, read_only: bool = False,
               best_metric: str | None = None):
    _quiet_closed_loop_callbacks()
    _whole_array_host_copies()
    preserve = ocp.checkpoint_managers.LatestN(keep)
    self.best_metric, self._best = best_metric, None  # (value, step) of the best checkpoint
    if best_metric:
      self._keep_best = _KeepStep()
      preserve = ocp.checkpoint_managers.AnyPreservationPolicy([preserve, self._keep_best])
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(max(1, save_every)),
        preservation_policy=preserve,
        enable_async_checkpointing=True,
        cleanup_tmp_directories=not read_only,  # saves killed mid-way leave *.orbax-checkpoint-tmp-*
        create=not read_only,
        read_only=read_only,
    )
    self.directory = workdir_lib.checkpoint_dir(workdir)
    check_remote(self.directory, 'checkpoint directory')  # before Orbax, whose ImportError is a long traceback
    self.read_only = read_only
    # Handlers named up front so metadata (for shape checks) is readable before any restore.
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()})
    if best_metric:
      self._best = self._saved_best(best_metric)
      self._keep_best.step = self._best and self._best[1]

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, *, data_position: int, config: dict[str, Any],
           force: bool = False, extra: dict[str, Any] | None = None, metrics: dict[str, float] | None = None) -> bool:
    """Starts an async save if the policy (or `force`) says so; returns whether it did.

    `metrics` (the held-out metrics of this step, if evaluated) go into the meta and rank the
    checkpoint for `best_metric`.
    """
    meta = {'step': int(step), 'data_position': int(data_position), 'config': config, **(extra or {})}
    if metrics:
      meta['eval'] = {**metrics, **METRIC_SCALE}
    with self._write_errors():  # the previous async save's error surfaces here
      if not (force or self.manager.should_save(step)):
        return False
      self._check_free_space()
      value = (metrics or {}).get(self.best_metric)
      if self.best_metric and _better(value, self._best):  # the policy keeps it before older ones are removed
        self._best = (value, int(step))
        self._keep_best.step = int(step)
      return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             meta=ocp.args.JsonSave(meta)), force=True)

  def best_step(self, metric: str) -> int | None:
    """The step whose saved held-out `metric` is highest (the earliest on ties); None when none has it."""
    if metric == self.best_metric:
      return self._best and self._best[1]
    best = self._saved_best(metric)
    return best and best[1]

  def meta(self, step: int | None = None) -> dict[str, Any]:
    """The meta of checkpoint `step` (None: the latest): step, data position, config, ...; no array is read.

    Raises:
      CheckpointError: no such checkpoint, or its meta is unreadable.
    """
    steps = self.all_steps()
    step = max(steps) if step is None and steps else step
    if step not in steps:
      raise CheckpointError(f'no checkpoint for step {step} in {self.directory}; available: {steps or "none"}')
    try:
      return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
    except Exception as e:  # pylint: disable=broad-except  # Orbax/tensorstore raise many kinds
      raise CheckpointError(f'checkpoint step {step} in {self.directory} cannot be read ({type(e).__name__}: '
                            f'{_first_line(e)})') from None

  def _saved_best(self, metric: str) -> tuple[float, int] | None:
    """(value, step) of the highest `metric` in the checkpoints' meta (the earliest on ties), or None."""
    best = None
    for step in sorted(self.all_steps()):
      try:
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
        value = upgrade_metrics(meta.get('eval', {}), (meta.get('config') or {}).get('task')).get(metric)
      except Exception:  # pylint: disable=broad-except  # an unreadable checkpoint is no candidate
        continue
      if _better(value, best):
        best = (value, step)
    return best

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
                            'the same command again to resume', reason=reason or e.strerror) from None

  def restore(self, step: int | None, abstract_state: Any, log: Callable[[str], None] = print, *,
              check_meta: Callable[[dict[str, Any]], None] | None = None,
              fresh_opt_state: Callable[[Any], Any] | None = None,
              params_only: bool = False) -> tuple[Any, dict[str, Any]]:
    """Restores `step` into the shapes/shardings of `abstract_state`; None: the newest good one.

    Only a checkpoint whose own bytes cannot be read, or that holds a non-finite or exploded
    state, is unusable: with step None it is reported through `log`, moved to
    workdir/corrupt_checkpoints/ (not when read_only) and the next older one is tried. A readable
    checkpoint that does not fit the request (another run, another model) raises and is never moved.

    Args:
      step: the checkpoint step; None: the newest usable one.
      abstract_state: the target state's shapes, dtypes and shardings.
      log: where fallbacks and a fresh optimizer state are reported.
      check_meta: called with the checkpoint's meta (its config) before any array is read; raises
        when the checkpoint belongs to another run.
      fresh_opt_state: params -> a new optimizer state. When given, a checkpoint whose optimizer
        state has another structure (a deliberately changed optimizer) restores its step, params
        and RNG and takes the new optimizer state from this; without it that is an error.
      params_only: restore {'params'} alone (inference, evaluation, initialising another run): the
        optimizer state is never read, whatever optimizer wrote it.

    Raises:
      CheckpointError: no such step; another model or optimizer; what `check_meta` raises; an
        explicit step that is unreadable or insane; or no good checkpoint is left.
    """
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise CheckpointError(f'no checkpoint for step {step} in {self.directory}; available: {steps or "none"}')
      restored, problem = self._try_restore(step, abstract_state, log, check_meta, fresh_opt_state, params_only)
      if problem:
        raise UnusableCheckpoint(f'checkpoint step {step} in {self.directory} is unusable: {problem}')
      return restored
    if not steps:
      raise CheckpointError(f'no checkpoint in {self.directory}')
    bad = []
    for candidate in sorted(steps, reverse=True):
      try:
        restored, problem = self._try_restore(candidate, abstract_state, log, check_meta, fresh_opt_state,
                                              params_only)
      except CheckpointGone:
        continue  # rotated away meanwhile: the next older one
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

  def _try_restore(self, step, abstract_state, log, check_meta, fresh_opt_state, params_only):
    """((state, meta), None), or (None, why the checkpoint's own bytes are unusable).

    Reads the meta and the array metadata first: a checkpoint that reads but does not fit the
    request raises CheckpointError instead of counting as unusable.
    """
    try:
      meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
      saved = self.manager.item_metadata(step)['state']
      problem = None if isinstance(meta, dict) and saved is not None else 'its metadata is missing'
    except Exception as e:  # pylint: disable=broad-except  # Orbax/tensorstore raise many kinds
      problem = f'it cannot be read ({type(e).__name__}: {_first_line(e)})'
      self._check_present(step)
    problem = _agree(problem)
    if problem:
      return None, problem
    if check_meta is not None:
      check_meta(meta)
    if params_only:
      self._check_params(step, saved, abstract_state)
      target, fresh = {'params': abstract_state['params']}, False
    else:
      target, fresh = self._restore_target(step, saved, abstract_state, fresh_opt_state is not None)
    try:
      state = self._read_state(step, target, partial=fresh or params_only)
      problem = state_problem(state['params'])
    except Exception as e:  # pylint: disable=broad-except
      problem = f'it cannot be read ({type(e).__name__}: {_first_line(e)})'
      self._check_present(step)
      # Unusable only when its own bytes fail: read every array as it is stored, on the host.
      if _agree(None if self._bytes_readable(step, saved) else problem) is None:
        raise CheckpointError(f'checkpoint step {step} in {self.directory} reads, but not into this run\'s '
                              f'state ({type(e).__name__}: {_first_line(e)})') from None
    problem = _agree(problem)
    if problem:
      return None, problem
    if fresh:
      state['opt_state'] = fresh_opt_state(state['params'])
      log(f'restored step {step}: parameters, step and RNG; its optimizer state has another structure than '
          'this run\'s optimizer, which starts fresh (allowed by resume_allow)')
    return (state, meta), None

  def _check_present(self, step: int) -> None:
    """CheckpointGone when the step's directory vanished during a failed read: the run writing the
    workdir rotated it away (it keeps its newest checkpoints), which says nothing of its bytes."""
    if (epath.Path(self.directory) / str(step)).exists():
      return
    self.manager.reload()
    raise CheckpointGone(f'checkpoint step {step} in {self.directory} was deleted while it was read: rotated away '
                         f'by the run writing there (not damaged); it now holds steps {self.all_steps() or "none"}')

  def _check_params(self, step: int, saved: Any, abstract_state: Any) -> None:
    """CheckpointError naming the first parameter whose name or shape differs from the model's."""
    # Orbax's own error on a mismatch is long and unspecific: name the tensor instead. Parameters
    # are nested dicts, so paths compare as '/'-joined key names.
    saved_params, wanted_params = _shapes(saved['params']), _shapes(abstract_state['params'])
    for name, want in wanted_params.items():
      if name not in saved_params:
        raise CheckpointError(f'checkpoint step {step} in {self.directory} has no parameter {name}: it was '
                              'written by a different model')
      if saved_params[name] != want:
        raise CheckpointError(f'checkpoint step {step} parameter {name} has shape {saved_params[name]} but '
                              f'the model expects {want}: it was written by a different model')
    extra = sorted(set(saved_params) - set(wanted_params))
    if extra:
      raise CheckpointError(f'checkpoint step {step} has parameters the model lacks ({", ".join(extra[:3])}'
                            f'{"..." if len(extra) > 3 else ""}): it was written by a different model')

  def _restore_target(self, step: int, saved: Any, abstract_state: Any, allow_fresh: bool) -> tuple[Any, bool]:
    """(what to restore, whether the optimizer state is left out) for checkpoint `step`.

    Raises CheckpointError when its parameters are another model's, or its optimizer state has
    another structure and `allow_fresh` is False (optax's named tuples flatten to the names Orbax
    stores, so the two compare by path and shape).
    """
    self._check_params(step, saved, abstract_state)
    if _shapes(saved['opt_state']) == _shapes(abstract_state['opt_state']):
      return abstract_state, False
    if not allow_fresh:
      raise CheckpointError(f'checkpoint step {step} in {self.directory} holds the state of another optimizer '
                            '(its optimizer state has another structure); resume with the optimizer it was '
                            'written with, or allow a fresh optimizer state from its parameters with '
                            '--config.resume_allow=optim')
    return {k: v for k, v in abstract_state.items() if k != 'opt_state'}, True

  def _item_dir(self, step: int) -> epath.Path:
    return epath.Path(self.directory) / str(step) / 'state'

  def _read_state(self, step: int, target: Any, partial: bool) -> Any:
    """The 'state' item of checkpoint `step` in `target`'s shardings; `partial`: only target's keys."""
    if not partial:
      return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))['state']
    # The same files through the PyTree handler, which can leave the old optimizer state unread.
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
      return reader.restore(self._item_dir(step), args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))

  def _bytes_readable(self, step: int, saved: Any) -> bool:
    """Whether every array of checkpoint `step` reads back as stored (host numpy, any devices)."""
    is_leaf = lambda x: hasattr(x, 'shape')  # pylint: disable=unnecessary-lambda-assignment
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved, is_leaf=is_leaf)
    try:
      with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
        reader.restore(self._item_dir(step), args=ocp.args.PyTreeRestore(restore_args=as_numpy))
      return True
    except Exception:  # pylint: disable=broad-except
      return False

  def _move_aside(self, step: int) -> str | None:
    if self.read_only:
      return None
    target = os.path.join(os.path.dirname(self.directory), CORRUPT_DIR, f'{step}-{int(time.time())}')
    if jax.process_index() == 0:
      if files.is_remote(target):  # an object store moves a directory object by object (no parent to create)
        files.move_tree(os.path.join(self.directory, str(step)), target)
      else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(self.directory, str(step)), target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'bert_jax moved checkpoint {step} aside')
    self.manager.reload()
    if self.best_metric and self._best and self._best[1] == step:  # the best among those left keeps its place
      self._best = self._saved_best(self.best_metric)
      self._keep_best.step = self._best and self._best[1]
    return target

  def wait(self) -> None:
    with self._write_errors():
      self.manager.wait_until_finished()

  def close(self) -> None:
    with self._write_errors():
      self.manager.wait_until_finished()
      # The clean-up of killed saves' temporary directories that the manager starts in a thread of its own: its
      # close does not wait for it (only a save does, orbax-checkpoint 0.12.8). Left running when a run fails
      # before its first save, it outlives the interpreter's executors: a 42-line traceback after the error line.
      cleanup = getattr(self.manager, '_maybe_await_cleanup_tmp_directory', None)
      if cleanup is not None:
        cleanup()
    self.manager.close()


def _better(value: Any, best: tuple[float, int] | None) -> bool:
  """Whether a held-out `value` beats the best so far (a strictly higher number; NaN never does)."""
  return isinstance(value, (int, float)) and not math.isnan(value) and (best is None or value > best[0])


def _disk_bytes(directory: str) -> int:
  """Bytes of the files under `directory` (0 when it is gone)."""
  total = 0
  for root, _, names in os.walk(directory):
    for name in names:
      with contextlib.suppress(OSError):
        total += files.getsize(os.path.join(root, name))
  return total


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return (text.splitlines()[0] if text else '')[:200]
