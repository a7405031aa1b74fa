"""Heads on the shared encoder: pretraining (masked LM at the masked positions, NSP) and fine-tuning
(sequence classification/regression, token classification and span (start/end) question answering)
— Hugging Face's BertFor* layouts.

Every head model has a `bert` encoder (the pretrained parameters go there) and new head
parameters initialised like BERT's (truncated normal, std `initializer_range`, zero bias).
Logits are float32 whatever the compute dtype.

Fine-tuning inputs may be packed (`finetuning/batching.py`): several examples per row, told apart by `segment_ids`
(attention stays inside a segment) with positions restarting at each example. The sequence
classifier then pools each example's own [CLS], found at (`example_row`, `example_offset`).
Unpacked inputs are the special case of one example per row: segment_ids = attention mask;
without segment_ids, tokens attend to every non-[PAD] token of their row.

Each model takes the `platform` it is built for (`BertEncoder`'s; None: jax's default devices', resolved once).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from bert_jax import hardware
from bert_jax.config import ModelConfig
from bert_jax.model.dropout import Dropout
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.layers import Dense, LayerNorm, compute_dtype, param
from bert_jax.sharding import constrain


class MaskedLMHead(nnx.Module):
  """dense + GELU + LayerNorm, then the tied word-embedding matrix plus a bias (BERT's and ModernBERT's
  head; `use_bias=False` drops the dense and LayerNorm biases, never the per-token one). The dense maps
  hidden_size to the embeddings' width (ELECTRA's generator head when `embedding_size` differs)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
    d, e = cfg.hidden_size, cfg.embed_dim
    self.transform = Dense((d,), (e,), ('embed', 'mlp'), std=cfg.initializer_range,
                           dtype=compute_dtype(cfg), rngs=rngs, use_bias=cfg.use_bias, platform=platform)
    self.layer_norm = LayerNorm(e, eps=cfg.layer_norm_eps, dtype=compute_dtype(cfg), use_bias=cfg.use_bias)
    self.bias = param(jax.nn.initializers.zeros, None, (cfg.vocab_size,), ('vocab',))
    self.logits_backward = cfg.logits_backward

  def __call__(self, h_bpd, word_embeddings) -> jax.Array:
    h_bpd = constrain(self.transform(constrain(h_bpd, ('activation_batch', None, 'activation_embed'))),
                      ('activation_batch', None, 'activation_embed'))
    h_bpd = self.layer_norm(jax.nn.gelu(h_bpd, approximate=False))
    return word_embeddings.attend(h_bpd, backward=self.logits_backward) + self.bias[...]  # float32 logits


