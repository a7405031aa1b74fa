"""Your own token classification data: a tag per word, from JSONL/Parquet rows or CoNLL-style column files.

JSONL (`.jsonl`/`.ndjson`) and Parquet rows hold a sentence each: its words in `text_column` (the default 'text'
also reads a 'tokens' or 'words' column) and their tags in `label_column` (the default 'label' also reads 'tags'),
two lists of equal length. Any other file is read as CoNLL columns: a word per line (its first field), its tag in
the last field, a blank line after each sentence, `-DOCSTART-` lines skipped.

Tags are named as written; `label_names` gives their order, else the training file's tags sorted ('O' first). When
every tag is 'O' or starts with B-/I- (BIO or IOB1), the score is conlleval's entity F1 (`metrics.entity_scores`,
the main metric) beside the token accuracy; other tag sets (part of speech, ...) score token accuracy. Each word's
tag is predicted at its first sub-token, as for CoNLL-2003 (`conll.featurize`).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from bert_jax import files
from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import conll, own_data
from bert_jax import metrics
from bert_jax.finetuning.tasks.base import EvalSet, Feature
from bert_jax.finetuning.tasks.own_data import Row

WORD_COLUMNS = ('tokens', 'words')  # read when text_column is the default and the file has no 'text'
TAG_COLUMNS = ('tags',)  # read when label_column is the default and the file has no 'label'
_FLAGS = "--config.text_column to the words' column and --config.label_column to the tags'"


def read_sentences(path: str, text_column: str, label_column: str) -> list[Row]:
  """The file's sentences as rows: `text` the words, `label` the tags (lists of equal length)."""
  if not is_row_file(path):
    return [Row(words, None, tags, i + 1) for i, (words, tags) in enumerate(conll.read_conll(path, labels=None))]
  names, records = tables.records(path)
  words_at, tags_at = sentence_columns(path, names, text_column, label_column)
  rows = []
  for line, record in records:
    words, tags = _strings(path, line, record, words_at), _strings(path, line, record, tags_at)
    if len(words) != len(tags):
      raise DataError(f'{path}:{line}: {len(words)} words but {len(tags)} tags; give one tag per word')
    rows.append(Row(words, None, tags, line))
  return rows


def is_row_file(path: str) -> bool:
  """Whether `path` holds a sentence per row (JSONL, Parquet, compressed or not); any other file is read as CoNLL
  columns."""
  return os.path.splitext(files.without_compression(path))[1].lower() in ('.jsonl', '.ndjson', '.parquet')


def sentence_columns(path: str, names: Sequence[str], text_column: str, label_column: str) -> tuple[str, str]:
  """(the words' column, the tags' column) of a row file whose columns are `names`; DataError naming them."""
  return (tables.find_column(path, names, text_column, own_data.Columns.text, WORD_COLUMNS, _FLAGS),
          tables.find_column(path, names, label_column, own_data.Columns.label, TAG_COLUMNS, _FLAGS))


def _strings(path: str, line: int, record: dict[str, Any], column: str) -> list[str]:
  value = record.get(column)
  if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v.strip() for v in value):
    raise DataError(f'{path}:{line}: {column!r} must be a non-empty list of non-empty texts, got {value!r}')
  return [v.strip() for v in value]


def sorted_tags(tags: Sequence[str]) -> list[str]:
  """Distinct tags, 'O' first, then sorted (B-X before I-X)."""
  return sorted(set(tags), key=lambda t: (t != 'O', t[2:] if t[:2] in ('B-', 'I-') else t, t))


def is_chunked(names: Sequence[str]) -> bool:
  """Whether the tags are BIO/IOB1 chunk tags ('O', B-X, I-X), scored as entities."""
  return all(n == 'O' or (n[:2] in ('B-', 'I-') and len(n) > 2) for n in names)


class TagTask(own_data.FileTask):
  """Token classification on the config's files; one per run. Labels and the held-out split as `FileTask`'s,
  per tag instead of per row."""

  def __init__(self, name: str = 'tag'):
    super().__init__(name, 'token')

  @property
  def main_metric(self) -> str:
    return 'f1' if is_chunked(self.label_names) else 'token_accuracy'

  def _read(self, path: str, cfg) -> list[Row]:
    return read_sentences(path, cfg.text_column, cfg.label_column)

  def _values(self, rows: Sequence[Row]) -> list[str]:
    return [t for r in rows for t in r.label]

  def _names_of(self, values: Sequence[str]) -> list[str]:
    return sorted_tags(values)

  def _indices(self, rows: Sequence[Row], path: str, why: str) -> list[np.ndarray]:
    index = {n: i for i, n in enumerate(self.label_names)}
    for r in rows:
      unknown = next((t for t in r.label if t not in index), None)
      if unknown is not None:
        raise DataError(f'{path}:{r.line}: tag {unknown!r} {why}; the tags are {", ".join(self.label_names)}')
    return [np.array([index[t] for t in r.label], np.int64) for r in rows]

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    rows, _ = self._train_split(cfg)
    if cfg.max_train_samples > 0:
      rows = rows[:cfg.max_train_samples]
    self._labels(cfg, rows, cfg.train_file)  # every tag is one of the names
    return self._featurize(rows, tokenizer, cfg, cfg.train_file)[0]

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    if cfg.eval_file:
      path, rows = cfg.eval_file, self._read(cfg.eval_file, cfg)
    else:
      path, rows = cfg.train_file, self._train_split(cfg)[1]
    self._labels(cfg, rows, path)
    return [EvalSet('dev', *self._featurize(rows, tokenizer, cfg, path))]

  def _featurize(self, rows: Sequence[Row], tokenizer, cfg, path: str):
    return conll.featurize([(r.text, r.label) for r in rows], tokenizer, cfg.max_seq_length, path,
                           labels=self.label_names, to_bio=False)

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray], output_dir: str | None) -> dict[str, Any]:
    """Token accuracy, and conlleval's entity scores for chunk tags; predictions_<set>.txt (word gold pred)."""
    data: conll.ConllEvalData = eval_set.data
    if len(logits) != len(data.words):
      raise ValueError(f'{len(logits)} logits for {len(data.words)} sentences of {eval_set.name}')
    outside = 'O' if 'O' in self.label_names else self.label_names[0]
    preds = [conll.word_predictions(np.asarray(l), first, self.label_names, outside)
             for l, first in zip(logits, data.first_positions)]
    result = metrics.entity_scores(data.tags, preds) if is_chunked(self.label_names) else {}
    n_words = sum(len(t) for t in data.tags)
    n_right = sum(g == p for gold, pred in zip(data.tags, preds) for g, p in zip(gold, pred))
    result.update(token_accuracy=n_right / n_words if n_words else 0.0, n_cut_words=data.n_cut_words)
    if output_dir is not None:
      conll.write_predictions(os.path.join(output_dir, f'predictions_{eval_set.name}.txt'), data.words, data.tags,
                              preds)
    return result
