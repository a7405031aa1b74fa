"""Hugging Face ELECTRA (ElectraModel, ElectraForPreTraining: the discriminator, ElectraForMaskedLM: the
generator): BERT's layers and names, embeddings of their own width (`model.embedding_size`) projected to the
hidden size (`embeddings_project`) when the two differ, and no pooler.

An imported config keeps ELECTRA's embedding_size even when it equals hidden_size (electra-base): a config with
embedding_size > 0 exports as ELECTRA (`exports`). The discriminator head (`discriminator_predictions`)
is imported as params['discriminator'] and exported back (ElectraForPreTraining); bert_jax does not train it.
ElectraForMaskedLM's head is our MLM head (dense to embedding_size, GELU, LayerNorm, the tied word embeddings).

Correspondence with transformers' ELECTRA (modeling_electra.py), besides BERT's encoder names:
  embeddings_project                                 bert/embeddings/project
  generator_predictions.dense, .LayerNorm            mlm/transform, mlm/layer_norm
  generator_lm_head (weight tied), .bias             the tied word embeddings, mlm/bias
  discriminator_predictions.dense, .dense_prediction discriminator/dense, discriminator/prediction
"""

from __future__ import annotations

from typing import Any

from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax.errors import BertJaxError, CheckpointError
from bert_jax.interop.hf import bert_layout
from bert_jax.interop.hf.name_tables import SAME, Entry, bert_encoder_table, check_bert_layers, check_tied, dense, norm

# ElectraConfig's defaults, for keys a config.json leaves out.
_HF_DEFAULTS = dict(vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                    num_attention_heads=4, intermediate_size=1024, hidden_act='gelu', hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                    initializer_range=0.02, layer_norm_eps=1e-12, position_embedding_type='absolute',
                    pad_token_id=0, tie_word_embeddings=True)


def _table(cfg: ModelConfig) -> list[Entry]:
  table = bert_encoder_table(cfg.num_layers)
  if cfg.embed_dim != cfg.hidden_size:
    table += dense(('bert', 'embeddings', 'project'), 'embeddings_project')
  table += dense(('mlm', 'transform'), 'generator_predictions.dense', group='mlm')
  table += norm(('mlm', 'layer_norm'), 'generator_predictions.LayerNorm', group='mlm')
  table.append(Entry(('mlm', 'bias'), 'generator_lm_head.bias', SAME, 'mlm'))
  table += dense(('discriminator', 'dense'), 'discriminator_predictions.dense', group='discriminator')
  table += dense(('discriminator', 'prediction'), 'discriminator_predictions.dense_prediction',
                 group='discriminator')
  return table


def _discriminator_shapes(cfg: ModelConfig) -> dict:
  d = cfg.hidden_size
  return {('discriminator', 'dense', 'kernel'): (d, d), ('discriminator', 'dense', 'bias'): (d,),
          ('discriminator', 'prediction', 'kernel'): (d, 1), ('discriminator', 'prediction', 'bias'): (1,)}


FAMILY = bert_layout.Family(
    name='ELECTRA', prefix='electra.', table=_table, decoder='generator_lm_head.weight',
    words='embeddings.word_embeddings.weight', extra_shapes=_discriminator_shapes,
    classes={frozenset(): 'ElectraModel', frozenset({'mlm'}): 'ElectraForMaskedLM',
             frozenset({'discriminator'}): 'ElectraForPreTraining'},
    stem='Electra', sequence_head=('classifier.dense', 'classifier.out_proj'), pooler_activation='gelu')


def exports(cfg: ModelConfig) -> bool:
  """Whether `cfg` exports as ELECTRA: BERT-shaped with an embedding_size, without a position_offset."""
  return bert_layout.bert_shaped(cfg) and bool(cfg.embedding_size) and not cfg.position_offset


def model_config(path: str, hf: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of an ELECTRA config.json (`hf`, already parsed; `path` names it in errors)."""
  hf = {**_HF_DEFAULTS, **hf}
  check_bert_layers(path, hf)
  check_tied(path, hf)
  try:
    return ModelConfig(vocab_size=hf['vocab_size'], embedding_size=hf['embedding_size'],
                       hidden_size=hf['hidden_size'], num_layers=hf['num_hidden_layers'],
                       num_heads=hf['num_attention_heads'], intermediate_size=hf['intermediate_size'],
                       max_position_embeddings=hf['max_position_embeddings'], type_vocab_size=hf['type_vocab_size'],
                       hidden_dropout=hf['hidden_dropout_prob'], attention_dropout=hf['attention_probs_dropout_prob'],
                       initializer_range=hf['initializer_range'], layer_norm_eps=hf['layer_norm_eps'],
                       pad_token_id=hf['pad_token_id'], pooler_activation=FAMILY.pooler_activation)
  except (BertJaxError, TypeError) as e:
    raise CheckpointError(f'{path}: {e}') from None


def hf_config(cfg: ModelConfig, architecture: str, tokenizer) -> dict[str, Any]:
  return {'architectures': [architecture], 'model_type': 'electra', 'vocab_size': cfg.vocab_size,
          'embedding_size': cfg.embed_dim, 'hidden_size': cfg.hidden_size, 'num_hidden_layers': cfg.num_layers,
          'num_attention_heads': cfg.num_heads, 'intermediate_size': cfg.intermediate_size, 'hidden_act': 'gelu',
          'hidden_dropout_prob': cfg.hidden_dropout, 'attention_probs_dropout_prob': cfg.attention_dropout,
          'max_position_embeddings': cfg.max_position_embeddings, 'type_vocab_size': cfg.type_vocab_size,
          'initializer_range': cfg.initializer_range, 'layer_norm_eps': cfg.layer_norm_eps,
          'position_embedding_type': 'absolute', 'tie_word_embeddings': True,
          'pad_token_id': tokenizer.pad_id if tokenizer is not None else tokenization.PAD_ID}


def check_exportable(cfg: ModelConfig) -> None:
  if not cfg.type_vocab_size:
    raise CheckpointError('model.embedding_size > 0 exports as ELECTRA, which has token type embeddings, but '
                          'model.type_vocab_size=0; nothing written')


def load_checkpoint(directory: str, cfg: ModelConfig):
  return bert_layout.load(directory, cfg, FAMILY)


def save_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *, overwrite: bool = False,
                    task=None) -> None:
  check_exportable(cfg)
  bert_layout.save(directory, cfg, params, tokenizer, FAMILY, hf_config, overwrite=overwrite, task=task)
