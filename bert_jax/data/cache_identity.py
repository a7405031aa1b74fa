"""A prepared cache's place and name: a fingerprint of its inputs' contents and of the settings that shape its records.

`cache_dirs` says where caches are looked for (the user's cache directory by default, then where earlier versions
put them); `fingerprints` computes the name, and the name earlier versions gave the same data (keyed by the files'
paths); `link_earlier_cache` serves a cache an earlier version prepared under the new name.
"""

from __future__ import annotations

import hashlib
import json
import os

from etils import epath

from bert_jax import files
from bert_jax.config import DataConfig, facts
from bert_jax.data import records, tokenization
from bert_jax.data.records import META_FILE

# DataConfig fields that change the records (their `records` fact; masking happens later, per batch); with the
# inputs' contents, the seed and records.FORMAT_VERSION they make the cache fingerprint (keys sorted: their
# order is no part of it).
RECORD_FIELDS = facts(DataConfig, 'records')
# Where versions before 2026-11-28 put caches by default: inside the checkout, data/cache (the shipped configs named
# the checkout's; the library's default was relative to the working directory).
EARLIER_DEFAULTS = (os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'data',
                                 'cache'), os.path.join('data', 'cache'))


def cache_dirs(cache_dir: str) -> list[str]:
  """Where a run looks for its cache, the first the one it prepares into: `data.cache_dir` when given; by
  default ('') the user's cache directory, $XDG_CACHE_HOME/bert_jax (~/.cache/bert_jax), then the earlier default
  (data/cache), so that a corpus prepared there is not prepared again."""
  if cache_dir:
    return [cache_dir]
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  earlier = [d for i, d in enumerate(EARLIER_DEFAULTS) if os.path.abspath(d) not in map(os.path.abspath,
                                                                                      EARLIER_DEFAULTS[:i])]
  return [os.path.join(base, 'bert_jax'), *earlier]


def holds(cache_dir: str, fingerprint: str, legacy: str) -> bool:
  """Whether `cache_dir` holds a complete cache of this data, under its name or the one earlier versions gave it."""
  return any(files.exists(os.path.join(cache_dir, name, META_FILE)) for name in (fingerprint, legacy))


def fingerprints(cfg, train_paths, eval_paths, given, vocab_size, seed) -> tuple[str, str]:
  """(the cache's fingerprint, the same data's fingerprint under earlier versions).

  The fingerprint names the data by its contents: each file's size and sha256 in the order the files are read
  (which is all preparation reads of them), not where they are, so a moved checkout or corpus is the same data.
  Earlier versions keyed the files by their absolute paths; that key is computed too, for their checkpoints.
  """
  digests = {p: _file_digest(p) for p in (*train_paths, *eval_paths)}
  key = dict(
      format=records.FORMAT_VERSION, vocab_size=vocab_size, seed=seed,
      tokenizer=[_file_digest(p)[1] for p in tokenization.tokenizer_files(given)] if given else None,
      fields={f: getattr(cfg, f) for f in RECORD_FIELDS})
  if not given:  # a trained tokenizer's bytes depend on how it is trained
    key['tokenizer_training'] = tokenization.SENTENCEPIECE_TRAINING
  elif isinstance(given, tokenization.WordPieceTokenizer):  # earlier caches turned spelled specials into ids
    key['special_strings'] = 'as_text'
  if cfg.objective != 'nsp':  # only then: caches of NSP pairs keep their fingerprints
    key['objective'] = {'none': 'mlm_full_sentences', 'sop': 'sop'}[cfg.objective]
  by_content = {**key, 'train': [list(digests[p]) for p in train_paths], 'eval': [list(digests[p]) for p in eval_paths],
                'identity': 'content'}
  by_path = {**key, 'train': [(_absolute(p), digests[p][1]) for p in train_paths],
             'eval': [(_absolute(p), digests[p][1]) for p in eval_paths]}
  return tuple(hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16] for k in (by_content, by_path))


def _absolute(path: str) -> str:
  return path if '://' in path else os.path.abspath(path)


def _file_digest(path: str) -> tuple[int, str]:
  """(size, sha256) of a file's bytes."""
  h, size = hashlib.sha256(), 0
  with epath.Path(path).open('rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
      size += len(block)
  return size, h.hexdigest()


def link_earlier_cache(cache_dir: str, legacy: str, final_dir: str, log) -> None:
  """Serves the cache an earlier version prepared of the same data (named by its files' absolute paths) under
  the content-keyed name too: a relative link inside `cache_dir`, so an upgrade does not prepare a corpus again.
  Local caches only (remote filesystems have no links: those prepare again)."""
  earlier = os.path.join(cache_dir, legacy)
  if ('://' in cache_dir or os.path.lexists(final_dir) or legacy == os.path.basename(final_dir)
      or not files.exists(os.path.join(earlier, META_FILE))):
    return
  try:
    os.symlink(legacy, final_dir, target_is_directory=True)
  except FileExistsError:  # another run linked or built it meanwhile
    return
  log(f'prepared data: the cache an earlier version prepared of these files, {earlier}, serves as {final_dir}')
