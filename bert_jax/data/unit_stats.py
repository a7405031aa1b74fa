"""The built units merged for the manifest: their statistics summed in unit order, their index files joined, and
the check that the corpus gave the sequences its objective needs.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Sequence

import numpy as np

from bert_jax import files
from bert_jax.config import DataConfig
from bert_jax.data import records, work_units
from bert_jax.errors import DataError


def check_pairs(cfg: DataConfig, stats: dict, splits: dict, train_name: str, has_eval_files: bool, log) -> None:
  """Refuses a corpus that gives no NSP/SOP pairs on either side; warns when labels are unbalanced."""
  task = cfg.objective.upper()
  if not splits['train']['num'] and not splits['eval']['num']:
    raise DataError(f'no document in {train_name} has two sentences; {task} needs documents of several '
                    'sentences (in plain text, blank lines separate documents; or set data.objective=none)')
  if cfg.objective == 'sop' and not splits['train']['num']:
    raise DataError(f'{train_name} gave no training pairs; SOP needs a training document of two sentences '
                    '(add text, or lower data.eval_fraction)')
  if stats['train_documents'] < 2 or not splits['train']['num']:
    raise DataError(f'{train_name} has {stats["train_documents"]} training document(s), '
                    f'{splits["train"]["num"]} training pairs; NSP needs two documents at least, one of '
                    'them of two sentences (add text, or lower data.eval_fraction)')
  if not splits['eval']['num']:
    where = (f'eval corpus {cfg.eval_files!r} has no document of two sentences' if has_eval_files
             else f'no document of two sentences was held out of {train_name} (eval_fraction='
                  f'{cfg.eval_fraction}, {stats["eval_documents"]} held-out documents)')
    raise DataError(f'{where}; raise data.eval_fraction or set data.eval_files')
  fraction = stats['random_next_fraction']
  if abs(fraction - 0.5) > 0.05:
    log(f'warning: {fraction:.0%} of {task} pairs have label 1, not about 50% (few multi-sentence '
        'documents?)')


def merge_unit_stats(build_dir: str, units: Sequence[work_units.Unit], vocab_size: int, tokenizer):
  """Sums the units' markers in unit order; writes the split index files. (stats, splits)."""
  splits = {s: dict(num=0, shards=[], shard_records=[], documents=0, sentences=0, tokens=0, random=0)
            for s in ('train', 'eval')}
  totals = dict(bytes=0, invalid_utf8=0, formats={}, special_text=collections.Counter())
  counts = np.zeros(vocab_size, np.int64)
  worker_seconds = dict(read=0.0, tokenize=0.0, pairs_write=0.0)
  for u in units:
    with files.open(work_units.marker(build_dir, u.index), encoding='utf-8') as f:
      m = json.load(f)
    totals['bytes'] += m['bytes']
    totals['invalid_utf8'] += m['invalid_utf8']
    totals['invalid_utf8_first'] = totals.get('invalid_utf8_first') or m.get('invalid_utf8_first')
    totals['special_text'].update(m.get('special_text', {}))  # a marker written before counting: none
    for name, n in m['formats'].items():
      totals['formats'][name] = totals['formats'].get(name, 0) + n
    for k in worker_seconds:
      worker_seconds[k] += m['seconds'][k]
    for split, s in m['splits'].items():
      agg = splits[split]
      agg['num'] += s['pairs']
      agg['documents'] += s['documents']
      agg['sentences'] += s['sentences']
      agg['tokens'] += s['tokens']
      agg['random'] += s['random_next']
      if s['pairs']:
        agg['shards'].append(records.shard_name(split, u.index))
        agg['shard_records'].append(s['pairs'])
      if split == 'train':
        counts += np.load(os.path.join(build_dir, work_units.UNITS_DIR, f'{u.index:05d}.train.counts.npy'))
  for split, agg in splits.items():
    work_units.atomic(os.path.join(build_dir, records.index_name(split)),
                      lambda p, split=split, n=agg['num']: _join_indexes(p, build_dir, units, split, n))
  special = tokenizer.special_table()  # a checkpoint's embedding table may be longer than its tokenizer
  counts[:len(special)][special] = 0
  train, evals = splits['train'], splits['eval']
  stats = dict(
      files=len({p.path for u in units for p in u.pieces}), bytes=totals['bytes'],
      documents=train['documents'] + evals['documents'], sentences=train['sentences'] + evals['sentences'],
      train_documents=train['documents'], eval_documents=evals['documents'],
      train_sentences=train['sentences'], eval_sentences=evals['sentences'],
      corpus_tokens=train['tokens'] + evals['tokens'], train_tokens=int(counts.sum()),
      train_pairs=train['num'], eval_pairs=evals['num'],
      random_next_fraction=round(train['random'] / max(train['num'], 1), 4),
      eval_random_next_fraction=round(evals['random'] / max(evals['num'], 1), 4),
      invalid_utf8=totals['invalid_utf8'], formats=totals['formats'],
      most_frequent_token=int(np.argmax(counts)),
      worker_seconds={k: round(v, 2) for k, v in worker_seconds.items()},
      special_text=dict(totals['special_text'].most_common()), invalid_utf8_first=totals.get('invalid_utf8_first'))
  return stats, splits


def _join_indexes(path: str, build_dir: str, units: Sequence[work_units.Unit], split: str, num: int) -> None:
  """Concatenates the units' index files into one .npy, a unit at a time (bounded memory)."""
  out = np.lib.format.open_memmap(path, mode='w+', dtype=records.INDEX_DTYPE, shape=(num,))
  at = 0
  for u in units:
    part = np.load(os.path.join(build_dir, work_units.UNITS_DIR, f'{u.index:05d}.{split}.index.npy'))
    out[at:at + len(part)] = part
    at += len(part)
  out.flush()
  del out
