"""The hardware a process runs on, decided once: the platform the model is built for, and the process's allocator.

Platform. `resolve` turns a hardware setting ('auto', 'cpu', 'gpu', 'rocm' or 'tpu', as MaxText's `hardware`) into
a concrete platform: 'auto' is the platform of a mesh's devices, or of jax's default devices. The model's modules
take the resolved value as their `platform` argument when they are built (`BertEncoder(cfg, rngs=rngs,
platform='cpu')`; None resolves 'auto' there and then) and keep it, so no trace asks jax which backend it runs on.
The runs resolve it from their mesh. It decides which attention kernel runs (`model.attention.choose_attention`:
cuDNN flash only on an NVIDIA GPU) and whether Dense's bfloat16 backward runs in the layouts XLA:CPU's fast
bfloat16 kernels take (`model.layers.matmul`: only on 'cpu').

Huge pages. XLA:CPU allocates each step's buffers afresh (gigabytes for a training step), and glibc's malloc maps
them anew each time: in 4 KiB pages that is a page fault for every 4 KiB first touched, 512 times as many as in
2 MiB ones (the page faults and the effect on a step: docs/results.md). glibc >= 2.35 backs its allocations with transparent huge pages when
started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which only the loader reads, at the start of a process.
`prepare_process()` checks the settings and, where that tunable is not set yet and it helps (Linux, glibc >= 2.35,
the kernel's huge pages in 'madvise' mode, the common default), re-executes the script as the same process (same
process id, arguments and environment) with the tunable added; nothing else changes. Every entry point of
experiments/ calls it before any work (through experiments/cli.py), a notebook or script of your own may too:

  from bert_jax import hardware
  hardware.prepare_process()  # restarts `python3 my_script.py ...` once; returns whether malloc is on huge pages

Only a script started as itself (`python3 path/to/script.py ...`: its arguments end the interpreter's command line)
restarts; a process that cannot be started again as it was (a notebook's kernel, `python3 -c`, a script read from
stdin, a test runner) goes on as started: start it with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 instead.
BERT_JAX_HUGE_PAGES=0 keeps every process as started; a GLIBC_TUNABLES that names glibc.malloc.hugetlb already is
left as it is. A value neither reads (BERT_JAX_HUGE_PAGES other than 0 or 1; a glibc.malloc.hugetlb that is not a
number, which glibc would ignore, silently) is a ConfigError.

This module imports jax only where it asks for devices: the entry points check the huge-pages settings before
jax is imported.
"""

from __future__ import annotations

import os
import platform as _platform_module
import re
import sys
from typing import Any

from bert_jax.errors import ConfigError

# The values of a hardware setting: 'auto' and the platforms it resolves to.
PLATFORMS = ('cpu', 'gpu', 'rocm', 'tpu')
HARDWARE = ('auto',) + PLATFORMS


def resolve(hardware: str | None = 'auto', *, mesh: Any = None) -> str:
  """The concrete platform of a hardware setting: 'cpu', 'gpu' (NVIDIA), 'rocm' or 'tpu'.

  Args:
    hardware: one of `HARDWARE`; 'auto' (or None) is the platform of `mesh`'s devices, else of jax's default
      devices. A platform is returned as it is.
    mesh: a `jax.sharding.Mesh` whose devices decide 'auto'.

  Raises:
    ConfigError: `hardware` is none of `HARDWARE`.
  """
  if hardware is None or hardware == 'auto':
    return _platform_of(mesh.devices.flat[0] if mesh is not None else None)
  if hardware not in PLATFORMS:
    raise ConfigError(f'hardware must be one of {", ".join(HARDWARE)}, got {hardware!r}')
  return hardware


def _platform_of(device) -> str:
  import jax  # pylint: disable=g-import-not-at-top  # not at import: the entry points check their flags first
  device = device if device is not None else jax.devices()[0]
  # jax calls an AMD GPU 'gpu' too; its client names ROCm.
  if device.platform == 'gpu' and 'rocm' in str(getattr(device.client, 'platform_version', '')).lower():
    return 'rocm'
  return device.platform


# --- Huge pages ---------------------------------------------------------------------------------------------------

HUGE_PAGES_TUNABLE = 'glibc.malloc.hugetlb=1'


def prepare_process(restart: bool = True) -> bool:
  """Prepares this process's allocator for XLA:CPU (the module docstring): checks the huge-pages settings, then,
  with `restart`, re-executes a script started as itself on transparent huge pages where they are not set yet
  and help (`restart_with_huge_pages`; the call then does not return).

  Args:
    restart: False keeps the allocator the process was started with (the settings are checked either way).

  Returns:
    Whether this process's environment puts glibc's malloc on huge pages (its GLIBC_TUNABLES).

  Raises:
    ConfigError: BERT_JAX_HUGE_PAGES or glibc.malloc.hugetlb has a value no reader takes (`runs_on_huge_pages`).
  """
  runs_on_huge_pages(os.environ)
  if restart:
    restart_with_huge_pages()
  return bool(given_huge_pages(os.environ))


