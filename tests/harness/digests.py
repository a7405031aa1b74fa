"""What a run left on disk, read back, and damage done to files: `tree_digest` (a user's files before and after a
command), `png_size`, `restore_pretraining_state` (a pretraining checkpoint through the library's Checkpointer,
read-only), `cut_in_half` (a file cut short), `tmpfs` (a small filesystem to fill or remount read-only).

Production behaviour changed: none (`tmpfs` mounts a filesystem at the test's own path; without root the test skips).
"""

import contextlib
import os

import pytest


def tree_digest(directory) -> str:
  """sha256 over every file's path and bytes under `directory` (a user's files before and after a command)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(directory)):
    dirs.sort()
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, directory).encode())
      with open(path, 'rb') as f:
        h.update(f.read())
  return h.hexdigest()


def png_size(path) -> tuple[int, int]:
  """(width, height) of a PNG file from its IHDR chunk, after checking its signature."""
  import struct  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    head = f.read(24)
  assert head[:8] == b'\x89PNG\r\n\x1a\n' and head[12:16] == b'IHDR', path
  return struct.unpack('>II', head[16:24])


def restore_pretraining_state(workdir: str, cfg, step=None):
  """(the whole train state as numpy, the checkpoint meta) of a pretraining workdir's `step` (latest when None)."""
  import jax  # pylint: disable=g-import-not-at-top

  from bert_jax import sharding
  from bert_jax.pretraining.pretrain_run import pretraining_model  # pylint: disable=g-import-not-at-top
  from bert_jax.runs.checkpoints import Checkpointer  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  model = pretraining_model(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps),
                           sharding.make_mesh(cfg.mesh), objective=cfg.data.objective)
  state, meta = Checkpointer(workdir, read_only=True).restore(step, model.abstract_state)
  return jax.device_get(state), meta


def cut_in_half(path: str) -> None:
  """`path` with its second half gone (a download or copy cut short)."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2])


@contextlib.contextmanager
def tmpfs(path, size: str):
  """A tmpfs of `size` (e.g. '4M') mounted at `path` for the block (remount it read-only or larger with
  `mount -o remount,...`); the test skips where mounting is not allowed (it needs root)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  path = str(path)
  os.makedirs(path, exist_ok=True)
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', path], capture_output=True).returncode:
    pytest.skip('mounting a tmpfs needs root')
  try:
    yield path
  finally:
    subprocess.run(['umount', path], capture_output=True)
