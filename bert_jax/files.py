"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from typing import Any


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
