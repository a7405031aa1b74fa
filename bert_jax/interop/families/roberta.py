"""Hugging Face RoBERTa and XLM-R (RobertaModel, RobertaForMaskedLM; XLMRobertaModel, XLMRobertaForMaskedLM):
BERT's layers and names under 'roberta.', learned positions offset by padding_idx + 1, and an LM head of BERT's
function under its own names.

Positions: transformers numbers a row's real tokens padding_idx + 1, padding_idx + 2, ... (padding tokens get
padding_idx), so RoBERTa's table has max_position_embeddings rows of which the first padding_idx + 1 are never read
by a real token. The import keeps the whole table and sets `model.position_offset` = padding_idx + 1 and
`model.max_position_embeddings` to the positions usable (theirs minus the offset): our position p reads row
p + offset, the BERT path is unchanged (offset 0), and an export writes the table back as it was. A config with
position_offset > 0 exports as RoBERTa (`exports`).

RoBERTa and XLM-R differ in their tokenizer only (byte-level BPE; SentencePiece Unigram): XLM-R's model_type is
written back when the tokenizer is a Unigram one (or a SentencePiece model), RoBERTa's otherwise. Their tokenizers
return no token type ids (type_vocab_size is 1: every id 0).

Correspondence with transformers' RoBERTa (modeling_roberta.py), besides BERT's encoder and pooler names:
  lm_head.dense, lm_head.layer_norm                  mlm/transform, mlm/layer_norm
  lm_head.decoder.weight (tied), lm_head.bias         the tied word embeddings, mlm/bias (decoder.bias equals it)
"""

from __future__ import annotations

import json
from typing import Any

from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax.errors import BertJaxError, CheckpointError
from bert_jax.interop.hf import bert_layout, model_dir
from bert_jax.interop.hf.name_tables import SAME, Entry, bert_encoder_table, check_bert_layers, check_tied, dense, norm

# RobertaConfig's defaults (XLMRobertaConfig's are the same), for keys a config.json leaves out.
_HF_DEFAULTS = dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, hidden_act='gelu', hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                    initializer_range=0.02, layer_norm_eps=1e-12, position_embedding_type='absolute',
                    pad_token_id=1, tie_word_embeddings=True)


def _table(cfg: ModelConfig) -> list[Entry]:
  table = bert_encoder_table(cfg.num_layers)
  table += dense(('bert', 'pooler'), 'pooler.dense', group='pooler')
  table += dense(('mlm', 'transform'), 'lm_head.dense', group='mlm')
  table += norm(('mlm', 'layer_norm'), 'lm_head.layer_norm', group='mlm')
  table.append(Entry(('mlm', 'bias'), 'lm_head.bias', SAME, 'mlm'))
  return table


def _family(name: str, cls: str) -> bert_layout.Family:
  return bert_layout.Family(
      name=name, prefix='roberta.', table=_table, decoder='lm_head.decoder.weight',
      words='embeddings.word_embeddings.weight', token_types=False, pooled=frozenset({frozenset()}),
      decoder_bias=('lm_head.decoder.bias', 'lm_head.bias'),
      classes={frozenset(): f'{cls}Model', frozenset({'mlm'}): f'{cls}ForMaskedLM'},
      stem=cls, sequence_head=('classifier.dense', 'classifier.out_proj'), pooler_activation='tanh')


# model_type -> its description (the registry, `families.FAMILIES`, has a row for each).
DESCRIPTIONS = {'roberta': _family('RoBERTa', 'Roberta'), 'xlm-roberta': _family('XLM-R', 'XLMRoberta')}


def exports(cfg: ModelConfig) -> bool:
  """Whether `cfg` exports as RoBERTa (or XLM-R, by its tokenizer: `save_checkpoint`): BERT-shaped with a
  position_offset, without an embedding_size."""
  return bert_layout.bert_shaped(cfg) and bool(cfg.position_offset) and not cfg.embedding_size