class BertForPreTraining(nnx.Module):
  """BERT with the MLM head (only at masked positions) and the NSP classifier (`nsp_head`;
  masked-LM-only pretraining, data.objective=none, has none)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, nsp_head: bool = True, platform: str | None = None):
    self.cfg = cfg
    platform = hardware.resolve(platform)
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    self.mlm = MaskedLMHead(cfg, rngs=rngs, platform=platform)
    # float32 logits computed in float32 (a [D, 2] matmul: nothing to save in bfloat16).
    self.nsp = Dense((cfg.hidden_size,), (2,), ('embed', None), std=cfg.initializer_range,
                     dtype=jnp.float32, rngs=rngs, platform=platform) if nsp_head else None

  def __call__(self, input_ids_bt, token_type_ids_bt, attention_mask_bt, masked_lm_positions_bp,
               position_ids_bt=None, *, segment_ids_bt=None, cls_positions_bk=None,
               deterministic: bool = True):
    """Returns (mlm_logits [B, P, V], nsp_logits [B, 2]), both float32 (nsp_logits None without
    an NSP head).

    The MLM head runs only on the P gathered masked positions, not on all T tokens.
    Packed rows (`data.loader.pack_batch`) pass `segment_ids_bt` (attention stays inside
    each example) and `cls_positions_bk` (each of K examples' [CLS] offset, pooled for NSP):
    nsp_logits are then [B, K, 2].
    """
    seq_btd, pooled_bd = self.bert(input_ids_bt, token_type_ids_bt, attention_mask_bt, position_ids_bt,
                                   segment_ids_bt=segment_ids_bt, deterministic=deterministic)
    h_bpd = jnp.take_along_axis(seq_btd, masked_lm_positions_bp[..., None], axis=1)
    mlm_logits_bpv = self.mlm(h_bpd, self.bert.embeddings.word_embeddings)
    if self.nsp is None:
      return mlm_logits_bpv, None
    if segment_ids_bt is not None:  # packed: the pooler on every example's [CLS], [B, K, D]
      cls_bkd = jnp.take_along_axis(seq_btd, cls_positions_bk[..., None], axis=1)
      pooled_bd = self.bert.pool(cls_bkd)
    return mlm_logits_bpv, self.nsp(pooled_bd).astype(jnp.float32)


# head kind -> what the logits mean
HEAD_KINDS = ('classification', 'regression', 'multilabel', 'token', 'span')
# The kinds with one logits row per example (BertForSequenceClassification): one label, a number, a set of labels.
SEQUENCE_KINDS = ('classification', 'regression', 'multilabel')


def _encode(bert: BertEncoder, input_ids_bt, token_type_ids_bt, segment_ids_bt, position_ids_bt,
            deterministic: bool) -> jax.Array:
  # Without segment_ids the encoder's default mask applies: every non-[PAD] token (one example per row).
  seq_btd, _ = bert(input_ids_bt, token_type_ids_bt, None, position_ids_bt, segment_ids_bt=segment_ids_bt,
                    deterministic=deterministic)
  return seq_btd


class _DropoutClassifier(nnx.Module):
  """The encoder, dropout and a `num_labels`-way dense layer (Hugging Face's `dropout` + `classifier`)."""

  def __init__(self, cfg: ModelConfig, num_labels: int, *, rngs: nnx.Rngs, platform: str | None = None):
    platform = hardware.resolve(platform)
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    self.dropout = Dropout(cfg.hidden_dropout, impl=cfg.dropout_impl, rngs=rngs)
    # Logits in float32 (a [D, num_labels] matmul: nothing to save in bfloat16).
    self.classifier = Dense((cfg.hidden_size,), (num_labels,), ('embed', None), std=cfg.initializer_range,
                            dtype=jnp.float32, rngs=rngs, platform=platform)


class BertForSequenceClassification(_DropoutClassifier):
  """dropout + dense on the pooled [CLS] output; `num_labels=1` is regression (STS-B)."""

  def __call__(self, input_ids_bt, token_type_ids_bt=None, segment_ids_bt=None, position_ids_bt=None,
               example_row_e=None, example_offset_e=None, *, deterministic: bool = True) -> jax.Array:
    """Returns logits [E, num_labels], one row per example (E = B when unpacked)."""
    seq_btd = _encode(self.bert, input_ids_bt, token_type_ids_bt, segment_ids_bt, position_ids_bt, deterministic)
    if example_row_e is None:
      cls_ed = seq_btd[:, 0]
    else:
      cls_ed = seq_btd[example_row_e, example_offset_e]
    pooled_ed = self.bert.pool(cls_ed)
    return self.classifier(self.dropout(pooled_ed, deterministic=deterministic)).astype(jnp.float32)


class BertForTokenClassification(_DropoutClassifier):
  """dropout + dense on every token's final hidden state (NER)."""

  def __call__(self, input_ids_bt, token_type_ids_bt=None, segment_ids_bt=None, position_ids_bt=None,
               example_row_e=None, example_offset_e=None, *, deterministic: bool = True) -> jax.Array:
    """Returns logits [B, T, num_labels] (per row; examples are cut out by the caller)."""
    del example_row_e, example_offset_e
    seq_btd = _encode(self.bert, input_ids_bt, token_type_ids_bt, segment_ids_bt, position_ids_bt, deterministic)
    return self.classifier(self.dropout(seq_btd, deterministic=deterministic)).astype(jnp.float32)


class BertForQuestionAnswering(nnx.Module):
  """A dense layer to (start, end) logits on every token (no dropout, as BERT's SQuAD head)."""

  def __init__(self, cfg: ModelConfig, num_labels: int = 2, *, rngs: nnx.Rngs, platform: str | None = None):
    del num_labels  # always start and end
    platform = hardware.resolve(platform)
    self.bert = BertEncoder(cfg, rngs=rngs, platform=platform)
    self.qa_outputs = Dense((cfg.hidden_size,), (2,), ('embed', None), std=cfg.initializer_range,
                            dtype=jnp.float32, rngs=rngs, platform=platform)

  def __call__(self, input_ids_bt, token_type_ids_bt=None, segment_ids_bt=None, position_ids_bt=None,
               example_row_e=None, example_offset_e=None, *, deterministic: bool = True) -> jax.Array:
    """Returns logits [B, T, 2]: start at [..., 0], end at [..., 1] (per row)."""
    del example_row_e, example_offset_e
    seq_btd = _encode(self.bert, input_ids_bt, token_type_ids_bt, segment_ids_bt, position_ids_bt, deterministic)
    return self.qa_outputs(seq_btd).astype(jnp.float32)


def head_model(kind: str, cfg: ModelConfig, num_labels: int, *, rngs: nnx.Rngs,
               platform: str | None = None) -> nnx.Module:
  """The model for a head kind (one of HEAD_KINDS), built for `platform` (`BertEncoder`'s)."""
  if kind in SEQUENCE_KINDS:
    return BertForSequenceClassification(cfg, num_labels, rngs=rngs, platform=platform)
  if kind == 'token':
    return BertForTokenClassification(cfg, num_labels, rngs=rngs, platform=platform)
  if kind == 'span':
    return BertForQuestionAnswering(cfg, rngs=rngs, platform=platform)
  raise ValueError(f'unknown head kind {kind!r}; choose from {", ".join(HEAD_KINDS)}')
