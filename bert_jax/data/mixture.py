"""A mixture of corpora (data.train_weights): each prepared on its own, training rows drawn in proportion to weights.

Stream position s (the run's s-th training example) lies in period t = s // PERIOD; each corpus c owns
quota_c = its weight's share of the period's PERIOD slots (largest remainders, every quota >= 1), and a keyed
permutation of the period's slots says which corpus position s draws from and its rank j among that corpus's
draws. Corpus c's j-th draw is its record permute(j % N_c, key(seed, c, j // N_c)): each corpus goes through its
records in a new order every epoch of its own, as one corpus does (`loader.BatchMaker`). Everything is a pure
function of (seed, s), so a resumed run draws the same rows, and the shares are exact over every period.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Callable, Sequence

import numpy as np

from bert_jax.data import hashing
from bert_jax.data.loader import PretrainingDataset
from bert_jax.data.records import PreparedData, Rows
from bert_jax.errors import ConfigError, DataError

PERIOD = 10_000  # slots per period: shares are exact to 1e-4 over each run of 10,000 examples
_CORPUS_ORDER, _SLOT_ORDER = 3, 4  # key streams (the loader's are 0-2)


@dataclasses.dataclass(frozen=True)
class Mixture:
  """Corpora prepared apart (one cache each, one tokenizer) and their shares of the training rows."""

  parts: tuple[PreparedData, ...]
  shares: tuple[float, ...]
  names: tuple[str, ...]  # each corpus's train_files entry, for messages

  # What a run reads of its prepared data: the first corpus's tokenizer describes every corpus.
  @property
  def tokenizer_path(self) -> str:
    return self.parts[0].tokenizer_path

  @property
  def special_ids(self):
    return self.parts[0].special_ids

  @property
  def most_frequent_token(self) -> int:
    return self.parts[0].most_frequent_token

  @property
  def num_train(self) -> int:
    return sum(p.num_train for p in self.parts)

  @property
  def fingerprint(self) -> str:
    """The caches and the shares: another mixture of the same corpora is other data."""
    return self._fingerprint(fingerprint)

  @property
  def legacy_fingerprint(self) -> str:
    return self._fingerprint(legacy_fingerprint)

  def _fingerprint(self, of: Callable[[PreparedData | Mixture], str]) -> str:
    key = '+'.join(f'{of(p)}*{s!r}' for p, s in zip(self.parts, self.shares))
    return 'mix-' + hashlib.sha256(key.encode()).hexdigest()[:16]


def fingerprint(data: PreparedData | Mixture) -> str:
  """The name of what a run trains on: a cache directory's name, or a mixture's."""
  return data.fingerprint if isinstance(data, Mixture) else os.path.basename(os.path.normpath(data.dir))


def legacy_fingerprint(data: PreparedData | Mixture) -> str:
  """The same data's name under earlier versions (caches keyed by absolute paths), for their checkpoints."""
  if isinstance(data, Mixture):
    return data.legacy_fingerprint
  return data.legacy_fingerprint or fingerprint(data)


def quotas(shares: Sequence[float], period: int = PERIOD) -> np.ndarray:
  """Slots per period of each corpus: the shares' largest-remainder apportionment of `period`, each >= 1."""
  exact = np.asarray(shares, np.float64) * period
  out = np.maximum(np.floor(exact).astype(np.int64), 1)
  left = period - int(out.sum())
  if left >= 0:  # the largest remainders get the slots left
    for c in np.argsort(-(exact - np.floor(exact)), kind='stable')[:left]:
      out[c] += 1
  else:  # corpora raised to one slot: the largest quotas give theirs back
    for _ in range(-left):
      out[int(np.argmax(out))] -= 1
  if len(out) > period or out.sum() != period:
    raise ConfigError(f'a mixture of {len(out)} corpora needs at most {period} of them')
  return out


