"""Workdir ownership: what kind of directory a path is, one run at a time, and config history.

Every entry point that writes a workdir calls `claim(path, kind)` before writing anything:
it refuses a path that is a file, unwritable, or a workdir of another kind (pretraining,
fine-tuning, Hugging Face export), then takes `<workdir>/.lock` (host, pid and the pid's start
time). A second run on the same workdir stops with one line; a lock left by a process that no
longer exists on this host (kill -9, a crashed node) is taken over with a warning. On a pod
only process 0 holds the lock (the workdir is on a shared filesystem).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from typing import Any, Iterator

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.files import write_json_atomic

LOCK_FILE = '.lock'
CONFIG_FILE = 'config.json'
HISTORY_FILE = 'config_history.jsonl'
KINDS = ('pretraining', 'finetuning', 'export')


def kind_of(path: str) -> str | None:
  """'pretraining', 'finetuning', 'export' (a Hugging Face directory) or None (new, empty, or unknown)."""
  config = os.path.join(path, CONFIG_FILE)
  if os.path.isfile(config):
    try:
      with open(config, encoding='utf-8') as f:
        saved = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
      saved = None
    if isinstance(saved, dict):
      if 'finetune' in saved:
        return 'finetuning'
      if 'model_type' in saved or 'architectures' in saved:
        return 'export'
      if {'model', 'data', 'optim'} <= set(saved):
        return 'pretraining'
  if not os.path.isdir(path):
    return None
  names = os.listdir(path)
  if any(n.startswith('seed_') for n in names):
    return 'finetuning'
  if 'checkpoints' in names:
    return 'pretraining'
  if any(n.endswith('.safetensors') for n in names):
    return 'export'
  return None


def check_kind(path: str, kind: str, what: str = 'workdir') -> None:
  """ConfigError unless `path` can hold a `kind` workdir: absent, a directory of that kind or of none."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'{what} {path} is a file, not a directory')
  found = kind_of(path)
  if found is not None and found != kind:
    raise ConfigError(f'{what} {path} is a {found} directory, not a {kind} one; nothing was written there. '
                      f'Use a new or empty directory')


def check_outside(workdir: str, source: str, what: str) -> None:
  """ConfigError when `workdir` is `source` or inside it (a checkpoint that is only ever read).

  Paths compare resolved (symbolic links, '..', relative paths).
  """
  work, src = os.path.realpath(workdir), os.path.realpath(source)
  if work == src or work.startswith(src + os.sep):
    raise ConfigError(f'workdir {workdir} is inside {what} {source}, which is only ever read: choose another '
                      '--workdir (re-running in the same workdir resumes a run)')


def _lock_error(path: str, owner: dict[str, Any], detail: str) -> ConfigError:
  return ConfigError(f'workdir {os.path.dirname(path)} is in use by {files.describe_holder(owner)}: {detail}')


@contextlib.contextmanager
def claim(path: str, kind: str, *, owner: bool = True, log=print) -> Iterator[None]:
  """Checks `path` for a `kind` run, creates it and holds its lock while the block runs.

  Args:
    path: the workdir.
    kind: one of KINDS.
    owner: whether this process takes the lock (process 0 of a pod; the others only check).
    log: where the stale-lock warning goes.
  """
  check_kind(path, kind)
  if not owner:
    yield
    return
  created = not os.path.exists(path)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'cannot create workdir {path}: {e.strerror}') from None
  lock = files.Lock(os.path.join(path, LOCK_FILE), log)
  try:
    held = lock.acquire()
  except OSError as e:
    raise ConfigError(f'cannot write in workdir {path}: {e.strerror}') from None
  if held is not None:
    if created:
      with contextlib.suppress(OSError):
        os.rmdir(path)
    if held.get('remote'):
      raise _lock_error(lock.path, held, f'a run on another host may be using it; if none is, delete {lock.path}')
    raise _lock_error(lock.path, held, 'two runs on one workdir would mix their checkpoints and metrics; wait '
                      'for it to finish or use another --workdir')
  try:
    yield
  finally:
    lock.release()
    if created:  # a run that stopped before writing anything leaves no empty workdir behind
      with contextlib.suppress(OSError):
        os.rmdir(path)


def write_config(path: str, config: dict[str, Any]) -> None:
  """Writes `path/config.json`; an earlier, different config is appended to config_history.jsonl first."""
  target = os.path.join(path, CONFIG_FILE)
  if os.path.isfile(target):
    try:
      with open(target, encoding='utf-8') as f:
        old = json.load(f)
    except (OSError, ValueError):
      old = None
    if old == json.loads(json.dumps(config)):
      return
    if old is not None:
      entry = {'replaced': datetime.datetime.now().isoformat(timespec='seconds'), 'config': old}
      with open(os.path.join(path, HISTORY_FILE), 'a', encoding='utf-8') as f:
        f.write(json.dumps(entry, sort_keys=True) + '\n')
  write_json_atomic(target, config, sort_keys=True)
