"""One I/O layer: no module of bert_jax but bert_jax/files.py and bert_jax/object_stores.py calls open() or asks
os.path / os about a file (exists, isfile, isdir, getsize, listdir), so every path a user gives is read the one way:
local or remote (gs://, s3://), compressed or not. The modules are parsed (ast), not imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

from harness.inputs import REPO

LAYER = ('bert_jax/files.py', 'bert_jax/object_stores.py')
# module -> why it may read a file directly (a /proc or /sys probe of this machine, which no user path reaches).
ALLOWED: dict[str, str] = {
    'bert_jax/hardware.py': 'the kernel\'s huge-pages setting (/sys) and the running script: the process, not a '
                            'user\'s file, below the I/O layer\'s floor',
}
DIRECT = frozenset({'open', 'io.open', 'builtins.open', 'os.listdir', 'os.path.exists', 'os.path.isfile',
                    'os.path.isdir', 'os.path.getsize'})


def _imported_names(tree: ast.AST) -> dict[str, str]:
  """Local name -> the dotted name it was imported as ('osp' -> 'os.path', 'isfile' -> 'os.path.isfile')."""
  names = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name.split('.')[0]] = alias.name if alias.asname else alias.name.split('.')[0]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        names[alias.asname or alias.name] = f'{node.module}.{alias.name}'
  return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
  """The dotted name a call's function is (its first part as imported), None for anything else (a call's result)."""
  if isinstance(node, ast.Name):
    return names.get(node.id, node.id)
  if isinstance(node, ast.Attribute):
    head = _dotted(node.value, names)
    return None if head is None else f'{head}.{node.attr}'
  return None


def direct_access(source: str) -> list[tuple[int, str]]:
  """(line, the call as resolved) of each call in `source` that reads the filesystem past the I/O layer."""
  tree = ast.parse(source)
  names = _imported_names(tree)
  return sorted((node.lineno, dotted) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and (dotted := _dotted(node.func, names)) in DIRECT)


def _modules() -> dict[str, pathlib.Path]:
  root = pathlib.Path(REPO)
  return {p.relative_to(root).as_posix(): p for p in sorted((root / 'bert_jax').rglob('*.py'))}


def test_only_the_io_layer_opens_files():
  modules = _modules()
  found = {name: [f'line {line}: {call}(' for line, call in direct_access(path.read_text(encoding='utf-8'))]
           for name, path in modules.items() if name not in LAYER and name not in ALLOWED}
  found = {name: calls for name, calls in found.items() if calls}
  assert not found, ('files read past bert_jax.files (use files.open, files.exists, files.isfile, files.isdir, '
                     f'files.getsize, files.listdir; or add the module to ALLOWED with the reason): {found}')
  assert set(ALLOWED) <= set(modules), f'ALLOWED names modules that are gone: {set(ALLOWED) - set(modules)}'
  assert all(name in modules for name in LAYER)


def test_the_check_finds_every_way_of_calling_them():
  source = '\n'.join([
      'import builtins, io, os',  # 1
      'import os.path as osp',
      'from os import listdir, path',
      'from os.path import isfile as is_file',
      'from bert_jax import files',  # 5
      "with open('a') as f: pass",
      "os.path.exists('a'); os.path.isfile('a'); os.path.isdir('a'); os.path.getsize('a')",
      "os.listdir('.'); io.open('a'); builtins.open('a')",
      "osp.isdir('a'); path.exists('a'); listdir('.'); is_file('a')",
      "files.open('a'); files.isfile('a'); files.listdir('.'); os.makedirs('a'); os.path.join('a', 'b')",  # 10
      "epath.Path('a').open(); f.read(); getattr(os, 'listdir')('.')",
  ])
  assert direct_access(source) == [
      (6, 'open'), (7, 'os.path.exists'), (7, 'os.path.getsize'), (7, 'os.path.isdir'), (7, 'os.path.isfile'),
      (8, 'builtins.open'), (8, 'io.open'), (8, 'os.listdir'),
      (9, 'os.listdir'), (9, 'os.path.exists'), (9, 'os.path.isdir'), (9, 'os.path.isfile')]


@pytest.mark.parametrize('line', ["open('x')", "os.path.isfile('x')", "os.listdir('x')"])
def test_a_module_calling_one_fails_the_check(line):
  assert direct_access(f'import os\n\n\ndef read():\n  return {line}\n') == [(5, line.split('(')[0])]
