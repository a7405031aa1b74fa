"""The sentences a SentencePiece model is trained on, when no tokenizer is given.

Without `data.tokenizer` the preparation trains one first, on a seeded sample of at most
`data.tokenizer_sample_sentences` distinct training sentences: the ones with the smallest
keyed hash, collected per unit while streaming and merged, so the sample too is independent of
how the work was split. Each unit's sample (`sample_unit`) is taken in a worker process; `BottomK`
merges them.
"""

from __future__ import annotations

import hashlib
import heapq

from bert_jax.data import work_units


def _sentence_hash(sentence: str, key: bytes) -> int:
  return int.from_bytes(hashlib.blake2b(sentence.encode('utf-8', 'surrogatepass'), digest_size=8,
                                        key=key).digest(), 'little')


class BottomK:
  """The k distinct sentences with the smallest hashes seen so far: a bounded, order-free sample."""

  def __init__(self, k: int):
    self.k = k
    self._heap: list[tuple[int, str]] = []  # (-hash, sentence): a max-heap of the k smallest
    self._seen: set[str] = set()

  def add(self, h: int, sentence: str) -> None:
    if sentence in self._seen:
      return
    if len(self._heap) < self.k:
      heapq.heappush(self._heap, (-h, sentence))
      self._seen.add(sentence)
    elif -self._heap[0][0] > h:
      self._seen.discard(heapq.heappushpop(self._heap, (-h, sentence))[1])
      self._seen.add(sentence)

  def items(self) -> list[tuple[int, str]]:
    return [(-nh, s) for nh, s in self._heap]

  def sentences(self) -> list[str]:
    """The sample in hash order (a fixed order for the tokenizer trainer)."""
    return [s for _, s in sorted(self.items())]


def sample_unit(job: work_units.Job, unit: work_units.Unit, k: int) -> list[tuple[int, str]]:
  """The unit's k distinct training sentences with the smallest keyed hashes."""
  key = (job.seed + 1).to_bytes(8, 'little', signed=True)
  sample = BottomK(k)
  for split, doc in work_units.documents(job, unit):
    if split == 'train':
      for sentence in doc:
        sample.add(_sentence_hash(sentence, key), sentence)
  return sample.items()
