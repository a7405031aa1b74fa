"""Each task kind's config type: its own fields on top of `FinetuneConfig`'s shared ones, and the registry
`CONFIG_TYPES` (one row per type) that `FinetuneConfig(task=...)` and `from_dict` build from.

  HeadTaskConfig   a head on the encoder (classification, regression, multi-label, tagging, extractive QA): the
                   task's files, your own files' columns and labels, SQuAD's windows and answers
  RetrievalConfig  a bi-encoder trained on pairs, contrastively or by distillation from teacher scores: pooling,
                   temperature, Matryoshka sizes, the loss, the pairs' columns, its BEIR and STS evaluation
  MultiVectorConfig  a multi-vector (ColBERT) encoder scored by MaxSim: projection size, query and document
                   lengths, markers, the punctuation skiplist, the loss, the pairs' columns, its BEIR evaluation
  RerankConfig     a cross-encoder (one logit on [CLS] q [SEP] p [SEP]) on labelled or scored pairs or on groups:
                   the columns, the loss, the query's length, the held-out split, its BEIR evaluation (rerank a
                   first stage's top k)
  SparseConfig     a SPLADE encoder (term weights from the masked-LM head) trained on pairs: the ranking loss's
                   temperature, the FLOPS regularisers' weights and warm-up, the pairs' columns, its BEIR evaluation
A new kind with fields of its own adds its type here and one row of CONFIG_TYPES (a kind without any runs on
FinetuneConfig itself).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Collection

from bert_jax.config.fields import _f
from bert_jax.config.finetune import GLUE_TASKS, TASK_KINDS, FinetuneConfig, _readers, unread_fields
from bert_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HeadTaskConfig(FinetuneConfig):
  """A head on the encoder: GLUE, CoNLL-2003 and SQuAD from a data_dir, or your own files by their columns."""

  TASKS: ClassVar[tuple[str, ...]] = TASK_KINDS['classification'] + TASK_KINDS['tagging'] + TASK_KINDS['qa']

  data_dir: str = _f('', path=True)
  eval_file: str = _f('', free=True, path=True, evaluation=True)
  # Packs several examples into each row (per-example attention, restarted positions);
  # the same function as padding each one, with no compute spent on padding.
  pack: bool = True
  # classify / regress: your own CSV, TSV, JSONL or Parquet files, by column names (finetuning.tasks.own_data)
  text_column: str = 'text'  # the default also reads a 'sentence' column
  text_pair_column: str = ''  # the second text of a pair; '' single texts
  label_column: str = 'label'
  # classify / multilabel / tag: the labels in order, comma-separated; '' the training file's, sorted
  label_names: str = ''
  # Imbalanced labels (classification, multi-label, tagging): '' none, 'auto' (inverse frequency) or per label name,
  # e.g. 'negative=3,positive=1' (finetuning.class_weights says what a weight does for each head kind)
  class_weights: str = ''
  label_smoothing: float = 0.0  # classification, multi-label, tagging: targets moved this far towards uniform
  eval_fraction: float = 0.1  # without eval_file: this share of the training file's rows is held out ...
  split_seed: int = 0  # ... drawn with this seed
  # SQuAD
  doc_stride: int = 128  # overlap in tokens between consecutive windows (HF run_qa convention)
  max_query_length: int = 64
  n_best_size: int = _f(20, free=True, evaluation=True)
  max_answer_length: int = _f(30, free=True, evaluation=True)
  null_score_diff_threshold: float = _f(0.0, free=True, evaluation=True)  # SQuAD 2.0: no answer above this
  tune_null_threshold: bool = _f(True, free=True, evaluation=True)  # SQuAD 2.0: also report the best threshold
  train_articles: int = 40  # without a train file: the first N articles of dev-v1.1.json train
  eval_articles: int = _f(8, free=True, evaluation=True)  # ... and the last N evaluate

  def __post_init__(self):
    super().__post_init__()
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ConfigError(f'eval_fraction={self.eval_fraction} must be in [0, 1)')
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f'label_smoothing={self.label_smoothing} must be in [0, 1)')

  @classmethod
  def readers(cls, name: str) -> tuple[str, ...]:
    return TASK_FIELDS.get(name, cls.TASKS)

  def check_task_fields(self, names: Collection[str] | None = None) -> None:
    """ConfigError naming each of this kind's fields (`TASK_FIELDS`) set to other than its default on a task that
    does not read it. Called when a run starts; a saved config (a workdir's config.json) is not checked when it
    loads. `names`: check only these fields (evaluating a workdir again: the ones given); None all."""
    super().check_task_fields(names)
    defaults = HeadTaskConfig()
    unread: dict[str, list[str]] = {}  # the tasks that read them -> the fields set
    for name, tasks in TASK_FIELDS.items():
      if names is not None and name not in names or self.task in tasks:
        continue
      if getattr(self, name) != getattr(defaults, name):
        unread.setdefault(_readers(tasks), []).append(f'--config.{name}')
    if unread:
      raise ConfigError(unread_fields(unread, self.task))


# Which of the head tasks read each of HeadTaskConfig's fields but data_dir-free ones every head task reads: a
# field set to other than its default on a task that does not read it is refused (`check_task_fields`), not
# silently ignored. tests/config/test_task_configs.py fails on a HeadTaskConfig field in neither.
HEAD_SHARED = ('eval_file', 'pack')  # every head task's
_SHIPPED = GLUE_TASKS + ('conll2003', 'squad', 'squad_v2')  # the files of a data_dir
_OWN_FILES = ('classify', 'regress', 'multilabel', 'tag', 'qa')  # your files, by columns
_QA = TASK_KINDS['qa']
_CLASSES = tuple(t for t in GLUE_TASKS if t != 'stsb') + ('classify', 'multilabel', 'conll2003', 'tag')
TASK_FIELDS = {
    'data_dir': _SHIPPED,
    # your own files (classify / regress / multilabel, tag, qa): columns, labels, the held-out split
    'text_column': _OWN_FILES,
    'text_pair_column': ('classify', 'regress', 'multilabel', 'qa'),
    'label_column': _OWN_FILES,
    'label_names': ('classify', 'multilabel', 'tag'),
    # the tasks with classes (not regression: stsb, regress)
    'class_weights': _CLASSES,
    'label_smoothing': _CLASSES,
    'eval_fraction': _OWN_FILES,
    'split_seed': _OWN_FILES,
    # QA (SQuAD, own-data qa)
    'doc_stride': _QA,
    'max_query_length': _QA,
    'n_best_size': _QA,
    'max_answer_length': _QA,
    'null_score_diff_threshold': _QA,
    'tune_null_threshold': _QA,
    'train_articles': ('squad', 'squad_v2'),
    'eval_articles': ('squad', 'squad_v2'),
}


# The retrieval task's losses: InfoNCE over the global batch, or distillation from teacher scores of each row's
# candidates (its positive, then its negatives): MarginMSE on the score margins, KL between the softmaxes.
RETRIEVAL_LOSSES = ('contrastive', 'margin_mse', 'kl')
_QUANTIZED = ('int8', 'uint8', 'binary', 'ubinary')  # RetrievalConfig.eval_precisions (embedding.quantization)
RERANK_LOSSES = ('', 'bce', 'mse', 'listwise')  # RerankConfig.loss ('' inferred from the training file)


@dataclasses.dataclass(frozen=True)
class RetrievalConfig(FinetuneConfig):
  """A bi-encoder trained on pairs from train_file, by columns: contrastively (InfoNCE over the global batch) or by
  distillation from the teacher scores in score_columns (`loss`); passages are cut to max_seq_length tokens, queries
  to max_query_length (embedding/, finetuning.retrieval)."""

  TASKS: ClassVar[tuple[str, ...]] = TASK_KINDS['retrieval']

  task: str = 'retrieval'
  max_query_length: int = 64
  # Packs the texts of a step's batch (queries, positives, negatives) several per row, each attending only to
  # itself (embedding.packed_pairs): the same vectors and loss as padding each side, with no compute spent on
  # padding; False pads each side to its longest text.
  pack: bool = True
  pooling: str = 'mean'  # 'mean' or 'cls'; embeddings are normalised
  temperature: float = 0.05  # fixed, or the learned one's initial value
  learn_temperature: bool = False
  temperature_min: float = 0.01  # the learned temperature's bounds
  temperature_max: float = 1.0
  symmetric: bool = False  # also passage -> query
  matryoshka_dims: str = ''  # e.g. '384,256,128,64': the loss at each leading size, evaluated at each
  matryoshka_weights: str = ''  # one per dim, comma-separated; '' equal
  query_column: str = 'query'
  positive_column: str = 'positive'
  negative_columns: str = ''  # comma-separated hard-negative columns (JSONL/Parquet: a column may hold a list)
  loss: str = 'contrastive'  # one of RETRIEVAL_LOSSES
  # Distillation: comma-separated columns of teacher scores, 1 + K per row (the positive's, then each negative's, as
  # mine.py --scores writes them in 'scores'); a column may hold a list.
  score_columns: str = ''
  teacher_temperature: float = 0.0  # kl: the teacher scores' temperature; 0: `temperature`'s value
  beir_dir: str = _f('', free=True, path=True, evaluation=True)  # corpus.jsonl, queries.jsonl, qrels/<split>.tsv
  # The evaluation also at these quantized precisions, comma-separated (int8, uint8, binary, ubinary:
  # embedding.quantization), reported as eval_<metric>_<precision>
  eval_precisions: str = _f('', free=True, evaluation=True)
  beir_split: str = _f('test', free=True, evaluation=True)
  # Scored pairs (STS): also report Spearman's correlation of the embeddings' cosine with the gold scores.
  sts_file: str = _f('', free=True, path=True, evaluation=True)
  sts_columns: str = _f('sentence1,sentence2,score', free=True, evaluation=True)

  def __post_init__(self):
    """The retrieval fields' mesh- and model-free checks (the dims against the model: `finetuning.retrieval`)."""
    super().__post_init__()
    if self.pooling not in ('mean', 'cls'):
      raise ConfigError(f"pooling must be 'mean' or 'cls', got {self.pooling!r}")
    self.eval_precision_names()
    for name in ('temperature',) + (('temperature_min', 'temperature_max') if self.learn_temperature else ()):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise ConfigError(f'{name}={value} must be a finite number > 0')
    if self.learn_temperature and not self.temperature_min <= self.temperature <= self.temperature_max:
      raise ConfigError(f'temperature={self.temperature} must lie within [temperature_min, temperature_max] = '
                        f'[{self.temperature_min}, {self.temperature_max}] when learn_temperature is set')
    dims, weights = self.retrieval_dims(), self.retrieval_weights()
    if any(a <= b for a, b in zip(dims, dims[1:])):
      raise ConfigError(f'matryoshka_dims={self.matryoshka_dims!r} must be strictly decreasing (largest first)')
    if weights and len(weights) != len(dims):
      raise ConfigError(f'matryoshka_weights has {len(weights)} values for {len(dims)} matryoshka_dims')
    for name in ('query_column', 'positive_column'):
      if not getattr(self, name).strip():
        raise ConfigError(f'{name} must name a column')
    if self.max_query_length < 3:
      raise ConfigError(f'max_query_length={self.max_query_length} must be at least 3')
    self._check_loss()

  def _check_loss(self) -> None:
    """The loss against the fields it reads: scores and negatives for distillation, none for InfoNCE."""
    if self.loss not in RETRIEVAL_LOSSES:
      raise ConfigError(f'loss must be one of {", ".join(RETRIEVAL_LOSSES)}, got {self.loss!r}')
    if not math.isfinite(self.teacher_temperature) or self.teacher_temperature < 0:
      raise ConfigError(f'teacher_temperature={self.teacher_temperature} must be a finite number > 0 (0: the '
                        'temperature)')
    if self.teacher_temperature and self.loss != 'kl':
      raise ConfigError(f"teacher_temperature is read by loss='kl' only; this run's loss is {self.loss!r}")
    if self.loss == 'contrastive':
      if self.score_column_names():
        raise ConfigError("score_columns (teacher scores) are read by loss='margin_mse' or 'kl' (distillation); "
                          "the contrastive loss takes no scores: set --config.loss or leave score_columns out")
      return
    if not self.score_column_names():
      raise ConfigError(f"loss={self.loss!r} distils teacher scores: set --config.score_columns to the column of "
                        "each row's scores (the positive's, then each negative's; mine.py --scores writes 'scores')")
    if not self.negative_column_names():
      raise ConfigError(f"loss={self.loss!r} compares each row's positive with its negatives: set "
                        "--config.negative_columns (mine.py writes them in 'negatives')")
    if self.symmetric:
      raise ConfigError(f"symmetric is a contrastive loss's passage -> query direction; loss={self.loss!r} has none")
    if self.loss == 'margin_mse' and self.learn_temperature:
      raise ConfigError("loss='margin_mse' reads no temperature (it compares score margins): leave "
                        'learn_temperature out')

  def retrieval_dims(self) -> tuple[int, ...]:
    """matryoshka_dims as integers (ConfigError when they are not positive integers)."""
    return _int_list('matryoshka_dims', self.matryoshka_dims)

  def eval_precision_names(self) -> tuple[str, ...]:
    """eval_precisions as names (ConfigError for one that is not int8, uint8, binary or ubinary)."""
    names = tuple(p.strip() for p in self.eval_precisions.split(',') if p.strip())
    bad = [p for p in names if p not in _QUANTIZED]
    if bad:
      raise ConfigError(f'eval_precisions={self.eval_precisions!r}: {", ".join(bad)} is not one of '
                        f'{", ".join(_QUANTIZED)}')
    return names

  def retrieval_weights(self) -> tuple[float, ...]:
    try:
      weights = tuple(float(w) for w in self.matryoshka_weights.split(',') if w.strip())
    except ValueError:
      raise ConfigError(f'matryoshka_weights={self.matryoshka_weights!r} must be numbers separated by commas') from None
    if any(not math.isfinite(w) or w < 0 for w in weights):
      raise ConfigError(f'matryoshka_weights={self.matryoshka_weights!r} must be finite numbers >= 0')
    return weights

  def negative_column_names(self) -> tuple[str, ...]:
    return tuple(c.strip() for c in self.negative_columns.split(',') if c.strip())

  def score_column_names(self) -> tuple[str, ...]:
    return tuple(c.strip() for c in self.score_columns.split(',') if c.strip())


@dataclasses.dataclass(frozen=True)
class RerankConfig(FinetuneConfig):
  """A cross-encoder: each (query, passage) pair of train_file read as one BERT sentence pair and scored by one
  logit. train_file holds pairs (query_column, passage_column, and label_column or score_column) or groups
  (query_column, positive_column, negatives_column: a list; read as groups when the file has negatives_column and
  no passage_column). Losses: binary cross-entropy on 0/1 labels, squared error on teacher scores, or a listwise
  softmax cross-entropy over each group (the positive the target; with teacher scores the KL divergence to their
  softmax). Evaluated by reranking a first stage's top rerank_top_k on the BEIR-layout set in beir_dir, or, without
  one, on eval_fraction of the training rows (pairs or groups) held out (finetuning.rerank)."""

  TASKS: ClassVar[tuple[str, ...]] = TASK_KINDS['rerank']

  task: str = 'rerank'
  query_column: str = 'query'
  passage_column: str = 'passage'
  label_column: str = 'label'  # 0/1 labels: binary cross-entropy on the logit
  score_column: str = ''  # teacher scores (any finite number): squared error on the logit; label_column unread
  # Groups (experiments/mine.py --layout=negatives): a positive and a list of negatives per query; with score_column
  # (mine.py --scores writes 'scores') a list of teacher scores per group: the positive's, then each negative's.
  positive_column: str = 'positive'
  negatives_column: str = 'negatives'
  # 'bce' (0/1 labels; groups: the positive 1, each negative 0), 'mse' (teacher scores), 'listwise' (groups: softmax
  # cross-entropy over each group's logits; with score_column the KL divergence to the teacher's softmax); '' infers
  # it: groups 'listwise', pairs with score_column 'mse', else 'bce'. With 'listwise' batch_size counts groups.
  loss: str = ''
  teacher_temperature: float = 1.0  # listwise with teacher scores: their softmax is over score / this
  max_query_length: int = 64  # the query's tokens at most ([CLS] and its [SEP] included); the passage gets the rest
  # Without beir_dir: this share of the training rows is held out (loss, and accuracy for labels) ...
  eval_fraction: float = 0.1
  split_seed: int = 0  # ... drawn with this seed
  beir_dir: str = _f('', free=True, path=True, evaluation=True)  # corpus.jsonl, queries.jsonl, qrels/<split>.tsv
  beir_split: str = _f('test', free=True, evaluation=True)
  # The first stage whose top rerank_top_k the cross-encoder reranks: an embedding model directory (a retrieval
  # workdir, a Hugging Face or sentence-transformers directory, as experiments/embed.py loads them), or a TREC run
  # file of the BEIR set's ids (embedding.trec).
  first_stage: str = _f('', free=True, path=True, evaluation=True)
  rerank_top_k: int = _f(20, free=True, evaluation=True)

  def __post_init__(self):
    """The rerank fields' mesh- and model-free checks."""
    super().__post_init__()
    for name in ('query_column', 'passage_column', 'positive_column', 'negatives_column') + (
        () if self.score_column.strip() else ('label_column',)):
      if not getattr(self, name).strip():
        raise ConfigError(f'{name} must name a column')
    if self.loss not in RERANK_LOSSES:
      raise ConfigError(f"loss={self.loss!r} must be one of {', '.join(map(repr, RERANK_LOSSES))} ('' infers it from "
                        'the training file: groups listwise, pairs with score_column mse, else bce)')
    if self.loss == 'mse' and not self.uses_scores():
      raise ConfigError("loss='mse' trains on teacher scores: set --config.score_column")
    if self.loss == 'bce' and self.uses_scores():
      raise ConfigError(f"loss='bce' trains on 0/1 labels, not on score_column={self.score_column!r}: unset one")
    if not math.isfinite(self.teacher_temperature) or self.teacher_temperature <= 0:
      raise ConfigError(f'teacher_temperature={self.teacher_temperature} must be a finite number > 0')
    if self.max_query_length < 3:
      raise ConfigError(f'max_query_length={self.max_query_length} must be at least 3')
    if self.max_query_length > self.max_seq_length:
      raise ConfigError(f'max_query_length={self.max_query_length} must be at most max_seq_length='
                        f'{self.max_seq_length} (the pair is cut to max_seq_length, longest first)')
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ConfigError(f'eval_fraction={self.eval_fraction} must be in [0, 1)')
    if not self.beir_dir and self.eval_fraction == 0.0:
      raise ConfigError('rerank: nothing to evaluate on: give --config.beir_dir and --config.first_stage, or hold out '
                        '--config.eval_fraction > 0 of the training rows')
    if self.rerank_top_k < 1:
      raise ConfigError(f'rerank_top_k={self.rerank_top_k} must be at least 1')
    if bool(self.beir_dir) != bool(self.first_stage):
      raise ConfigError('rerank: --config.beir_dir and --config.first_stage go together (the first stage retrieves '
                        'on the BEIR set, the cross-encoder reranks its top rerank_top_k); set both or neither')

  def uses_scores(self) -> bool:
    return bool(self.score_column.strip())


@dataclasses.dataclass(frozen=True)
class SparseConfig(FinetuneConfig):
  """A SPLADE encoder: each text's vocabulary-sized term weights are the max over its tokens of log(1 + ReLU) of the
  masked-LM head's logits (a checkpoint without that head gets one tied to its word embeddings). Trained on the
  pairs of train_file (query_column, positive_column, any negative_columns) by the ranking loss over the global
  batch (softmax cross-entropy of each query's dot products with every positive and hard negative, divided by
  `temperature`) plus the FLOPS regulariser of the queries' and of the documents' weights (sum over the vocabulary
  of the squared mean weight), each with its own weight reached quadratically over regularizer_warmup_steps
  (sentence-transformers' SpladeLoss). Evaluated on the BEIR-layout set in beir_dir by exact sparse dot products
  (finetuning.sparse)."""

  TASKS: ClassVar[tuple[str, ...]] = TASK_KINDS['sparse']

  task: str = 'sparse'
  max_query_length: int = 64
  query_column: str = 'query'
  positive_column: str = 'positive'
  negative_columns: str = ''  # comma-separated hard-negative columns (JSONL/Parquet: a column may hold a list)
  temperature: float = 1.0  # dot products / temperature (sentence-transformers' sparse ranking loss: scale 1)
  # The FLOPS regularisers' weights (SPLADE's lambda_q, lambda_d; documents: the positives and hard negatives) ...
  query_regularizer_weight: float = 5e-5
  document_regularizer_weight: float = 3e-5
  # ... reached as weight * min(1, step / regularizer_warmup_steps)^2 (0: from the first step)
  regularizer_warmup_steps: int = 0
  beir_dir: str = _f('', free=True, path=True, evaluation=True)  # corpus.jsonl, queries.jsonl, qrels/<split>.tsv
  beir_split: str = _f('test', free=True, evaluation=True)
  # Corpus texts embedded and searched at a time: a block holds block x vocabulary float32 weights.
  search_block_size: int = _f(1024, free=True, evaluation=True)

  def __post_init__(self):
    """The sparse fields' mesh- and model-free checks (the vocabulary against the tokenizer: finetuning.sparse)."""
    super().__post_init__()
    for name in ('query_column', 'positive_column'):
      if not getattr(self, name).strip():
        raise ConfigError(f'{name} must name a column')
    if not math.isfinite(self.temperature) or self.temperature <= 0:
      raise ConfigError(f'temperature={self.temperature} must be a finite number > 0')
    for name in ('query_regularizer_weight', 'document_regularizer_weight'):
      value = getattr(self, name)
      if not math.isfinite(value) or value < 0:
        raise ConfigError(f'{name}={value} must be a finite number >= 0 (0: no FLOPS regulariser)')
    if self.regularizer_warmup_steps < 0:
      raise ConfigError(f'regularizer_warmup_steps={self.regularizer_warmup_steps} must be >= 0')
    if self.max_query_length < 3:
      raise ConfigError(f'max_query_length={self.max_query_length} must be at least 3')
    if self.search_block_size < 1:
      raise ConfigError(f'search_block_size={self.search_block_size} must be at least 1')

  negative_column_names = RetrievalConfig.negative_column_names

  def score_column_names(self) -> tuple[str, ...]:
    return ()  # no distillation yet: pairs_lib.PairColumns reads none


MULTIVECTOR_LOSSES = ('contrastive', 'kl')  # MultiVectorConfig.loss


@dataclasses.dataclass(frozen=True)
class MultiVectorConfig(FinetuneConfig):
  """A multi-vector (ColBERT) encoder: every token's output projected to projection_dim and normalised, queries and
  documents scored by MaxSim; trained on the pairs of train_file (the retrieval task's columns) by InfoNCE over the
  global batch or by KL distillation from teacher scores (`loss`), evaluated by exact MaxSim on the BEIR-layout set
  in beir_dir (finetuning.multivector). Queries are read as '[Q] ' + query and filled with [MASK] to exactly
  query_length tokens, documents as '[D] ' + document cut to document_length (max_seq_length is not read), their
  punctuation not scored: sentence-transformers' MultiVectorEncoder, to which it exports."""

  TASKS: ClassVar[tuple[str, ...]] = TASK_KINDS['multivector']

  task: str = 'multivector'
  projection_dim: int = 128  # the token vectors' size: at most the model's hidden size
  query_length: int = 32  # every query's tokens ([CLS], marker, [SEP] and [MASK] filling included)
  document_length: int = 180  # a document's tokens at most ([CLS], marker and [SEP] included)
  markers: bool = True  # '[Q] ' / '[D] ' before queries / documents
  skip_punctuation: bool = True  # a document's punctuation tokens are not scored
  temperature: float = 1.0  # MaxSim scores are divided by it (a sum of up to query_length cosines: 1, as PyLate)
  query_column: str = 'query'
  positive_column: str = 'positive'
  negative_columns: str = ''  # comma-separated hard-negative columns (JSONL/Parquet: a column may hold a list)
  loss: str = 'contrastive'  # one of MULTIVECTOR_LOSSES
  score_columns: str = ''  # kl: the teacher scores, 1 + K per row (mine.py --scores writes 'scores')
  teacher_temperature: float = 0.0  # kl: the teacher scores' temperature; 0: `temperature`'s value
  beir_dir: str = _f('', free=True, path=True, evaluation=True)  # corpus.jsonl, queries.jsonl, qrels/<split>.tsv
  beir_split: str = _f('test', free=True, evaluation=True)

  negative_column_names = RetrievalConfig.negative_column_names
  score_column_names = RetrievalConfig.score_column_names

  def __post_init__(self):
    """The multivector fields' mesh- and model-free checks (the projection and lengths against the model, and the
    query length against the markers' tokens: `finetuning.multivector`)."""
    super().__post_init__()
    for name in ('query_column', 'positive_column'):
      if not getattr(self, name).strip():
        raise ConfigError(f'{name} must name a column')
    if self.projection_dim < 1:
      raise ConfigError(f'projection_dim={self.projection_dim} must be at least 1')
    if self.query_length < 3 or self.document_length < 3:
      raise ConfigError(f'query_length={self.query_length} and document_length={self.document_length} must be at '
                        'least 3 ([CLS], a token, [SEP])')
    for name in ('temperature',) + (('teacher_temperature',) if self.teacher_temperature else ()):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise ConfigError(f'{name}={value} must be a finite number > 0')
    if self.loss not in MULTIVECTOR_LOSSES:
      raise ConfigError(f'loss must be one of {", ".join(MULTIVECTOR_LOSSES)}, got {self.loss!r}')
    if self.loss == 'contrastive' and (self.score_column_names() or self.teacher_temperature):
      raise ConfigError("score_columns and teacher_temperature are read by loss='kl' (distillation); the contrastive "
                        'loss takes no scores: set --config.loss=kl or leave them out')
    if self.loss == 'kl' and not (self.score_column_names() and self.negative_column_names()):
      raise ConfigError("loss='kl' distils teacher scores of each row's candidates: set --config.score_columns "
                        "(mine.py --scores writes 'scores') and --config.negative_columns ('negatives')")


# One row per config type: FinetuneConfig(task=...) builds the one whose TASKS name the task.
CONFIG_TYPES: tuple[type, ...] = (
    HeadTaskConfig,
    RetrievalConfig,
    RerankConfig,
    SparseConfig,
    MultiVectorConfig,
)


def _int_list(name: str, text: str) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in text.split(',') if v.strip())
  except ValueError:
    raise ConfigError(f'{name}={text!r} must be positive integers separated by commas') from None
  if any(v < 1 for v in values):
    raise ConfigError(f'{name}={text!r} must be positive integers separated by commas')
  return values
