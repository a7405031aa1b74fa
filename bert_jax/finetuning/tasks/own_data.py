"""Your own data: single-text and text-pair classification and regression from any file, by column names.

Files are CSV, TSV, JSONL or Parquet (`bert_jax.data.tables`: by extension; compressed with .gz, .bz2 or .xz after
it, or not; local or remote). The columns are config fields: `text_column` ('text', or 'sentence' when the
file has no 'text'), `text_pair_column` (none by default: single texts), `label_column` ('label').

Multi-label rows hold a set of labels: a JSON list (JSONL, Parquet, or a CSV/TSV cell written as one), or labels
separated by commas; an empty set is allowed (sigmoid cross-entropy per label; micro/macro F1, subset accuracy).

Classification labels are the label column's values, named as written: `label_names` (comma-separated) gives their
order, else they are the training file's distinct values sorted (as numbers when they all are integers). The names
are recorded in the workdir, and predictions and exports answer with them. Regression targets are finite numbers.

Without an `eval_file`, `eval_fraction` of the training file's rows (drawn with `split_seed`) is held out and
evaluated; the split is logged. Every bad row is one DataError naming the file and its line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.files import write_text_atomic
from bert_jax import metrics
from bert_jax.finetuning.tasks.base import EvalSet, Feature
from bert_jax.finetuning.tasks.glue import featurize
from bert_jax.runs import reporting

TEXT_FALLBACK = 'sentence'  # read when text_column is the default 'text' and the file has no such column


@dataclasses.dataclass(frozen=True)
class Columns:
  """Which columns hold the text, the optional second text and the label ('' for none)."""

  text: str = 'text'
  text_pair: str = ''
  label: str = 'label'


@dataclasses.dataclass(frozen=True)
class Row:
  """One example: its text(s), its label as written (classification) or its target (regression), its line."""

  text: str
  text_pair: str | None
  label: Any
  line: int  # 1-based line of the file where the row starts (Parquet: the row's 1-based index)


@dataclasses.dataclass
class FileEvalData:
  """`EvalSet.data`: where the rows came from, their gold labels (indices or targets) and lines."""

  path: str
  labels: np.ndarray
  lines: np.ndarray


# ------------------------------------------------------------------------------------------ reading


def read_rows(path: str, columns: Columns, kind: str) -> list[Row]:
  """The rows of `path` by `columns`; a `columns.label` of '' reads no label (text to predict).

  Labels are as written (classification: a string; JSON numbers and booleans as JSON spells them) or finite
  numbers (regression).

  Raises:
    DataError: a column the file lacks (naming those it has), an empty text, a missing, non-numeric or non-finite
      target, labels that mix numbers and strings: the file and line.
  """
  names, records_ = tables.records(path)
  text = check_columns(path, names, columns)
  rows = [Row(tables.text_at(path, line, r, text),
              tables.text_at(path, line, r, columns.text_pair) if columns.text_pair else None,
              _label(path, line, r, columns.label, kind) if columns.label else None, line) for line, r in records_]
  if columns.label and kind == 'classification':
    _check_one_label_type(path, records_, columns.label)

  return rows


COLUMN_FLAGS = '--config.text_column, --config.text_pair_column or --config.label_column'


def resolve_text_column(path: str, names: Sequence[str], text: str) -> str:
  """`text`, or 'sentence' when `text` is the default 'text' and only 'sentence' is there."""
  return tables.find_column(path, names, text, Columns.text, (TEXT_FALLBACK,), COLUMN_FLAGS)


def check_columns(path: str, names: Sequence[str], columns: Columns) -> str:
  """The text column `read_rows` reads (`resolve_text_column`); DataError naming the file's columns `names` when
  they lack it, the second text's or the label's."""
  text = resolve_text_column(path, names, columns.text)
  for wanted in (columns.text_pair, columns.label):
    if wanted and wanted not in names:
      raise tables.missing_column(path, wanted, names, COLUMN_FLAGS)
  return text


def _label_set(path: str, line: int, value: Any) -> tuple[str, ...]:
  """A multi-label row's labels: a list, a JSON list in a text, or a comma-separated text ('' none)."""
  if isinstance(value, str) and value.strip().startswith('['):
    try:
      value = json.loads(value)
    except ValueError:
      raise DataError(f'{path}:{line}: labels {value!r} start like a JSON list but are not one') from None
  if isinstance(value, str):
    value = [v for v in value.split(',') if v.strip()]
  if not isinstance(value, (list, tuple)):
    raise DataError(f'{path}:{line}: a multi-label row needs a list of labels (or a comma-separated text), '
                    f'got {value!r}')
  labels = []
  for v in value:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
      raise DataError(f'{path}:{line}: a label must be a non-empty text or an integer, got {v!r}')
    labels.append(v.strip() if isinstance(v, str) else str(v))
  return tuple(dict.fromkeys(labels))  # a label given twice is one


