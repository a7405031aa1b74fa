"""GLUE tasks: TSV readers, featurisers and the metrics GLUE reports.

Files are the GLUE download's: `train.tsv` and `dev.tsv` (MNLI: `dev_matched.tsv` and
`dev_mismatched.tsv`) under `cfg.data_dir`. Rows are split on tabs only, never csv-quoted
(GLUE text holds unbalanced quotes), and columns are found by header name; CoLA alone has no
header. Labels are indexed in Hugging Face's order of `label_values` (the file's spellings: SST-2's '0'/'1')
and named by `label_names`, GLUE's (and Hugging Face datasets') names: SST-2 negative/positive, CoLA
unacceptable/acceptable, MRPC not_equivalent/equivalent, QQP not_duplicate/duplicate, WNLI
not_entailment/entailment; MNLI, QNLI and RTE write their names in the files. Prediction files keep the
files' spellings (GLUE's submission format).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from bert_jax import files
from bert_jax.errors import DataError
from bert_jax.files import check_regular, not_utf8, write_text_atomic
from bert_jax import metrics
from bert_jax.finetuning.tasks.base import EvalSet, Feature

Column = str | int  # a header name, or a 0-based index in a file without a header


@dataclasses.dataclass(frozen=True)
class Example:
  """One TSV row: text(s), label (class index or regression target) and where it came from."""

  text_a: str
  text_b: str | None
  label: int | float
  row: int  # 0-based data row (header not counted)
  line: int  # 1-based line in the file


@dataclasses.dataclass
class GlueEvalData:
  """`EvalSet.data` of a GLUE set: gold labels and row ids in feature order."""

  path: str
  labels: np.ndarray  # int64 class indices, or float64 targets for regression
  row_ids: np.ndarray  # int64


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE task: which columns to read, its labels and its metrics."""

  name: str
  text_a: Column
  text_b: Column | None
  label: Column
  label_names: list[str] = dataclasses.field(default_factory=lambda: ['0', '1'])  # [] regression
  label_values: tuple[str, ...] = ()  # how the file writes each label, in index order; () as label_names
  main_metric: str = 'accuracy'
  extra_metrics: tuple[str, ...] = ()  # beside accuracy and macro_f1 (classification) / pearson+spearmanr
  eval_files: tuple[tuple[str, str], ...] = (('dev', 'dev.tsv'),)  # (set name, file name)

  @property
  def kind(self) -> str:
    return 'classification' if self.label_names else 'regression'

  @property
  def num_labels(self) -> int:
    return len(self.label_names) or 1

  @property
  def file_labels(self) -> list[str]:
    """Each label as the files write it, in index order (the names an older workdir recorded)."""
    return list(self.label_values or self.label_names)

  @property
  def has_header(self) -> bool:
    return isinstance(self.label, str)

  def read_examples(self, path: str, labelled: bool = True, limit: int = 0) -> list[Example]:
    """All rows of `path` (the first `limit` when > 0); DataError naming the file (and line) for anything unusable
    among them.

    With `labelled` False (new text to predict) the label column may be absent; labels are 0.
    """
    lines = _read_lines(path)
    if self.has_header:
      header, lines = [c.strip() for c in lines[0][1]], lines[1:]
      columns = self._column_indices(path, header, labelled)
    else:
      columns = (self.text_a, self.text_b, self.label if labelled else None)
    if limit > 0:  # rows past the ones asked for are not parsed (a short run of SST-2 reads 67k rows otherwise)
      lines = lines[:limit]
    examples = [self._example(path, line_no, fields, columns, row)
                for row, (line_no, fields) in enumerate(lines)]
    if not examples:
      raise DataError(f'{path} has no data rows')
    return examples

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    """Features of the training file, the first `cfg.max_train_samples` rows when that is > 0."""
    examples = self.read_examples(cfg.train_file or os.path.join(cfg.data_dir, 'train.tsv'),
                                  limit=cfg.max_train_samples)
    return [_feature(e, tokenizer, cfg.max_seq_length) for e in examples]

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    """One set per dev file ('dev'; MNLI: 'dev_matched', 'dev_mismatched'); cfg.eval_file: 'dev'."""
    named = ((('dev', cfg.eval_file),) if cfg.eval_file else
             tuple((name, os.path.join(cfg.data_dir, f)) for name, f in self.eval_files))
    return [self._eval_set(name, path, cfg, tokenizer) for name, path in named]

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray],
               output_dir: str | None) -> dict[str, Any]:
    """GLUE's metrics for `eval_set`; writes predictions_<set>.tsv under `output_dir`."""
    data: GlueEvalData = eval_set.data
    scores = np.stack([np.asarray(l, np.float32).reshape(self.num_labels) for l in logits]) \
        if len(logits) else np.zeros((0, self.num_labels), np.float32)
    if len(scores) != len(data.labels):
      raise ValueError(f'{len(scores)} logits for {len(data.labels)} features of {eval_set.name}')
    if self.kind == 'regression':
      preds = scores[:, 0].astype(np.float64)
      result = {m: _METRICS[m](preds, data.labels) for m in ('pearson', 'spearmanr')}
    else:
      preds = scores.argmax(axis=-1)
      result = {m: _METRICS[m](preds, data.labels) for m in ('accuracy',) + self.extra_metrics + ('macro_f1',)}
    if output_dir is not None:
      self._write_predictions(os.path.join(output_dir, f'predictions_{eval_set.name}.tsv'),
                              data.row_ids, preds)
    return result

  def _eval_set(self, name: str, path: str, cfg, tokenizer) -> EvalSet:
    examples = self.read_examples(path)
    features = [_feature(e, tokenizer, cfg.max_seq_length) for e in examples]
    dtype = np.float64 if self.kind == 'regression' else np.int64
    data = GlueEvalData(path=path, labels=np.array([e.label for e in examples], dtype),
                        row_ids=np.array([e.row for e in examples], np.int64))
    return EvalSet(name, features, data)

  def _column_indices(self, path: str, header: list[str], labelled: bool = True) -> tuple[int, int | None, int]:
    wanted = [c for c in (self.text_a, self.text_b, self.label if labelled else None) if c is not None]
    missing = [c for c in wanted if c not in header]
    if missing:
      raise DataError(f'{path}: the header lacks column(s) {", ".join(missing)}; {self.name} '
                      f'needs {", ".join(wanted)} but the header has {", ".join(header)}')
    index = {c: header.index(c) for c in wanted}
    return index[self.text_a], index.get(self.text_b), index.get(self.label)

  def _example(self, path: str, line_no: int, fields: list[str],
               columns: tuple[int, int | None, int], row: int) -> Example:
    a, b, label = columns
    needed = max(c for c in columns if c is not None) + 1
    if len(fields) < needed:
      raise DataError(f'{path}:{line_no}: {len(fields)} tab-separated column(s), {self.name} '
                      f'needs at least {needed}')
    text_a = _text(path, line_no, fields[a])
    text_b = None if b is None else _text(path, line_no, fields[b])
    value = 0 if label is None else self._label(path, line_no, fields[label])
    return Example(text_a, text_b, value, row, line_no)

  def _label(self, path: str, line_no: int, value: str) -> int | float:
    value = value.strip()
    if self.kind == 'regression':
      try:
        return float(value)
      except ValueError:
        raise DataError(f'{path}:{line_no}: label {value!r} is not a number') from None
    if value not in self.file_labels:
      raise DataError(f'{path}:{line_no}: label {value!r} is not a {self.name} label; valid '
                      f'labels are {", ".join(self.file_labels)}')
    return self.file_labels.index(value)

  def _write_predictions(self, path: str, row_ids: np.ndarray, preds: np.ndarray) -> None:
    if self.kind == 'regression':
      values = [format(float(p), '.6g') for p in preds]
    else:
      values = [self.file_labels[int(p)] for p in preds]  # GLUE's submission format
    lines = ['index\tprediction'] + [f'{r}\t{v}' for r, v in zip(row_ids, values)]
    write_text_atomic(path, '\n'.join(lines) + '\n')


