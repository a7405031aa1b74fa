"""Tests for bert_jax.data.nsp: BERT's sentence pairs as token ranges, and their records."""

import random

import numpy as np

from bert_jax.data import nsp, records
from bert_jax.data.tokenization import CLS_ID, SEP_ID


def _pairs(docs, *, max_seq_length, short_seq_prob, dupe_factor, rng, pool=None, sentence_order=False):
  """create_pairs + assemble_records, decoded back to (tokens_a, tokens_b, is_random_next) lists."""
  tokenized = nsp.TokenizedDocs.from_lists(docs)
  pool = nsp.TokenizedDocs.from_lists(pool) if pool else None
  pairs = nsp.create_pairs(tokenized, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                           dupe_factor=dupe_factor, rng=rng, random_pool=pool, sentence_order=sentence_order)
  used_pool = pool if pool is not None and tokenized.num_docs < 2 else None
  flat, bounds = nsp.assemble_records(tokenized, pairs, cls_id=CLS_ID, sep_id=SEP_ID, pool=used_pool)
  out = []
  for (lo, hi), (a0, a1, *_, is_random_next) in zip(zip(bounds[:-1], bounds[1:]), pairs.tolist()):
    tokens, len_a = flat[lo:hi], a1 - a0
    assert tokens[0] == CLS_ID and tokens[len_a + 1] == SEP_ID and tokens[-1] == SEP_ID
    out.append((tokens[1:1 + len_a].tolist(), tokens[2 + len_a:-1].tolist(), bool(is_random_next)))
  return out


def _coded_documents(num_docs=30, seed=0):
  """Sentence j of document d is [code] * n with code = 5 + 100 d + j: pairs are checkable."""
  rng = random.Random(seed)
  return [[[5 + 100 * d + j] * rng.randint(2, 12) for j in range(rng.randint(40, 90))]
          for d in range(num_docs)]


def _doc_sentence(code):
  return divmod(code - 5, 100)


