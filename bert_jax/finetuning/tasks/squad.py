"""SQuAD v1.1 / v2.0: reader, sliding-window featuriser, post-processing and official metrics.

Features follow Hugging Face's `run_qa.py`: [CLS] question [SEP] context-window [SEP] (the tokenizer's own pair
template: RoBERTa's <s> question </s></s> context-window </s>), the
question cut to `max_query_length` WordPieces, the context split into windows that overlap by
`doc_stride` tokens (the `tokenizers` overflow convention), and the same windows for training
and evaluation. Predictions are picked as `postprocess_qa_predictions` picks them; EM/F1 are
the official evaluate-v1.1.py / evaluate-v2.0.py computations.

Without a training file (only the dev set is staged) the eval file is split by article: the
first `cfg.train_articles` articles train and the last `cfg.eval_articles` evaluate.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import string
from typing import Any, Sequence

import numpy as np

from bert_jax import files
from bert_jax.data import tokenization
from bert_jax.errors import ConfigError, DataError
from bert_jax.files import check_regular, write_json_atomic
from bert_jax.finetuning.tasks.base import EvalSet, Feature
from bert_jax.runs import reporting

Offset = tuple[int, int] | None  # a token's (start, end) character span; None off-context
_PUNCTUATION = frozenset(string.punctuation)


@dataclasses.dataclass
class SquadExample:
  """One question about one paragraph."""

  id: str
  question: str  # left-stripped
  context: str
  answers: list[dict[str, Any]]  # [{'text': str, 'answer_start': int}, ...]; [] when impossible
  is_impossible: bool = False


@dataclasses.dataclass
class SquadEvalData:
  """What `Squad.evaluate` needs besides the logits (`EvalSet.data`)."""

  examples: list[SquadExample]
  offsets: list[list[Offset]]  # per feature, per input token
  n_best_size: int
  max_answer_length: int
  null_score_diff_threshold: float
  tune_null_threshold: bool


@dataclasses.dataclass
class Prediction:
  """The best non-null answer of one example and the scores the v2 decision needs."""

  text: str  # '' when no valid span was found
  score: float  # start + end logit of `text` (0.0 when none, as Hugging Face scores 'empty')
  null_score: float  # min over the example's features of start[0] + end[0]


# ----------------------------------------------------------------------------- reading


def read_articles(path: str) -> list[dict[str, Any]]:
  """The 'data' list of an official-format SQuAD JSON file.

  Args:
    path: a train-/dev-v1.1.json or -v2.0.json file.

  Returns:
    The articles ({'title', 'paragraphs'}), in file order. DataError if the file is missing,
    not JSON or has no 'data' list.
  """
  check_regular(path, 'SQuAD file')
  if not files.isfile(path):
    raise DataError(f'SQuAD file {path} does not exist; set --config.data_dir (or train_file/'
                    'eval_file) to where the official JSON files are')
  try:
    with files.open(path, encoding='utf-8') as f:
      obj = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f'{path} is not a JSON file ({e})') from None
  if not isinstance(obj, dict) or not isinstance(obj.get('data'), list):
    raise DataError(f"{path} has no 'data' list; expected the official SQuAD format "
                    '{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}')
  return obj['data']


def articles_to_examples(articles: Sequence[dict[str, Any]], path: str = '') -> list[SquadExample]:
  """One `SquadExample` per question, in file order.

  Args:
    articles: the 'data' list (or a slice of it) of a SQuAD file.
    path: the file, named in error messages.

  Returns:
    The examples. DataError on a question without an id or a malformed entry.
  """
  examples = []
  try:
    for article in articles:
      for paragraph in article['paragraphs']:
        context = paragraph['context']
        for qa in paragraph['qas']:
          examples.append(_example(qa, context, article.get('title', '?'), path))
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f'{path}: malformed SQuAD entry ({type(e).__name__}: {e}); expected '
                    '{"title", "paragraphs": [{"context", "qas": [{"id", "question", '
                    '"answers": [{"text", "answer_start"}]}]}]}') from None
  return examples


def _example(qa: dict[str, Any], context: str, title: str, path: str) -> SquadExample:
  if not qa.get('id'):
    raise DataError(f'{path}: a question in article {title!r} has no id: '
                    f'{str(qa.get("question", ""))[:80]!r}')
  answers = [{'text': str(a['text']), 'answer_start': int(a['answer_start'])}
             for a in qa.get('answers', [])]
  return SquadExample(id=str(qa['id']), question=str(qa['question']).lstrip(), context=context,
                      answers=answers, is_impossible=bool(qa.get('is_impossible', False)))


def file_names(version_2: bool) -> tuple[str, str]:
  """(train, dev) file names of the official release."""
  return ('train-v2.0.json', 'dev-v2.0.json') if version_2 else ('train-v1.1.json', 'dev-v1.1.json')


def load_examples(cfg, version_2: bool) -> tuple[list[SquadExample], list[SquadExample]]:
  """(train, eval) examples of a FinetuneConfig, split by article when there is no train file.

  Args:
    cfg: a FinetuneConfig (data_dir, train_file, eval_file, train_articles, eval_articles,
      max_train_samples).
    version_2: look for the v2.0 file names.

  Returns:
    Training examples (the first `max_train_samples` when > 0) and evaluation examples.
  """
  train_name, dev_name = file_names(version_2)
  eval_path = cfg.eval_file or os.path.join(cfg.data_dir, dev_name)
  train_path = cfg.train_file or os.path.join(cfg.data_dir, train_name)
  eval_articles = read_articles(eval_path)
  if cfg.train_file or files.isfile(train_path):
    train = articles_to_examples(read_articles(train_path), train_path)
    evals = articles_to_examples(eval_articles, eval_path)
    reporting.log(f'SQuAD: training on {train_path} ({len(train)} questions), evaluating on {eval_path} '
                  f'({len(evals)} questions)')
  else:
    train, evals = _split_by_article(eval_articles, cfg, eval_path, train_path)
  if cfg.max_train_samples > 0:
    train = train[:cfg.max_train_samples]
  for name, examples in (('training', train), ('evaluation', evals)):
    if not examples:
      raise DataError(f'no SQuAD {name} questions (eval file {eval_path})')
  return train, evals


def _split_by_article(articles, cfg, eval_path: str, train_path: str):
  n, n_train, n_eval = len(articles), cfg.train_articles, cfg.eval_articles
  if n_train < 0 or n_eval < 0 or n_train + n_eval > n:
    raise DataError(f'{eval_path} has {n} articles, fewer than train_articles={n_train} + '
                    f'eval_articles={n_eval}; lower them')
  train = articles_to_examples(articles[:n_train], eval_path)
  evals = articles_to_examples(articles[n - n_eval:], eval_path)
  reporting.log(f'SQuAD: no training file {train_path}; splitting {eval_path} by article: [0, {n_train}) train '
                f'({len(train)} questions), [{n - n_eval}, {n}) evaluate ({len(evals)} questions)')
  return train, evals


# ----------------------------------------------------------------------------- features


def windows(num_tokens: int, window: int, doc_stride: int) -> list[tuple[int, int]]:
  """[start, stop) context-token spans; consecutive ones overlap by `doc_stride` tokens.

  The `tokenizers` overflow rule: starts step by `window - doc_stride`, and the last window is
  the first that reaches the end of the context.

  Args:
    num_tokens: context length in tokens.
    window: most context tokens per feature.
    doc_stride: overlap between consecutive windows.

  Returns:
    The spans, at least one (an empty context gives [(0, 0)]).
  """
  if num_tokens <= window:
    return [(0, num_tokens)]
  if window <= doc_stride:
    raise ConfigError(f'a window of {window} context tokens is not longer than doc_stride='
                      f'{doc_stride}; lower doc_stride or max_query_length, or raise '
                      'max_seq_length')
  spans, start = [], 0
  while True:
    stop = min(start + window, num_tokens)
    spans.append((start, stop))
    if stop == num_tokens:
      return spans
    start += window - doc_stride


def answer_char_span(example: SquadExample) -> tuple[int, int] | None:
  """[start, end) characters of the first answer; None when it is not at answer_start."""
  answer = example.answers[0]
  start, text = answer['answer_start'], answer['text']
  if example.context[start:start + len(text)] != text:
    return None
  return start, start + len(text)


def char_to_token_span(offsets: Sequence[tuple[int, int]], start: int,
                       end: int) -> tuple[int, int] | None:
  """Token indices (inclusive) covering characters [start, end), or None if none do.

  Start: the first token whose span ends after `start`; end: the last token that starts
  before `end`.
  """
  if not offsets:
    return None
  spans = np.asarray(offsets, np.int64).reshape(-1, 2)
  after = np.flatnonzero(spans[:, 1] > start)
  before = np.flatnonzero(spans[:, 0] < end)
  if not after.size or not before.size or before[-1] < after[0]:
    return None
  return int(after[0]), int(before[-1])


def featurize(examples: Sequence[SquadExample], tokenizer, *, max_seq_length: int, doc_stride: int,
              max_query_length: int, train: bool) -> tuple[list[Feature], list[list[Offset]]]:
  """Features of `examples` and the character offsets of each feature's input tokens.

  Args:
    examples: the questions.
    tokenizer: a WordPieceTokenizer or SentencePieceTokenizer.
    max_seq_length: tokens per feature, [CLS]/[SEP]s included.
    doc_stride: overlap in tokens between consecutive context windows.
    max_query_length: question tokens kept.
    train: label start/end (0/0 = [CLS] when the answer is not inside the window or the
      question is impossible) and skip, with one warning, examples whose answer text is not
      found at answer_start; evaluation keeps every example.

  Returns:
    (features, offsets): `Feature.example_index` indexes `examples`; offsets hold a
    (start, end) character span per context token and None for [CLS], question and [SEP].
  """
  questions = tokenizer.encode_batch([e.question for e in examples])
  template = tokenization.template_of(tokenizer)  # [CLS] q [SEP] ctx [SEP], or the tokenizer's own pair template
  before = len(template.head) + len(template.mid)  # specials before the context, besides the question
  contexts: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
  features, offsets, skipped = [], [], 0
  for i, (example, q_ids) in enumerate(zip(examples, questions)):
    if example.context not in contexts:
      contexts[example.context] = tokenizer.encode_with_offsets(example.context)
    ctx_ids, ctx_offsets = contexts[example.context]
    span = None
    if train and not example.is_impossible:
      char_span = answer_char_span(example) if example.answers else None
      if char_span is None:
        skipped += 1
        continue
      span = char_to_token_span(ctx_offsets, *char_span)
    q_ids = q_ids[:max_query_length]
    window = max_seq_length - len(q_ids) - template.pair_specials
    if window < 1:
      raise ConfigError(f'max_seq_length={max_seq_length} leaves no room for context after a '
                        f'{len(q_ids)}-token question; raise it or lower max_query_length')
    for lo, hi in windows(len(ctx_ids), window, doc_stride):
      feature = _feature(template, q_ids, ctx_ids[lo:hi], i)
      if span is not None and lo <= span[0] and span[1] < hi:
        feature.start, feature.end = (t - lo + len(q_ids) + before for t in span)
      features.append(feature)
      offsets.append([None] * (len(q_ids) + before) + list(ctx_offsets[lo:hi]) + [None] * len(template.tail))
  if skipped and skipped == len(examples):
    raise DataError('every SQuAD training question was skipped: no answer text matches its '
                    'context at answer_start')
  _log_featurize(examples, questions, max_query_length, skipped, len(features), train)
  return features, offsets


def _feature(template: tokenization.Template, q_ids: Sequence[int], ctx_ids: Sequence[int],
             example_index: int) -> Feature:
  input_ids, token_type_ids = template.pair(q_ids, ctx_ids)
  return Feature(input_ids=np.asarray(input_ids, np.int32),
                 token_type_ids=np.asarray(token_type_ids, np.int32), example_index=example_index)


def _log_featurize(examples, questions, max_query_length: int, skipped: int, num_features: int,
                   train: bool) -> None:
  kind = 'training' if train else 'evaluation'
  if skipped:
    reporting.log(f'warning: skipped {skipped} of {len(examples)} SQuAD training questions whose answer text is not '
                  'found in the context at answer_start (or that have no answer)')
  cut = sum(len(q) > max_query_length for q in questions)
  if cut:
    reporting.log(f'warning: {cut:,} of {len(examples):,} questions were longer than max_query_length='
                  f'{max_query_length} tokens and were cut (contexts are read in overlapping windows, never cut)')
  reporting.log(f'SQuAD {kind}: {len(examples) - skipped} questions -> {num_features} features')


# ----------------------------------------------------------------------------- predictions


def postprocess(examples: Sequence[SquadExample], features: Sequence[Feature],
                offsets: Sequence[Sequence[Offset]], logits: Sequence[np.ndarray], *,
                n_best_size: int, max_answer_length: int) -> list[Prediction]:
  """The best answer span of each example, as Hugging Face's postprocess_qa_predictions picks it.

  Per feature, the `n_best_size` highest start and end logits are paired; a pair counts when
  both tokens are context tokens, end >= start and the span has at most `max_answer_length`
  tokens. The highest start + end logit over the example's features wins (the first on ties).

  Args:
    examples: the questions.
    features: their features (`example_index` into `examples`).
    offsets: per feature, each token's character span or None.
    logits: per feature, float [len, 2] (start logits [:, 0], end logits [:, 1]).
    n_best_size: start and end candidates per feature.
    max_answer_length: longest answer in tokens.

  Returns:
    One Prediction per example, in order.
  """
  answers = n_best_answers(examples, features, offsets, logits, n_best_size=n_best_size,
                           max_answer_length=max_answer_length, keep=1)
  return [Prediction(text=a[0].text if a else '', score=a[0].score if a else 0.0, null_score=n)
          for a, n in zip(*answers)]


@dataclasses.dataclass
class Answer:
  """One candidate answer span of an example."""

  text: str
  score: float  # start + end logit
  probability: float  # softmax(start) x softmax(end) over its feature's tokens, as transformers' pipeline
  start: int  # character span in the context
  end: int


def n_best_answers(examples: Sequence[SquadExample], features: Sequence[Feature],
                   offsets: Sequence[Sequence[Offset]], logits: Sequence[np.ndarray], *, n_best_size: int,
                   max_answer_length: int, keep: int) -> tuple[list[list[Answer]], list[float]]:
  """The `keep` best answer spans of each example, best first, and each example's null score.

  Candidates are `postprocess`'s, over all the example's features; the order is by start + end
  logit, the first found (feature order, then Hugging Face's pairing order) first on ties.

  Returns:
    (answers per example, null score per example: the min over its features of start[0] + end[0]).
  """
  if len(logits) != len(features):
    raise ValueError(f'{len(logits)} logit arrays for {len(features)} features')
  found: list[list[Answer]] = [[] for _ in examples]
  null = np.full(len(examples), np.inf)
  for feature, offs, lg in zip(features, offsets, logits):
    lg = np.asarray(lg, np.float32)[:len(offs)]
    i = feature.example_index
    null[i] = min(null[i], float(lg[0, 0] + lg[0, 1]))
    p_start, p_end = _softmax(lg[:, 0]), _softmax(lg[:, 1])
    for score, s, e in _ranked_spans(lg[:, 0], lg[:, 1], offs, n_best_size, max_answer_length, keep):
      start, end = offs[s][0], offs[e][1]
      found[i].append(Answer(examples[i].context[start:end], score, float(p_start[s] * p_end[e]), start, end))
  # Stable: equal scores keep the order they were found in, so the first is postprocess's winner.
  return [sorted(a, key=lambda x: -x.score)[:keep] for a in found], [float(n) for n in null]


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max())
  return e / e.sum()


def _ranked_spans(start: np.ndarray, end: np.ndarray, offs: Sequence[Offset], n_best_size: int,
                  max_answer_length: int, keep: int) -> list[tuple[float, int, int]]:
  """The `keep` best valid (score, start token, end token) of one feature, best first."""
  is_context = np.array([o is not None for o in offs])
  s = np.argsort(start)[-1:-n_best_size - 1:-1]  # Hugging Face's exact expression (same ties)
  e = np.argsort(end)[-1:-n_best_size - 1:-1]
  length = e[None, :] - s[:, None] + 1
  valid = (is_context[s][:, None] & is_context[e][None, :] & (length >= 1)
           & (length <= max_answer_length))
  scores = np.where(valid, start[s][:, None] + end[e][None, :], -np.inf).ravel()
  # Row-major order breaks ties: Hugging Face's loop order, so the same winner.
  order = np.argsort(-scores, kind='stable')[:keep]
  return [(float(scores[k]), int(s[k // len(e)]), int(e[k % len(e)])) for k in order if valid.ravel()[k]]


# ----------------------------------------------------------------------------- official metrics


def normalize_answer(s: str) -> str:
  """Lower case, drop punctuation and the articles a/an/the, collapse whitespace (official)."""
  s = ''.join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  s = re.sub(r'\b(a|an|the)\b', ' ', s)
  return ' '.join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
  return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
  """Token F1 of evaluate-v1.1.py (0 when nothing is shared, also for two empty answers)."""
  pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def squad_v1_metrics(examples: Sequence[SquadExample], predictions: dict[str, str]) -> dict[str, Any]:
  """evaluate-v1.1.py: EM and F1 maxed over each question's gold answers, as fractions (the script prints x100).

  Args:
    examples: the questions with their gold answers.
    predictions: question id -> answer text; a missing id scores 0 (as the official script).

  Returns:
    {'exact_match', 'f1', 'num_examples'}.
  """
  em = f1 = 0.0
  for example in examples:
    if example.id not in predictions:
      continue
    golds = [a['text'] for a in example.answers]
    pred = predictions[example.id]
    em += max(float(exact_match_score(pred, g)) for g in golds)
    f1 += max(f1_score(pred, g) for g in golds)
  n = len(examples)
  return {'exact_match': em / n, 'f1': f1 / n, 'num_examples': n}


def _tokens_v2(s: str) -> list[str]:
  return normalize_answer(s).split() if s else []


def _f1_v2(gold: str, pred: str) -> float:
  """compute_f1 of evaluate-v2.0.py: 1 when both are empty, 0 when only one is."""
  gold_toks, pred_toks = _tokens_v2(gold), _tokens_v2(pred)
  if not gold_toks or not pred_toks:
    return float(gold_toks == pred_toks)
  same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_toks), same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def _raw_scores_v2(examples, predictions) -> tuple[dict[str, float], dict[str, float]]:
  exact, f1 = {}, {}
  for example in examples:
    if example.id not in predictions:
      continue
    golds = [a['text'] for a in example.answers if normalize_answer(a['text'])] or ['']
    pred = predictions[example.id]
    exact[example.id] = max(float(normalize_answer(g) == normalize_answer(pred)) for g in golds)
    f1[example.id] = max(_f1_v2(g, pred) for g in golds)
  return exact, f1


def _mean_dict(exact, f1, qids) -> dict[str, float]:
  n = len(qids)
  return {'exact': sum(exact.get(k, 0.0) for k in qids) / n, 'f1': sum(f1.get(k, 0.0) for k in qids) / n,
          'total': n}


def find_best_thresh(preds: dict[str, str], scores: dict[str, float], na_probs: dict[str, float],
                     qid_to_has_ans: dict[str, bool]) -> tuple[float, float]:
  """evaluate-v2.0.py's threshold search: (best score as a fraction, its na_prob threshold)."""
  cur = best = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if qid_to_has_ans[qid]:
      cur += scores[qid]
    else:
      cur += -1 if preds[qid] else 0
    if cur > best:
      best, best_thresh = cur, na_probs[qid]
  return best / len(scores), best_thresh


def squad_v2_metrics(examples: Sequence[SquadExample], predictions: dict[str, str], *,
                     na_probs: dict[str, float] | None = None,
                     answer_predictions: dict[str, str] | None = None) -> dict[str, Any]:
  """evaluate-v2.0.py: exact/f1 overall and over HasAns/NoAns questions, best thresholds (fractions; x100 there).

  Args:
    examples: the questions; an empty answer list means unanswerable.
    predictions: question id -> answer text ('' = no answer), scored as given.
    na_probs: question id -> no-answer score (larger = more likely unanswerable); when given,
      best_exact/best_f1 and their thresholds are searched as the official script does.
    answer_predictions: the non-null answers the threshold search ranks (the official script's
      predictions file when run with --na-prob-file); defaults to `predictions`.

  Returns:
    Flat metrics: exact, f1, total, HasAns_*/NoAns_* (when such questions exist) and, with
    `na_probs`, best_exact, best_exact_thresh, best_f1, best_f1_thresh.
  """
  has_ans = {e.id: bool(e.answers) for e in examples}
  exact, f1 = _raw_scores_v2(examples, predictions)
  metrics = _mean_dict(exact, f1, list(has_ans))
  for prefix, want in (('HasAns', True), ('NoAns', False)):
    qids = [k for k, v in has_ans.items() if v == want]
    if qids:
      metrics.update({f'{prefix}_{k}': v for k, v in _mean_dict(exact, f1, qids).items()})
  if na_probs is not None:
    answers = predictions if answer_predictions is None else answer_predictions
    for name, scores in zip(('exact', 'f1'), _raw_scores_v2(examples, answers)):
      metrics[f'best_{name}'], metrics[f'best_{name}_thresh'] = find_best_thresh(
          answers, scores, na_probs, has_ans)
  return metrics


# ----------------------------------------------------------------------------- task


class Squad:
  """SQuAD v1.1 (`version_2=False`) or v2.0 extractive QA as a `base.Task`."""

  kind = 'span'
  num_labels = 2
  main_metric = 'f1'

  def __init__(self, version_2: bool = False):
    self.version_2 = version_2
    self.name = 'squad_v2' if version_2 else 'squad'
    self._cache: tuple[tuple, tuple[list[SquadExample], list[SquadExample]]] | None = None

  def examples(self, cfg) -> tuple[list[SquadExample], list[SquadExample]]:
    """(train, eval) examples of `cfg` (read once per set of file options)."""
    key = (cfg.data_dir, cfg.train_file, cfg.eval_file, cfg.train_articles, cfg.eval_articles,
           cfg.max_train_samples)
    if self._cache is None or self._cache[0] != key:
      self._cache = (key, load_examples(cfg, self.version_2))
    return self._cache[1]

  def _featurize(self, cfg, tokenizer, examples, train: bool):
    return featurize(examples, tokenizer, max_seq_length=cfg.max_seq_length,
                     doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length, train=train)

  def train_features(self, cfg, tokenizer) -> list[Feature]:
    """Labelled windows of the training questions (see `featurize`)."""
    return self._featurize(cfg, tokenizer, self.examples(cfg)[0], train=True)[0]

  def eval_sets(self, cfg, tokenizer) -> list[EvalSet]:
    """[EvalSet('eval', features, SquadEvalData)] with the post-processing settings of `cfg`."""
    examples = self.examples(cfg)[1]
    if not self.version_2 and any(not e.answers for e in examples):
      raise DataError('SQuAD v1.1 evaluation needs gold answers for every question, but some '
                      "have none (a v2.0 file?); use task 'squad_v2'")
    features, offsets = self._featurize(cfg, tokenizer, examples, train=False)
    data = SquadEvalData(examples=examples, offsets=offsets, n_best_size=cfg.n_best_size,
                         max_answer_length=cfg.max_answer_length,
                         null_score_diff_threshold=cfg.null_score_diff_threshold,
                         tune_null_threshold=cfg.tune_null_threshold)
    return [EvalSet('eval', features, data)]

  def evaluate(self, eval_set: EvalSet, logits: Sequence[np.ndarray],
               output_dir: str | None) -> dict[str, Any]:
    """Official metrics of the predicted spans; writes predictions_<set>.json (v2 also
    null_odds_<set>.json) under `output_dir` when it is not None."""
    data: SquadEvalData = eval_set.data
    preds = postprocess(data.examples, eval_set.features, data.offsets, logits,
                        n_best_size=data.n_best_size, max_answer_length=data.max_answer_length)
    answers = {e.id: p.text for e, p in zip(data.examples, preds)}
    if self.version_2:
      odds = {e.id: p.null_score - p.score for e, p in zip(data.examples, preds)}
      final = {k: '' if odds[k] > data.null_score_diff_threshold else v for k, v in answers.items()}
      metrics = squad_v2_metrics(data.examples, final, answer_predictions=answers,
                                 na_probs=odds if data.tune_null_threshold else None)
    else:
      final, metrics = answers, squad_v1_metrics(data.examples, answers)
    if output_dir is not None:
      write_json_atomic(os.path.join(output_dir, f'predictions_{eval_set.name}.json'), final)
      if self.version_2:
        write_json_atomic(os.path.join(output_dir, f'null_odds_{eval_set.name}.json'), odds)
    return metrics