def _label(path: str, line: int, record: dict[str, Any], column: str, kind: str) -> str | float | tuple[str, ...]:
  value = tables.value_at(path, line, record, column)
  if kind == 'multilabel':
    return _label_set(path, line, value)
  if kind == 'regression':
    try:
      target = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
      raise DataError(f'{path}:{line}: target {column!r} is {value!r}, not a number') from None
    if not math.isfinite(target) or isinstance(value, bool):
      raise DataError(f'{path}:{line}: target {column!r} is {value!r}; regression needs a finite number')
    return target
  if isinstance(value, (bool, int, float)) and not isinstance(value, str):
    return json.dumps(value)
  if not isinstance(value, str) or not value.strip():
    raise DataError(f'{path}:{line}: label {column!r} must be a non-empty text or number, got {value!r}')
  return value.strip()


def _check_one_label_type(path: str, records_: Sequence[tuple[int, dict[str, Any]]], column: str) -> None:
  """JSONL/Parquet: labels that are all numbers or all strings, never both (1 and "1" would be two classes)."""
  first = {}
  for line, r in records_:
    kind = 'string' if isinstance(r[column], str) else 'number'
    first.setdefault(kind, (line, r[column]))
  if len(first) > 1:
    (l1, v1), (l2, v2) = first['number'], first['string']
    raise DataError(f'{path}:{max(l1, l2)}: labels mix numbers and strings (line {l1}: {v1!r}, line {l2}: '
                    f'{v2!r}); write every label the same way')


# ------------------------------------------------------------------------------------------ labels


def sorted_labels(values: Sequence[str]) -> list[str]:
  """Distinct label values in order: as numbers when every one is an integer, else as strings."""
  distinct = set(values)
  try:
    return sorted(distinct, key=int)
  except ValueError:
    return sorted(distinct)


def parse_label_names(text: str) -> list[str]:
  """label_names as given ('a,b,c'): DataError for an empty or repeated name."""
  names = [n.strip() for n in text.split(',')] if text.strip() else []
  if any(not n for n in names) or len(set(names)) != len(names):
    raise DataError(f'label_names={text!r}: give distinct, non-empty names separated by commas')
  return names


def label_indices(rows: Sequence[Row], names: Sequence[str], path: str, why: str) -> np.ndarray:
  """Each row's label as its index in `names`; DataError at the first label outside them (`why`: whose names)."""
  index = {n: i for i, n in enumerate(names)}
  for r in rows:
    if r.label not in index:
      raise DataError(f'{path}:{r.line}: label {r.label!r} {why}; the labels are {", ".join(names)}')
  return np.array([index[r.label] for r in rows], np.int64)


# ------------------------------------------------------------------------------------------ the task


