"""Tests for bert_jax.tokenization on a slice of the bundled WikiText corpus."""

import io
import os

import numpy as np
import pytest
import sentencepiece as spm

from bert_jax.data import readers as corpus, tokenization as tk
from bert_jax.errors import ConfigError, DataError

from harness.inputs import REPO

WIKITEXT_VALID = os.path.join(REPO, 'data', 'wikitext-2-raw', 'wiki.valid.raw')
VOCAB = 400


@pytest.fixture(scope='module')
def sentences(tmp_path_factory):
  with open(WIKITEXT_VALID, encoding='utf-8') as f:
    head = ''.join(next(f) for _ in range(600))
  path = tmp_path_factory.mktemp('corpus') / 'wiki.raw'
  path.write_text(head, encoding='utf-8')
  docs = corpus.read_all([str(path)])
  return [s for d in docs for s in d]


@pytest.fixture(scope='module')
def tokenizer(sentences, tmp_path_factory):
  path = str(tmp_path_factory.mktemp('spm') / 'lower.model')
  return tk.train_sentencepiece(sentences, path, VOCAB, lower_case=True)


def test_special_ids(tokenizer):
  assert tokenizer.vocab_size == VOCAB
  assert [tokenizer.id_to_token(i) for i in range(tk.NUM_SPECIAL)] == list(tk.SPECIAL_TOKENS)
  assert (tk.PAD_ID, tk.UNK_ID, tk.CLS_ID, tk.SEP_ID, tk.MASK_ID) == tuple(
      tokenizer.token_to_id(t) for t in tk.SPECIAL_TOKENS)
  # Specials are never produced from text, even when it spells them.
  ids = tokenizer.encode('the [MASK] [CLS] sat')
  assert not any(i in (tk.PAD_ID, tk.CLS_ID, tk.SEP_ID, tk.MASK_ID) for i in ids)
  assert tokenizer.decode([tk.CLS_ID] + tokenizer.encode('the lobster') + [tk.SEP_ID]) == \
      'the lobster'


def test_round_trip_on_real_sentences(tokenizer, sentences):
  ascii_sentences = [s for s in sentences if s.isascii()]
  assert len(ascii_sentences) > 100
  for s in ascii_sentences:
    assert tokenizer.decode(tokenizer.encode(s)) == ' '.join(s.lower().split())
  assert tokenizer.encode_batch(sentences[:50]) == [tokenizer.encode(s) for s in sentences[:50]]


def test_cased_tokenizer_keeps_case(sentences, tmp_path):
  cased = tk.train_sentencepiece(sentences, str(tmp_path / 'cased.model'), VOCAB, lower_case=False)
  s = 'It is closely related to the American lobster , H. americanus .'
  assert cased.decode(cased.encode(s)) == s


def test_training_is_deterministic(sentences, tokenizer, tmp_path):
  again = tk.train_sentencepiece(sentences, str(tmp_path / 'again.model'), VOCAB, lower_case=True)
  with open(tokenizer.path, 'rb') as a, open(again.path, 'rb') as b:
    assert a.read() == b.read()
  assert not [p for p in os.listdir(tmp_path) if '.tmp' in p]  # atomic write left no temp file


def test_vocab_mismatch(tokenizer):
  tk.check_vocab_size(tokenizer, VOCAB)
  with pytest.raises(ConfigError, match=f'model.vocab_size=8000 but tokenizer .* has {VOCAB} '
                     f'tokens; set --config.model.vocab_size={VOCAB}'):
    tk.check_vocab_size(tokenizer, 8000)


def test_vocab_too_large(tmp_path):
  with pytest.raises(DataError, match='vocab_size 5000 too large for this corpus; '
                     'sentencepiece says: Vocabulary size too high'):
    tk.train_sentencepiece(['a tiny corpus .', 'with two lines .'], str(tmp_path / 'x.model'),
                           5000, lower_case=True)
  assert not os.path.exists(tmp_path / 'x.model')


