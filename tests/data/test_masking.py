"""Tests for bert_jax.data.masking.mask_batch: rates, specials, labels, whole words, keys, rows."""

import numpy as np
import pytest

from bert_jax.data import hashing, masking
from bert_jax.data.tokenization import CLS_ID, MASK_ID, NUM_SPECIAL, SEP_ID, UNK_ID

VOCAB = 1000
UNUSED = np.arange(NUM_SPECIAL, NUM_SPECIAL + 10)  # WordPiece-style [unusedN]: special too
SPECIAL = np.zeros(VOCAB, bool)
SPECIAL[:NUM_SPECIAL] = True
SPECIAL[UNUSED] = True
SPECIAL[UNK_ID] = False  # [UNK] stands for text
REPLACE = np.arange(UNUSED[-1] + 1, VOCAB, dtype=np.int32)
WORD_STARTS = np.zeros(VOCAB, bool)
WORD_STARTS[:NUM_SPECIAL] = True
WORD_STARTS[NUM_SPECIAL::3] = True  # a third of the pieces start words


def _rows(rng, num_rows, seq_len=128, lengths=None):
  """[CLS] A [SEP] B [SEP] rows of random real tokens (some [UNK], a few [unusedN]), zero-padded."""
  lengths = np.full(num_rows, seq_len) if lengths is None else np.asarray(lengths)
  tokens = np.zeros((num_rows, seq_len), np.int32)
  for r, n in enumerate(lengths):
    if n == 0:
      continue
    ids = rng.integers(REPLACE[0], VOCAB, n)
    ids[rng.random(n) < 0.02] = UNK_ID
    ids[rng.random(n) < 0.01] = rng.choice(UNUSED)
    ids[0], ids[n // 3], ids[-1] = CLS_ID, SEP_ID, SEP_ID
    tokens[r, :n] = ids
  return tokens, lengths


def _mask(tokens, lengths, keys, max_predictions=20, whole_words=False, **kwargs):
  return masking.mask_batch(tokens, lengths, keys, special_v=SPECIAL, replace_ids=REPLACE, mask_id=MASK_ID,
                            max_predictions=max_predictions,
                            word_starts_v=WORD_STARTS if whole_words else None, **kwargs)


def _keys(num_rows, seed=1):
  return hashing.key(seed, np.arange(num_rows))


def _check_structure(tokens, lengths, outputs, max_predictions):
  """What holds for every row: returns the per-row prediction counts."""
  masked, positions, labels, weights = outputs
  b, t = tokens.shape
  assert masked.shape == (b, t) and positions.shape == labels.shape == weights.shape == (b, max_predictions)
  assert masked.dtype == positions.dtype == labels.dtype == np.int32 and weights.dtype == np.float32
  counts = weights.sum(axis=1).astype(int)
  for r in range(b):
    n, length = counts[r], lengths[r]
    np.testing.assert_array_equal(weights[r], np.arange(max_predictions) < n)  # 1s first
    pos = positions[r, :n]
    assert np.all(np.diff(pos) > 0) and np.all(pos < length)  # ascending, unique, in the row
    np.testing.assert_array_equal(positions[r, n:], 0)
    np.testing.assert_array_equal(labels[r, n:], 0)
    np.testing.assert_array_equal(labels[r, :n], tokens[r, pos])  # labels are the originals
    assert not SPECIAL[tokens[r, pos]].any()  # never [PAD]/[CLS]/[SEP]/[MASK]/[unusedN]
    unchosen = np.setdiff1d(np.arange(length), pos)
    np.testing.assert_array_equal(masked[r, unchosen], tokens[r, unchosen])
    np.testing.assert_array_equal(masked[r, length:], 0)
    replaced = masked[r, pos]
    other = replaced[(replaced != MASK_ID) & (replaced != labels[r, :n])]
    assert np.isin(other, REPLACE).all()  # random replacements only from replace_ids
    candidates = int((~SPECIAL[tokens[r, :length]]).sum())
    need = min(masking.num_predictions(length, max_predictions, 0.15), candidates)
    assert n <= need
  return counts


def test_num_predictions_scalar_and_arrays():
  assert masking.num_predictions(128, 20, 0.15) == 19  # round(19.2)
  assert masking.num_predictions(512, 20, 0.15) == 20  # capped
  assert masking.num_predictions(3, 20, 0.15) == 1  # at least one
  assert masking.num_predictions(10, 20, 0.25) == 2  # round(2.5) = 2, half to even as Python
  assert isinstance(masking.num_predictions(128, 20, 0.15), int)
  lengths = np.arange(0, 1025)
  for prob in (0.15, 0.25, 0.5):
    got = masking.num_predictions(lengths.astype(np.int32), 80, prob)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [masking.num_predictions(int(n), 80, prob) for n in lengths])