class FileTask:
  """Classification or regression on the config's files (see the module docstring); one per run.

  Its label names are decided when it first reads data: the config's `label_names`, else the ones recorded in a
  workdir trained before (`recorded_labels`, set by the run), else the training file's sorted values.
  """

  def __init__(self, name: str, kind: str):
    self.name, self.kind = name, kind
    self.label_names: list[str] = []
    self.recorded_labels: list[str] = []
    self._split: tuple[list[Row], list[Row]] | None = None  # the training file: (train, held out)

  @property
  def main_metric(self) -> str:
    return {'classification': 'accuracy', 'multilabel': 'micro_f1'}.get(self.kind, 'pearson')

  @property
  def num_labels(self) -> int:
    if self.kind == 'regression':
      return 1
    if not self.label_names:
      raise RuntimeError('the label names are known once the task has read its data')
    return len(self.label_names)

  def planned_label_names(self, cfg) -> list[str]:
    """The label names a new run of `cfg` takes ([] for regression): label_names, else the training file's values,
    read without deciding this task's names (--print_config)."""
    if self.kind == 'regression':
      return []
    if cfg.label_names:
      return parse_label_names(cfg.label_names)
    return self._names_of(self._values(self._read(cfg.train_file, cfg)))

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    """The training rows (without the held-out ones; the first `max_train_samples` when > 0) as features."""
    rows, _ = self._train_split(cfg)
    if cfg.max_train_samples > 0:
      rows = rows[:cfg.max_train_samples]
    labels = self._labels(cfg, rows, cfg.train_file)
    return [featurize(r.text, r.text_pair, tokenizer, cfg.max_seq_length, _item(l), r.line)[0]
            for r, l in zip(rows, labels)]

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    """'dev': the eval file's rows, or the rows held out of the training file."""
    if cfg.eval_file:
      path, rows = cfg.eval_file, self._read(cfg.eval_file, cfg)
    else:
      path, rows = cfg.train_file, self._train_split(cfg)[1]
    labels = self._labels(cfg, rows, path)
    features = [featurize(r.text, r.text_pair, tokenizer, cfg.max_seq_length, _item(l), r.line)[0]
                for r, l in zip(rows, labels)]
    return [EvalSet('dev', features, FileEvalData(path, labels, np.array([r.line for r in rows], np.int64)))]

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray], output_dir: str | None) -> dict[str, Any]:
    """accuracy and macro_f1 (classification) or pearson and spearmanr (regression); predictions_<set>.tsv."""
    data: FileEvalData = eval_set.data
    scores = np.stack([np.asarray(l, np.float32).reshape(self.num_labels) for l in logits]) if len(logits) \
        else np.zeros((0, self.num_labels), np.float32)
    if len(scores) != len(data.labels):
      raise ValueError(f'{len(scores)} logits for {len(data.labels)} features of {eval_set.name}')
    if self.kind == 'regression':
      preds = scores[:, 0].astype(np.float64)
      result = {'pearson': metrics.pearson(preds, data.labels), 'spearmanr': metrics.spearman(preds, data.labels)}
      values = [format(float(p), '.6g') for p in preds]
    elif self.kind == 'multilabel':
      chosen = scores > 0  # sigmoid above one half
      result = metrics.multilabel_scores(chosen, data.labels.reshape(chosen.shape) > 0.5)
      values = [','.join(n for n, c in zip(self.label_names, row) if c) for row in chosen]
    else:
      preds = scores.argmax(axis=-1)
      result = {'accuracy': metrics.accuracy(preds, data.labels),
                'macro_f1': metrics.f1_macro(preds, data.labels)}
      values = [self.label_names[int(p)] for p in preds]
    if output_dir is not None:
      lines = ['line\tprediction'] + [f'{l}\t{v}' for l, v in zip(data.lines, values)]
      write_text_atomic(os.path.join(output_dir, f'predictions_{eval_set.name}.tsv'), '\n'.join(lines) + '\n')
    return result

  def _train_split(self, cfg) -> tuple[list[Row], list[Row]]:
    """(training rows, held-out rows): all and none with an eval file, else a seeded split, logged once."""
    if self._split is not None:
      return self._split
    if not cfg.train_file:
      raise DataError(f'task {self.name} reads your files: set --config.train_file (and --config.eval_file, or '
                      'hold out --config.eval_fraction of the training file)')
    rows = self._read(cfg.train_file, cfg)
    self._labels(cfg, rows, cfg.train_file, train_rows=rows)  # every class of the file, before any is held out
    if cfg.eval_file:
      self._split = rows, []
      return self._split
    held = int(round(cfg.eval_fraction * len(rows)))
    if not 0 < held < len(rows):
      raise DataError(f'{cfg.train_file}: eval_fraction={cfg.eval_fraction} of its {len(rows)} rows leaves no '
                      'rows to train or to evaluate; give --config.eval_file or another --config.eval_fraction')
    order = np.random.default_rng(cfg.split_seed).permutation(len(rows))
    eval_rows = set(order[:held].tolist())
    self._split = ([r for i, r in enumerate(rows) if i not in eval_rows],
                   [r for i, r in enumerate(rows) if i in eval_rows])
    reporting.log(f'{self.name}: no eval_file: {held} of the {len(rows)} rows of {cfg.train_file} held out for '
                  f'evaluation (eval_fraction={cfg.eval_fraction}, split_seed={cfg.split_seed})')
    return self._split

  def _labels(self, cfg, rows: Sequence[Row], path: str, train_rows: Sequence[Row] | None = None) -> np.ndarray:
    """The rows' labels: targets (regression) or indices in the label names, which the first call decides."""
    if self.kind == 'regression':
      return np.array([r.label for r in rows], np.float64)
    if not self.label_names:
      self._decide_names(cfg, train_rows)
    if cfg.label_names:
      why = 'is not one of label_names'
    elif self.recorded_labels:
      why = 'is not one this run was trained with'
    else:
      why = f'never appears in the training file {cfg.train_file}'
    return self._indices(rows, path, why)

  # What a subclass reading other rows (tagging.TagTask: a tag per word) changes.
  def _read(self, path: str, cfg) -> list[Row]:
    return read_rows(path, columns(cfg), self.kind)

  def _values(self, rows: Sequence[Row]) -> list[str]:
    """The label values of `rows` (their names are decided from the training rows')."""
    return [l for r in rows for l in r.label] if self.kind == 'multilabel' else [r.label for r in rows]

  def _names_of(self, values: Sequence[str]) -> list[str]:
    return sorted_labels(values)

  def _indices(self, rows: Sequence[Row], path: str, why: str):
    if self.kind != 'multilabel':
      return label_indices(rows, self.label_names, path, why)
    index = {n: i for i, n in enumerate(self.label_names)}
    hot = np.zeros((len(rows), len(self.label_names)), np.float32)  # multi-hot rows
    for i, r in enumerate(rows):
      for label in r.label:
        if label not in index:
          raise DataError(f'{path}:{r.line}: label {label!r} {why}; the labels are {", ".join(self.label_names)}')
        hot[i, index[label]] = 1.0
    return hot

  def _decide_names(self, cfg, train_rows: Sequence[Row] | None) -> None:
    """Sets and logs the label names: label_names, else the recorded ones, else the training file's values."""
    if cfg.label_names:
      names = parse_label_names(cfg.label_names)
    elif self.recorded_labels:
      names = list(self.recorded_labels)
    elif train_rows is None:
      self._train_split(cfg)  # reads the training file, which decides them
      return
    else:
      names = self._names_of(self._values(train_rows))
      if not names:
        raise DataError(f'{cfg.train_file}: no row has a label')
      if len(names) < 2 and self.kind != 'multilabel':  # multi-label: one label is a yes/no per row
        raise DataError(f'{cfg.train_file}: every row has the label {names[0]!r}; classification needs two '
                        'labels or more')
    self.label_names = names
    reporting.log(f'{self.name}: {len(names)} labels: {", ".join(names)}')


def columns(cfg) -> Columns:
  """The config's column names."""
  return Columns(cfg.text_column, cfg.text_pair_column, cfg.label_column)


def _item(label) -> int | float:
  return label.item() if isinstance(label, np.generic) else label


TASKS = {'classify': 'classification', 'regress': 'regression', 'multilabel': 'multilabel'}  # task name -> kind

