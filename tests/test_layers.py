"""The library's floors: each package imports only from the floors below its own (docs/architecture.md draws them).

Read from the source (ast), not from imported modules, so an import inside a function counts as much as one at the
top. A new upward import fails here naming the module, the line and the floors; an exception belongs in `ALLOWED`
with its reason, and the list stays short.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top. A unit is bert_jax's top-level module or package; a unit imports its own modules and those of lower
# floors, never a higher one nor another unit of its own floor.
FLOORS = (
    ('errors',),
    ('hardware',),  # the platform decided once; the process's allocator (huge pages)
    ('object_stores',),  # the object-store side of the I/O layer
    ('files',),  # the I/O layer: local, gs://, s3://; atomic writes; the lock
    ('metrics',),  # numpy metrics (GLUE, CoNLL, correlations)
    ('config',),
    ('data',),
    ('sharding',),
    ('distributed',),
    ('model',),
    ('runs',),  # workdir layout, checkpoints, reporting: what every run and tool stands on
    ('interop',),  # weights in and out of other libraries' formats: what a run may start from
    ('train',),  # the one trainer
    ('embedding',),  # the retrieval features: contrastive loss, exact search, BEIR, STS
    ('pretraining', 'finetuning'),  # the run kinds: pretraining, and every task fine-tuned from a checkpoint
    ('inference',),
    ('launch',),  # processes: sweeps' cells, SLURM arrays, the stderr filter
)
RANK = {unit: i for i, floor in enumerate(FLOORS) for unit in floor}

# (importing module, imported module) -> why it may cross.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, REPO)[:-len('.py')].replace(os.sep, '.')
  return rel[:-len('.__init__')] if rel.endswith('.__init__') else rel


def imports(path: str, library_only: bool = True) -> list[tuple[int, str]]:
  """(line, absolute module) of each import in the file at `path` (relative ones resolved): bert_jax's alone unless
  `library_only` is False."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  module = _module_name(path)
  package = module if path.endswith('__init__.py') else module.rpartition('.')[0]
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      # `from bert_jax import files`: the imported name may itself be a module of the package.
      out += [(node.lineno, f'{base}.{a.name}' if base == 'bert_jax' else base) for a in node.names]
  return [(line, name) for line, name in out
          if not library_only or name == 'bert_jax' or name.startswith('bert_jax.')]


def unit(module: str) -> str | None:
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else None


def violations(edges: list[tuple[str, int, str]]) -> list[str]:
  """'module:line imports target (floor a above floor b)' for every edge that goes up or sideways."""
  out = []
  for module, line, target in edges:
    src, dst = unit(module), unit(target)
    if dst is None or src == dst or (module, target) in ALLOWED:
      continue
    if src not in RANK or dst not in RANK:
      out.append(f'{module}:{line}: {src if src not in RANK else dst} is in no floor of tests/test_layers.py')
    elif RANK[dst] >= RANK[src]:
      out.append(f'{module}:{line} imports {target}: {dst} is not below {src} (floors: tests/test_layers.py)')
  return out


def library_edges(library_only: bool = True) -> list[tuple[str, int, str]]:
  """(module, line, imported module) of every import in bert_jax/ (`imports`)."""
  edges = []
  for root, _, names in os.walk(os.path.join(REPO, 'bert_jax')):
    for name in sorted(names):
      if name.endswith('.py'):
        path = os.path.join(root, name)
        edges += [(_module_name(path), line, target) for line, target in imports(path, library_only)]
  return edges


def test_every_import_goes_down_a_floor():
  edges = library_edges()
  assert len(edges) > 300  # the walk found the library
  assert not violations(edges), '\n'.join(violations(edges))


def test_every_unit_has_a_floor():
  units = {os.path.splitext(n)[0] for n in os.listdir(os.path.join(REPO, 'bert_jax'))
           if (n.endswith('.py') and n != '__init__.py') or os.path.isfile(os.path.join(REPO, 'bert_jax', n, '__init__.py'))}
  assert units == set(RANK), f'units without a floor: {sorted(units - set(RANK))}; floors naming nothing: ' \
                             f'{sorted(set(RANK) - units)}'


@pytest.mark.parametrize('module, target, wrong', [
    ('bert_jax.train.step', 'bert_jax.embedding.contrastive', True),  # up
    ('bert_jax.pretraining.pretrain_run', 'bert_jax.finetuning.seeds', True),  # sideways, same floor
    ('bert_jax.finetuning.finetune_run', 'bert_jax.train.scaffold', False),  # down
    ('bert_jax.model.encoder', 'bert_jax.model.layers', False),  # within a unit
])
def test_the_check_sees_an_upward_import(module, target, wrong):
  assert bool(violations([(module, 1, target)])) == wrong


def test_imports_resolve_relative_and_package_names(tmp_path, monkeypatch):
  package = tmp_path / 'bert_jax' / 'train'
  package.mkdir(parents=True)
  (package / 'x.py').write_text('from . import step\nfrom bert_jax import embedding\n'
                                'def f():\n  from bert_jax.finetuning import finetune\n')
  monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
  found = imports(str(package / 'x.py'))
  assert found == [(1, 'bert_jax.train'), (2, 'bert_jax.embedding'), (4, 'bert_jax.finetuning')]
  assert len(violations([('bert_jax.train.x', line, t) for line, t in found])) == 2


def test_the_library_imports_no_entry_point():
  """experiments/ (the entry points, cli, tools) is above every floor: the library never imports it."""
  for module, line, target in library_edges(library_only=False):
    assert target.split('.')[0] not in ('cli', 'tools', 'experiments'), f'{module}:{line} imports {target}'

def test_one_module_per_name():
  """No two modules of the library share a name (a package counts as its name): `files` means one thing."""
  seen: dict[str, list[str]] = {}
  for root, dirs, names in os.walk(os.path.join(REPO, 'bert_jax')):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    rel = os.path.relpath(root, REPO)
    if rel != 'bert_jax':
      seen.setdefault(os.path.basename(root), []).append(rel)
    for name in names:
      if name.endswith('.py') and name != '__init__.py':
        seen.setdefault(name[:-3], []).append(os.path.join(rel, name))
  assert not {n: p for n, p in seen.items() if len(p) > 1}, {n: p for n, p in seen.items() if len(p) > 1}
