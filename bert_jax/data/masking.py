"""BERT's masked-LM corruption, vectorised over a batch: the one masking function.

Follows `create_masked_lm_predictions` of google-research/bert: a row of length L gets
round(L * masked_lm_prob) predictions (L counts [CLS]/[SEP], as there), at least 1, at most
`max_predictions`, fewer when it has fewer candidates; candidates (every token but the special
ones) are shuffled -- whole words when word starts are given -- and taken greedily, a word that
does not fit the remaining budget being skipped; each chosen token becomes [MASK] with
probability 0.8, stays unchanged 0.1, or becomes a random token 0.1 (one uniform draw per
position).

Span masking (SpanBERT) cuts each row's words into consecutive spans of geometric length
(`span_p`, truncated to at most `span_max_words` words: mean 3.8 at SpanBERT's 0.2 and 10; a
span also ends where the candidates do, e.g. at [SEP]) and takes spans as whole-word masking
takes words: in random order while they fit, so the chosen spans keep nearly that length
distribution (a span that no longer fits is skipped). The 80/10/10 choice is made once per span.

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
_STREAM_ACTION = 2  # the i-th chosen position's (ascending) 80/10/10 draw and random replacement
_STREAM_SPAN = 3  # span masking: the j-th span's length draw

# Sort keys are uint64: 46 random bits, then the column in the low 16 bits (so keys are
# distinct and a row's order does not depend on T); excluded columns' keys are 2**62.
_COL_BITS = 16
_COL_MASK = np.uint64((1 << _COL_BITS) - 1)
_RAND_MASK = np.uint64(((1 << 62) - 1) ^ ((1 << _COL_BITS) - 1))  # bits 16..61
_EXCLUDED = np.uint64(1 << 62)
_MAX_T = 1 << _COL_BITS
_BLOCK_ELEMENTS = 8192  # tokens per block of rows in _lowest_keys (its keys: 64 KiB)


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
               word_starts_v: np.ndarray | None = None,
               span: tuple[float, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    span: (span_p, span_max_words) for span masking (needs `word_starts_v`): spans of whole
      words are taken instead of words, each with one 80/10/10 choice.

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

  k = min(p, t)
  first_bk = None  # span masking: each chosen slot's span's first slot (its 80/10/10 draw)
  if span is not None and word_starts_v is None:
    raise ValueError('span masking needs word_starts_v')
  if word_starts_v is None:
    positions_bk, count_b = _choose_tokens(keys_b, cand_bt, n_b, k)
  else:
    start_bt = _word_starts(cand_bt, input_ids, np.asarray(word_starts_v, dtype=bool))
    if span is not None:
      start_bt = _span_starts(keys_b, start_bt, cand_bt, *span)
    positions_bk, count_b, first_bk = _choose_whole_words(keys_b, cand_bt, start_bt, n_b, k)

  valid_bk = np.arange(k) < count_b[:, None]
  positions_bk = np.where(valid_bk, positions_bk, 0)
  labels_bk = np.where(valid_bk, np.take_along_axis(input_ids, positions_bk, axis=1), 0)

  # The i-th chosen position (ascending) uses elements (i, 0) and (i, 1) of stream _STREAM_ACTION:
  # one draw as in BERT (<0.8 [MASK], [0.8, 0.9) keep, >=0.9 random) and the random id's index
  # (floor(u * R), as hashing.randint).
  draws_bk2 = hashing.uniform(keys_b, (k, 2), _STREAM_ACTION)
  action_bk = draws_bk2[:, :, 0]
  if span is not None:
    action_bk = np.take_along_axis(action_bk, first_bk, axis=1)
  random_bk = replace_ids[(draws_bk2[:, :, 1] * replace_ids.size).astype(np.int64)]
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


def _sort_keys(rand: np.ndarray, low: np.ndarray) -> np.ndarray:
  """uint64 keys ordering by 46 random bits (bits 16..61 of rand), ties broken by `low`
  (< 2**16, in the low bits), in place on rand; all below _EXCLUDED."""
  rand &= _RAND_MASK
  rand |= low.astype(np.uint64)
  return rand


def _lowest_keys(keys_b, allowed_bt, m):
  """uint64[B, m]: each row's m lowest sort keys, ascending; column j's key is element j of
  stream _STREAM_ORDER (so a row's order does not depend on T) with j in the low bits, and
  columns not allowed get _EXCLUDED."""
  b, t = allowed_bt.shape
  col_t = np.arange(t)
  lowest_bm = np.empty((b, m), np.uint64)
  step = max(1, _BLOCK_ELEMENTS // max(t, 1))  # rows at a time: their [rows, T] keys stay in the cache
  for i in range(0, b, step):
    order_bt = _sort_keys(hashing.bits(keys_b[i:i + step], (t,), _STREAM_ORDER), col_t)
    np.copyto(order_bt, _EXCLUDED, where=~allowed_bt[i:i + step])
    lowest_bm[i:i + step] = np.partition(order_bt, m - 1, axis=1)[:, :m] if m < t else order_bt
  lowest_bm.sort(axis=1)
  return lowest_bm


def _choose_tokens(keys_b, cand_bt, n_b, k):
  """The n_b candidates of each row with the lowest keys: (columns int64[B, k], ascending in
  the first count_b slots, then T; count_b int64[B])."""
  t = cand_bt.shape[1]
  lowest_bk = _lowest_keys(keys_b, cand_bt, k)
  take_bk = (lowest_bk < _EXCLUDED) & (np.arange(k) < n_b[:, None])
  count_b = take_bk.sum(axis=1)
  cols_bk = np.where(take_bk, (lowest_bk & _COL_MASK).astype(np.int64), t)
  cols_bk.sort(axis=1)  # chosen columns ascending, then t
  return cols_bk, count_b


def _previous(cand_bt):
  prev_cand_bt = np.zeros_like(cand_bt)
  prev_cand_bt[:, 1:] = cand_bt[:, :-1]
  return prev_cand_bt


def _word_starts(cand_bt, ids_bt, word_starts_v):
  """bool[B, T]: candidates that start a word (a start piece, or the first after a non-candidate)."""
  return cand_bt & (word_starts_v[ids_bt] | ~_previous(cand_bt))


def _span_starts(keys_b, start_bt, cand_bt, span_p, max_words):
  """bool[B, T]: the word starts that start a span. Row b's words (counted from its first) are cut
  into spans of Geometric(span_p) words truncated to 1 .. max_words, the j-th length from element
  j of stream _STREAM_SPAN; a run of candidates starts a span of its own (where spans also end)."""
  b, t = start_bt.shape
  u_bt = hashing.uniform(keys_b, (t,), _STREAM_SPAN)  # at most T spans per row
  if span_p >= 1:
    length_bt = np.ones((b, t), np.int64)
  else:  # inverse CDF of the geometric distribution on 1 .. max_words (renormalised, as SpanBERT)
    q = 1.0 - span_p
    length_bt = 1 + np.floor(np.log1p(-u_bt * (1.0 - q ** max_words)) / np.log(q)).astype(np.int64)
  ends_bt = np.cumsum(np.minimum(length_bt, max_words), axis=1)  # word index after each span
  first_word_bt = np.zeros((b, t + 1), bool)
  first_word_bt[:, 0] = True
  rows_bt = np.broadcast_to(np.arange(b)[:, None], (b, t))
  inside = ends_bt < t
  first_word_bt[rows_bt[inside], ends_bt[inside]] = True
  word_bt = np.cumsum(start_bt, axis=1) - 1  # each position's word index in its row
  return start_bt & (first_word_bt[np.arange(b)[:, None], np.maximum(word_bt, 0)] | ~_previous(cand_bt))


def _choose_whole_words(keys_b, cand_bt, start_bt, n_b, k):
  """Whole units (words, or spans of words) in random order, each taken if it fits the row's
  remaining budget; a unit runs from a start in `start_bt` to the next start or non-candidate.

  A unit is keyed by its start column's key (`_lowest_keys`), so one-piece words are ordered
  as `_choose_tokens` orders tokens. The greedy pass looks at each row's 2k + 16 first units
  only; a row still short of its budget after them that has more units is redone with all
  of its units (rare), so the result is that of the full pass.

  Returns (columns int64[B, k] as `_choose_tokens`, count int64[B], and for each slot the slot
  of its unit's first piece, int64[B, k]).
  """
  b, t = cand_bt.shape
  prev_cand_bt = _previous(cand_bt)
  none = (np.full((b, k), t, np.int64), np.zeros(b, np.int64), np.zeros((b, k), np.int64))
  if not b * t:
    return none
  # A word runs from its start to the next boundary: a start, the end of a run of candidates
  # (a non-candidate) or the end of the row (the next row's column 0 or the end).
  bound_bt = start_bt | (prev_cand_bt & ~cand_bt)
  bound_bt[:, 0] = True
  bound_f = np.flatnonzero(bound_bt)
  is_start_f = start_bt.reshape(-1)[bound_f]
  start_f = bound_f[is_start_f]  # flat position of every word's first piece
  if not start_f.size:
    return none
  # Lengths at the start positions, clipped to the longest that can ever be taken plus one
  # (so uint16 suffices); other entries are never read.
  too_long = min(int(n_b.max()) + 1, np.iinfo(np.uint16).max)
  length_f = np.empty(b * t, np.uint16)
  length_f[start_f] = np.minimum(np.diff(bound_f, append=b * t)[is_start_f], too_long)

  def greedy(rows, m):
    """The chosen words' flat start positions and the counts, for some rows, from their first m words."""
    lowest_rm = _lowest_keys(keys_b[rows], start_bt[rows], m)
    pos_rm = rows[:, None] * t + (lowest_rm & _COL_MASK).astype(np.int64)
    n_r = n_b[rows]
    len_rm = np.where(lowest_rm < _EXCLUDED, length_f[pos_rm].astype(np.int64), too_long)
    take_rm, count_r = _greedy_fill(len_rm, n_r)
    return pos_rm[take_rm], count_r

  m = min(t, 2 * k + 16)
  chosen, count_b = greedy(np.arange(b), m)
  redo = np.flatnonzero((count_b < n_b) & (start_bt.sum(axis=1) > m))
  if redo.size:
    keep = ~np.isin(chosen // t, redo)
    chosen_redo, count_b[redo] = greedy(redo, t)
    chosen = np.concatenate([chosen[keep], chosen_redo])

  # The chosen words in flat (row, column) order, expanded into their pieces: count_b <= n_b
  # <= P pieces per row, ascending.
  chosen.sort()
  len_c = length_f[chosen].astype(np.int64)
  piece = np.arange(int(len_c.sum()))
  piece_pos = np.repeat(chosen - (np.cumsum(len_c) - len_c), len_c) + piece  # flat positions
  piece_row = piece_pos // t
  row_first_b = np.cumsum(count_b) - count_b  # each row's first piece
  cols_bk = np.full((b, k), t, np.int64)
  slot = piece - row_first_b[piece_row]
  cols_bk[piece_row, slot] = piece_pos - piece_row * t
  first_bk = np.zeros((b, k), np.int64)
  first_bk[piece_row, slot] = np.repeat(np.cumsum(len_c) - len_c, len_c) - row_first_b[piece_row]
  return cols_bk, count_b, first_bk


def _greedy_fill(len_bw, n_b):
  """google-research/bert's greedy pass over words in order (lengths len_bw, padded with
  lengths > n): a word is taken if it fits the remaining budget, else skipped. Returns
  (take bool[B, W], count int64[B]).

  Vectorised over rows: the leading words that fit are taken outright (a prefix); then each
  step jumps every unfilled row to its next word that fits what is left (words skipped on
  the way stay skipped: the budget only shrinks). Each step takes a word per row, so there
  are fewer steps than the longest word has pieces.
  """
  take_bw = np.cumsum(len_bw, axis=1) <= n_b[:, None]
  count_b = np.where(take_bw, len_bw, 0).sum(axis=1)
  last_b = take_bw.sum(axis=1)  # rank of the first word that did not fit
  rank_w = np.arange(len_bw.shape[1])
  active = np.flatnonzero(count_b < n_b)
  while active.size:
    fits_aw = (rank_w > last_b[active, None]) & (len_bw[active] <= (n_b - count_b)[active, None])
    next_a = np.argmax(fits_aw, axis=1)
    found_a = fits_aw[np.arange(active.size), next_a]
    active, next_a = active[found_a], next_a[found_a]
    take_bw[active, next_a] = True
    count_b[active] += len_bw[active, next_a]
    last_b[active] = next_a
    active = active[count_b[active] < n_b[active]]
  return take_bw, count_b