def test_nsp_pairs_follow_bert():
  max_len = 32
  instances = _pairs(_coded_documents(), max_seq_length=max_len,
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
  assert untruncated_true_pairs > 50


def test_nsp_labels_stay_balanced_when_sentences_are_long():
  # Sentences longer than the target length make every chunk one sentence; original BERT
  # then labels every pair random-next. Ours pairs such a sentence with its successor half the time.
  rng = random.Random(0)
  docs = [[[5 + 100 * d + j] * rng.randint(30, 60) for j in range(20)] for d in range(20)]
  instances = _pairs(docs, max_seq_length=32, short_seq_prob=0.1,
                                                    dupe_factor=5, rng=random.Random(2))
  assert 0.46 < np.mean([r for _, _, r in instances]) < 0.54
  for a, b, is_random_next in instances:
    doc_a, sent_a = _doc_sentence(a[0])
    doc_b, sent_b = _doc_sentence(b[0])
    assert (doc_a != doc_b) if is_random_next else (doc_a == doc_b and sent_b == sent_a + 1)


def test_sop_pairs_are_consecutive_segments_swapped_half_of_the_time():
  max_len = 32
  instances = _pairs(_coded_documents(), max_seq_length=max_len, short_seq_prob=0.1, dupe_factor=10,
                     rng=random.Random(1), pool=_coded_documents(2, seed=5), sentence_order=True)
  nsp_count = len(_pairs(_coded_documents(), max_seq_length=max_len, short_seq_prob=0.1, dupe_factor=10,
                         rng=random.Random(1)))
  # NSP makes more: after a random-next pair, the chunk's unused sentences start the next chunk.
  assert 0.6 * nsp_count < len(instances) < nsp_count
  assert 0.47 < np.mean([r for _, _, r in instances]) < 0.53
  untruncated = {False: 0, True: 0}
  for a, b, swapped in instances:
    assert a and b and len(a) + len(b) <= max_len - 3
    (doc_a,), (doc_b,) = {_doc_sentence(t)[0] for t in a}, {_doc_sentence(t)[0] for t in b}
    assert doc_a == doc_b  # never another document, the pool unused
    sents_a = sorted({_doc_sentence(t)[1] for t in a})
    sents_b = sorted({_doc_sentence(t)[1] for t in b})
    first, second = (sents_b, sents_a) if swapped else (sents_a, sents_b)
    assert second[0] > first[-1]
    if len(a) + len(b) < max_len - 3:  # not truncated: the two segments are consecutive text
      assert second[0] == first[-1] + 1
      untruncated[swapped] += 1
  assert min(untruncated.values()) > 50


def test_sop_pairs_a_long_sentence_with_the_next_and_drops_a_last_one_alone():
  rng = random.Random(0)
  docs = [[[5 + 100 * d + j] * rng.randint(30, 60) for j in range(20)] for d in range(5)]
  instances = _pairs(docs, max_seq_length=32, short_seq_prob=0.0, dupe_factor=1, rng=random.Random(2),
                     sentence_order=True)
  assert len(instances) == 5 * 10  # sentences 0+1, 2+3, ... of every document
  for a, b, swapped in instances:
    (doc_a, sent_a), (doc_b, sent_b) = _doc_sentence(a[0]), _doc_sentence(b[0])
    assert doc_a == doc_b and (sent_a == sent_b + 1 if swapped else sent_b == sent_a + 1)
  odd = [doc[:3] for doc in docs]  # three sentences: 0+1, then 2 alone gives no pair
  assert len(_pairs(odd, max_seq_length=32, short_seq_prob=0.0, dupe_factor=1, rng=random.Random(2),
                    sentence_order=True)) == 5


def test_short_seq_prob_gives_shorter_pairs():
  docs = _coded_documents()
  lengths = {}
  for p in (0.0, 0.5):
    instances = _pairs(docs, max_seq_length=64, short_seq_prob=p,
                                        dupe_factor=2, rng=random.Random(0))
    lengths[p] = np.mean([len(a) + len(b) for a, b, _ in instances])
  assert lengths[0.5] < 0.85 * lengths[0.0]


def test_one_document_pairs_with_the_pool_or_only_true_pairs():
  docs = _coded_documents(num_docs=1)
  alone = _pairs(docs, max_seq_length=32, short_seq_prob=0.0, dupe_factor=3, rng=random.Random(0))
  assert alone and not any(r for _, _, r in alone)  # no other document: every pair is a true pair
  pool = [[[5 + 100 * 50 + j] * 4 for j in range(30)], [[5 + 100 * 51 + j] * 4 for j in range(30)]]
  mixed = _pairs(docs, max_seq_length=32, short_seq_prob=0.0, dupe_factor=3, rng=random.Random(0), pool=pool)
  assert 0.3 < np.mean([r for _, _, r in mixed]) < 0.7
  for a, b, is_random_next in mixed:
    assert _doc_sentence(a[0])[0] == 0
    assert (_doc_sentence(b[0])[0] in (50, 51)) if is_random_next else _doc_sentence(b[0])[0] == 0


def test_truncation_matches_the_token_by_token_loop():
  def original(len_a, len_b, max_tokens):
    cut_a = cut_b = 0
    while len_a - cut_a + len_b - cut_b > max_tokens:
      if len_a - cut_a > len_b - cut_b:
        cut_a += 1
      else:
        cut_b += 1
    return cut_a, cut_b

  rng = random.Random(0)
  for len_a in range(0, 30):
    for len_b in range(0, 30):
      for max_tokens in (5, 17, 29):
        a0, a1, b0, b1 = nsp._truncate((0, len_a), (100, 100 + len_b), max_tokens, rng)
        assert (len_a - (a1 - a0), len_b - (b1 - b0)) == original(len_a, len_b, max_tokens)
        assert 0 <= a0 <= a1 <= len_a and 100 <= b0 <= b1 <= 100 + len_b
  fronts = [nsp._truncate((0, 40), (100, 110), 20, rng)[0] for _ in range(2000)]
  assert 14.0 < np.mean(fronts) < 16.0  # 30 cuts from A, each from the front with probability 1/2


def test_record_round_trip(tmp_path):
  for vocab_size, dtype, big in ((30522, '<u2', 30521), (70000, '<i4', 69999)):
    docs = nsp.TokenizedDocs.from_lists([[[7, 8, 9], [10, 11]], [[big, 12]]])
    pairs = np.array([[0, 3, 3, 5, 0], [5, 6, 0, 3, 1]])  # the second: A = [big], B from document 0
    flat, bounds = nsp.assemble_records(docs, pairs, cls_id=CLS_ID, sep_id=SEP_ID)
    assert flat.dtype == np.int32 and bounds.tolist() == [0, 8, 15]
    assert records.token_dtype(vocab_size) == dtype
    shard, index = str(tmp_path / f'shard-{vocab_size}'), str(tmp_path / f'index-{vocab_size}.npy')
    records.write_shard(shard, flat, dtype)
    np.save(index, records.make_index(bounds, pairs[:, 1] - pairs[:, 0], pairs[:, 4]))
    reader = records.RecordReader([shard], [2], index, dtype)
    expected = [([CLS_ID, 7, 8, 9, SEP_ID, 10, 11, SEP_ID], 3, False),
                ([CLS_ID, big, SEP_ID, 7, 8, 9, SEP_ID], 1, True)]
    for i, (tokens, len_a, is_random_next) in enumerate(expected):
      got = reader[i]
      assert got[0].dtype == np.int32 and got[0].tolist() == tokens and got[1:] == (len_a, is_random_next)
    rows = reader.gather([1, 0, 1], 10)
    assert rows.tokens.shape == (3, 10) and rows.lengths.tolist() == [7, 8, 7]
    assert rows.tokens[1].tolist() == expected[0][0] + [0, 0]
    assert rows.len_a.tolist() == [1, 3, 1] and rows.random_next.tolist() == [1, 0, 1]


def _full_sentences(docs, max_seq_length):
  tokenized = nsp.TokenizedDocs.from_lists(docs)
  ranges, stream = nsp.full_sentence_records(tokenized, max_seq_length=max_seq_length, sep_id=SEP_ID)
  flat, bounds = nsp.assemble_full_sentences(ranges, stream, cls_id=CLS_ID, sep_id=SEP_ID)
  return [flat[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


def test_full_sentences_follow_roberta():
  docs = _coded_documents(num_docs=12)
  for t in (16, 64, 128):
    out = _full_sentences(docs, t)
    assert all(r[0] == CLS_ID and r[-1] == SEP_ID and 3 <= len(r) <= t for r in out)
    # Read back in order, the records are the corpus: every sentence once, a [SEP] between documents.
    body = np.concatenate([r[1:-1] for r in out])
    expected = np.concatenate([np.concatenate([np.concatenate(doc)] + ([[SEP_ID]] if d < len(docs) - 1 else []))
                               for d, doc in enumerate(docs)])
    boundaries = [k for k, r in enumerate(out[:-1]) if r[-2] != SEP_ID]
    np.testing.assert_array_equal(body[body != SEP_ID], expected[expected != SEP_ID])
    # Whole sentences (codes change only at record edges or within), packed greedily: the next
    # record's first sentence would not have fitted.
    for a, b in zip(out[:-1], out[1:]):
      assert a[-2] != b[1] or t == 16  # no sentence split (at 16, sentences of 12 fit anyway)
      first_len = int(np.argmax(b[1:-1] != b[1])) or len(b) - 2
      sep = 1 if _doc_sentence(int(a[-2]))[0] != _doc_sentence(int(b[1]))[0] else 0
      assert len(a) - 2 + sep + first_len > t - 2
    assert boundaries  # documents run on into the next record


def test_full_sentences_cut_a_sentence_longer_than_a_record():
  out = _full_sentences([[[7] * 3, [8] * 25, [9] * 2], [[10] * 4]], 12)
  assert [r.tolist() for r in out] == [[CLS_ID, 7, 7, 7, SEP_ID], [CLS_ID] + [8] * 10 + [SEP_ID],
                                      [CLS_ID] + [8] * 10 + [SEP_ID],
                                      [CLS_ID] + [8] * 5 + [9, 9, SEP_ID], [CLS_ID] + [10] * 4 + [SEP_ID]]


# ----------------------------------------------------------------------------- the reference loops
# create_pairs and full_sentence_records as first written: a sentence-by-sentence walk with
# random.Random's own methods. The faster ones must give the same pairs from the same draws,
# which is what keeps the records of a given corpus and seed byte-identical.


def _reference_create_pairs(docs, *, max_seq_length, short_seq_prob, dupe_factor, rng, random_pool=None):
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
          out.append((*nsp._truncate(a, b, max_tokens, rng), int(is_random)))
          chunk_start = i + 1
        i += 1
  return np.array(out, np.int64).reshape(-1, len(nsp.PAIR_FIELDS))


def _reference_full_sentence_records(docs, *, max_seq_length, sep_id):
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


def _random_docs(rng, num_docs, max_sentences, max_len):
  """Documents of random sentences, some of them empty (dropped by TokenizedDocs.from_lists)."""
  return [[[rng.randrange(5, 999) for _ in range(rng.randint(0, max_len))] for _ in range(rng.randint(0, max_sentences))]
          for _ in range(num_docs)]


def test_create_pairs_matches_the_reference_loop_draw_for_draw():
  rng = random.Random(0)
  total = 0
  for trial in range(400):
    docs = nsp.TokenizedDocs.from_lists(_random_docs(rng, rng.randint(0, 8), rng.choice([1, 3, 10, 40]),
                                                     rng.choice([1, 5, 30, 200])))
    pool = nsp.TokenizedDocs.from_lists(_random_docs(rng, rng.randint(0, 4), 10, 20)) if rng.random() < 0.5 else None
    args = dict(max_seq_length=rng.choice([5, 6, 16, 64, 128, 512]), short_seq_prob=rng.choice([0, 0.1, 0.5, 1]),
                dupe_factor=rng.randint(1, 3), random_pool=pool)
    ours, theirs = random.Random(f'{trial}'), random.Random(f'{trial}')
    got = nsp.create_pairs(docs, rng=ours, **args)
    want = _reference_create_pairs(docs, rng=theirs, **args)
    assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all(), (trial, args)
    assert ours.getstate() == theirs.getstate()  # the same draws, so what follows them is the same too
    total += len(got)
  assert total > 5000


def test_full_sentence_records_match_the_reference_loop():
  rng = random.Random(0)
  for trial in range(400):
    sizes = [rng.choice([0, 1, 1, 2, 5, 20]) for _ in range(rng.randint(0, 8))]  # empty documents too
    lengths = [rng.choice([1, 2, 3, 7, 20, 60, 200]) for _ in range(sum(sizes))]
    docs = nsp.TokenizedDocs(np.arange(5, 5 + sum(lengths), dtype=np.int32),
                             np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                             np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    max_seq_length = rng.choice([5, 6, 8, 16, 64, 128])
    got = nsp.full_sentence_records(docs, max_seq_length=max_seq_length, sep_id=SEP_ID)
    want = _reference_full_sentence_records(docs, max_seq_length=max_seq_length, sep_id=SEP_ID)
    for a, b in zip(got, want):
      assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), (trial, sizes, lengths, max_seq_length)


def test_record_blocks_are_the_records():
  rng = random.Random(0)
  docs = nsp.TokenizedDocs.from_lists(_random_docs(rng, 6, 30, 40))
  pairs = nsp.create_pairs(docs, max_seq_length=64, short_seq_prob=0.1, dupe_factor=3, rng=random.Random(1))
  runs = nsp.record_runs(docs, pairs, cls_id=CLS_ID, sep_id=SEP_ID, dtype='<u2')
  flat = runs.tokens()
  assert flat.dtype == np.dtype('<u2') and len(flat) == runs.bounds[-1]
  for block_tokens in (1, 7, 100, 10**9):
    blocks = list(runs.blocks(block_tokens))
    np.testing.assert_array_equal(np.concatenate(blocks), flat)
    # Whole records: every block ends at a record boundary, and only a lone record passes the size.
    ends = np.cumsum([len(b) for b in blocks])
    assert np.isin(ends, runs.bounds).all()
    assert all(len(b) <= block_tokens or np.isin([len(b)], np.diff(runs.bounds)).all() for b in blocks)
