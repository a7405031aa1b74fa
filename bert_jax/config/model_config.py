"""The model block: `ModelConfig` (BERT's architecture, the ModernBERT switches, how it is computed), the named
presets (`PRESETS`, `preset`) and the values its choice fields take."""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax.config.fields import _f
from bert_jax.errors import ConfigError

# name: (num_layers, hidden_size, num_heads, intermediate_size)
PRESETS: dict[str, tuple[int, int, int, int]] = {
    'tiny': (2, 64, 2, 256),
    'mini': (4, 256, 4, 1024),
    'small': (4, 512, 8, 2048),
    'medium': (8, 512, 8, 2048),
    'base': (12, 768, 12, 3072),
    'large': (24, 1024, 16, 4096),
}


# model.attention_impl: '' chooses per call (layers.choose_attention); the others force a kernel.
ATTENTION_IMPLS = ('', 'xla', 'cudnn', 'einsum')
# model.remat_policy: what each encoder layer keeps for the backward pass (model.REMAT_POLICIES).
REMAT_POLICIES = ('none', 'full', 'dots', 'dots_no_batch')
# model.dropout_impl: hashed masks (bert_jax/model/dropout.py) or jax.random.bernoulli, as nnx.Dropout.
DROPOUT_IMPLS = ('hash', 'threefry')
# model.fused_mask: how a padded row's mask reaches cuDNN's fused attention.
FUSED_MASKS = ('lengths', 'dense')
# model.logits_backward: the dtype of the backward matmuls of float32-output products (layers.einsum_f32).
LOGITS_BACKWARDS = ('compute', 'float32')
# Architecture switches (ModelConfig); the first value of each is BERT's.
NORM_POSITIONS = ('post', 'pre')
POSITION_EMBEDDINGS = ('learned', 'rotary')
MLPS = ('gelu', 'geglu')
# model.pooler_activation: after the [CLS] pooler's dense layer: BERT's and RoBERTa's tanh, DistilBERT's ReLU
# (pre_classifier), ELECTRA's exact GELU (ElectraClassificationHead).
POOLER_ACTIVATIONS = ('tanh', 'relu', 'gelu')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """BERT architecture and how it is computed.

  Every field may change when a run resumes (`free`): the fields that shape the parameters or the
  function they compute (`checkpoint='fixed'`) are checked against the workdir's checkpoints on
  their own, by `architecture_diffs`, and are taken from a starting checkpoint. The architecture
  switches (`norm_position` to `global_attention_every`) default to BERT; together
  (pre-LN, rotary, GeGLU, no token types) they give a ModernBERT-shaped encoder. `dtype` is the
  compute dtype; parameters stay float32. `attention_impl`, `remat_policy` and `scan_layers` are
  speed switches: each computes the same function (tests/model/test_speed_switches.py) and none
  changes the parameter tree, so checkpoints move freely between settings.
  """

  vocab_size: int = _f(30522, free=True, checkpoint='fixed')
  hidden_size: int = _f(768, free=True, checkpoint='fixed')
  num_layers: int = _f(12, free=True, checkpoint='fixed')
  num_heads: int = _f(12, free=True, checkpoint='fixed')
  intermediate_size: int = _f(3072, free=True, checkpoint='fixed')
  # The longest sequence: the rows of the learned position table, a bound on inputs with rotary positions.
  max_position_embeddings: int = _f(512, free=True, checkpoint='fixed')
  # Rows of the learned position table before position 0 (RoBERTa / XLM-R: padding_idx + 1 = 2, their positions
  # start past the padding row): the table has max_position_embeddings + position_offset rows and position p reads
  # row p + position_offset. 0 = BERT. Kept so those tables import and export whole, unused rows included.
  position_offset: int = _f(0, free=True, checkpoint='fixed')
  # Token type (segment A/B) embeddings; 0 = none (ModernBERT): token_type_ids are ignored.
  type_vocab_size: int = _f(2, free=True, checkpoint='fixed')
  # Width of the embedding tables and their LayerNorm; 0 = hidden_size (BERT). ELECTRA's embedding_size: a dense
  # projection (embeddings/project) to hidden_size follows when it differs, and the MLM transform maps back to it.
  embedding_size: int = _f(0, free=True, checkpoint='fixed')
  hidden_dropout: float = _f(0.1, free=True, checkpoint='default')
  attention_dropout: float = _f(0.1, free=True, checkpoint='default')
  initializer_range: float = _f(0.02, free=True, checkpoint='fixed')
  layer_norm_eps: float = _f(1e-12, free=True, checkpoint='fixed')
  # [PAD]'s id: without an explicit attention mask, tokens attend to every non-[PAD] token.
  pad_token_id: int = _f(0, free=True, checkpoint='fixed')
  # --- Architecture switches: the defaults are BERT's (tests/model/test_architecture.py). Each changes the
  # function the parameters compute, so checkpoints carry them; Hugging Face export: bert_jax.interop.families
  # (hf_model_type).
  # 'post': x = LN(x + f(x)) after each sub-layer (BERT). 'pre': x = x + f(LN(x)) and a final LayerNorm after the
  # last layer; the embeddings keep their LayerNorm, so the first layer has no LayerNorm before its attention
  # (it would normalise a normalised input), as in ModernBERT.
  norm_position: str = _f('post', free=True, checkpoint='fixed')
  # 'learned': a max_position_embeddings x hidden table added to the embeddings (BERT). 'rotary': RoPE on every
  # layer's queries and keys (rotate-half layout, as RoFormer and ModernBERT): no table, attention scores depend
  # on relative positions only.
  position_embedding: str = _f('learned', free=True, checkpoint='fixed')
  # RoPE base of global-attention layers, and of local-window ones (ModernBERT: 160000 and 10000).
  rope_theta: float = _f(10000.0, free=True, checkpoint='fixed', layout=True)
  local_rope_theta: float = _f(10000.0, free=True, checkpoint='fixed', layout=True)
  # 'gelu': dense -> exact GELU -> dense (BERT). 'geglu': GELU(x W) * (x V) -> dense, with W and V side by side
  # in one intermediate kernel [hidden, 2, intermediate_size] (ModernBERT).
  mlp: str = _f('gelu', free=True, checkpoint='fixed')
  # The pooler's activation (POOLER_ACTIVATIONS): what the NSP head and a sequence classifier read is
  # activation(dense([CLS])). Imports set their family's, so a fine-tuned model exports as that family's classifier.
  pooler_activation: str = _f('tanh', free=True, checkpoint='fixed')
  # A LayerNorm after the pooler's activation: ModernBERT's classification head (ModernBertPredictionHead: dense,
  # GELU, LayerNorm on [CLS]), which the ModernBERT import sets with pooler_activation='gelu'.
  pooler_norm: bool = _f(False, free=True, checkpoint='fixed')
  # False: no bias in any dense layer or LayerNorm of the encoder (pooler included) or of the MLM transform. The
  # output layers keep theirs: the MLM decoder's per-token bias, the NSP and task classifiers (as ModernBERT).
  use_bias: bool = _f(True, free=True, checkpoint='fixed')
  # 0: every layer attends to the whole sequence. > 0 (even): local layers attend only to keys at most
  # attention_window / 2 positions away (the window of Longformer and ModernBERT's local_attention).
  attention_window: int = _f(0, free=True, checkpoint='fixed')
  # With an attention_window: layers 0, N, 2N, ... stay global (ModernBERT: N = 3) and the others are local;
  # 0 = every layer local.
  global_attention_every: int = _f(0, free=True, checkpoint='fixed')
  # 'float32' or 'bfloat16': matmul dtype; LayerNorm, softmax, logits and losses stay float32.
  dtype: str = _f('float32', free=True)
  # Attention kernel. '' = automatic, logged when a model is built: 'cudnn' (flash) on an NVIDIA
  # GPU in bfloat16 with head_dim <= 128, else 'xla' (both jax.nn.dot_product_attention), and
  # 'einsum' (explicit softmax, the only path with dropout on the probabilities) while training
  # with attention_dropout > 0. 'xla'/'cudnn' force that kernel wherever no attention dropout is
  # active; 'einsum' forces the explicit path everywhere.
  attention_impl: str = _f('', free=True)
  # Rematerialisation of each encoder layer in the backward pass: 'none' keeps every activation;
  # 'full' recomputes the layer (least memory); 'dots' keeps matmul outputs and recomputes the
  # elementwise ops; 'dots_no_batch' keeps only matmuls without batch dimensions (the weight
  # matmuls, not attention's QK^T and PV). Maps to jax.checkpoint_policies.
  remat_policy: str = _f('none', free=True)
  # Dropout masks: 'hash' (a counter-based hash of each element's index: one threefry call per
  # dropout site instead of one per element, the bulk of a BERT-base CPU step; bert_jax/model/dropout.py)
  # or 'threefry' (jax.random.bernoulli, as flax's nnx.Dropout). Same rates, different masks.
  dropout_impl: str = _f('hash', free=True)
  # How a padding mask reaches cuDNN flash attention: 'lengths' (each right-padded row's length, cuDNN's padding
  # mask: no [B, 1, T, S] bias is built, read or differentiated) or 'dense' (the boolean mask as an additive
  # bias). Padding masks are right-padded wherever bert_jax builds them (a prefix of ones per row); packed rows
  # (segment ids) and local bands always go dense.
  fused_mask: str = _f('lengths', free=True)
  # The backward matmuls of the products with float32 results (the MLM decoder's logits, the einsum attention
  # paths' scores): 'compute' runs them in the compute dtype as every other matmul's backward (bfloat16 products
  # accumulated in float32); 'float32' in float32 (jax's own transpose of a float32-output product, before
  # 2026-11-28). The same under model.dtype=float32.
  logits_backward: str = _f('compute', free=True)
  # Runs the encoder layers as one jax.lax.scan over their stacked parameters: compile time
  # independent of depth. The parameter tree (layers/0, layers/1, ...) is unchanged.
  scan_layers: bool = _f(False, free=True)

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ConfigError(f'model.hidden_size={self.hidden_size} is not divisible by '
                        f'model.num_heads={self.num_heads}')
    if self.dtype not in ('float32', 'bfloat16'):
      raise ConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ConfigError(f'model.attention_impl must be one of {ATTENTION_IMPLS} (\'\' = automatic), '
                        f'got {self.attention_impl!r}')
    if self.dropout_impl not in DROPOUT_IMPLS:
      raise ConfigError(f'model.dropout_impl must be one of {", ".join(DROPOUT_IMPLS)}, got {self.dropout_impl!r}')
    if self.logits_backward not in LOGITS_BACKWARDS:
      raise ConfigError(f'model.logits_backward must be one of {", ".join(LOGITS_BACKWARDS)}, '
                        f'got {self.logits_backward!r}')
    if self.fused_mask not in FUSED_MASKS:
      raise ConfigError(f'model.fused_mask must be one of {", ".join(FUSED_MASKS)}, got {self.fused_mask!r}')
    if self.remat_policy not in REMAT_POLICIES:
      raise ConfigError(f'model.remat_policy must be one of {", ".join(REMAT_POLICIES)}, '
                        f'got {self.remat_policy!r}')
    for name in ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                 'max_position_embeddings'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'model.{name} must be positive, got {getattr(self, name)}')
    for name, choices in (('norm_position', NORM_POSITIONS), ('position_embedding', POSITION_EMBEDDINGS),
                          ('mlp', MLPS), ('pooler_activation', POOLER_ACTIVATIONS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f'model.{name} must be one of {", ".join(choices)}, got {getattr(self, name)!r}')
    for name in ('type_vocab_size', 'embedding_size', 'attention_window', 'global_attention_every',
                 'position_offset'):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ConfigError(f'model.{name} must be a non-negative integer, got {getattr(self, name)!r}')
    if self.position_offset and self.position_embedding != 'learned':
      raise ConfigError(f'model.position_offset={self.position_offset} needs learned positions '
                        f'(position_embedding=learned), got {self.position_embedding!r}')
    if self.attention_window % 2:
      raise ConfigError(f'model.attention_window={self.attention_window} must be even: local layers attend '
                        f'attention_window / 2 positions to each side')
    if self.global_attention_every and not self.attention_window:
      raise ConfigError(f'model.global_attention_every={self.global_attention_every} needs model.attention_window '
                        '> 0: without a window every layer is global')
    for name in ('rope_theta', 'local_rope_theta'):
      if not getattr(self, name) > 0:
        raise ConfigError(f'model.{name} must be positive, got {getattr(self, name)}')
    if self.position_embedding == 'rotary' and self.head_dim % 2:
      raise ConfigError(f'model.position_embedding=rotary needs an even head dim (hidden_size / num_heads = '
                        f'{self.head_dim})')

  @property
  def embed_dim(self) -> int:
    """The width of the embedding tables (embedding_size, or hidden_size when 0)."""
    return self.embedding_size or self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def layer_windows(self) -> tuple[int, ...]:
    """Each layer's attention window: 0 = global, else `attention_window` (local)."""
    every = self.global_attention_every
    return tuple(0 if not self.attention_window or (every and i % every == 0) else self.attention_window
                 for i in range(self.num_layers))

  @classmethod
  def from_saved(cls, d: dict[str, Any]) -> 'ModelConfig':
    """From a workdir's saved model dict; keys of fields no longer defined are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def preset(name: str, **overrides: Any) -> ModelConfig:
  """Returns the ModelConfig of a named preset with `overrides` applied."""
  if name not in PRESETS:
    raise ConfigError(f'unknown model preset {name!r}; choose from {", ".join(PRESETS)}')
  layers, hidden, heads, inter = PRESETS[name]
  fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=inter)
  fields.update(overrides)
  return ModelConfig(**fields)