def test_rates_specials_and_labels():
  tokens, lengths = _rows(np.random.default_rng(0), 1000)  # 128k tokens
  outputs = _mask(tokens, lengths, _keys(1000), max_predictions=20)
  counts = _check_structure(tokens, lengths, outputs, 20)
  masked, positions, labels, weights = outputs
  candidates = (~SPECIAL[tokens]).sum(axis=1)
  assert candidates.sum() >= 100_000
  # round(128 * 0.15) = 19 per row, as in BERT (the length counts [CLS]/[SEP]).
  np.testing.assert_array_equal(counts, np.minimum(19, candidates))
  chosen = weights > 0
  replaced = np.take_along_axis(masked, positions, axis=1)[chosen]
  original = labels[chosen]
  assert np.mean(replaced == MASK_ID) == pytest.approx(0.8, abs=0.01)
  same = np.mean(replaced == original)
  assert same == pytest.approx(0.1 + 0.1 / len(REPLACE), abs=0.01)
  assert np.mean((replaced != MASK_ID) & (replaced != original)) == pytest.approx(0.1, abs=0.01)
  assert np.sum(original == UNK_ID) > 0  # [UNK] is real text and gets predicted
  assert np.all(np.isin(tokens[np.isin(tokens, UNUSED)], UNUSED))  # the data do contain [unusedN]
  assert np.isin(tokens, UNUSED).sum() > 500


def test_random_replacements_are_uniform_over_replace_ids():
  tokens, lengths = _rows(np.random.default_rng(1), 2000)
  replace = np.array([20, 500, 999], np.int32)
  masked, positions, labels, weights = masking.mask_batch(
      tokens, lengths, _keys(2000), special_v=SPECIAL, replace_ids=replace, mask_id=MASK_ID, max_predictions=20)
  replaced = np.take_along_axis(masked, positions, axis=1)[weights > 0]
  other = replaced[(replaced != MASK_ID) & (replaced != labels[weights > 0])]
  assert set(np.unique(other).tolist()) <= set(replace.tolist())
  counts = np.array([np.sum(other == i) for i in replace])
  assert counts.sum() > 3000
  np.testing.assert_allclose(counts / counts.sum(), 1 / 3, atol=0.03)


def test_variable_lengths_and_padding_rows():
  rng = np.random.default_rng(2)
  lengths = rng.integers(0, 129, 500)
  lengths[:5] = [0, 1, 2, 3, 128]
  tokens, lengths = _rows(rng, 500, lengths=lengths)
  tokens[0, :] = 17  # a padding row's (length 0) garbage is ignored
  for whole_words in (False, True):
    outputs = _mask(tokens, lengths, _keys(500), max_predictions=20, whole_words=whole_words)
    counts = _check_structure(tokens, lengths, outputs, 20)
    for out in outputs:
      np.testing.assert_array_equal(out[lengths == 0], 0)  # padding rows are all zero
    if not whole_words:
      candidates = np.array([(~SPECIAL[tokens[r, :n]]).sum() for r, n in enumerate(lengths)])
      np.testing.assert_array_equal(counts, np.minimum(masking.num_predictions(lengths, 20, 0.15), candidates))


