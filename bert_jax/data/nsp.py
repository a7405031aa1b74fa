"""BERT's next-sentence-prediction pairs, built from one work unit's tokenised documents.

A unit's text is held as one flat token array: documents are runs of sentences and
sentences runs of tokens, so every segment of a pair is a contiguous slice and a pair is
five integers (`PAIR_FIELDS`). Records are then assembled for all pairs at once.

The algorithm is google-research/bert's `create_instances_from_document`, with the
randomness of a `random.Random` seeded per unit and split, so a unit's pairs depend only on
its own text, never on which worker or host built it. Random-next segments come from other
documents of the same unit (google-research/bert draws them from all documents of one
`create_pretraining_data.py` run, which users ran per input file or file group; a unit is
up to `data.unit_mb` of whole documents, several files when they are small).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

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
                 random_pool: TokenizedDocs | None = None) -> np.ndarray:
  """Builds NSP pairs (`PAIR_FIELDS` per row) as google-research/bert does.

  Per document, sentences are accumulated up to a target length (max_seq_length - 3, or with
  probability `short_seq_prob` a random shorter one) and split at a random sentence boundary
  into A and B; with probability 0.5 B is replaced by text from another document and the
  unused sentences start the next chunk. Pairs are truncated to fit by trimming the longer
  side at a random end. Unlike the original, a one-sentence chunk gets its true next sentence
  half of the time and one-sentence documents give no pairs, so labels stay near 50/50 even
  when sentences are long, and a random document is always another document.

  Args:
    docs: the documents to pair.
    max_seq_length: T; a pair has at most T - 3 tokens (room for [CLS] [SEP] [SEP]).
    short_seq_prob: probability of a shorter target length.
    dupe_factor: passes over the documents (each pairs differently).
    rng: the randomness.
    random_pool: where random-next segments come from when `docs` has a single document
      (the held-out documents of a unit with one of them borrow the unit's training text);
      None: from `docs` only. With no other document at all, every pair is a true pair.

  Returns:
    int64[num_pairs, 5]: token ranges of A and B in `docs.tokens` (B in the pool's tokens
    when `is_random_next` and the pool is another one), and the label.
  """
  pool, pool_is_docs = docs, True
  if docs.num_docs < 2 and random_pool is not None and random_pool.num_docs:
    pool, pool_is_docs = random_pool, False
  sent = docs.sentence_starts
  pool_sent, pool_docs = pool.sentence_starts, pool.doc_starts
  num_pool = pool.num_docs - (1 if pool_is_docs else 0)  # other documents to draw from
  max_tokens = max_seq_length - 3
  out: list[tuple[int, int, int, int, int]] = []
  for _ in range(dupe_factor):
    for d in range(docs.num_docs):
      first, last = int(docs.doc_starts[d]), int(docs.doc_starts[d + 1])
      if last - first < 2:
        continue  # could only give random-next pairs; still a source of random segments
      target = max_tokens
      if rng.random() < short_seq_prob:
        target = rng.randint(2, max_tokens)
      chunk_start, i = first, first
      while i < last:
        chunk_len = int(sent[i + 1] - sent[chunk_start])
        if i == last - 1 or chunk_len >= target:
          n = i + 1 - chunk_start
          if n == 1 and i + 1 < last and rng.random() >= 0.5:
            i += 1  # a lone (long) sentence gets its true continuation half of the time
            a_end, is_random = chunk_start + 1, False
          else:
            a_end = chunk_start + (rng.randrange(1, n) if n >= 2 else 1)
            is_random = num_pool > 0 and (n == 1 or rng.random() < 0.5)
          a = (int(sent[chunk_start]), int(sent[a_end]))
          if is_random:
            other = rng.randrange(num_pool)
            if pool_is_docs and other >= d:
              other += 1
            o_first, o_last = int(pool_docs[other]), int(pool_docs[other + 1])
            j = o_first + rng.randrange(o_last - o_first)
            b_target = target - (a[1] - a[0])
            k = j
            while k < o_last - 1 and pool_sent[k + 1] - pool_sent[j] < b_target:
              k += 1
            b = (int(pool_sent[j]), int(pool_sent[k + 1]))
            i = a_end - 1  # the unused sentences start the next chunk
          else:
            b = (int(sent[a_end]), int(sent[i + 1]))
          out.append((*_truncate(a, b, max_tokens, rng), int(is_random)))
          chunk_start = i + 1
        i += 1
  return np.array(out, np.int64).reshape(-1, len(PAIR_FIELDS))


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


def assemble_records(docs: TokenizedDocs, pairs: np.ndarray, *, cls_id: int, sep_id: int,
                     pool: TokenizedDocs | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Every pair's tokens, [CLS] A [SEP] B [SEP], back to back in one flat array.

  Args:
    docs: the documents the pairs index.
    pairs: `create_pairs` output (len(A) and the label are its columns).
    cls_id: the tokenizer's [CLS].
    sep_id: the tokenizer's [SEP].
    pool: the `random_pool` the pairs drew from when it was not `docs`, else None.

  Returns:
    (int32 tokens of all records, int64[num_pairs + 1] record boundaries in it).
  """
  a0, a1, b0, b1, rnd = (pairs[:, k] for k in range(5))
  len_a, len_b = a1 - a0, b1 - b0
  bounds = np.concatenate([[0], np.cumsum(len_a + len_b + 3)]).astype(np.int64)
  out = np.empty(int(bounds[-1]), np.int32)
  start = bounds[:-1]
  out[start] = cls_id
  out[start + 1 + len_a] = sep_id
  out[bounds[1:] - 1] = sep_id
  # B comes from the pool for random pairs drawn there; the tokens of both in one array.
  b_from_pool = (rnd == 1) & (pool is not None)
  source = docs.tokens if pool is None else np.concatenate([docs.tokens, pool.tokens])
  b_offset = np.where(b_from_pool, len(docs.tokens), 0)
  _gather(out, start + 1, a0, len_a, source)
  _gather(out, start + 2 + len_a, b0 + b_offset, len_b, source)
  return out, bounds


def _gather(out, dst_starts, src_starts, lengths, source):
  """out[dst_starts[i] + k] = source[src_starts[i] + k] for k < lengths[i], for every i at once."""
  total = int(lengths.sum())
  if not total:
    return
  run_offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
  within = np.arange(total) - run_offsets
  out[np.repeat(dst_starts, lengths) + within] = source[np.repeat(src_starts, lengths) + within]


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
  out: list[tuple[int, int]] = []
  start = None  # stream position where the open record starts
  for k in range(num_sentences):
    begin, end = int(pos[k]), int(pos[k + 1]) - (1 if k + 1 < num_sentences and first_of_doc[k + 1] else 0)
    if start is not None and end - start > budget:
      out.append((start, int(pos[k]) - (1 if first_of_doc[k] else 0)))  # close before sentence k
      start = None
    if start is None:
      while end - begin > budget:  # a sentence longer than a record: whole pieces of it
        out.append((begin, begin + budget))
        begin += budget
      start = begin if end > begin else None
  if start is not None and pos[-1] > start:
    out.append((start, int(pos[-1])))
  return np.array(out, np.int64).reshape(-1, 2), stream


def assemble_full_sentences(ranges: np.ndarray, stream: np.ndarray, *, cls_id: int, sep_id: int
                            ) -> tuple[np.ndarray, np.ndarray]:
  """[CLS] stream[start:end] [SEP] for every range, back to back (as `assemble_records`)."""
  lengths = ranges[:, 1] - ranges[:, 0]
  bounds = np.concatenate([[0], np.cumsum(lengths + 2)]).astype(np.int64)
  out = np.empty(int(bounds[-1]), np.int32)
  out[bounds[:-1]] = cls_id
  out[bounds[1:] - 1] = sep_id
  _gather(out, bounds[:-1] + 1, ranges[:, 0], lengths, stream)
  return out, bounds