class MixtureDataset:
  """One split of a `Mixture`: its corpora's records end to end (record i of corpus c is offset_c + i).

  Training orders them with `record_indices`; the held-out split is every corpus's held-out records in turn
  (with data.eval_files, the first corpus's: each prepared the same files).
  """

  def __init__(self, data: Mixture, split: str = 'train', *, shared_eval: bool = False):
    self.data, self.split = data, split
    self.parts = [PretrainingDataset(p, split) for p in (data.parts[:1] if shared_eval else data.parts)]
    sizes = [len(p) for p in self.parts]
    if split == 'train':
      for name, n in zip(data.names, sizes):
        if not n:
          raise DataError(f'corpus {name!r} of the mixture (data.train_weights) has no training records')
    self.sizes = np.asarray(sizes, np.int64)
    self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
    self.quotas = quotas(data.shares)
    self.slot_starts = np.concatenate([[0], np.cumsum(self.quotas)])

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def record_lengths(self, indices: np.ndarray) -> np.ndarray:
    """The token counts of the records at `indices` (of the concatenation), read corpus by corpus."""
    out = np.zeros(len(indices), np.int64)
    for c, sel, local in self._by_corpus(indices):
      out[sel] = self.parts[c].record_lengths(local)
    return out

  def _by_corpus(self, indices: Sequence[int]):
    """(corpus, where its records stand in `indices`, their indices within the corpus), corpus by corpus."""
    indices = np.asarray(indices, np.int64)
    corpus = np.searchsorted(self.offsets, indices, side='right') - 1
    for c in np.unique(corpus).tolist():
      sel = corpus == c
      yield c, sel, indices[sel] - self.offsets[c]

  def __getitem__(self, index: int):
    c = int(np.searchsorted(self.offsets, index, side='right') - 1)
    return self.parts[c][int(index - self.offsets[c])]

  def gather(self, indices: Sequence[int], width: int) -> Rows:
    """The records at `indices` (of the concatenation), in order, as rows of `width` tokens."""
    n = len(indices)
    out = Rows(np.zeros((n, width), np.int32), *(np.zeros(n, np.int64) for _ in range(3)))
    for c, sel, local in self._by_corpus(indices):
      rows = self.parts[c].gather(local, width)
      for field in ('tokens', 'lengths', 'len_a', 'random_next'):
        getattr(out, field)[sel] = getattr(rows, field)
    return out

  def corpus_draws(self, positions: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(corpus, rank among that corpus's draws) of each stream position."""
    positions = np.asarray(positions, np.int64)
    periods, offsets = np.divmod(positions, PERIOD)
    slots = np.empty_like(positions)
    for t in np.unique(periods).tolist():  # a batch spans one period, rarely two
      sel = periods == t
      slots[sel] = hashing.permute(offsets[sel], PERIOD, int(hashing.key(seed, _SLOT_ORDER, t)))
    corpus = np.searchsorted(self.slot_starts, slots, side='right') - 1
    return corpus, periods * self.quotas[corpus] + slots - self.slot_starts[corpus]

  def record_indices(self, positions: np.ndarray, seed: int) -> np.ndarray:
    """The records (of the concatenation) at training stream positions."""
    corpus, draws = self.corpus_draws(positions, seed)
    epochs, within = np.divmod(draws, self.sizes[corpus])
    out = np.empty_like(draws)
    for c, epoch in {(int(c), int(e)) for c, e in zip(corpus.tolist(), epochs.tolist())}:
      sel = (corpus == c) & (epochs == epoch)
      out[sel] = self.offsets[c] + hashing.permute(within[sel], int(self.sizes[c]),
                                                   int(hashing.key(seed, _CORPUS_ORDER, c, epoch)))
    return out


def open_split(data: PreparedData | Mixture, split: str, *, shared_eval: bool = False):
  """The records of `split` that training or evaluation reads: one cache's, or a mixture's."""
  if isinstance(data, Mixture):
    return MixtureDataset(data, split, shared_eval=shared_eval)
  return PretrainingDataset(data, split)
