"""Tests for bert_jax.pretraining_data: NSP pairs, records, the cache."""

import dataclasses
import json
import os
import random

import numpy as np
import pytest

from bert_jax.data import loader as ip
from bert_jax.data import prepare as pretraining_data
from bert_jax.errors import ConfigError, DataError
from bert_jax.data.tokenization import CLS_ID, SEP_ID, SentencePieceTokenizer

from conftest import SMALL_VOCAB as VOCAB, small_data_config


# ----------------------------------------------------------------------------- NSP pairs


def _coded_documents(num_docs=30, seed=0):
  """Sentence j of document d is [code] * n with code = 5 + 100 d + j: pairs are checkable."""
  rng = random.Random(seed)
  return [[[5 + 100 * d + j] * rng.randint(2, 12) for j in range(rng.randint(40, 90))]
          for d in range(num_docs)]


def _doc_sentence(code):
  return divmod(code - 5, 100)


def test_nsp_pairs_follow_bert():
  max_len = 32
  instances = pretraining_data.create_nsp_instances(_coded_documents(), max_seq_length=max_len,
                                      short_seq_prob=0.0, dupe_factor=10, rng=random.Random(1))
  assert len(instances) > 5000
  assert 0.47 < np.mean([r for _, _, r in instances]) < 0.53
  untruncated_true_pairs = 0
  for a, b, is_random_next in instances:
    assert a and b and len(a) + len(b) <= max_len - 3
    doc_a = {_doc_sentence(t)[0] for t in a}
    doc_b = {_doc_sentence(t)[0] for t in b}
    assert len(doc_a) == len(doc_b) == 1  # segments never mix documents
    sents_a = sorted({_doc_sentence(t)[1] for t in a})
    sents_b = sorted({_doc_sentence(t)[1] for t in b})
    assert sents_a == list(range(sents_a[0], sents_a[-1] + 1))  # contiguous sentences
    if is_random_next:
      assert doc_a != doc_b
    else:
      assert doc_a == doc_b and sents_b[0] > sents_a[-1]
      if len(a) + len(b) < max_len - 3:  # truncation (which stops at max_len - 3) did not run
        assert sents_b[0] == sents_a[-1] + 1  # B follows A immediately
        untruncated_true_pairs += 1
  assert untruncated_true_pairs > 100


def test_nsp_labels_stay_balanced_when_sentences_are_long():
  # Sentences longer than the target length make every chunk one sentence; original BERT
  # then labels every pair random-next. Ours pairs such a sentence with its successor half the time.
  rng = random.Random(0)
  docs = [[[5 + 100 * d + j] * rng.randint(30, 60) for j in range(20)] for d in range(20)]
  instances = pretraining_data.create_nsp_instances(docs, max_seq_length=32, short_seq_prob=0.1,
                                                    dupe_factor=5, rng=random.Random(2))
  assert 0.46 < np.mean([r for _, _, r in instances]) < 0.54
  for a, b, is_random_next in instances:
    doc_a, sent_a = _doc_sentence(a[0])
    doc_b, sent_b = _doc_sentence(b[0])
    assert (doc_a != doc_b) if is_random_next else (doc_a == doc_b and sent_b == sent_a + 1)


def test_short_seq_prob_gives_shorter_pairs():
  docs = _coded_documents()
  lengths = {}
  for p in (0.0, 0.5):
    instances = pretraining_data.create_nsp_instances(docs, max_seq_length=64, short_seq_prob=p,
                                        dupe_factor=2, rng=random.Random(0))
    lengths[p] = np.mean([len(a) + len(b) for a, b, _ in instances])
  assert lengths[0.5] < 0.85 * lengths[0.0]


def test_nsp_needs_two_sentences_and_two_documents():
  with pytest.raises(DataError, match='no document in my corpus has two sentences; NSP needs'):
    pretraining_data.create_nsp_instances([[[5, 6]], [[7]]], max_seq_length=16, short_seq_prob=0.1,
                            dupe_factor=1, rng=random.Random(0), name='my corpus')
  with pytest.raises(DataError, match='single document'):
    pretraining_data.create_nsp_instances([[[5, 6], [7]]], max_seq_length=16, short_seq_prob=0.1,
                            dupe_factor=1, rng=random.Random(0))


# ----------------------------------------------------------------------------- records


def test_record_round_trip():
  tokens, len_a, is_random_next = pretraining_data.decode_record(pretraining_data.encode_record([7, 8, 9], [10, 11], True))
  assert tokens.dtype == np.int32
  assert tokens.tolist() == [CLS_ID, 7, 8, 9, SEP_ID, 10, 11, SEP_ID]
  assert (len_a, is_random_next) == (3, True)


