"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from typing import Any

from bert_jax.errors import ConfigError

# How a failed write reads in library errors that carry no errno (tensorstore reports ENOSPC as ValueError).
WRITE_FAILURES = ('No space left on device', 'Disk quota exceeded', 'Read-only file system')


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through `path.tmp` and os.replace, creating the directory."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8', newline='') as f:
    f.write(text)
  os.replace(tmp, path)


def write_json_atomic(path: str, obj: Any, **dump_kwargs: Any) -> None:
  """Writes `obj` as indented JSON to `path` atomically."""
  write_text_atomic(path, json.dumps(obj, indent=2, **dump_kwargs))


def check_output(path: str, kind: str, what: str = 'output') -> None:
  """Checks, before any work, that `path` can be written as a `kind` ('file' or 'directory').

  ConfigError when it exists as the other kind, or its nearest existing parent is not a
  writable directory.
  """
  if kind == 'file' and os.path.isdir(path):
    raise ConfigError(f'{what} {path} is a directory; give a file path')
  if kind == 'directory' and os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'{what} {path} is a file; give a directory')
  parent = os.path.abspath(path if kind == 'directory' else os.path.dirname(os.path.abspath(path)))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f'{what} {path} cannot be created: {parent} is a file')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f'{what} {path} cannot be written: {parent} is not writable')
