"""Tests for bert_jax.masking.mask_tokens: rates, specials, labels, whole words."""

import numpy as np
import pytest

from bert_jax.data import masking
from bert_jax.data.tokenization import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID, UNK_ID

VOCAB = 1000


def _sequence(rng, length=128):
  """[CLS] A [SEP] B [SEP] with random real tokens (some [UNK])."""
  ids = rng.integers(NUM_SPECIAL, VOCAB, length)
  ids[rng.random(length) < 0.02] = UNK_ID
  ids[0], ids[length // 3], ids[-1] = CLS_ID, SEP_ID, SEP_ID
  return ids.astype(np.int32)


def _is_real(ids):
  return (ids >= NUM_SPECIAL) | (ids == UNK_ID)


def _run(num_seqs, **kwargs):
  data_rng, mask_rng = np.random.default_rng(0), np.random.default_rng(1)
  for _ in range(num_seqs):
    ids = _sequence(data_rng)
    yield ids, masking.mask_tokens(ids, mask_rng, vocab_size=VOCAB, **kwargs)


def test_rates_specials_and_labels():
  counts = dict(real=0, chosen=0, mask=0, same=0, random=0, unk=0)
  for ids, (masked, positions, labels) in _run(1000, max_predictions=1000):  # 128k tokens
    assert masked.dtype == positions.dtype == labels.dtype == np.int32
    assert np.all(np.diff(positions) > 0)  # sorted, unique
    np.testing.assert_array_equal(labels, ids[positions])
    assert not np.isin(ids[positions], [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()
    unchosen = np.setdiff1d(np.arange(len(ids)), positions)
    np.testing.assert_array_equal(masked[unchosen], ids[unchosen])
    assert len(positions) == round(len(ids) * 0.15)
    replaced = masked[positions]
    counts['real'] += int(_is_real(ids).sum())
    counts['chosen'] += len(positions)
    counts['mask'] += int(np.sum(replaced == MASK_ID))
    counts['same'] += int(np.sum(replaced == labels))
    other = replaced[(replaced != MASK_ID) & (replaced != labels)]
    assert np.all((other >= NUM_SPECIAL) & (other < VOCAB))
    counts['random'] += len(other)
    counts['unk'] += int(np.sum(labels == UNK_ID))
  assert counts['real'] >= 100_000
  # round(128 * 0.15) = 19 of 125 real tokens, as in BERT (the length counts [CLS]/[SEP]).
  assert counts['chosen'] / counts['real'] == pytest.approx(19 / 125, abs=1e-9)
  assert counts['mask'] / counts['chosen'] == pytest.approx(0.8, abs=0.01)
  assert counts['same'] / counts['chosen'] == pytest.approx(0.1, abs=0.01)
  assert counts['random'] / counts['chosen'] == pytest.approx(0.1, abs=0.01)
  assert counts['unk'] > 0  # [UNK] is real text and gets predicted


def test_max_predictions_caps_and_short_sequences():
  for _, (_, positions, _) in _run(20, max_predictions=5):
    assert len(positions) == 5
  ids = np.array([CLS_ID, 7, SEP_ID], np.int32)
  masked, positions, labels = masking.mask_tokens(ids, np.random.default_rng(0), vocab_size=VOCAB,
                                                  max_predictions=20)
  assert positions.tolist() == [1] and labels.tolist() == [7]  # at least one prediction
  _, positions, _ = masking.mask_tokens(np.array([CLS_ID, SEP_ID]), np.random.default_rng(0),
                                        vocab_size=VOCAB, max_predictions=20)
  assert positions.size == 0


def test_same_rng_same_masks():
  ids = _sequence(np.random.default_rng(3))
  a = masking.mask_tokens(ids, np.random.default_rng(7), vocab_size=VOCAB, max_predictions=20)
  b = masking.mask_tokens(ids, np.random.default_rng(7), vocab_size=VOCAB, max_predictions=20)
  c = masking.mask_tokens(ids, np.random.default_rng(8), vocab_size=VOCAB, max_predictions=20)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a[1], c[1])


def test_whole_word_masking_masks_complete_words():
  word_starts = np.zeros(VOCAB, bool)
  word_starts[:NUM_SPECIAL] = True
  word_starts[NUM_SPECIAL::3] = True  # a third of the pieces start words
  chosen = real = 0
  for ids, (_, positions, labels) in _run(1000, max_predictions=1000, word_starts=word_starts):
    np.testing.assert_array_equal(labels, ids[positions])
    budget = round(len(ids) * 0.15)
    assert len(positions) <= budget
    # Word boundaries: a start piece, or the first real token after [CLS]/[SEP].
    is_real = _is_real(ids)
    starts = is_real & (word_starts[ids] | ~np.roll(is_real, 1))
    word_id = np.cumsum(starts)
    picked = set(positions.tolist())
    for w in set(word_id[positions].tolist()):
      members = np.flatnonzero((word_id == w) & is_real)
      assert set(members.tolist()) <= picked, 'a word was masked partially'
    chosen += len(positions)
    real += int(is_real.sum())
  # Words that do not fit the remaining budget are skipped, so slightly below 15%.
  assert 0.13 < chosen / real <= 19 / 125
