"""The SparseEncoder folder (`save_sparse_encoder`): a BertForMaskedLM directory whose head reads back as written,
the module list and settings sentence-transformers reads, and bad exports refused with nothing written.
sentence-transformers loading such a folder with our term weights: tests/finetuning/test_sparse.py (slow)."""

import json
import os

from flax import nnx
import jax
import numpy as np
import pytest

from bert_jax import config
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.interop import families, sentence_transformers as st_folder
from bert_jax.model.sparse_encoder import SparseEncoder


def _cfg():
  return config.preset('tiny', vocab_size=30522, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1)


def test_the_folder_holds_the_masked_lm_model_and_splade_pooling(wordpiece, tmp_path):
  cfg = _cfg()
  params = jax.device_get(nnx.to_pure_dict(nnx.state(SparseEncoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)))
  params['mlm']['bias'] = np.linspace(-1, 1, cfg.vocab_size).astype(np.float32)  # not the fresh zeros
  folder = str(tmp_path / 'st')
  st_folder.save_sparse_encoder(folder, cfg, params, wordpiece, max_query_length=8, max_seq_length=16)

  def read(name):
    with open(os.path.join(folder, name), encoding='utf-8') as f:
      return json.load(f)
  assert [m['type'].rsplit('.', 1)[-1] for m in read('modules.json')] == ['Transformer', 'SpladePooling']
  assert read('config.json')['architectures'] == ['BertForMaskedLM']
  assert read('config_sentence_transformers.json')['model_type'] == 'SparseEncoder'
  assert read('1_SpladePooling/config.json') == {'pooling_strategy': 'max', 'activation_function': 'relu',
                                                 'embedding_dimension': 30522}
  sbert = read('sentence_bert_config.json')
  assert (sbert['transformer_task'], sbert['query_length'], sbert['document_length']) == ('fill-mask', 8, 16)
  _, back, _, _ = families.load_hf_checkpoint(folder)
  np.testing.assert_array_equal(back['mlm']['bias'], params['mlm']['bias'])
  np.testing.assert_array_equal(back['mlm']['transform']['kernel'], params['mlm']['transform']['kernel'])


def test_an_export_without_the_head_or_with_a_bad_length_is_refused(wordpiece, tmp_path):
  cfg = _cfg()
  with pytest.raises(CheckpointError, match='masked-LM head'):
    st_folder.save_sparse_encoder(str(tmp_path / 'a'), cfg, {'bert': {}}, wordpiece, max_query_length=8,
                                  max_seq_length=16)
  with pytest.raises(ConfigError, match='max_seq_length=1000 must be between 2'):
    st_folder.save_sparse_encoder(str(tmp_path / 'b'), cfg, {'bert': {}, 'mlm': {}}, wordpiece, max_query_length=8,
                                  max_seq_length=1000)
  assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()
