"""Hugging Face DistilBERT (DistilBertModel, DistilBertForMaskedLM): BERT's post-LN layers under other names,
without token type embeddings or a pooler.

A BERT-shaped ModelConfig without token types (type_vocab_size=0) is DistilBERT's function, and exports as it
(`exports`). DistilBERT's LayerNorms have eps 1e-12 whatever its config says.

Correspondence with transformers' DistilBERT (modeling_distilbert.py):
  embeddings.{word,position}_embeddings, embeddings.LayerNorm   the same tables, the embeddings' layer_norm
  transformer.layer.i.attention.{q,k,v,out}_lin              layers/i/attention/{query,key,value,output}
  transformer.layer.i.sa_layer_norm, ffn.lin1, ffn.lin2       attention_norm, intermediate, output
  transformer.layer.i.output_layer_norm                       output_norm
  vocab_transform, vocab_layer_norm                           mlm/transform, mlm/layer_norm
  vocab_projector (weight tied), vocab_projector.bias         the tied word embeddings, mlm/bias
"""

from __future__ import annotations

from typing import Any

from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax.errors import BertJaxError, CheckpointError
from bert_jax.interop.hf import bert_layout
from bert_jax.interop.hf.name_tables import SAME, Entry, attention, check_tied, dense, norm

LAYER_NORM_EPS = 1e-12  # fixed in DistilBERT's modules
# DistilBertConfig's defaults, for keys a config.json leaves out.
_HF_DEFAULTS = dict(vocab_size=30522, max_position_embeddings=512, sinusoidal_pos_embds=False, n_layers=6,
                    n_heads=12, dim=768, hidden_dim=3072, dropout=0.1, attention_dropout=0.1, activation='gelu',
                    initializer_range=0.02, pad_token_id=0, tie_word_embeddings=True)


def _table(cfg: ModelConfig) -> list[Entry]:
  emb = ('bert', 'embeddings')
  table = [Entry(emb + (name, 'embedding'), f'embeddings.{name}.weight', SAME, 'bert')
           for name in ('word_embeddings', 'position_embeddings')]
  table += norm(emb + ('layer_norm',), 'embeddings.LayerNorm')
  for i in range(cfg.num_layers):
    ours, theirs = ('bert', 'layers', i), f'transformer.layer.{i}'
    table += attention(ours, *(f'{theirs}.attention.{n}_lin' for n in ('q', 'k', 'v', 'out')))
    table += norm(ours + ('attention_norm',), f'{theirs}.sa_layer_norm')
    table += dense(ours + ('intermediate',), f'{theirs}.ffn.lin1')
    table += dense(ours + ('output',), f'{theirs}.ffn.lin2')
    table += norm(ours + ('output_norm',), f'{theirs}.output_layer_norm')
  table += dense(('mlm', 'transform'), 'vocab_transform', group='mlm')
  table += norm(('mlm', 'layer_norm'), 'vocab_layer_norm', group='mlm')
  table.append(Entry(('mlm', 'bias'), 'vocab_projector.bias', SAME, 'mlm'))
  return table


FAMILY = bert_layout.Family(
    name='DistilBERT', prefix='distilbert.', table=_table, decoder='vocab_projector.weight',
    words='embeddings.word_embeddings.weight', token_types=False,
    classes={frozenset(): 'DistilBertModel', frozenset({'mlm'}): 'DistilBertForMaskedLM'},
    stem='DistilBert', sequence_head=('pre_classifier', 'classifier'), pooler_activation='relu')


def exports(cfg: ModelConfig) -> bool:
  """Whether `cfg` exports as DistilBERT: BERT-shaped without token types, embedding_size or position_offset."""
  return (bert_layout.bert_shaped(cfg) and not cfg.type_vocab_size and not cfg.embedding_size
          and not cfg.position_offset)


def model_config(path: str, hf: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of a DistilBERT config.json (`hf`, already parsed; `path` names it in errors)."""
  hf = {**_HF_DEFAULTS, **hf}
  if hf['activation'] != 'gelu':
    raise CheckpointError(f"{path}: activation={hf['activation']!r}, but bert_jax implements only BERT's exact "
                          "(erf) GELU, 'gelu'; this model's outputs would not match")
  check_tied(path, hf)
  # sinusoidal_pos_embds=true: the table is stored all the same, and imports as a learned one (the same function).
  try:
    return ModelConfig(vocab_size=hf['vocab_size'], hidden_size=hf['dim'], num_layers=hf['n_layers'],
                       num_heads=hf['n_heads'], intermediate_size=hf['hidden_dim'],
                       max_position_embeddings=hf['max_position_embeddings'], type_vocab_size=0,
                       hidden_dropout=hf['dropout'], attention_dropout=hf['attention_dropout'],
                       initializer_range=hf['initializer_range'], layer_norm_eps=LAYER_NORM_EPS,
                       pad_token_id=hf['pad_token_id'], pooler_activation=FAMILY.pooler_activation)
  except (BertJaxError, TypeError) as e:
    raise CheckpointError(f'{path}: {e}') from None


def hf_config(cfg: ModelConfig, architecture: str, tokenizer) -> dict[str, Any]:
  return {'architectures': [architecture], 'model_type': 'distilbert', 'vocab_size': cfg.vocab_size,
          'dim': cfg.hidden_size, 'n_layers': cfg.num_layers, 'n_heads': cfg.num_heads,
          'hidden_dim': cfg.intermediate_size, 'max_position_embeddings': cfg.max_position_embeddings,
          'sinusoidal_pos_embds': False, 'dropout': cfg.hidden_dropout, 'attention_dropout': cfg.attention_dropout,
          'activation': 'gelu', 'initializer_range': cfg.initializer_range, 'tie_word_embeddings': True,
          'pad_token_id': tokenizer.pad_id if tokenizer is not None else tokenization.PAD_ID}


def check_exportable(cfg: ModelConfig) -> None:
  if cfg.layer_norm_eps != LAYER_NORM_EPS:
    raise CheckpointError(f'model.layer_norm_eps={cfg.layer_norm_eps}: a BERT without token types exports as '
                          f'DistilBERT, whose LayerNorms have eps {LAYER_NORM_EPS}; nothing written')


def load_checkpoint(directory: str, cfg: ModelConfig):
  return bert_layout.load(directory, cfg, FAMILY)


def save_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *, overwrite: bool = False,
                    task=None) -> None:
  check_exportable(cfg)
  bert_layout.save(directory, cfg, params, tokenizer, FAMILY, hf_config, overwrite=overwrite, task=task)