def test_bad_tokenizer_files(tmp_path, sentences):
  with pytest.raises(DataError, match='missing.model does not exist'):
    tk.SentencePieceTokenizer(str(tmp_path / 'missing.model'))
  (tmp_path / 'junk.model').write_text('not a model')
  with pytest.raises(DataError, match='junk.model is not a sentencepiece model'):
    tk.SentencePieceTokenizer(str(tmp_path / 'junk.model'))
  # A default sentencepiece model has <unk>, <s>, </s> at ids 0..2.
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buf,
                                 vocab_size=200, minloglevel=2)
  (tmp_path / 'plain.model').write_bytes(buf.getvalue())
  with pytest.raises(DataError, match=r'plain.model has .*<unk>.* at ids 0..4'):
    tk.SentencePieceTokenizer(str(tmp_path / 'plain.model'))


def test_word_start_table(tokenizer):
  table = tokenizer.word_start_table()
  assert table.shape == (VOCAB,) and table.dtype == np.bool_
  assert table[:tk.NUM_SPECIAL].all()
  for i in range(tk.NUM_SPECIAL, VOCAB):
    assert table[i] == tokenizer.id_to_token(i).startswith('\u2581')
  ids = tokenizer.encode('crustacean lobsters')
  assert table[ids[0]] and len(ids) > 2 and not table[ids[1:]].all()


def test_sentencepiece_encode_inputs(tokenizer):
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
      tk.PAD_ID, tk.UNK_ID, tk.CLS_ID, tk.SEP_ID, tk.MASK_ID)
  a, b = tokenizer.encode('the lobster is blue'), tokenizer.encode('it was cooked')
  assert tokenizer.encode_inputs('the lobster is blue', max_length=64) == (
      [tk.CLS_ID] + a + [tk.SEP_ID], [0] * (len(a) + 2), False)
  assert tokenizer.encode_inputs('the lobster is blue', 'it was cooked', max_length=64) == (
      [tk.CLS_ID] + a + [tk.SEP_ID] + b + [tk.SEP_ID], [0] * (len(a) + 2) + [1] * (len(b) + 1), False)
  ids, types, truncated = tokenizer.encode_inputs('the lobster is blue', 'it was cooked', max_length=6)
  assert len(ids) == len(types) == 6 and truncated and ids[0] == tk.CLS_ID and ids.count(tk.SEP_ID) == 2


def test_sentencepiece_encode_inputs_maps_literal_mask(tokenizer):
  ids, _, _ = tokenizer.encode_inputs('the [MASK] is blue [MASK]', max_length=64)
  assert ids == ([tk.CLS_ID] + tokenizer.encode('the') + [tk.MASK_ID] + tokenizer.encode('is blue')
                 + [tk.MASK_ID, tk.SEP_ID])
  assert tk.MASK_ID not in tokenizer.encode('the [MASK] is blue')  # encode() still never does


def test_longest_first_truncation():
  # Both texts cut: budget // 2 each, the odd token to the longer one (the second on a tie).
  assert tk.assemble_inputs([5] * 8, [6] * 8, max_length=16, cls_id=2, sep_id=3)[0] == (
      [2] + [5] * 6 + [3] + [6] * 7 + [3])
  assert tk.assemble_inputs([5] * 20, [6] * 3, max_length=16, cls_id=2, sep_id=3)[0] == (
      [2] + [5] * 10 + [3] + [6] * 3 + [3])
  assert tk.assemble_inputs([5] * 3, [], max_length=4, cls_id=2, sep_id=3) == (
      [2, 5, 3, 3], [0, 0, 0, 1], True)
  with pytest.raises(ConfigError, match='max_length=2 leaves no room for text'):
    tk.assemble_inputs([5], None, max_length=2, cls_id=2, sep_id=3)


def test_a_remote_tokenizer_local_copy_goes_with_the_tokenizer(tokenizer, fake_bucket, tmp_path, monkeypatch):
  """Loading from gs:// copies the files to a temporary directory (SentencePiece reads local files only); the copy is
  removed when the tokenizer is, so loads do not leave directories behind in /tmp."""
  import gc  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  remote = tk.save_tokenizer(tokenizer, f'{fake_bucket}/tok')
  copies = lambda: [n for n in os.listdir(tmp_path) if n.startswith('bert_jax-remote-tokenizer-')]
  for path in (remote, os.path.dirname(remote)):  # the model file, and its directory
    loaded = tk.load_tokenizer(path)
    assert loaded.encode('The castle') == tokenizer.encode('The castle') and len(copies()) == 1
    del loaded
    gc.collect()
    assert not copies()
