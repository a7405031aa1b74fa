"""BERT's masked-LM corruption: the one masking function (pretraining and fill-mask).

Follows `create_masked_lm_predictions` of google-research/bert: the number of
predictions is round(len(input_ids) * masked_lm_prob) (the count includes [CLS]/[SEP],
as there), at least 1, at most `max_predictions`; candidates are shuffled (whole words
when `word_starts` is given) and taken greedily; each chosen token becomes [MASK] with
probability 0.8, a random token 0.1, or stays unchanged 0.1.
"""

from __future__ import annotations

import numpy as np

from bert_jax.data.tokenization import MASK_ID, NUM_SPECIAL, UNK_ID


def mask_tokens(input_ids, rng: np.random.Generator, *, vocab_size: int, max_predictions: int,
                masked_lm_prob: float = 0.15, word_starts: np.ndarray | None = None):
  """Chooses and corrupts the tokens the MLM head must predict.

  Args:
    input_ids: int[L], one unpadded sequence including [CLS]/[SEP].
    rng: the randomness; a fixed seed gives fixed masks.
    vocab_size: random replacements are drawn uniformly from [NUM_SPECIAL, vocab_size).
    max_predictions: cap on masked tokens (P, the width of the masked-LM arrays).
    masked_lm_prob: fraction of the sequence to predict.
    word_starts: optional bool[vocab_size] (`tokenizer.word_start_table()`); when given,
      whole words (a start piece and the continuation pieces after it) are masked together.

  Returns:
    (masked_ids int32[L], positions int32[n], labels int32[n]) with n <= max_predictions:
    the corrupted sequence, the ascending positions chosen (whatever their replacement),
    and the original ids there, i.e. labels == input_ids[positions].
  """
  ids_l = np.asarray(input_ids, dtype=np.int32)
  # Never [PAD]/[CLS]/[SEP]/[MASK]; [UNK] stands for real text and is predicted like any token.
  candidates = np.flatnonzero((ids_l >= NUM_SPECIAL) | (ids_l == UNK_ID))
  num_to_predict = num_predictions(len(ids_l), max_predictions, masked_lm_prob)
  if word_starts is None:
    positions = np.sort(rng.permutation(candidates)[:num_to_predict])
  else:
    positions = _choose_whole_words(ids_l, candidates, word_starts, num_to_predict, rng)
  positions = positions.astype(np.int32)
  labels = ids_l[positions]
  # One draw per position as in BERT: <0.8 mask, [0.8, 0.9) keep, >=0.9 random.
  action = rng.random(len(positions))
  random_ids = rng.integers(NUM_SPECIAL, vocab_size, len(positions), dtype=np.int32)
  masked_l = ids_l.copy()
  masked_l[positions] = np.where(action < 0.8, MASK_ID, np.where(action < 0.9, labels, random_ids))
  return masked_l, positions, labels


def num_predictions(length: int, max_predictions: int, masked_lm_prob: float) -> int:
  """How many tokens `mask_tokens` tries to predict in a sequence of `length` (fewer if it lacks candidates)."""
  return min(max_predictions, max(1, int(round(length * masked_lm_prob))))


def _choose_whole_words(ids_l, candidates, word_starts, num_to_predict, rng):
  """Shuffled whole words, taken while they fit (a word that does not fit is skipped)."""
  words: list[list[int]] = []
  prev = -2
  for pos in candidates.tolist():
    # A word also ends where a non-candidate ([CLS]/[SEP]) interrupts it.
    if words and not word_starts[ids_l[pos]] and pos == prev + 1:
      words[-1].append(pos)
    else:
      words.append([pos])
    prev = pos
  chosen: list[int] = []
  for k in rng.permutation(len(words)).tolist():
    if len(chosen) >= num_to_predict:
      break
    if len(chosen) + len(words[k]) <= num_to_predict:
      chosen.extend(words[k])
  return np.sort(np.array(chosen, dtype=np.int64))
