"""BERT's masked-LM corruption, vectorised over a batch: the one masking function.

Follows `create_masked_lm_predictions` of google-research/bert: a row of length L gets
round(L * masked_lm_prob) predictions (L counts [CLS]/[SEP], as there), at least 1, at most
`max_predictions`, fewer when it has fewer candidates; candidates (every token but the special
ones) are shuffled -- whole words when word starts are given -- and taken greedily, a word that
does not fit the remaining budget being skipped; each chosen token becomes [MASK] with
probability 0.8, stays unchanged 0.1, or becomes a random token 0.1 (one uniform draw per
position).

Randomness is counter-based (`bert_jax.data.hashing`): each row's masks are a pure function of
its 64-bit key, tokens and length, whatever other rows share its batch and however wide the
batch is padded (T), so processes that each build a block of a global batch produce exactly the
rows one process would. numpy only (it runs in spawned data workers).
"""

from __future__ import annotations

import numpy as np

from bert_jax.data import hashing

# Streams of hashing's per-row randomness (one per purpose).
_STREAM_ORDER = 1  # candidate (or word) order: element j is column j's sort key
_STREAM_ACTION = 2  # the 80/10/10 draw: element k is the k-th chosen position's (ascending)
_STREAM_REPLACE = 3  # the random replacement of the k-th chosen position

# Sort keys are uint64: 46 random bits, then the column in the low 16 bits (so keys are
# distinct and a row's order does not depend on T); excluded columns' keys are 2**62.
_COL_BITS = 16
_COL_MASK = np.uint64((1 << _COL_BITS) - 1)
_RAND_SHIFT = np.uint64(64 - 46)
_EXCLUDED = np.uint64(1 << 62)
_MAX_T = 1 << _COL_BITS


def num_predictions(length, max_predictions: int, masked_lm_prob: float):
  """min(max_predictions, max(1, round(length * masked_lm_prob))): how many tokens a row of
  `length` gets (fewer if it lacks candidates). int for an int length; int64 array for arrays.
  Rounds half to even, like Python's round() in google-research/bert."""
  if np.ndim(length) == 0:
    return min(int(max_predictions), max(1, int(round(float(length) * masked_lm_prob))))
  n = np.rint(np.asarray(length, dtype=np.float64) * masked_lm_prob).astype(np.int64)
  return np.minimum(int(max_predictions), np.maximum(1, n))


