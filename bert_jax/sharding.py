"""Device mesh, the logical-axis rules table, and global-batch construction.

Modules name axes logically: parameters through Flax's partitioning metadata
(`nnx.with_partitioning`: 'vocab', 'embed', 'heads', 'kv', 'mlp') and activations through
`constrain` with names of their own ('activation_batch', 'activation_length', ...), so that
weights and activations (e.g. sequence parallelism) can be placed independently. This file alone
decides which mesh axis (data, fsdp, tensor) each name is split over, in one table that
`MeshConfig.rules` can override per run. With the default mesh (data=-1, fsdp=1, tensor=1)
parameters are replicated and the batch is split over all devices; FSDP and tensor parallelism
are a matter of mesh sizes, not code.
"""

from __future__ import annotations

from typing import Any, Sequence

from flax import nnx
from flax.core import spmd as flax_spmd
import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from bert_jax.config import MeshConfig
from bert_jax.errors import ConfigError

MESH_AXES = ('data', 'fsdp', 'tensor')

# logical axis name -> mesh axis (or axes); None = replicated.
LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ('vocab', 'tensor'),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('mlp', 'tensor'),
    ('kv', None),
    # activations
    ('activation_batch', ('data', 'fsdp')),
    ('activation_length', None),
    ('activation_embed', None),
    ('activation_mlp', 'tensor'),
)