def test_max_predictions_caps_and_short_sequences():
  tokens, lengths = _rows(np.random.default_rng(3), 20)
  _, _, _, weights = _mask(tokens, lengths, _keys(20), max_predictions=5)
  np.testing.assert_array_equal(weights.sum(axis=1), 5)
  tokens = np.array([[CLS_ID, 70, SEP_ID, 0], [CLS_ID, SEP_ID, 0, 0], [CLS_ID, UNUSED[0], SEP_ID, 0],
                     [CLS_ID, UNK_ID, SEP_ID, 0]], np.int32)
  lengths = np.array([3, 2, 3, 3])
  # P larger than T works: the outputs are P wide.
  masked, positions, labels, weights = _mask(tokens, lengths, _keys(4), max_predictions=6)
  assert positions.shape == (4, 6)
  assert positions[0, :1].tolist() == [1] and labels[0, :1].tolist() == [70]  # at least one
  np.testing.assert_array_equal(weights, [[1, 0, 0, 0, 0, 0], [0] * 6, [0] * 6, [1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(masked[1:3], tokens[1:3])  # nothing to mask: unchanged
  assert labels[3, 0] == UNK_ID


def test_same_keys_same_masks():
  tokens, lengths = _rows(np.random.default_rng(4), 64)
  for whole_words in (False, True):
    a = _mask(tokens, lengths, _keys(64, seed=7), whole_words=whole_words)
    b = _mask(tokens, lengths, _keys(64, seed=7), whole_words=whole_words)
    c = _mask(tokens, lengths, _keys(64, seed=8), whole_words=whole_words)
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
    assert np.mean(np.all(a[1] == c[1], axis=1)) < 0.05
    assert np.mean(np.all(a[0] == c[0], axis=1)) < 0.05


@pytest.mark.parametrize('whole_words', [False, True])
def test_rows_do_not_depend_on_the_rest_of_the_batch(whole_words):
  rng = np.random.default_rng(5)
  lengths = rng.integers(0, 129, 40)
  tokens, lengths = _rows(rng, 40, lengths=lengths)
  keys = _keys(40, seed=3)
  full = _mask(tokens, lengths, keys, whole_words=whole_words)
  for r in (0, 7, 39):  # alone
    alone = _mask(tokens[r:r + 1], lengths[r:r + 1], keys[r:r + 1], whole_words=whole_words)
    for x, y in zip(full, alone):
      np.testing.assert_array_equal(x[r:r + 1], y)
  order = rng.permutation(40)[:25]  # another composition and order
  other = _mask(tokens[order], lengths[order], keys[order], whole_words=whole_words)
  for x, y in zip(full, other):
    np.testing.assert_array_equal(x[order], y)
  # The same rows padded wider (T 128 -> 200) mask the same positions the same way.
  wide = np.zeros((40, 200), np.int32)
  wide[:, :128] = tokens
  padded = _mask(wide, lengths, keys, whole_words=whole_words)
  np.testing.assert_array_equal(padded[0][:, :128], full[0])
  np.testing.assert_array_equal(padded[0][:, 128:], 0)
  for x, y in zip(full[1:], padded[1:]):
    np.testing.assert_array_equal(x, y)


def _words(ids_t, length, word_starts=WORD_STARTS):
  """Whole words of a row as lists of positions: a start piece and the non-start candidates after it."""
  words, prev = [], -2
  for pos in range(length):
    if SPECIAL[ids_t[pos]]:
      continue
    if words and not word_starts[ids_t[pos]] and pos == prev + 1:
      words[-1].append(pos)
    else:
      words.append([pos])
    prev = pos
  return words


def test_whole_word_masking_masks_complete_words():
  tokens, lengths = _rows(np.random.default_rng(6), 1000)
  outputs = _mask(tokens, lengths, _keys(1000), max_predictions=20, whole_words=True)
  counts = _check_structure(tokens, lengths, outputs, 20)
  positions = outputs[1]
  for r in range(len(tokens)):
    picked = set(positions[r, :counts[r]].tolist())
    for word in _words(tokens[r], lengths[r]):
      assert set(word) <= picked or not set(word) & picked, 'a word was masked partially'
  candidates = (~SPECIAL[tokens]).sum()
  # Words that do not fit the remaining budget are skipped, so slightly below 19 per row.
  assert 0.13 < counts.sum() / candidates <= 19 * len(tokens) / candidates
  assert np.mean(counts == 19) > 0.9


def _reference_row(ids_t, length, key, max_predictions, word_starts):
  """google-research/bert's create_masked_lm_predictions for one row, with mask_batch's random
  numbers: candidates (or words, keyed by their start) ordered by hashing.bits of stream
  _STREAM_ORDER (bits 16..61, the column breaking ties), then taken greedily."""
  # pylint: disable=protected-access
  t = len(ids_t)
  rand = hashing.bits(key, (t,), masking._STREAM_ORDER) & masking._RAND_MASK
  if word_starts is not None:
    units = _words(ids_t, length, word_starts)
  else:
    units = [[pos] for pos in range(length) if not SPECIAL[ids_t[pos]]]
  units.sort(key=lambda u: (int(rand[u[0]]), u[0]))
  n = masking.num_predictions(length, max_predictions, 0.15)
  chosen = []
  for unit in units:
    if len(chosen) >= n:
      break
    if len(chosen) + len(unit) > n:
      continue
    chosen.extend(unit)
  positions = sorted(chosen)
  k = min(max_predictions, t)
  draws = hashing.uniform(key, (k, 2), masking._STREAM_ACTION)
  action = draws[:, 0]
  random_ids = REPLACE[np.floor(draws[:, 1] * len(REPLACE)).astype(int)]
  masked = np.zeros(t, np.int32)
  masked[:length] = ids_t[:length]
  for slot, pos in enumerate(positions):
    masked[pos] = MASK_ID if action[slot] < 0.8 else ids_t[pos] if action[slot] < 0.9 else random_ids[slot]
  return masked, positions


_LONG_WORDS = np.zeros(VOCAB, bool)
_LONG_WORDS[:NUM_SPECIAL] = True
_LONG_WORDS[NUM_SPECIAL::8] = True  # words of 8 pieces on average


@pytest.mark.parametrize('word_starts,max_predictions,seq_len', [
    (None, 12, 96), (WORD_STARTS, 12, 96), (_LONG_WORDS, 2, 200), (_LONG_WORDS, 30, 200)])
def test_matches_per_row_reference(word_starts, max_predictions, seq_len, monkeypatch):
  rng = np.random.default_rng(7)
  lengths = rng.integers(0, seq_len + 1, 300)
  tokens, lengths = _rows(rng, 300, seq_len=seq_len, lengths=lengths)
  keys = _keys(300, seed=11)
  calls = []
  lowest_keys = masking._lowest_keys  # pylint: disable=protected-access
  monkeypatch.setattr(masking, '_lowest_keys', lambda *a: calls.append(len(a[0])) or lowest_keys(*a))
  masked, positions, _, weights = masking.mask_batch(
      tokens, lengths, keys, special_v=SPECIAL, replace_ids=REPLACE, mask_id=MASK_ID,
      max_predictions=max_predictions, word_starts_v=word_starts)
  if max_predictions == 2:
    assert len(calls) == 2 and 0 < calls[1] < 300  # some rows needed more than their first words
  for r in range(300):
    want_masked, want_positions = _reference_row(tokens[r], lengths[r], keys[r], max_predictions, word_starts)
    n = int(weights[r].sum())
    assert positions[r, :n].tolist() == want_positions
    np.testing.assert_array_equal(masked[r], want_masked)


def test_whole_word_edges():
  s = REPLACE[WORD_STARTS[REPLACE]][0]  # a start piece
  c = REPLACE[~WORD_STARTS[REPLACE]][0]  # a continuation piece
  # A word longer than the budget is skipped: round(10 * 0.15) = 2 but the only word has 3 pieces.
  tokens = np.array([[CLS_ID, s, c, c, SEP_ID, 0, 0, 0, 0, SEP_ID]], np.int32)
  _, _, _, weights = _mask(tokens, np.array([10]), _keys(1), whole_words=True)
  assert weights.sum() == 0
  # A continuation piece right after [SEP] (or a leading one) starts a word of its own; the
  # row ends inside a word (no final [SEP]).
  tokens = np.array([[c, c, SEP_ID, c, s, c, c]], np.int32)
  for seed in range(30):
    _, positions, _, weights = _mask(tokens, np.array([7]), _keys(1, seed), max_predictions=1,
                                     masked_lm_prob=0.2, whole_words=True)
    assert weights.sum() == 1 and positions[0, 0] == 3  # the only 1-piece word
  _, positions, _, weights = _mask(tokens, np.array([7]), _keys(1), max_predictions=6, masked_lm_prob=1.0,
                                   whole_words=True)
  assert positions[0, :int(weights.sum())].tolist() == [0, 1, 3, 4, 5, 6]


def test_empty_batch():
  for whole_words in (False, True):
    outputs = _mask(np.zeros((0, 16), np.int32), np.zeros(0, int), _keys(0), max_predictions=4,
                    whole_words=whole_words)
    assert [o.shape for o in outputs] == [(0, 16), (0, 4), (0, 4), (0, 4)]
    outputs = _mask(np.zeros((3, 16), np.int32), np.zeros(3, int), _keys(3), max_predictions=4,
                    whole_words=whole_words)
    assert all(not o.any() for o in outputs)


def test_bad_arguments():
  tokens, lengths = _rows(np.random.default_rng(8), 2)
  with pytest.raises(ValueError):
    _mask(tokens, lengths, _keys(3))
  with pytest.raises(ValueError):
    _mask(tokens, lengths + 1, _keys(2))
  with pytest.raises(ValueError):
    masking.mask_batch(tokens, lengths, _keys(2), special_v=SPECIAL, replace_ids=np.array([], np.int32),
                       mask_id=MASK_ID, max_predictions=20)


def _mask_spans(tokens, lengths, keys, span=(0.2, 10), word_starts=WORD_STARTS, max_predictions=20):
  return masking.mask_batch(tokens, lengths, keys, special_v=SPECIAL, replace_ids=REPLACE, mask_id=MASK_ID,
                            max_predictions=max_predictions, word_starts_v=word_starts, span=span)


def _runs(positions):
  """Maximal runs of consecutive positions."""
  runs = []
  for pos in positions:
    if runs and pos == runs[-1][-1] + 1:
      runs[-1].append(pos)
    else:
      runs.append([pos])
  return runs


def _span_units(ids_t, length, key, span, word_starts):
  """The row's spans (masking's segmentation, protected helpers) as lists of positions."""
  # pylint: disable=protected-access
  cand = np.zeros((1, len(ids_t)), bool)
  cand[0, :length] = ~SPECIAL[ids_t[:length]]
  starts = masking._span_starts(np.asarray([key]), masking._word_starts(cand, ids_t[None], word_starts), cand,
                                *span)[0]
  units = []
  for pos in range(length):
    if starts[pos]:
      units.append([pos])
    elif cand[0, pos] and units and units[-1][-1] == pos - 1:
      units[-1].append(pos)
  return units


def test_span_masking_takes_whole_spans_of_geometric_length():
  every = np.ones(VOCAB, bool)  # every piece a word: span lengths in words are lengths in tokens
  tokens, lengths = _rows(np.random.default_rng(8), 1000, seq_len=256)
  inner = SPECIAL[tokens]
  inner[:, 0] = False
  inner[np.arange(len(tokens)), lengths - 1] = False
  tokens[inner] = 500  # no special token inside: spans end only at the row's last [SEP]
  keys = _keys(1000)
  outputs = _mask_spans(tokens, lengths, keys, word_starts=every, max_predictions=40)
  counts = _check_structure(tokens, lengths, outputs, 40)
  assert np.mean(counts == 38) > 0.9  # round(0.15 * 256) = 38 predictions, as token masking
  all_spans, chosen = [], []
  for b in range(len(tokens)):
    picked = set(outputs[1][b, :counts[b]].tolist())
    units = _span_units(tokens[b], lengths[b], keys[b], (0.2, 10), every)
    all_spans += [len(u) for u in units[:-1]]  # the last one is cut by the row's end
    for unit in units:
      assert set(unit) <= picked or not set(unit) & picked, 'a span was masked partially'
      if set(unit) <= picked:
        chosen.append(len(unit))
  all_spans, chosen = np.array(all_spans), np.array(chosen)
  # Geometric(0.2) truncated to 1..10 (SpanBERT): P(l) = 0.2 * 0.8**(l - 1) / (1 - 0.8**10), mean 3.80.
  expected = 0.2 * 0.8 ** np.arange(10) / (1 - 0.8 ** 10)
  assert abs(all_spans.mean() - np.sum(expected * np.arange(1, 11))) < 0.05 and all_spans.max() == 10
  np.testing.assert_allclose(np.bincount(all_spans, minlength=11)[1:] / len(all_spans), expected, atol=0.01)
  # Spans are taken in random order while they fit, so the chosen ones are a little shorter.
  assert 3.2 < chosen.mean() < all_spans.mean()


def test_span_masking_keeps_words_whole_and_one_choice_per_span():
  tokens, lengths = _rows(np.random.default_rng(9), 1000)
  keys = _keys(1000)
  masked, positions, labels, weights = _mask_spans(tokens, lengths, keys, span=(0.2, 10))
  counts = _check_structure(tokens, lengths, (masked, positions, labels, weights), 20)
  kinds = {'mask': 0, 'keep': 0, 'random': 0}
  mixed = 0
  for r in range(len(tokens)):
    picked = set(positions[r, :counts[r]].tolist())
    for word in _words(tokens[r], lengths[r]):
      assert set(word) <= picked or not set(word) & picked, 'a word was masked partially'
    for run in _runs(sorted(picked)):
      fate = ['mask' if masked[r, p] == MASK_ID else 'keep' if masked[r, p] == tokens[r, p] else 'random'
              for p in run]
      for f in fate:
        kinds[f] += 1
      # A run may join two spans; a span's tokens share one choice, so runs of one span are uniform:
      # a random replacement can equal the original, so only [MASK] against a non-[MASK] is counted.
      mixed += len(set(f == 'mask' for f in fate)) > 1
  total = sum(kinds.values())
  assert 0.75 < kinds['mask'] / total < 0.85 and 0.07 < kinds['random'] / total < 0.13
  runs = sum(len(_runs(positions[r, :counts[r]].tolist())) for r in range(len(tokens)))
  assert mixed < 0.2 * runs  # only where two adjacent spans were both chosen


def test_span_masking_is_a_function_of_the_row_key_and_differs_from_whole_words():
  tokens, lengths = _rows(np.random.default_rng(10), 64)
  keys = _keys(64)
  full = _mask_spans(tokens, lengths, keys)
  for b in (0, 17, 63):
    alone = _mask_spans(tokens[b:b + 1, :lengths[b]], lengths[b:b + 1], keys[b:b + 1])
    np.testing.assert_array_equal(alone[0][0], full[0][b, :lengths[b]])
    np.testing.assert_array_equal(alone[1][0], full[1][b])
  words = _mask(tokens, lengths, keys, whole_words=True)
  assert not np.array_equal(words[1], full[1])
  with pytest.raises(ValueError, match='span masking needs word_starts_v'):
    _mask_spans(tokens, lengths, keys, word_starts=None)
  # span_p 1: every span one word, so the choice of units is whole-word masking's.
  np.testing.assert_array_equal(_mask_spans(tokens, lengths, keys, span=(1.0, 10))[1], words[1])