def huge_pages_unavailable() -> str | None:
  """Why glibc's malloc cannot use transparent huge pages here, or None when `HUGE_PAGES_TUNABLE` gives them."""
  libc, version = _platform_module.libc_ver()
  try:
    if sys.platform != 'linux' or libc != 'glibc' or tuple(map(int, version.split('.')[:2])) < (2, 35):
      return f'needs Linux with glibc >= 2.35 (here {sys.platform}, {libc or "no glibc"} {version})'
    with open('/sys/kernel/mm/transparent_hugepage/enabled', encoding='ascii') as f:
      mode = f.read().strip()
  except (OSError, ValueError):
    return 'no transparent huge pages in this kernel'
  # [always]: every large mapping gets them already; [never]: none can
  return None if '[madvise]' in mode else f'transparent huge pages are {mode!r}, not madvise'


def restart_with_huge_pages() -> None:
  """Re-executes this script (same process id, arguments and environment) with glibc's malloc asking for
  transparent huge pages, where that is not set yet and it helps (`runs_on_huge_pages`), and only when it was
  started as itself (`started_as_script`). The imports before the call are done twice. The settings must be valid
  (`prepare_process` checks them first)."""
  if not started_as_script() or given_huge_pages(os.environ) is not None or not runs_on_huge_pages(os.environ):
    return
  tunables = os.environ.get('GLIBC_TUNABLES', '')
  # 'restarted' keeps a process whose tunables the loader drops (a privileged interpreter) from restarting again.
  env = dict(os.environ, BERT_JAX_HUGE_PAGES='restarted',
             GLIBC_TUNABLES=f'{tunables}:{HUGE_PAGES_TUNABLE}' if tunables else HUGE_PAGES_TUNABLE)
  for stream in (sys.stdout, sys.stderr):
    if stream is not None:
      stream.flush()
  try:
    os.execve(sys.executable, sys.orig_argv, env)
  except OSError:  # the interpreter cannot be started again (removed, replaced): go on as started
    pass


# glibc.malloc.hugetlb: 0 (off), 1 (transparent huge pages through madvise), 2 (reserved huge pages of the default
# size) or a larger number (of that size in bytes), as glibc reads a size (decimal, or hexadecimal with 0x).
_HUGETLB_VALUE = re.compile(r'[0-9]+|0[xX][0-9a-fA-F]+')
# BERT_JAX_HUGE_PAGES: 0 (never restart), 1 or unset (restart where huge pages help), 'restarted' (the restart's mark).
_HUGE_PAGES_SETTINGS = ('', '0', '1', 'restarted')


def given_huge_pages(environ) -> bool | None:
  """What `environ`'s GLIBC_TUNABLES says of glibc.malloc.hugetlb (None: nothing; `prepare_process` then decides).

  Raises:
    ConfigError: a value glibc does not read (the loader ignores it, silently: the process would not run on huge
      pages while its results said it did).
  """
  given = dict(t.split('=', 1) for t in environ.get('GLIBC_TUNABLES', '').split(':') if '=' in t)
  if 'glibc.malloc.hugetlb' not in given:
    return None
  value = given['glibc.malloc.hugetlb']
  if not _HUGETLB_VALUE.fullmatch(value):
    raise ConfigError(f'GLIBC_TUNABLES: glibc.malloc.hugetlb={value} is not a value glibc reads (it would ignore it): '
                      'give 0 (off), 1 (transparent huge pages), or 2 (reserved huge pages; a larger number: their '
                      'size in bytes)')
  return int(value, 16 if value[:2] in ('0x', '0X') else 10) != 0


def runs_on_huge_pages(environ) -> bool:
  """Whether a script started with `environ` runs on huge pages, as started or after `prepare_process`'s restart.

  Raises:
    ConfigError: BERT_JAX_HUGE_PAGES or glibc.malloc.hugetlb (`given_huge_pages`) has a value no reader takes.
  """
  allowed = environ.get('BERT_JAX_HUGE_PAGES', '')
  if allowed not in _HUGE_PAGES_SETTINGS:
    raise ConfigError(f'BERT_JAX_HUGE_PAGES={allowed} is neither 0 (keep the allocator the process started with) '
                      'nor 1 (restart on transparent huge pages where they help; the default when unset)')
  given = given_huge_pages(environ)
  if given is not None:
    return given
  return allowed not in ('0', 'restarted') and not huge_pages_unavailable()


def started_as_script() -> bool:
  """Whether this process is a script of its own (`python3 path/to/script.py ...`: its arguments end the
  interpreter's command line), which can be started again as it was: not code run inside another program (a
  notebook's kernel, a test runner), nor a script read from stdin (`python3 -`, which cannot be read again)."""
  return (getattr(sys, 'orig_argv', [])[-len(sys.argv):] == sys.argv and len(sys.orig_argv) > len(sys.argv)
          and os.path.isfile(sys.argv[0]))
