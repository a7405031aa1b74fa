"""The hardware a process runs on, decided once: the platform the model is built for.

Platform. `resolve` turns a hardware setting ('auto', 'cpu', 'gpu', 'rocm' or 'tpu', as MaxText's `hardware`) into
a concrete platform: 'auto' is the platform of a mesh's devices, or of jax's default devices. The model's modules
take the resolved value as their `platform` argument when they are built (`BertEncoder(cfg, rngs=rngs,
platform='cpu')`; None resolves 'auto' there and then) and keep it, so no trace asks jax which backend it runs on.
The runs resolve it from their mesh. It decides which attention kernel runs (`model.attention.choose_attention`:
cuDNN flash only on an NVIDIA GPU) and whether Dense's bfloat16 backward runs in the layouts XLA:CPU's fast
bfloat16 kernels take (`model.layers.matmul`: only on 'cpu').

This module imports jax only where it asks for devices.
"""

from __future__ import annotations

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
