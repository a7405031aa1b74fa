"""Multi-process start-up (`jax.distributed`) and which rows of each global batch a process feeds.

JAX runs one Python process per host (or per GPU); each drives its local devices and they
meet in collectives. `initialize` connects the processes and must run before anything else
touches jax (entry points call it through `bert_jax.cli.run`). It needs the coordinator's
address, the process count and this process's id, given explicitly or, on SLURM and Cloud
TPU pods, found by jax's own cluster detection. On a plain machine it does nothing, so
single-process runs are unchanged. On CPU, cross-process collectives use gloo, jax's default
`jax_cpu_collectives_implementation` (so nothing to set): tests/test_multihost.py runs two
processes on one machine that way.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax

from bert_jax import sharding as shd
from bert_jax.errors import ConfigError

MODES = ('auto', 'on', 'off')


def detect_cluster() -> str | None:
  """Names the multi-process launcher found in the environment, or None.

  Only launchers that start several processes count: a single SLURM task or a one-host TPU VM
  runs as a plain single process.

  Returns:
    'env' (JAX_COORDINATOR_ADDRESS is set), 'slurm' (inside `srun` with SLURM_NTASKS > 1),
    'tpu' (TPU_WORKER_HOSTNAMES lists several hosts, as on GKE) or None.
  """
  env = os.environ
  if env.get('JAX_COORDINATOR_ADDRESS'):
    return 'env'
  # SLURM_STEP_NODELIST is set inside `srun` steps only (the variables jax's SlurmCluster reads);
  # a bare `python ...` in an allocation must not wait for tasks that never start.
  if 'SLURM_STEP_NODELIST' in env and 'SLURM_PROCID' in env and int(env.get('SLURM_NTASKS', '1')) > 1:
    return 'slurm'
  if ',' in env.get('TPU_WORKER_HOSTNAMES', ''):
    return 'tpu'
  return None


def _check_address(address: str) -> None:
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError(f'--coordinator_address must be HOST:PORT (process 0\'s host and a free port), '
                      f'got {address!r}')


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Sequence[int] | None = None, *,
               mode: str = 'auto', initialization_timeout: int = 300) -> bool:
  """Connects this process to the others with `jax.distributed.initialize`, when there are others.

  Call it first, before any jax computation or `jax.devices()`.

  Args:
    coordinator_address: 'host:port' of process 0 (its host, a port free there), the same on all
      processes. With it, `num_processes` and `process_id` are required unless a cluster is detected.
    num_processes: total number of processes.
    process_id: this process, in [0, num_processes).
    local_device_ids: accelerator ids this process drives (one process per GPU); all local ones
      when None.
    mode: 'auto' initializes when an address is given or `detect_cluster()` finds a launcher;
      'on' always does, letting jax detect what is not given (e.g. Cloud TPU pods on GCE, whose
      workers are found through the metadata server); 'off' never does.
    initialization_timeout: seconds to wait for all processes to connect.

  Returns:
    Whether jax.distributed was initialized (now or by an earlier call).

  Raises:
    ConfigError: an invalid combination of arguments.
  """
  if mode not in MODES:
    raise ConfigError(f'--distributed must be one of {", ".join(MODES)}, got {mode!r}')
  given = {name: value for name, value in (('--coordinator_address', coordinator_address),
                                           ('--num_processes', num_processes), ('--process_id', process_id),
                                           ('--local_device_ids', local_device_ids)) if value is not None}
  if mode == 'off':
    if given:
      raise ConfigError(f'--distributed=off contradicts {", ".join(given)}')
    return False
  if num_processes is not None and num_processes < 1:
    raise ConfigError(f'--num_processes must be positive, got {num_processes}')
  if process_id is not None and not 0 <= process_id < (num_processes or float('inf')):
    raise ConfigError(f'--process_id={process_id} must be in [0, --num_processes={num_processes})')
  if coordinator_address is not None:
    _check_address(coordinator_address)
  cluster = detect_cluster()
  explicit = coordinator_address is not None and num_processes is not None and process_id is not None
  if given and not explicit and cluster is None and mode != 'on':
    raise ConfigError(f'{", ".join(given)} given, but a multi-process run needs all of --coordinator_address, '
                      '--num_processes and --process_id (or a SLURM/TPU launcher that provides them)')
  if mode == 'auto' and not given and cluster is None:
    return False  # a plain single-process run
  if jax.distributed.is_initialized():
    return True
  try:
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
        local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
        # Explicit flags win outright: jax's SLURM detection would otherwise pin each task to one
        # GPU (SLURM_LOCALID) even when one task per node drives all of them.
        cluster_detection_method='deactivate' if explicit else None,
        initialization_timeout=initialization_timeout)
  except ValueError as e:  # nothing detected what was not given
    raise ConfigError(f'jax.distributed could not start ({e}); give --coordinator_address, --num_processes '
                      'and --process_id') from None
  return True


def process_batch_block(mesh: jax.sharding.Mesh) -> tuple[int, int]:
  """Which contiguous block of every global batch this process must supply.

  `jax.make_array_from_process_local_data` fills the batch rows that this process's devices hold
  from its local rows, in order. Those rows are block `index` of `count` equal blocks; usually
  index = jax.process_index() and count = jax.process_count(), but the mesh's device order decides
  (and processes that only split tensor axes share a block). Feed the result to the input
  pipeline as (process_index, process_count).

  Args:
    mesh: the training mesh; the batch is split over its data and fsdp axes.

  Returns:
    (index, count).

  Raises:
    ConfigError: this process's devices hold rows that are not one contiguous block.
  """
  n = shd.num_batch_shards(mesh)
  rows = set()
  for index in shd.batch_sharding(mesh).addressable_devices_indices_map((n,)).values():
    rows.update(range(*index[0].indices(n)))
  first, size = min(rows), len(rows)
  if rows != set(range(first, first + size)) or n % size or first % size:
    raise ConfigError(f'process {jax.process_index()} holds batch shards {sorted(rows)} of {n}, not one '
                      'contiguous block; order the mesh devices by process')
  return first // size, n // size
