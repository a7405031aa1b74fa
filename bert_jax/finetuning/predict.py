"""Predictions of a fine-tuned model on new text, for every task kind; nothing is written to its workdir.

Rows come from `read_rows` (plain text, TSV, JSONL, or the task's own file formats: GLUE TSV with
its header, CoNLL columns, SQuAD JSON) and go through the task's own featuriser, the same
batching and the same forward pass as the evaluation path, so the dev set gets the same
predictions that fine-tuning wrote. One process, batched; one compile per batch shape.

Outputs (one dict per row; a kind that predicts by itself, as rerank's {'score', 'probability'}, says its own):
  classification  {'label', 'probabilities': {label: p}}
  regression      {'score'}
  token           {'words', 'tags', 'scores' (the tag's probability), 'entities': [{'type', 'text',
                  'start', 'end'} (word indices, end exclusive)]}
  span            {'answer', 'score' (start + end logit), 'probability', 'start', 'end' (characters
                  in the context), 'n_best': [the same for the next candidates]}
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterator, Sequence

import numpy as np

from bert_jax import files
from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.files import check_regular
from bert_jax.finetuning import kinds
from bert_jax.finetuning.predictor import Predictor
from bert_jax.finetuning.tasks import conll, get_task, glue, own_data, squad
from bert_jax import metrics
from bert_jax.interop.pretrained import FinetunedBert
from bert_jax.model.heads import SEQUENCE_KINDS
from bert_jax.runs import reporting

FORMATS = ('auto', 'txt', 'tsv', 'jsonl', 'glue', 'conll', 'squad')
# Words of raw text for NER: runs of letters/digits, or single other symbols (CoNLL splits punctuation).
_WORD = re.compile(r'\w+|[^\w\s]')


# ------------------------------------------------------------------------------------------ input


def read_rows(path: str, kind: str, task_name: str, fmt: str = 'auto', finetune=None) -> list[dict[str, Any]]:
  """The rows of an input file for a task of `kind`.

  A model fine-tuned on your own files (classify/regress; `finetune` its config) reads a .csv, .tsv, .jsonl or
  .parquet input by the run's own columns (text_column, text_pair_column); a label column is not needed.

  Formats: 'txt' (one row per line: a text; 'a<TAB>b' for pairs; 'question<TAB>context' for
  span tasks), 'tsv' (the same), 'jsonl' (objects with 'text'/'text_pair', 'tokens' (NER),
  'question'/'context', optional 'id'), and the task's own: 'glue' (a GLUE TSV with its header,
  e.g. dev.tsv), 'conll' (word ... tag columns, blank lines between sentences), 'squad' (the
  official JSON). 'auto' picks jsonl/squad/conll/glue/txt from the file's name and first line. Any input may
  be compressed (named .gz, .bz2 or .xz after its own extension) and local or remote (gs://, s3://).

  Raises:
    DataError: a missing, empty or malformed file, or a format that does not fit the task.
  """
  check_regular(path, 'input file')
  if not files.isfile(path):
    raise DataError(f'input file {path} does not exist')
  own = kind_predictions(task_name)
  if own is not None:
    return own.read_rows(path, fmt, finetune)
  if task_name in own_data.TASKS and finetune is not None and fmt == 'auto' and \
      tables.extension(path) in tables.FORMATS:
    columns = dataclasses.replace(own_data.columns(finetune), label='')
    return [{'text': r.text, 'text_pair': r.text_pair} for r in own_data.read_rows(path, columns, kind)]
  fmt = _detect(path, kind, task_name) if fmt == 'auto' else fmt
  if fmt == 'conll':
    if kind != 'token':
      raise DataError(f'{path}: CoNLL input is for token classification; this model is {kind}')
    return [{'words': words} for words, _ in conll.read_conll(path)]
  if fmt == 'squad':
    if kind != 'span':
      raise DataError(f'{path}: SQuAD input is for question answering; this model is {kind}')
    return [{'id': e.id, 'question': e.question, 'context': e.context}
            for e in squad.articles_to_examples(squad.read_articles(path), path)]
  if fmt == 'glue':
    task = glue.TASKS.get(task_name)
    if task is None:
      raise DataError(f'{path}: GLUE input needs a GLUE task; this model was fine-tuned on {task_name}')
    return [{'text': e.text_a, 'text_pair': e.text_b} for e in task.read_examples(path, labelled=False)]
  if fmt == 'jsonl':
    return [_row(obj, kind, f'{path} line {i}') for i, obj in _jsonl(path)]
  return [_row(_fields(line, kind), kind, f'{path} line {i}') for i, line in _lines(path)]


def text_row(kind: str, text: str | None = None, text_pair: str | None = None, question: str | None = None,
             context: str | None = None, task_name: str = '') -> dict[str, Any]:
  """One row from flag values (--text/--text_pair, or --question/--context for span tasks)."""
  own = kind_predictions(task_name) if task_name else None
  if own is not None:
    return own.row(text if text is not None else question, text_pair if text_pair is not None else context)
  if kind == 'span':
    return _row({'question': question if question is not None else text,
                 'context': context if context is not None else text_pair}, kind, 'the flags')
  return _row({'text': text, 'text_pair': text_pair}, kind, 'the flags')


def kind_predictions(task_name: str):
  """The predictions of a task kind that makes its own (its class's `predictions`: rows, scores and TSV lines, as
  rerank's (query, passage) pairs), or None: the head tasks', made here."""
  return getattr(kinds.kind_of(task_name), 'predictions', None)


def _detect(path: str, kind: str, task_name: str) -> str:
  name = os.path.basename(files.without_compression(path)).lower()
  if name.endswith('.jsonl'):
    return 'jsonl'
  if name.endswith('.json'):
    return 'squad'
  with files.open(path, encoding='utf-8', errors='replace') as f:
    first = f.readline()
  if kind == 'token' and (first.startswith('-DOCSTART-') or re.search(r'\.(train|testa|testb|conll)$', name)):
    return 'conll'
  task = glue.TASKS.get(task_name)
  if task is not None and task.has_header and task.text_a in first.rstrip('\n').split('\t'):
    return 'glue'
  return 'txt'


def _lines(path: str) -> Iterator[tuple[int, str]]:
  with files.open(path, encoding='utf-8', errors='replace') as f:
    lines = [(i, l.rstrip('\n').rstrip('\r')) for i, l in enumerate(f, 1)]
  lines = [(i, l) for i, l in lines if l.strip()]
  if not lines:
    raise DataError(f'input file {path} has no text')
  return iter(lines)


def _jsonl(path: str) -> Iterator[tuple[int, dict]]:
  return iter(list(tables.json_objects(path, _lines(path))))


def _fields(line: str, kind: str) -> dict[str, Any]:
  parts = line.split('\t')
  if len(parts) > 2:
    raise DataError(f'{len(parts)} tab-separated fields; give one text or two')
  if kind == 'span':
    return {'question': parts[0], 'context': parts[1] if len(parts) == 2 else None}
  return {'text': parts[0], 'text_pair': parts[1] if len(parts) == 2 else None}


def _row(obj: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
  """A validated row: the keys the task kind reads, plus 'id' when given."""
  row = {'id': obj['id']} if 'id' in obj else {}
  if kind == 'span':
    if not _text(obj.get('question')) or not _text(obj.get('context')):
      raise DataError(f'{where}: a question-answering row needs a question and a context')
    return {**row, 'question': obj['question'], 'context': obj['context']}
  if kind == 'token':
    words = obj.get('words', obj.get('tokens'))
    if words is None and _text(obj.get('text')):
      words = _WORD.findall(obj['text'])
    if not words or not all(isinstance(w, str) and w for w in words):
      raise DataError(f'{where}: a token-classification row needs a text (or a list of "tokens")')
    return {**row, 'words': list(words)}
  if not _text(obj.get('text')):
    raise DataError(f'{where}: a row needs a "text"')
  if obj.get('text_pair') is not None and not _text(obj['text_pair']):
    raise DataError(f'{where}: an empty text_pair')
  return {**row, 'text': obj['text'], 'text_pair': obj.get('text_pair')}


def _text(value) -> bool:
  return isinstance(value, str) and bool(value.strip())


# ------------------------------------------------------------------------------------------ model

def predict(tuned: FinetunedBert, rows: Sequence[dict[str, Any]], *, batch_size: int = 64, n_best: int = 5,
            log=reporting.log) -> list[dict[str, Any]]:
  """Predictions for `rows` (see `read_rows`), one dict per row in order (module docstring); warnings and each
  compile to `log`, a long run's progress lines through `reporting` (`Predictor.logits`)."""
  own = kind_predictions(tuned.task['name'])
  if own is not None:
    return own.predict(tuned, rows, batch_size=batch_size, log=log)
  kind, ft, tokenizer = tuned.task['kind'], tuned.finetune, tuned.tokenizer
  if kind in SEQUENCE_KINDS:
    check_pairs(tuned.task['name'], rows,
                bool(ft.text_pair_column) if tuned.task['name'] in own_data.TASKS else None)
  predictor = Predictor(tuned, batch_size, log)
  if kind in SEQUENCE_KINDS:
    featurized = [glue.featurize(r['text'], r.get('text_pair'), tokenizer, ft.max_seq_length) for r in rows]
    _warn_cut(log, sum(cut for _, cut in featurized), len(rows), f'texts were longer than max_seq_length='
              f'{ft.max_seq_length} tokens (the run\'s) and were truncated')
    return [_sequence_output(kind, label_names(tuned.task), l) for l in predictor.logits([f for f, _ in featurized])]
  if kind == 'token':
    features, data = conll.featurize([(r['words'], ['O'] * len(r['words'])) for r in rows], tokenizer,
                                     ft.max_seq_length)
    names = label_names(tuned.task) or conll.LABELS
    return [_token_output(words, l, first, names)
            for words, l, first in zip(data.words, predictor.logits(features), data.first_positions)]
  examples = [squad.SquadExample(str(r.get('id', i)), r['question'].lstrip(), r['context'], [])
              for i, r in enumerate(rows)]
  # featurize warns of questions cut to max_query_length
  features, offsets = squad.featurize(examples, tokenizer, max_seq_length=ft.max_seq_length,
                                      doc_stride=ft.doc_stride, max_query_length=ft.max_query_length, train=False)
  answers, _ = squad.n_best_answers(examples, features, offsets, predictor.logits(features),
                                    n_best_size=ft.n_best_size, max_answer_length=ft.max_answer_length,
                                    keep=max(n_best, 1))
  return [_span_output(a) for a in answers]


def check_pairs(task_name: str, rows: Sequence[dict[str, Any]], pair: bool | None = None) -> None:
  """DataError when rows do not match what the task read: one sentence (SST-2, CoLA) or a pair (RTE, ...);
  `pair` for a task on your own files (whether it had a text_pair_column), else the GLUE task's."""
  task = glue.TASKS.get(task_name)
  if pair is None and task is None:
    return
  pair = task.text_b is not None if pair is None else pair
  for i, r in enumerate(rows):
    if (r.get('text_pair') is not None) != pair:
      where = f'row {i + 1}' if len(rows) > 1 else 'the input'
      raise DataError(f'{where}: {task_name} classifies sentence pairs: give the second text (--text_pair, or '
                      'a<TAB>b in --input)' if pair else
                      f'{where}: {task_name} classifies single sentences: drop the second text (--text_pair, or '
                      'the part after a tab in --input); the model never saw pairs')


def _warn_cut(log, cut: int, total: int, what: str) -> None:
  if cut:
    log(f'warning: {cut:,} of {total:,} {what}')


def label_names(task: dict[str, Any]) -> list[str]:
  """The task's label names: as recorded in the workdir, else (older workdirs) the ones they had: the labels as the
  task's files write them (GLUE's '0'/'1' then, not today's names)."""
  if task.get('label_names'):
    return list(task['label_names'])
  own = get_task(task['name'])
  return list(getattr(own, 'file_labels', None) or getattr(own, 'label_names', []))


def _sequence_output(kind: str, names: Sequence[str], logits: np.ndarray) -> dict[str, Any]:
  logits = np.asarray(logits, np.float64).reshape(-1)
  if kind == 'regression':
    return {'score': float(logits[0])}
  if kind == 'multilabel':  # each label on its own: a sigmoid, predicted above one half
    p = 1 / (1 + np.exp(-logits))
    return {'labels': [n for n, v in zip(names, p) if v > 0.5],
            'probabilities': {n: float(v) for n, v in zip(names, p)}}
  p = np.exp(logits - logits.max())
  p /= p.sum()
  return {'label': names[int(np.argmax(logits))], 'probabilities': {n: float(v) for n, v in zip(names, p)}}


def _token_output(words: list[str], logits: np.ndarray, first: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
  logits = np.asarray(logits, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  tags = conll.word_predictions(logits, first, names, 'O' if 'O' in names else names[0])
  scores = [float(p[f].max()) if f >= 0 else None for f in first]
  entities = [{'type': typ, 'text': ' '.join(words[s:e + 1]), 'start': s, 'end': e + 1}
              for s, e, typ in sorted(metrics.conll_chunks(tags))]
  return {'words': words, 'tags': tags, 'scores': scores, 'entities': entities}


def _span_output(answers: list[squad.Answer]) -> dict[str, Any]:
  if not answers:
    return {'answer': '', 'score': None, 'probability': None, 'start': None, 'end': None, 'n_best': []}
  one = lambda a: {'answer': a.text, 'score': a.score, 'probability': a.probability,  # pylint: disable=unnecessary-lambda-assignment
                   'start': a.start, 'end': a.end}
  return {**one(answers[0]), 'n_best': [one(a) for a in answers[1:]]}


# ------------------------------------------------------------------------------------------ output


def tsv_lines(kind: str, rows: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]],
              task_name: str = '') -> list[str]:
  """A header and one line per row: the input and the prediction, tab-separated."""
  own = kind_predictions(task_name) if task_name else None
  if own is not None:
    return own.tsv_lines(rows, outputs)
  clean = lambda s: '' if s is None else str(s).replace('\t', ' ').replace('\n', ' ')  # pylint: disable=unnecessary-lambda-assignment
  if kind in ('classification', 'multilabel'):
    names = list(outputs[0]['probabilities']) if outputs else []
    lines = ['text\ttext_pair\tlabel\t' + '\t'.join(f'p_{n}' for n in names)]
    label = lambda o: o['label'] if 'label' in o else ','.join(o['labels'])  # pylint: disable=unnecessary-lambda-assignment
    lines += [f'{clean(r["text"])}\t{clean(r.get("text_pair"))}\t{label(o)}\t'
              + '\t'.join(f'{o["probabilities"][n]:.6f}' for n in names) for r, o in zip(rows, outputs)]
  elif kind == 'regression':
    lines = ['text\ttext_pair\tscore'] + [f'{clean(r["text"])}\t{clean(r.get("text_pair"))}\t{o["score"]:.6g}'
                                          for r, o in zip(rows, outputs)]
  elif kind == 'token':
    lines = ['words\ttags'] + [' '.join(o['words']) + '\t' + ' '.join(o['tags']) for o in outputs]
  else:
    lines = ['question\tanswer\tscore\tprobability'] + [
        f'{clean(r["question"])}\t{clean(o["answer"])}\t{clean(o["score"])}\t{clean(o["probability"])}'
        for r, o in zip(rows, outputs)]
  return lines