def mask_batch(tokens_bt: np.ndarray, lengths_b: np.ndarray, keys_b: np.ndarray, *, special_v: np.ndarray,
               replace_ids: np.ndarray, mask_id: int, max_predictions: int, masked_lm_prob: float = 0.15,
               word_starts_v: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Chooses and corrupts the tokens the MLM head must predict, for a batch of rows.

  Args:
    tokens_bt: int[B, T]; row b's real tokens are tokens_bt[b, :lengths_b[b]] (incl. [CLS]/[SEP]).
    lengths_b: int[B]; 0 marks a padding row.
    keys_b: uint64[B], one key per row (e.g. `hashing.key(seed, epoch, position)`); a row's
      outputs depend only on its key, tokens and length.
    special_v: bool[V]: ids never masked ([PAD]/[CLS]/[SEP]/[MASK] and, for WordPiece,
      [unusedN]). [UNK] is NOT special: it stands for text and is predicted like any token.
    replace_ids: int[R], the ids a random replacement draws from uniformly (non-special ids).
    mask_id: the [MASK] id.
    max_predictions: P, the width of the masked-LM outputs and the cap on predictions.
    masked_lm_prob: fraction of each row's length to predict (`num_predictions`).
    word_starts_v: optional bool[V] (`tokenizer.word_start_table()`) for whole-word masking: a
      word is a start piece and the non-start pieces right after it; a special token or any
      non-candidate also ends a word. Words are taken in random order while they fit.

  Returns:
    input_ids int32[B, T]: tokens_bt with the chosen positions corrupted (0 from each row's
      length on, so padding rows are all zero);
    masked_lm_positions int32[B, P]: the n chosen positions ascending, then zeros;
    masked_lm_ids int32[B, P]: the original tokens there, then zeros;
    masked_lm_weights float32[B, P]: 1 for the n chosen slots, then 0.
  """
  tokens_bt = np.asarray(tokens_bt)
  if tokens_bt.ndim != 2:
    raise ValueError(f'tokens_bt must be [B, T], got shape {tokens_bt.shape}')
  b, t = tokens_bt.shape
  p = int(max_predictions)
  lengths_b = np.asarray(lengths_b, dtype=np.int64)
  keys_b = np.asarray(keys_b)
  if lengths_b.shape != (b,) or keys_b.shape != (b,):
    raise ValueError(f'lengths_b {lengths_b.shape} and keys_b {keys_b.shape} must both be ({b},)')
  if b and (lengths_b.min() < 0 or lengths_b.max() > t):
    raise ValueError(f'lengths must lie in [0, T={t}]')
  if t > _MAX_T:
    raise ValueError(f'sequences longer than {_MAX_T} are not supported (got {t})')
  if p < 1:
    raise ValueError(f'max_predictions must be >= 1, got {p}')
  replace_ids = np.asarray(replace_ids, dtype=np.int32)
  if replace_ids.ndim != 1 or replace_ids.size == 0:
    raise ValueError('replace_ids must be a non-empty 1-D array of ids')

  col_t = np.arange(t, dtype=np.int64)
  in_row_bt = col_t < lengths_b[:, None]
  input_ids = np.where(in_row_bt, tokens_bt, 0).astype(np.int32, copy=False)
  cand_bt = in_row_bt & ~np.asarray(special_v, dtype=bool)[input_ids]
  n_b = num_predictions(lengths_b, p, masked_lm_prob)

  # Sort keys: random high bits, the column below; excluded columns sort last.
  order_bt = hashing.bits(keys_b, (t,), _STREAM_ORDER)
  order_bt >>= _RAND_SHIFT
  order_bt <<= np.uint64(_COL_BITS)
  order_bt |= col_t.astype(np.uint64)
  if word_starts_v is None:
    np.copyto(order_bt, _EXCLUDED, where=~cand_bt)
    positions_bk, count_b = _choose_tokens(order_bt, n_b, min(p, t))
  else:
    positions_bk, count_b = _choose_whole_words(order_bt, cand_bt, input_ids,
                                                np.asarray(word_starts_v, dtype=bool), n_b, min(p, t))

  k = positions_bk.shape[1]
  valid_bk = np.arange(k) < count_b[:, None]
  positions_bk = np.where(valid_bk, positions_bk, 0)
  labels_bk = np.where(valid_bk, np.take_along_axis(input_ids, positions_bk, axis=1), 0)

  # One draw per chosen position (k-th ascending): <0.8 [MASK], [0.8, 0.9) keep, >=0.9 random.
  action_bk = hashing.uniform(keys_b, (k,), _STREAM_ACTION)
  random_bk = replace_ids[hashing.randint(keys_b, (k,), _STREAM_REPLACE, 0, replace_ids.size)]
  new_bk = np.where(action_bk < 0.8, np.int32(mask_id), np.where(action_bk < 0.9, labels_bk, random_bk))
  flat_bk = positions_bk + (np.arange(b, dtype=np.int64) * t)[:, None]
  input_ids.reshape(-1)[flat_bk[valid_bk]] = new_bk[valid_bk]

  out_positions = np.zeros((b, p), np.int32)
  out_ids = np.zeros((b, p), np.int32)
  out_weights = np.zeros((b, p), np.float32)
  out_positions[:, :k] = positions_bk
  out_ids[:, :k] = labels_bk
  out_weights[:, :k] = valid_bk
  return input_ids, out_positions, out_ids, out_weights


def _choose_tokens(order_bt, n_b, k):
  """The n_b lowest-keyed candidates of each row: (columns int64[B, k] ascending, count int64[B])."""
  t = order_bt.shape[1]
  if k < t:
    lowest_bk = np.partition(order_bt, k - 1, axis=1)[:, :k]
  else:
    lowest_bk = order_bt
  lowest_bk = np.sort(lowest_bk, axis=1)  # the k lowest keys in key order
  take_bk = (lowest_bk < _EXCLUDED) & (np.arange(k) < n_b[:, None])
  count_b = take_bk.sum(axis=1)
  cols_bk = np.where(take_bk, (lowest_bk & _COL_MASK).astype(np.int64), t)
  cols_bk.sort(axis=1)  # chosen columns ascending, then t
  return cols_bk, count_b


def _choose_whole_words(order_bt, cand_bt, ids_bt, word_starts_v, n_b, k):
  """Whole words in random order, each taken if it fits the row's remaining budget."""
  b, t = cand_bt.shape
  prev_cand_bt = np.zeros_like(cand_bt)
  prev_cand_bt[:, 1:] = cand_bt[:, :-1]
  start_bt = cand_bt & (word_starts_v[ids_bt] | ~prev_cand_bt)
  # Word lengths: a word runs from its start to the next start or the end of its run of
  # candidates (a non-candidate, or the end of the row).
  run_end_bt = prev_cand_bt & ~cand_bt
  bound_f = np.flatnonzero(start_bt | run_end_bt)
  is_start_f = start_bt.reshape(-1)[bound_f]
  starts_f = bound_f[is_start_f]
  next_f = np.append(bound_f[1:], b * t)[is_start_f]
  row_end_f = (starts_f // t + 1) * t
  lens_f = np.minimum(next_f, row_end_f) - starts_f
  length_bt = np.zeros(b * t, np.int32)
  length_bt[starts_f] = lens_f
  length_bt = length_bt.reshape(b, t)

  # Words in random order: the start columns' keys, every other column's key sorts after them.
  np.copyto(order_bt, _EXCLUDED, where=~start_bt)
  w = int(start_bt.sum(axis=1).max()) if b else 0
  order_bt.sort(axis=1)
  words_bw = order_bt[:, :w]
  cols_bw = (words_bw & _COL_MASK).astype(np.int64)
  big = int(n_b.max()) + 1 if b else 1
  len_bw = np.where(words_bw < _EXCLUDED, np.take_along_axis(length_bt, cols_bw, axis=1), big)

  # Greedy, vectorised over rows. The leading words that fit are taken outright (a prefix of
  # the order); then google-research/bert skips a word that does not fit and goes on, so each
  # step jumps every row to its next word that fits the remaining budget (words skipped on
  # the way stay skipped: the budget only shrinks). Each step takes a word per row, so there
  # are fewer steps than the longest word has pieces.
  take_bw = np.cumsum(len_bw, axis=1) <= n_b[:, None]
  count_b = np.where(take_bw, len_bw, 0).sum(axis=1)
  last_b = take_bw.sum(axis=1)  # rank of the first word that did not fit
  rank_w = np.arange(w)
  rows_b = np.arange(b)
  while True:
    fits_bw = (rank_w > last_b[:, None]) & (len_bw <= (n_b - count_b)[:, None])
    next_b = np.argmax(fits_bw, axis=1)
    found_b = fits_bw[rows_b, next_b]
    if not found_b.any():
      break
    rows = rows_b[found_b]
    take_bw[rows, next_b[found_b]] = True
    count_b[rows] += len_bw[rows, next_b[found_b]]
    last_b = np.where(found_b, next_b, w)

  # The chosen words' pieces, ascending: sort each row's chosen words by column, then expand
  # every (start, length) into its positions (count_b <= n_b <= P of them per row).
  span_bw = np.where(take_bw, cols_bw * _MAX_T + len_bw, np.iinfo(np.int64).max)
  span_bw.sort(axis=1)  # (column, length) of the chosen words, by column, then the rest
  words_b = take_bw.sum(axis=1)
  span_f = span_bw[rank_w < words_b[:, None]]  # flat over rows, row-major
  start_f, len_f = span_f // _MAX_T, span_f % _MAX_T
  piece_f = np.arange(int(count_b.sum()))  # every chosen piece, row-major and ascending
  piece_row_f = np.repeat(np.repeat(rows_b, words_b), len_f)
  piece_word_first_f = np.repeat(np.cumsum(len_f) - len_f, len_f)  # its word's first piece
  row_first_b = np.cumsum(count_b) - count_b  # each row's first piece
  cols_bk = np.full((b, k), t, np.int64)
  cols_bk[piece_row_f, piece_f - row_first_b[piece_row_f]] = (np.repeat(start_f, len_f) + piece_f
                                                              - piece_word_first_f)
  return cols_bk, count_b