_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    'accuracy': metrics.accuracy,
    'f1': metrics.f1_binary,
    'macro_f1': metrics.f1_macro,
    'matthews_corrcoef': metrics.matthews_corrcoef,
    'pearson': metrics.pearson,
    'spearmanr': metrics.spearman,
}

_NLI = ['entailment', 'not_entailment']
_BINARY = ('0', '1')  # how CoLA, SST-2, MRPC, QQP and WNLI write their labels

TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask('cola', text_a=3, text_b=None, label=1, label_names=['unacceptable', 'acceptable'],
             label_values=_BINARY, main_metric='matthews_corrcoef', extra_metrics=('matthews_corrcoef',)),
    GlueTask('sst2', text_a='sentence', text_b=None, label='label', label_names=['negative', 'positive'],
             label_values=_BINARY),
    GlueTask('mrpc', text_a='#1 String', text_b='#2 String', label='Quality',
             label_names=['not_equivalent', 'equivalent'], label_values=_BINARY, main_metric='f1',
             extra_metrics=('f1',)),
    GlueTask('qqp', text_a='question1', text_b='question2', label='is_duplicate',
             label_names=['not_duplicate', 'duplicate'], label_values=_BINARY, main_metric='f1',
             extra_metrics=('f1',)),
    GlueTask('stsb', text_a='sentence1', text_b='sentence2', label='score', label_names=[],
             main_metric='pearson'),
    GlueTask('mnli', text_a='sentence1', text_b='sentence2', label='gold_label',
             label_names=['contradiction', 'entailment', 'neutral'],
             eval_files=(('dev_matched', 'dev_matched.tsv'),
                         ('dev_mismatched', 'dev_mismatched.tsv'))),
    GlueTask('qnli', text_a='question', text_b='sentence', label='label', label_names=list(_NLI)),
    GlueTask('rte', text_a='sentence1', text_b='sentence2', label='label', label_names=list(_NLI)),
    GlueTask('wnli', text_a='sentence1', text_b='sentence2', label='label',
             label_names=['not_entailment', 'entailment'], label_values=_BINARY),
)}


