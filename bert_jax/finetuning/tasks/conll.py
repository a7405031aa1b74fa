"""CoNLL-2003 English NER: reader, first-sub-token featuriser and conlleval scoring.

Files (`token POS chunk NER` per line, a blank line after each sentence, `-DOCSTART-` lines
between documents) are eng.train, eng.testa (dev) and eng.testb (test). Their tags are
IOB1; they are converted to BIO before training and scoring. Each word is tokenized on its
own; its label sits on its first sub-token and the model's prediction for the word is read
there. Words with no sub-token (empty after tokenization, or cut off by max_seq_length) are
predicted 'O', so they still count against recall.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import numpy as np

from bert_jax import files
from bert_jax.data import tokenization
from bert_jax.errors import ConfigError, DataError
from bert_jax.files import check_regular, not_utf8, write_text_atomic
from bert_jax import metrics
from bert_jax.finetuning.tasks.base import IGNORE, EvalSet, Feature
from bert_jax.runs import reporting

LABELS = ['O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC', 'B-ORG', 'I-ORG', 'B-MISC', 'I-MISC']
TRAIN_FILE, DEV_FILE, TEST_FILE = 'eng.train', 'eng.testa', 'eng.testb'


@dataclasses.dataclass
class ConllEvalData:
  """`EvalSet.data` of a CoNLL set, one entry per sentence in feature order."""

  path: str
  words: list[list[str]]
  tags: list[list[str]]  # gold, BIO
  first_positions: list[np.ndarray]  # int32 per word: its first sub-token's index, or -1
  n_cut_words: int = 0  # words lost to max_seq_length (predicted 'O')


def read_conll(path: str, labels: Sequence[str] | None = LABELS) -> list[tuple[list[str], list[str]]]:
  """Sentences of a CoNLL file as (words, tags), tags as written (IOB1 for CoNLL-2003).

  Args:
    path: the file.
    labels: the tags a line may have (None: any; the tagging task's own files).

  Returns:
    One (words, tags) pair per sentence. DataError naming file:line for a line with fewer
    than 2 fields or a tag outside `labels`; DataError for a missing or empty file.
  """
  check_regular(path, 'CoNLL file')
  if not files.isfile(path):
    raise DataError(f'{path} does not exist; set data_dir to the CoNLL-2003 folder '
                    f'({TRAIN_FILE}, {DEV_FILE}, {TEST_FILE}) or train_file/eval_file')
  sentences, words, tags = [], [], []
  try:
    with files.open(path, encoding='utf-8') as f:
      lines = f.read().split('\n')
  except UnicodeDecodeError:
    raise not_utf8(path) from None
  for line_no, line in enumerate(lines, 1):
    fields = line.split()
    if not fields:
      if words:
        sentences.append((words, tags))
      words, tags = [], []
      continue
    if fields[0] == '-DOCSTART-':
      continue
    words.append(fields[0])
    tags.append(_tag(path, line_no, fields, labels))
  if words:
    sentences.append((words, tags))
  if not sentences:
    raise DataError(f'{path} holds no sentences')
  return sentences


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
  """IOB1 -> BIO: an I- that does not continue a chunk of its type becomes B-.

  BIO input comes back unchanged.
  """
  out, prev = [], 'O'
  for tag in tags:
    if tag.startswith('I-') and not (prev != 'O' and prev[2:] == tag[2:]):
      tag = 'B-' + tag[2:]
    out.append(tag)
    prev = tag
  return out


def featurize(sentences: Sequence[tuple[list[str], list[str]]], tokenizer, max_seq_length: int,
              path: str = '', labels: Sequence[str] = LABELS, to_bio: bool = True
              ) -> tuple[list[Feature], ConllEvalData]:
  """Features ([CLS] sub-tokens [SEP], or the tokenizer's own template: <s> ... </s>; labels on first sub-tokens)
  of IOB1/BIO sentences.

  Args:
    sentences: (words, tags) pairs as `read_conll` returns them.
    labels: the tag of each label id (CoNLL-2003's, or a tagging task's own).
    to_bio: IOB1 tags are made BIO (CoNLL-2003); False keeps the tags as written.
    tokenizer: has encode(text) -> ids (no specials) and cls_id/sep_id.
    max_seq_length: length limit including [CLS] and [SEP]; trailing sub-tokens past it are
      dropped, and words whose first sub-token goes with them are cut (logged as a warning).
    path: the file the sentences came from, for the warning and `ConllEvalData.path`.

  Returns:
    (features, data): one feature per sentence, example_index = its sentence index.
  """
  template = tokenization.template_of(tokenizer)
  if max_seq_length < template.single_specials + 1:
    raise ConfigError(f'max_seq_length={max_seq_length} leaves no room for a word after '
                      '[CLS]/[SEP]; use a larger max_seq_length')
  features, data = [], ConllEvalData(path, [], [], [])
  index_of = {label: i for i, label in enumerate(labels)}
  for index, (words, raw_tags) in enumerate(sentences):
    tags = iob1_to_iob2(raw_tags) if to_bio else list(raw_tags)
    budget = max_seq_length - template.single_specials
    ids, token_labels, first, n_cut = _sentence_tokens(words, tags, tokenizer, budget, index_of, len(template.head))
    input_ids, token_type_ids = template.single(ids)
    features.append(Feature(
        input_ids=np.array(input_ids, np.int32), token_type_ids=np.array(token_type_ids, np.int32),
        token_labels=np.array([IGNORE] * len(template.head) + token_labels + [IGNORE] * len(template.single_tail),
                              np.int32),
        example_index=index))
    data.words.append(list(words))
    data.tags.append(tags)
    data.first_positions.append(first)
    data.n_cut_words += n_cut
  if data.n_cut_words:
    n_words = sum(len(w) for w in data.words)
    reporting.log(f'warning: {path or "CoNLL data"}: {data.n_cut_words} of {n_words} words cut off by '
                  f'max_seq_length={max_seq_length}; they are predicted O')
  return features, data


def _sentence_tokens(words: Sequence[str], tags: Sequence[str], tokenizer, budget: int,
                     index_of: dict[str, int], head: int = 1) -> tuple[list[int], list[int], np.ndarray, int]:
  """(ids, token labels, first-sub-token position per word, cut words) of one sentence."""
  ids, labels, n_cut = [], [], 0
  first = np.full(len(words), -1, np.int32)
  encode_word = getattr(tokenizer, 'encode_word', tokenizer.encode)  # a word's pieces inside a sentence
  for w, (word, tag) in enumerate(zip(words, tags)):
    pieces = encode_word(word)
    if not pieces:
      continue
    room = budget - len(ids)
    if room <= 0:
      n_cut += 1
      continue
    first[w] = len(ids) + head  # + the template's specials before the text ([CLS])
    pieces = pieces[:room]
    ids.extend(pieces)
    labels.extend([index_of[tag]] + [IGNORE] * (len(pieces) - 1))
  return ids, labels, first, n_cut


class Conll2003:
  """The CoNLL-2003 English NER task (token classification over LABELS)."""

  name = 'conll2003'
  kind = 'token'
  label_names = LABELS
  num_labels = len(LABELS)
  main_metric = 'f1'

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    """Features of eng.train (or cfg.train_file); the first cfg.max_train_samples if > 0."""
    path = cfg.train_file or os.path.join(cfg.data_dir, TRAIN_FILE)
    sentences = read_conll(path)
    if cfg.max_train_samples > 0:
      sentences = sentences[:cfg.max_train_samples]
    return featurize(sentences, tokenizer, cfg.max_seq_length, path)[0]

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    """'dev' (eng.testa, or cfg.eval_file) and 'test' (eng.testb).

    With cfg.eval_file and no cfg.data_dir there is no test file to read: 'dev' alone.
    """
    named = [('dev', cfg.eval_file or os.path.join(cfg.data_dir, DEV_FILE))]
    if cfg.data_dir or not cfg.eval_file:
      named.append(('test', os.path.join(cfg.data_dir, TEST_FILE)))
    read = [(name, path, read_conll(path)) for name, path in named]  # all files exist first
    return [EvalSet(name, *featurize(sentences, tokenizer, cfg.max_seq_length, path))
            for name, path, sentences in read]

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray],
               output_dir: str | None) -> dict[str, Any]:
    """conlleval entity scores and token accuracy; writes predictions_<set>.txt when asked.

    Returns:
      precision, recall, f1 (entity-level micro), n_gold, n_pred, n_correct, per_type
      {type: {precision, recall, f1, n_gold}}, token_accuracy (over words) and n_cut_words.
    """
    data: ConllEvalData = eval_set.data
    if len(logits) != len(data.words):
      raise ValueError(f'{len(logits)} logits for {len(data.words)} sentences of {eval_set.name}')
    preds = [word_predictions(np.asarray(l), first)
             for l, first in zip(logits, data.first_positions)]
    result = metrics.entity_scores(data.tags, preds)
    n_words = sum(len(t) for t in data.tags)
    n_right = sum(g == p for gold, pred in zip(data.tags, preds) for g, p in zip(gold, pred))
    result['token_accuracy'] = n_right / n_words if n_words else 0.0
    result['n_cut_words'] = data.n_cut_words
    if output_dir is not None:
      write_predictions(os.path.join(output_dir, f'predictions_{eval_set.name}.txt'),
                        data.words, data.tags, preds)
    return result


def word_predictions(logits: np.ndarray, first_positions: np.ndarray, labels: Sequence[str] = LABELS,
                     outside: str = 'O') -> list[str]:
  """A tag per word: the argmax at its first sub-token, `outside` for words without one (-1)."""
  best = np.asarray(logits).argmax(axis=-1)
  return [labels[int(best[p])] if p >= 0 else outside for p in first_positions]


def write_predictions(path: str, words: Sequence[Sequence[str]], golds: Sequence[Sequence[str]],
                      preds: Sequence[Sequence[str]]) -> None:
  """conlleval input: `word gold pred` per line, a blank line after each sentence (atomic)."""
  lines = []
  for sentence in zip(words, golds, preds):
    lines.extend(f'{w} {g} {p}' for w, g, p in zip(*sentence))
    lines.append('')
  write_text_atomic(path, '\n'.join(lines) + '\n' if lines else '')


def _tag(path: str, line_no: int, fields: list[str], labels: Sequence[str] | None) -> str:
  if len(fields) < 2:
    raise DataError(f'{path}:{line_no}: {len(fields)} field(s) but a CoNLL line needs a word and '
                    'a tag (token POS chunk NER)')
  tag = fields[-1]
  if labels is not None and tag not in labels:
    raise DataError(f'{path}:{line_no}: tag {tag!r} is not one of {" ".join(labels)}')
  return tag
