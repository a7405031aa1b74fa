"""Your own extractive question answering data: SQuAD-format JSON, or JSONL/CSV/TSV/Parquet rows by column names.

A `.json` file is read as SQuAD's official format ({"data": [{"paragraphs": [{"context", "qas"}]}]}). Rows hold a
question (`text_column`; the default 'text' also reads 'question'), its context (`text_pair_column`; '' reads
'context') and its answers (`label_column`; the default 'label' also reads 'answers'), written as Hugging Face
datasets write them ({"text": [...], "answer_start": [...]}), as a list of {"text", "answer_start"}, or as answer
texts (a string or a list), each found at its first place in the context. A row without an answer is a question
the context cannot answer: with any such row the task scores as SQuAD v2.0 (no-answer threshold), else as v1.1.

Without an `eval_file`, `eval_fraction` of the contexts (drawn with `split_seed`; every question of a context on
one side) are held out and evaluated. Metrics are SQuAD's official exact match and F1, as for the shipped task.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from bert_jax import files
from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import own_data, squad
from bert_jax.runs import reporting

QUESTION_COLUMNS, CONTEXT_COLUMNS, ANSWER_COLUMNS = ('question',), ('context',), ('answers',)
_FLAGS = ("--config.text_column to the questions', --config.text_pair_column to the contexts' and "
          "--config.label_column to the answers' column")


def read_examples(path: str, cfg) -> list[squad.SquadExample]:
  """The questions of a SQuAD JSON file or of a row file (module docstring), in file order."""
  if is_squad_file(path):
    return squad.articles_to_examples(squad.read_articles(path), path)
  names, records = tables.records(path)
  question, context, answers = row_columns(path, names, cfg)
  examples = []
  for line, record in records:
    q, c = (_text(path, line, record, col) for col in (question, context))
    found = _answers(path, line, c, record.get(answers))
    examples.append(squad.SquadExample(id=str(record.get('id', line)), question=q.lstrip(), context=c,
                                       answers=found, is_impossible=not found))
  return examples


def is_squad_file(path: str) -> bool:
  """Whether `path` is read as SQuAD's JSON format (else as rows by columns): a .json file, compressed or not."""
  return os.path.splitext(files.without_compression(path))[1].lower() == '.json'


def row_columns(path: str, names: Sequence[str], cfg) -> tuple[str, str, str]:
  """(question, context, answers) columns of a row file whose columns are `names`; DataError naming them."""
  return (tables.find_column(path, names, cfg.text_column, own_data.Columns.text, QUESTION_COLUMNS, _FLAGS),
          tables.find_column(path, names, cfg.text_pair_column, '', CONTEXT_COLUMNS, _FLAGS),
          tables.find_column(path, names, cfg.label_column, own_data.Columns.label, ANSWER_COLUMNS, _FLAGS))


def _text(path: str, line: int, record: dict[str, Any], column: str) -> str:
  value = record.get(column)
  if not isinstance(value, str) or not value.strip():
    raise DataError(f'{path}:{line}: {column!r} must be a non-empty text, got {value!r}')
  return value


def _answers(path: str, line: int, context: str, value: Any) -> list[dict[str, Any]]:
  """[{'text', 'answer_start'}] of a row; each answer checked against its context."""
  if isinstance(value, str) and value.strip().startswith(('{', '[')):  # CSV/TSV: JSON in a cell
    try:
      value = json.loads(value)
    except ValueError:
      pass
  if isinstance(value, dict):  # Hugging Face datasets: {"text": [...], "answer_start": [...]}
    texts, starts = value.get('text', []), value.get('answer_start', [])
    if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
      raise DataError(f'{path}:{line}: answers {value!r} must hold lists "text" and "answer_start" of one length')
    value = [{'text': t, 'answer_start': s} for t, s in zip(texts, starts)]
  if value is None or value == '':
    value = []
  items = value if isinstance(value, list) else [value]
  out = []
  for item in items:
    if isinstance(item, dict):
      text, start = item.get('text'), item.get('answer_start')
    else:
      text, start = item, None
    if not isinstance(text, str) or not text.strip():
      raise DataError(f'{path}:{line}: an answer must be a non-empty text, got {item!r}')
    if start is None:
      start = context.find(text)
    if not isinstance(start, int) or start < 0 or context[start:start + len(text)] != text:
      raise DataError(f'{path}:{line}: answer {text!r} is not in its context'
                      + (f' at character {start}' if isinstance(start, int) and start >= 0 else ''))
    out.append({'text': text, 'answer_start': start})
  return out


class AnswerTask(squad.Squad):
  """Extractive QA on the config's files; v2.0 scoring (no-answer threshold) when a question has no answer."""

  def __init__(self, name: str = 'qa'):
    super().__init__(version_2=False)
    self.name = name

  def examples(self, cfg) -> tuple[list[squad.SquadExample], list[squad.SquadExample]]:
    key = (cfg.train_file, cfg.eval_file, cfg.eval_fraction, cfg.split_seed, cfg.max_train_samples)
    if self._cache is None or self._cache[0] != key:
      self._cache = (key, self._load(cfg))
    return self._cache[1]

  def _load(self, cfg) -> tuple[list[squad.SquadExample], list[squad.SquadExample]]:
    if not cfg.train_file:
      raise DataError(f'task {self.name} reads your files: set --config.train_file (and --config.eval_file, or '
                      'hold out --config.eval_fraction of the training file\'s contexts)')
    train = read_examples(cfg.train_file, cfg)
    if cfg.eval_file:
      evals = read_examples(cfg.eval_file, cfg)
    else:
      train, evals = _split_by_context(train, cfg)
    if cfg.max_train_samples > 0:
      train = train[:cfg.max_train_samples]
    if not train or not evals:
      raise DataError(f'{cfg.train_file}: no questions to {"train on" if not train else "evaluate"}')
    self.version_2 = any(e.is_impossible for e in train + evals)
    return train, evals


def _split_by_context(examples: list[squad.SquadExample], cfg):
  """(train, held out): eval_fraction of the distinct contexts, drawn with split_seed; a context's questions stay
  together, so no paragraph is on both sides."""
  contexts = list(dict.fromkeys(e.context for e in examples))
  held = int(round(cfg.eval_fraction * len(contexts)))
  if not 0 < held < len(contexts):
    raise DataError(f'{cfg.train_file}: eval_fraction={cfg.eval_fraction} of its {len(contexts)} contexts leaves '
                    'none to train on or to evaluate; give --config.eval_file or another --config.eval_fraction')
  order = np.random.default_rng(cfg.split_seed).permutation(len(contexts))
  held_out = {contexts[i] for i in order[:held].tolist()}
  train = [e for e in examples if e.context not in held_out]
  evals = [e for e in examples if e.context in held_out]
  reporting.log(f'{cfg.task}: no eval_file: {held} of the {len(contexts)} contexts of {cfg.train_file} '
                f'({len(evals)} questions) held out for evaluation (eval_fraction={cfg.eval_fraction}, '
                f'split_seed={cfg.split_seed})')
  return train, evals