def rules(overrides: str = '') -> tuple[tuple[str, Any], ...]:
  """LOGICAL_AXIS_RULES with `overrides` (MeshConfig.rules) applied.

  Args:
    overrides: comma-separated `name=axis` entries, `axis` a mesh axis, several joined by '+', or
      empty to replicate: e.g. 'activation_length=tensor,embed='.

  Raises:
    ConfigError: an unknown logical name or mesh axis.
  """
  table = dict(LOGICAL_AXIS_RULES)
  for entry in (e.strip() for e in overrides.split(',') if e.strip()):
    name, sep, value = entry.partition('=')
    axes = tuple(a.strip() for a in value.split('+') if a.strip())
    if name.strip() == 'activation_batch':
      raise ConfigError(f'mesh.rules entry {entry!r}: the batch is always split over data x fsdp (set the mesh sizes)')
    if not sep or name.strip() not in table or any(a not in MESH_AXES for a in axes):
      raise ConfigError(f'mesh.rules entry {entry!r}: give logical_name=mesh_axis[+mesh_axis] with a name of '
                        f'{", ".join(table)} and axes of {", ".join(MESH_AXES)} (empty: replicated)')
    table[name.strip()] = None if not axes else axes[0] if len(axes) == 1 else axes
  return tuple(table.items())


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor) mesh; one size may be -1 to take the remaining devices. Devices of several
  slices get `device_grid`'s hybrid layout: slices split the data axis outermost."""
  devices = list(devices if devices is not None else jax.devices())
  grid = device_grid(cfg, devices)
  if grid is None:
    return jax.make_mesh(_sizes(cfg, len(devices)), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _sizes(cfg: MeshConfig, count: int, where: str = '') -> tuple[int, int, int]:
  """(data, fsdp, tensor) of `count` devices, the -1 resolved."""
  sizes = [cfg.data, cfg.fsdp, cfg.tensor]
  if sizes.count(-1) > 1:
    raise ConfigError(f'at most one mesh axis may be -1, got data={cfg.data} fsdp={cfg.fsdp} '
                      f'tensor={cfg.tensor}')
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if count % known:
      raise ConfigError(f'{count} devices{where} cannot be split into mesh {sizes}')
    sizes[sizes.index(-1)] = count // known
  if int(np.prod(sizes)) != count:
    raise ConfigError(f'mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs '
                      f'{int(np.prod(sizes))} devices, but {count} are available{where}')
  return tuple(sizes)


def device_grid(cfg: MeshConfig, devices: Sequence[Any]) -> np.ndarray | None:
  """The devices as a (data, fsdp, tensor) array for several slices, or None for one (`jax.make_mesh` lays it out).

  Slices are what the devices report (`slice_index`, as TPU multi-slice devices do) or, with `cfg.slices` > 1 on
  devices that report none (GPU hosts over the data-centre network), the processes. Each slice gets the mesh
  data x fsdp x tensor inside it (ICI, `mesh_utils.create_hybrid_device_mesh`), and the slices stack along the data
  axis, outermost: only the data-parallel gradient reduction crosses the slower network, the FSDP gathers and the
  tensor-parallel collectives stay inside a slice (MaxText's dcn_data_parallelism).

  Raises:
    ConfigError: `cfg.slices` is not the number of slices, or a slice's devices do not fit the mesh sizes.
  """
  reported = {getattr(d, 'slice_index', None) for d in devices} - {None}
  by_process = not reported and cfg.slices > 1
  count = len({d.process_index for d in devices}) if by_process else max(1, len(reported))
  if cfg.slices not in (-1, count):
    unit = 'processes' if by_process or not reported else 'slices'
    raise ConfigError(f'mesh.slices={cfg.slices}, but the {len(devices)} devices are in {count} {unit} '
                      '(-1: as many as they report)')
  if count == 1:
    return None
  if len(devices) % count:
    raise ConfigError(f'{len(devices)} devices cannot be split into {count} equal slices')
  inside = _sizes(cfg, len(devices) // count, where=' in each slice')
  return mesh_utils.create_hybrid_device_mesh(inside, (count, 1, 1), devices, process_is_granule=by_process,
                                              allow_split_physical_axes=True)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Pins an activation's sharding by logical axis names, under the mesh (and rules) in context.

  Inside the train/eval steps `under_mesh` puts the (data, fsdp, tensor) mesh and the run's rules
  in context; with no mesh (single-device inference) this is a no-op. Pinning activations at layer boundaries
  (batch over data x fsdp, features replicated or split over tensor) leaves the partitioner
  nothing to guess: without it, jax 0.10's CPU SPMD partitioner computed wrong gradients
  for fsdp x tensor meshes (tests/test_layouts.py).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not set(MESH_AXES) <= set(mesh.axis_names):
    return x
  return jax.lax.with_sharding_constraint(x, _drop_size_one_axes(logical_to_spec(axes), mesh))


def under_mesh(mesh: Mesh, fn, table: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES):
  """`fn` traced with `mesh` and the rules `table` in context, so `constrain` inside it applies (use
  it inside jit)."""
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), flax_spmd.logical_axis_rules(table):
      return fn(*args, **kwargs)
  return wrapped


def logical_to_spec(axes: Sequence[str | None] | None, table: Sequence[tuple[str, Any]] | None = None) -> P:
  """Maps logical axis names to a PartitionSpec through `table` (default: the rules in context, else
  LOGICAL_AXIS_RULES). Names not in the table are replicated."""
  table = dict(table or flax_spmd.get_logical_axis_rules() or LOGICAL_AXIS_RULES)
  if axes is None:
    return P()
  return P(*(table.get(a) if a is not None else None for a in axes))


def _drop_size_one_axes(spec: P, mesh) -> P:
  # Size-1 mesh axes shard nothing; dropping them keeps specs (and checkpoints) layout-free.
  def keep(entry):
    if entry is None:
      return None
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    names = tuple(n for n in names if mesh.shape[n] > 1)
    return None if not names else names[0] if len(names) == 1 else names
  return P(*(keep(e) for e in spec))


def state_shardings(state: nnx.State, mesh: Mesh, table: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES):
  """NamedShardings for an (abstract) nnx state, from its partitioning metadata through `table`."""
  with flax_spmd.logical_axis_rules(table):
    specs = nnx.get_partition_spec(state)  # each Variable's value replaced by its PartitionSpec
  return jax.tree.map(lambda v: NamedSharding(mesh, _drop_size_one_axes(v.get_value(), mesh)), specs,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over data x fsdp ('activation_batch'); the rest replicated."""
  return NamedSharding(mesh, _drop_size_one_axes(logical_to_spec(('activation_batch',), LOGICAL_AXIS_RULES), mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_batch_shards(mesh: Mesh) -> int:
  return mesh.shape['data'] * mesh.shape['fsdp']


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles per-process numpy batches into global arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
