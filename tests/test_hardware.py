"""bert_jax/hardware.py: the platform resolved once and passed to the model."""

from flax import nnx
import jax
import pytest

from bert_jax import config, hardware
from bert_jax.errors import ConfigError
from bert_jax.model import heads


def test_auto_is_the_platform_of_the_mesh_or_of_jax_s_devices():
  mesh = jax.make_mesh((jax.device_count(),), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  assert hardware.resolve('auto', mesh=mesh) == hardware.resolve() == hardware.resolve(None) == 'cpu'
  for platform in hardware.PLATFORMS:  # a platform is taken as given, whatever the devices
    assert hardware.resolve(platform, mesh=mesh) == platform
  with pytest.raises(ConfigError, match="hardware must be one of auto, cpu, gpu, rocm, tpu, got 'cuda'"):
    hardware.resolve('cuda')


def test_the_model_keeps_the_platform_it_was_built_for():
  # Resolved when the modules are built, down to every Dense: nothing asks jax while a step is traced.
  cfg = config.preset('tiny', vocab_size=50)
  built = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0), platform='gpu')
  platforms = {m.platform for _, m in nnx.iter_graph(built) if isinstance(m, nnx.Module) and hasattr(m, 'platform')}
  assert platforms == {'gpu'}
  assert built.bert.layers[0].attention.query.platform == 'gpu'
  assert heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)).bert.layers[0].output.platform == 'cpu'
  with pytest.raises(ConfigError, match='hardware must be one of'):
    heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0), platform='cuda')