def get_task(name: str) -> GlueTask:
  """The GLUE task called `name`; DataError listing the known ones otherwise."""
  if name not in TASKS:
    raise DataError(f'unknown GLUE task {name!r}; known: {", ".join(TASKS)}')
  return TASKS[name]


def _read_lines(path: str) -> list[tuple[int, list[str]]]:
  """(1-based line number, tab-split fields) of each non-blank line."""
  check_regular(path, 'GLUE file')
  if not files.isfile(path):
    raise DataError(f'{path} does not exist; set data_dir (or train_file/eval_file) to the '
                    'GLUE task folder')
  try:
    with files.open(path, encoding='utf-8-sig') as f:  # -sig: some MRPC copies start with a BOM
      raw = f.read().split('\n')
  except UnicodeDecodeError:
    raise not_utf8(path) from None
  lines = [(i + 1, l.rstrip('\r').split('\t')) for i, l in enumerate(raw) if l.rstrip('\r')]
  if not lines:
    raise DataError(f'{path} is empty')
  return lines


def _text(path: str, line_no: int, value: str) -> str:
  if not value.strip():
    raise DataError(f'{path}:{line_no}: empty sentence')
  return value


def featurize(text_a: str, text_b: str | None, tokenizer, max_length: int, label: int | float = 0,
              index: int = 0) -> tuple[Feature, bool]:
  """([CLS] text_a [SEP] (text_b [SEP]) truncated longest-first to `max_length`, whether it was cut)."""
  ids, type_ids, truncated = tokenizer.encode_inputs(text_a, text_b, max_length=max_length)
  return Feature(input_ids=np.asarray(ids, np.int32), token_type_ids=np.asarray(type_ids, np.int32),
                 label=label, example_index=index), truncated


def _feature(example: Example, tokenizer, max_length: int) -> Feature:
  return featurize(example.text_a, example.text_b, tokenizer, max_length, example.label, example.row)[0]