# ----------------------------------------------------------------------------- the cache




def test_prepare_writes_shards_and_meta(prepared):
  cfg, data = prepared
  files = sorted(os.listdir(data.dir))
  assert files == ['eval-00000-of-00003.array_record', 'eval-00001-of-00003.array_record',
                   'eval-00002-of-00003.array_record', 'meta.json', 'tokenizer.model',
                   'train-00000-of-00003.array_record', 'train-00001-of-00003.array_record',
                   'train-00002-of-00003.array_record']
  assert os.path.dirname(data.dir) == cfg.cache_dir and len(os.path.basename(data.dir)) == 16
  assert [p for p in os.listdir(cfg.cache_dir) if p.startswith('.tmp')] == []
  num_docs = data.stats['documents']
  assert data.stats['eval_documents'] == round(0.2 * num_docs) >= 2
  assert data.stats['train_documents'] == num_docs - data.stats['eval_documents']
  tokenizer = SentencePieceTokenizer(data.tokenizer_path)
  assert tokenizer.vocab_size == VOCAB
  train = ip.PretrainingDataset(data.dir, 'train')
  counts = np.bincount(np.concatenate([train[i][0] for i in range(len(train))]), minlength=VOCAB)
  assert data.most_frequent_token == np.argmax(counts[5:]) + 5
  for split, num in (('train', data.num_train), ('eval', data.num_eval)):
    dataset = ip.PretrainingDataset(data.dir, split)
    assert len(dataset) == num > 0
    for i in range(0, num, max(1, num // 50)):
      tokens, len_a, is_random_next = dataset[i]
      assert tokens.dtype == np.int32 and len(tokens) <= cfg.max_seq_length
      assert tokens[0] == CLS_ID and tokens[len_a + 1] == SEP_ID and tokens[-1] == SEP_ID
      assert len_a >= 1 and len(tokens) - len_a - 3 >= 1 and isinstance(is_random_next, bool)
      body = np.delete(tokens, [0, len_a + 1, len(tokens) - 1])
      assert np.all((body >= 5) | (body == 1)) and tokens.max() < VOCAB  # text and [UNK] only


def test_prepare_reuses_cache(prepared, monkeypatch):
  cfg, data = prepared
  meta_mtime = os.path.getmtime(os.path.join(data.dir, 'meta.json'))

  def no_rebuild(*args):
    raise AssertionError('rebuilt a complete cache')

  monkeypatch.setattr(pretraining_data, '_build', no_rebuild)
  assert pretraining_data.prepare_pretraining_data(cfg, vocab_size=VOCAB, seed=0) == data
  assert os.path.getmtime(os.path.join(data.dir, 'meta.json')) == meta_mtime
  # A field that shapes the records, or the seed, keys another cache.
  for other_cfg, seed in ((dataclasses.replace(cfg, dupe_factor=3), 0), (cfg, 1)):
    with pytest.raises(AssertionError, match='rebuilt'):
      pretraining_data.prepare_pretraining_data(other_cfg, vocab_size=VOCAB, seed=seed)
  # Masking settings are applied per batch and share the cache.
  masked_cfg = dataclasses.replace(cfg, masked_lm_prob=0.2, whole_word_masking=True)
  assert pretraining_data.prepare_pretraining_data(masked_cfg, vocab_size=VOCAB, seed=0).dir == data.dir


def test_prepare_with_given_tokenizer(prepared, tmp_path):
  cfg, data = prepared
  given = dataclasses.replace(cfg, tokenizer=data.tokenizer_path, cache_dir=str(tmp_path))
  with pytest.raises(ConfigError, match=f'set --config.model.vocab_size={VOCAB}'):
    pretraining_data.prepare_pretraining_data(given, vocab_size=VOCAB + 1, seed=0)
  other = pretraining_data.prepare_pretraining_data(given, vocab_size=VOCAB, seed=0)
  assert (other.num_train, other.num_eval) == (data.num_train, data.num_eval)
  assert json.load(open(os.path.join(other.dir, 'meta.json')))['most_frequent_token'] == \
      data.most_frequent_token


def test_prepare_badsmall_data_config(tmp_path):
  with pytest.raises(ConfigError, match='eval_fraction=0'):
    pretraining_data.prepare_pretraining_data(small_data_config(str(tmp_path), eval_fraction=0.0), vocab_size=VOCAB,
                                seed=0)
  with pytest.raises(DataError, match='does not exist'):
    pretraining_data.prepare_pretraining_data(small_data_config(str(tmp_path), train_files=str(tmp_path / 'nope')),
                                vocab_size=VOCAB, seed=0)
