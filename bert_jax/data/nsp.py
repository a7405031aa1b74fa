"""BERT's next-sentence-prediction pairs, built from one work unit's tokenised documents.

A unit's text is held as one flat token array: documents are runs of sentences and
sentences runs of tokens, so every segment of a pair is a contiguous slice and a pair is
five integers (`PAIR_FIELDS`) and a record a few runs of that array (`RecordRuns`), gathered
for many records at once.

The algorithm is google-research/bert's `create_instances_from_document`, with the
randomness of a `random.Random` seeded per unit and split, so a unit's pairs depend only on
its own text, never on which worker or host built it. Random-next segments come from other
documents of the same unit (google-research/bert draws them from all documents of one
`create_pretraining_data.py` run, which users ran per input file or file group; a unit is
up to `data.unit_mb` of whole documents, several files when they are small).
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import random

import numpy as np

from bert_jax.data import tokenization

PAIR_FIELDS = ('a_start', 'a_end', 'b_start', 'b_end', 'is_random_next')


@dataclasses.dataclass
class TokenizedDocs:
  """Documents of sentences of token ids, flat.

  Attributes:
    tokens: int32[N], every sentence's tokens back to back.
    sentence_starts: int64[S + 1], sentence k is tokens[sentence_starts[k]:sentence_starts[k + 1]].
    doc_starts: int64[D + 1], document d is sentences doc_starts[d] .. doc_starts[d + 1] - 1.
  """

  tokens: np.ndarray
  sentence_starts: np.ndarray
  doc_starts: np.ndarray

  @property
  def num_docs(self) -> int:
    return len(self.doc_starts) - 1

  @classmethod
  def from_lists(cls, docs: list[list[list[int]]]) -> 'TokenizedDocs':
    """From documents of sentences of ids (empty sentences and documents are dropped)."""
    docs = [d for d in ([s for s in doc if len(s)] for doc in docs) if d]
    sentences = [s for d in docs for s in d]
    lengths = np.array([len(s) for s in sentences], np.int64)
    tokens = (np.concatenate([np.asarray(s, np.int32) for s in sentences]) if sentences
              else np.zeros(0, np.int32))
    return cls(tokens, np.concatenate([[0], np.cumsum(lengths)]),
               np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64))


def create_pairs(docs: TokenizedDocs, *, max_seq_length: int, short_seq_prob: float,
                 dupe_factor: int, rng: random.Random,
                 random_pool: TokenizedDocs | None = None, sentence_order: bool = False,
                 specials: int = 3) -> np.ndarray:
  """Builds NSP pairs (`PAIR_FIELDS` per row) as google-research/bert does, or SOP pairs.

  Per document, sentences are accumulated up to a target length (max_seq_length - 3, or with
  probability `short_seq_prob` a random shorter one) and split at a random sentence boundary
  into A and B; with probability 0.5 B is replaced by text from another document and the
  unused sentences start the next chunk. Pairs are truncated to fit by trimming the longer
  side at a random end. Unlike the original, a one-sentence chunk gets its true next sentence
  half of the time and one-sentence documents give no pairs, so labels stay near 50/50 even
  when sentences are long, and a random document is always another document.

  With `sentence_order` (ALBERT's sentence-order prediction) the chunks are the same but B is
  always the true continuation (a lone sentence takes the next one; a document's last sentence
  alone gives no pair) and, after truncation, A and B are swapped with probability 0.5, the
  label (`is_random_next`) then 1.

  The draws are sequential (where a chunk ends depends on earlier draws), so this is one loop
  over chunks; what the draws do not decide is looked up, not walked: a chunk's last sentence
  and a random segment's end are binary searches over the sentence boundaries. Draws go
  straight to `rng.random` and `rng.getrandbits` with `random.Random.randrange`'s own
  arithmetic (`_below`), so the stream of draws and the pairs are those of the sentence-by-
  sentence loop this replaced (tests/data/test_nsp.py keeps it as the reference).

  Args:
    docs: the documents to pair.
    max_seq_length: T; a pair has at most T - `specials` tokens (room for [CLS] [SEP] [SEP]).
    short_seq_prob: probability of a shorter target length.
    dupe_factor: passes over the documents (each pairs differently).
    rng: the randomness.
    random_pool: where random-next segments come from when `docs` has a single document
      (the held-out documents of a unit with one of them borrow the unit's training text);
      None: from `docs` only. With no other document at all, every pair is a true pair.
      Unused with `sentence_order`.
    sentence_order: SOP pairs instead of NSP pairs.
    specials: the special tokens of a pair's record (3 = BERT's; RoBERTa's <s> A </s></s> B </s> 4).

  Returns:
    int64[num_pairs, 5]: token ranges of A and B in `docs.tokens` (B in the pool's tokens
    when `is_random_next` and the pool is another one), and the label.
  """
  pool, pool_is_docs = docs, True
  if sentence_order:
    random_pool = None
  if docs.num_docs < 2 and random_pool is not None and random_pool.num_docs:
    pool, pool_is_docs = random_pool, False
  # Python ints: a list read is several times cheaper than a numpy scalar read.
  sent = docs.sentence_starts.tolist()
  pool_sent = sent if pool_is_docs else pool.sentence_starts.tolist()
  pool_docs = pool.doc_starts.tolist()
  doc_starts = docs.doc_starts.tolist()
  # Only documents of two sentences or more give pairs (the others are still random segments).
  paired = np.flatnonzero(np.diff(docs.doc_starts) >= 2).tolist()
  num_pool = 0 if sentence_order else pool.num_docs - (1 if pool_is_docs else 0)  # other documents to draw from
  max_tokens = max_seq_length - specials
  uniform, getrandbits, bisect_left = rng.random, rng.getrandbits, bisect.bisect_left

  def below(n: int) -> int:  # rng.randrange(n), draw for draw
    k = n.bit_length()
    r = getrandbits(k)
    while r >= n:
      r = getrandbits(k)
    return r

  out = array.array('q')
  pool_bits = num_pool.bit_length()
  for _ in range(dupe_factor):
    for d in paired:
      first, last = doc_starts[d], doc_starts[d + 1]
      target = max_tokens
      if uniform() < short_seq_prob:
        target = 2 + below(max_tokens - 1)  # rng.randint(2, max_tokens)
      chunk_start = first
      while chunk_start < last:
        # The chunk ends at the first sentence that brings it to `target` tokens, or the document's last.
        i = bisect_left(sent, sent[chunk_start] + target, chunk_start + 1, last + 1) - 1
        if i == last:
          i -= 1
        n = i + 1 - chunk_start
        if n >= 2:
          k = (n - 1).bit_length()  # a_end = chunk_start + rng.randrange(1, n)
          r = getrandbits(k)
          while r >= n - 1:
            r = getrandbits(k)
          a_end = chunk_start + 1 + r
          is_random = num_pool > 0 and uniform() < 0.5
        elif i + 1 < last and (sentence_order or uniform() >= 0.5):
          i += 1  # a lone (long) sentence gets its true continuation (NSP: half of the time)
          a_end, is_random = chunk_start + 1, False
        elif sentence_order:  # a document's last sentence alone: no continuation to order
          break
        else:
          a_end, is_random = chunk_start + 1, num_pool > 0
        a0, a1 = sent[chunk_start], sent[a_end]
        if is_random:
          other = getrandbits(pool_bits)  # rng.randrange(num_pool)
          while other >= num_pool:
            other = getrandbits(pool_bits)
          if pool_is_docs and other >= d:
            other += 1
          o_first, o_last = pool_docs[other], pool_docs[other + 1]
          j = o_first + below(o_last - o_first)
          # Sentences j..k: up to the first that brings B to the rest of the target, or the document's last.
          k = bisect_left(pool_sent, pool_sent[j] + target - (a1 - a0), j + 1, o_last + 1) - 1
          if k == o_last:
            k -= 1
          b0, b1 = pool_sent[j], pool_sent[k + 1]
          i = a_end - 1  # the unused sentences start the next chunk
        else:
          b0, b1 = sent[a_end], sent[i + 1]
        if a1 - a0 + b1 - b0 > max_tokens:
          a0, a1, b0, b1 = _truncate((a0, a1), (b0, b1), max_tokens, rng)
        if sentence_order and uniform() < 0.5:
          out.extend((b0, b1, a0, a1, 1))
        else:
          out.extend((a0, a1, b0, b1, is_random))
        chunk_start = i + 1
  return np.frombuffer(out, np.int64).reshape(-1, len(PAIR_FIELDS)) if out else np.zeros((0, 5), np.int64)


def _truncate(a, b, max_tokens, rng):
  """Trims the longer segment one token at a time from a random end until the pair fits.

  The token-by-token loop of the original, computed in closed form: how many tokens leave
  each side depends only on the lengths, and each removal is from the front with
  probability 1/2, so the front share is binomial.
  """
  len_a, len_b = a[1] - a[0], b[1] - b[0]
  excess = len_a + len_b - max_tokens
  if excess <= 0:
    return a[0], a[1], b[0], b[1]
  # The original cuts A only while it is strictly longer, so B goes first on ties: the longer
  # side shrinks to the other's length, then the cuts alternate B, A, B, ...
  diff = abs(len_a - len_b)
  first = min(excess, diff)
  cut_a, cut_b = (first, 0) if len_a > len_b else (0, first)
  rest = excess - first
  cut_b += (rest + 1) // 2
  cut_a += rest // 2
  front_a = _coin_flips(rng, cut_a)
  front_b = _coin_flips(rng, cut_b)
  return (a[0] + front_a, a[1] - (cut_a - front_a), b[0] + front_b, b[1] - (cut_b - front_b))


def _coin_flips(rng: random.Random, n: int) -> int:
  """Binomial(n, 1/2): the number of heads in n fair coin flips."""
  return rng.getrandbits(n).bit_count() if n else 0


@dataclasses.dataclass
class RecordRuns:
  """Records as runs of one source array: record r is runs [r * k, (r + 1) * k) back to back.

  A run is `source[start:start + length]`; the tokens are only gathered when asked for, all at
  once (`tokens`) or a block of records at a time (`blocks`: bounded memory, and the index
  arrays stay in cache).

  Attributes:
    source: every token a record takes: the text's, then [CLS] and [SEP].
    starts: int64[R * k], where each run starts in `source`.
    lengths: int64[R * k], each run's length (0 for an empty segment).
    bounds: int64[R + 1], record r is tokens bounds[r]:bounds[r + 1] of all records.
    runs_per_record: k.
  """

  source: np.ndarray
  starts: np.ndarray
  lengths: np.ndarray
  bounds: np.ndarray
  runs_per_record: int

  def tokens(self, first: int = 0, last: int | None = None) -> np.ndarray:
    """The tokens of records first..last - 1 (all by default), back to back."""
    k = self.runs_per_record
    last = len(self.bounds) - 1 if last is None else last
    return _concat_runs(self.source, self.starts[first * k:last * k], self.lengths[first * k:last * k])

  def blocks(self, block_tokens: int = 1 << 20):
    """Yields `tokens()` in consecutive pieces of whole records, about `block_tokens` each."""
    first, num = 0, len(self.bounds) - 1
    while first < num:
      last = int(np.searchsorted(self.bounds, self.bounds[first] + block_tokens, side='right')) - 1
      last = min(max(last, first + 1), num)
      yield self.tokens(first, last)
      first = last


def record_runs(docs: TokenizedDocs, pairs: np.ndarray, *, cls_id: int, sep_id: int,
                pool: TokenizedDocs | None = None, dtype=np.int32,
                template: tokenization.Template | None = None) -> RecordRuns:
  """Every pair's record, [CLS] A [SEP] B [SEP] (or the tokenizer's own pair template), as five runs of the tokens.

  Args:
    docs: the documents the pairs index.
    pairs: `create_pairs` output (len(A) and the label are its columns).
    cls_id: the tokenizer's [CLS].
    sep_id: the tokenizer's [SEP].
    pool: the `random_pool` the pairs drew from when it was not `docs`, else None.
    dtype: of the tokens (the shard's `records.token_dtype`: written without a copy).
    template: the tokenizer's pair template when it is not [CLS] A [SEP] B [SEP] (RoBERTa's <s> A </s></s> B </s>).
  """
  template = template or tokenization.bert_template(cls_id, sep_id)
  head, mid, tail = template.head, template.mid, template.tail
  a0, a1, b0, b1, rnd = (pairs[:, k] for k in range(5))
  len_a, len_b = a1 - a0, b1 - b0
  bounds = np.concatenate([[0], np.cumsum(len_a + len_b + len(head) + len(mid) + len(tail))]).astype(np.int64)
  # One source for every run: the documents' tokens, the pool's (B of random pairs drawn
  # there), then the specials (head, mid, tail).
  parts = [docs.tokens] + ([pool.tokens] if pool is not None else [])
  specials = np.array([*head, *mid, *tail], docs.tokens.dtype)
  source = np.concatenate([*parts, specials]).astype(dtype, copy=False)
  head_at = len(source) - len(specials)
  mid_at, tail_at = head_at + len(head), head_at + len(head) + len(mid)
  b_from = b0 + np.where((rnd == 1) & (pool is not None), len(docs.tokens), 0)
  ones = np.ones_like(a0)
  starts = np.stack([head_at * ones, a0, mid_at * ones, b_from, tail_at * ones], axis=1).ravel()
  lengths = np.stack([len(head) * ones, len_a, len(mid) * ones, len_b, len(tail) * ones], axis=1).ravel()
  return RecordRuns(source, starts, lengths, bounds, 5)


def assemble_records(docs: TokenizedDocs, pairs: np.ndarray, *, cls_id: int, sep_id: int,
                     pool: TokenizedDocs | None = None, dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
  """Every pair's tokens, [CLS] A [SEP] B [SEP], back to back in one flat array (`record_runs`' args).

  Returns:
    (tokens of all records, int64[num_pairs + 1] record boundaries in it).
  """
  runs = record_runs(docs, pairs, cls_id=cls_id, sep_id=sep_id, pool=pool, dtype=dtype)
  return runs.tokens(), runs.bounds


def _concat_runs(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """source[starts[i]:starts[i] + lengths[i]] for every i, back to back, in one gather.

  The index array is a running sum: each index is the one before plus one, except at the
  start of a run, which jumps to the run's start in `source`.
  """
  keep = lengths > 0
  starts, lengths = starts[keep], lengths[keep]
  total = int(lengths.sum())
  index = np.ones(total, np.int32 if len(source) < 2**31 else np.int64)
  if total:
    jumps = starts.copy()
    jumps[1:] -= starts[:-1] + lengths[:-1] - 1
    index[np.cumsum(lengths) - lengths] = jumps
    np.cumsum(index, out=index)
  return source[index]


def full_sentence_records(docs: TokenizedDocs, *, max_seq_length: int, sep_id: int
                          ) -> tuple[np.ndarray, np.ndarray]:
  """RoBERTa's FULL-SENTENCES inputs (masked LM only): [CLS] sentences [SEP], back to back.

  Whole sentences are taken in order, across document boundaries with a [SEP] between
  documents, until the next would pass max_seq_length - 2 tokens; a sentence longer than that
  alone is cut into consecutive pieces of that length. Deterministic: masking, not pairing,
  varies from epoch to epoch.

  Returns:
    (token ranges int64[R, 2] in the stream, the stream int32[...]): record r is
    [CLS] stream[start:end] [SEP]; the stream is every document's tokens with a [SEP]
    between documents.
  """
  budget = max_seq_length - 2
  sent = docs.sentence_starts
  num_sentences = len(sent) - 1
  # Stream positions: every sentence shifts right by the [SEP]s of the documents before its own.
  doc_of = np.repeat(np.arange(docs.num_docs), np.diff(docs.doc_starts))
  shift = np.zeros(num_sentences + 1, np.int64)
  shift[:num_sentences] = doc_of
  shift[num_sentences] = max(docs.num_docs - 1, 0)
  pos = sent + shift
  first_of_doc = np.zeros(num_sentences, bool)
  first_of_doc[docs.doc_starts[:-1][np.diff(docs.doc_starts) > 0]] = True
  stream = np.full(int(pos[-1]), sep_id, np.int32)
  lengths = np.diff(sent)
  within = np.arange(len(docs.tokens)) - np.repeat(sent[:-1], lengths)
  stream[np.repeat(pos[:-1], lengths) + within] = docs.tokens
  # Where sentence k's tokens end in the stream (before the [SEP] when the next starts a document).
  next_first = np.zeros(num_sentences, np.int64)
  next_first[:-1] = first_of_doc[1:]
  begins, ends = pos[:-1].tolist(), (pos[1:] - next_first).tolist()
  out = array.array('q')
  start = None  # stream position where the open record starts
  k = 0  # the next sentence not in a record
  while k < num_sentences:
    if start is None:  # sentence k opens a record
      begin, end = begins[k], ends[k]
      while end - begin > budget:  # a sentence longer than a record: whole pieces of it
        out.extend((begin, begin + budget))
        begin += budget
      k += 1
      if end == begin:
        continue
      start = begin
    # The open record takes the sentences that fit whole: up to the first that would pass the budget.
    k = bisect.bisect_right(ends, start + budget, k, num_sentences)
    if k == num_sentences:
      break
    out.extend((start, ends[k - 1]))
    start = None
  if start is not None and pos[-1] > start:
    out.extend((start, int(pos[-1])))
  return np.frombuffer(out, np.int64).reshape(-1, 2) if out else np.zeros((0, 2), np.int64), stream


def full_sentence_runs(ranges: np.ndarray, stream: np.ndarray, *, cls_id: int, sep_id: int,
                       dtype=np.int32) -> RecordRuns:
  """[CLS] stream[start:end] [SEP] for every range, as three runs (as `record_runs`)."""
  lengths = ranges[:, 1] - ranges[:, 0]
  bounds = np.concatenate([[0], np.cumsum(lengths + 2)]).astype(np.int64)
  source = np.concatenate([stream, np.array([cls_id, sep_id], stream.dtype)]).astype(dtype, copy=False)
  ones = np.ones_like(lengths)
  starts = np.stack([(len(source) - 2) * ones, ranges[:, 0], (len(source) - 1) * ones], axis=1).ravel()
  return RecordRuns(source, starts, np.stack([ones, lengths, ones], axis=1).ravel(), bounds, 3)


def assemble_full_sentences(ranges: np.ndarray, stream: np.ndarray, *, cls_id: int, sep_id: int,
                            dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
  """[CLS] stream[start:end] [SEP] for every range, back to back (as `assemble_records`)."""
  runs = full_sentence_runs(ranges, stream, cls_id=cls_id, sep_id=sep_id, dtype=dtype)
  return runs.tokens(), runs.bounds