def model_config(path: str, hf: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of a RoBERTa or XLM-R config.json (`hf`, already parsed; `path` names it in errors)."""
  hf = {**_HF_DEFAULTS, **hf}
  check_bert_layers(path, hf)
  check_tied(path, hf)
  pad = hf['pad_token_id']
  offset = pad + 1 if isinstance(pad, int) else 0  # transformers' padding_idx + 1: the first position's row
  if not offset or not isinstance(hf['max_position_embeddings'], int) or hf['max_position_embeddings'] <= offset:
    raise CheckpointError(f"{path}: pad_token_id={hf['pad_token_id']!r} and max_position_embeddings="
                          f"{hf['max_position_embeddings']!r}: RoBERTa's positions start at pad_token_id + 1, "
                          'so the table needs more rows than that')
  try:
    return ModelConfig(vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'],
                       num_layers=hf['num_hidden_layers'], num_heads=hf['num_attention_heads'],
                       intermediate_size=hf['intermediate_size'],
                       max_position_embeddings=hf['max_position_embeddings'] - offset, position_offset=offset,
                       type_vocab_size=hf['type_vocab_size'], hidden_dropout=hf['hidden_dropout_prob'],
                       attention_dropout=hf['attention_probs_dropout_prob'],
                       initializer_range=hf['initializer_range'], layer_norm_eps=hf['layer_norm_eps'],
                       pad_token_id=hf['pad_token_id'])
  except (BertJaxError, TypeError) as e:
    raise CheckpointError(f'{path}: {e}') from None


def model_type_of(tokenizer) -> str:
  """'xlm-roberta' for a SentencePiece Unigram tokenizer (or a SentencePiece model), else 'roberta'."""
  if isinstance(tokenizer, tokenization.SentencePieceTokenizer):
    return 'xlm-roberta'
  model = json.loads(tokenizer.identity()).get('model', {}) if tokenizer is not None else {}
  return 'xlm-roberta' if model.get('type') == 'Unigram' else 'roberta'


def hf_config(model_type: str):
  def config(cfg: ModelConfig, architecture: str, tokenizer) -> dict[str, Any]:
    special = {} if tokenizer is None else {'bos_token_id': tokenizer.cls_id, 'eos_token_id': tokenizer.sep_id}
    return {'architectures': [architecture], 'model_type': model_type, 'vocab_size': cfg.vocab_size,
            'hidden_size': cfg.hidden_size, 'num_hidden_layers': cfg.num_layers, 'num_attention_heads': cfg.num_heads,
            'intermediate_size': cfg.intermediate_size, 'hidden_act': 'gelu',
            'hidden_dropout_prob': cfg.hidden_dropout, 'attention_probs_dropout_prob': cfg.attention_dropout,
            'max_position_embeddings': cfg.max_position_embeddings + cfg.position_offset,
            'type_vocab_size': cfg.type_vocab_size, 'initializer_range': cfg.initializer_range,
            'layer_norm_eps': cfg.layer_norm_eps, 'position_embedding_type': 'absolute', 'tie_word_embeddings': True,
            'pad_token_id': cfg.position_offset - 1, **special}
  return config


def check_exportable(cfg: ModelConfig, tokenizer) -> None:
  if not cfg.type_vocab_size:
    raise CheckpointError(f'model.position_offset={cfg.position_offset} exports as RoBERTa, which has token type '
                          'embeddings, but model.type_vocab_size=0; nothing written')
  if tokenizer is not None and tokenizer.pad_id != cfg.position_offset - 1:
    raise CheckpointError(f'model.position_offset={cfg.position_offset} exports as RoBERTa, whose positions start '
                          f'at pad_token_id + 1, but the tokenizer pads with id {tokenizer.pad_id}; nothing written')


def load_checkpoint(directory: str, cfg: ModelConfig):
  model_type = model_dir.read_json_config(directory).get('model_type')
  return bert_layout.load(directory, cfg, DESCRIPTIONS[model_type])


def save_checkpoint(directory: str, cfg: ModelConfig, params, tokenizer=None, *, overwrite: bool = False,
                    task=None) -> None:
  check_exportable(cfg, tokenizer)
  model_type = model_type_of(tokenizer)
  bert_layout.save(directory, cfg, params, tokenizer, DESCRIPTIONS[model_type], hf_config(model_type),
                   overwrite=overwrite, task=task)
