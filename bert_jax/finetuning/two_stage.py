"""Two-stage retrieval on a BEIR-layout set: a first stage's top k reranked by a cross-encoder, evaluated before and
after (experiments/rerank.py).

The first stage is an embedding model directory or a TREC run file (`embedding.first_stage`); the cross-encoder is a
bert_jax rerank workdir (finetune.py:rerank; its query and pair lengths as it trained) or a Hugging Face directory of
a one-logit sequence classifier of a family bert_jax imports (Bert-, Roberta-, XLMRoberta-, DistilBert-, Electra- or
ModernBertForSequenceClassification: experiments/export_hf.py's export of one, or a sentence-transformers
CrossEncoder such as ms-marco-MiniLM-L-6-v2; the pair cut to min(512, the model's positions) tokens, the query not
cut on its own, as CrossEncoder reads it); other shapes are one error line (model_type, a ModernBERT with
classifier_pooling='mean'). The scoring and the metrics are the rerank task's evaluation
(`rerank.rerank_first_stage`): nDCG@10, MRR@10 and recall@k under the names that task reports.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bert_jax.config import RerankConfig
from bert_jax.embedding import beir, first_stage, trec
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.finetuning import rerank
from bert_jax.finetuning.predictor import Predictor
from bert_jax.interop import families, pretrained as pretrained_lib
from bert_jax.interop.hf import model_dir
from bert_jax.interop.pretrained import FinetunedBert
from bert_jax.runs import reporting
from bert_jax.runs.workdir import inspect

HF_MAX_LENGTH = 512  # a Hugging Face cross-encoder's pair length at most (transformers' BERT tokenizers' default)
_RERANKER = ('give a bert_jax rerank workdir (experiments/finetune.py --config=experiments/configs/finetune.py:'
             'rerank) or a Hugging Face directory of a one-logit sequence classifier (BERT, RoBERTa, XLM-R, '
             'DistilBERT, ELECTRA or ModernBERT)')
_SEQUENCE_CLASS = 'ForSequenceClassification'  # transformers' <Family>ForSequenceClassification


def load_reranker(path: str, log=reporting.log) -> FinetunedBert:
  """The cross-encoder in `path` (see the module docstring), on one device.

  Raises:
    ConfigError: `path` holds another model (another task's workdir, a classifier of several labels, an encoder).
    CheckpointError: not a checkpoint at all, or an incomplete one.
  """
  if inspect(path).kind == 'finetuning':
    tuned = pretrained_lib.load_finetuned(path, log=log)
    if tuned.task.get('name') != rerank.TASK:
      raise ConfigError(f'--reranker {path} is a {tuned.task.get("name")!r} run, not a reranker: {_RERANKER}')
    return tuned
  source = pretrained_lib.describe(path, 'reranker', log=log)
  if source.kind != 'hf':
    raise ConfigError(f'--reranker {path} is a pretraining workdir (no reranking head): {_RERANKER}')
  hf = model_dir.read_json_config(path)
  arch = (hf.get('architectures') or [''])[0]
  labels = int(hf.get('num_labels') or len(hf.get('id2label') or {}) or 2)
  if not arch.endswith(_SEQUENCE_CLASS) or labels != 1:
    what = f'a classifier of {labels} labels' if arch.endswith(_SEQUENCE_CLASS) else f'a {arch or "model"}'
    raise ConfigError(f'--reranker {path} is {what}, not a one-logit sequence classifier: {_RERANKER}')
  tokenizer = source.tokenizer()
  cfg, params, _, _ = families.load_hf_checkpoint(path)
  if 'classifier' not in params:
    raise CheckpointError(f'{path}: a {arch} without classifier weights')
  length = min(HF_MAX_LENGTH, cfg.max_position_embeddings)
  settings = RerankConfig(init_checkpoint=path, model=cfg, max_seq_length=length, max_query_length=length)
  task = {'name': rerank.TASK, 'kind': rerank.KIND, 'num_labels': 1, 'label_names': []}
  return FinetunedBert(cfg, settings, task, params, tokenizer, path, seed=0, step=0)


def rerank_beir(first: str, reranker: str, beir_dir: str, *, split: str = 'test', top_k: int = 20,
                batch_size: int = 64, output_run: str | None = None, log=reporting.log) -> dict[str, Any]:
  """Retrieves (or reads) `first`'s top `top_k` on the BEIR set in `beir_dir`, reranks them with `reranker` and
  evaluates both; with `output_run`, writes the reranked run (TREC, atomically; scores: the cross-encoder's logits).

  Returns:
    {'eval_ndcg_at_10', 'eval_mrr_at_10', 'eval_recall_at_<top_k>' (reranked), 'eval_first_stage_*' (before),
    'queries', 'documents', 'top_k', 'pairs' (scored), 'first_stage', 'reranker', 'scoring_s' (tokenizing, compiling
    and scoring the pairs), 'wall_s'}.

  Raises:
    ConfigError, DataError, CheckpointError: bad flags, inputs or models (one line each).
  """
  if top_k < 1 or batch_size < 1:
    raise ConfigError(f'--top_k and --batch_size must be positive, got {top_k} and {batch_size}')
  start = time.time()
  first_stage.check(first, '--first_stage')
  data = beir.read_beir(beir_dir, split)
  ids_qk = None
  if first_stage.is_run_file(first):  # a bad run is refused before any model loads
    ids_qk = first_stage.ranking(first, data, top_k, batch_size, log=log)
  log(f'rerank: loading the cross-encoder {reranker} ...')
  tuned = load_reranker(reranker, log)
  if ids_qk is None:
    ids_qk = first_stage.ranking(first, data, top_k, batch_size, log=log)
  settings = tuned.finetune
  log(f'rerank: {len(data.query_ids)} queries x top {ids_qk.shape[1]} against {len(data.corpus_ids)} documents; '
      f'pairs of at most {settings.max_seq_length} tokens (queries {settings.max_query_length})')
  predictor = Predictor(tuned, batch_size, log, pack=True)
  scoring = time.time()
  reranked, scores, metrics = rerank.rerank_first_stage(
      data, ids_qk, predictor.scores, tuned.tokenizer, top_k=top_k, max_query_length=settings.max_query_length,
      max_seq_length=settings.max_seq_length)
  scoring = time.time() - scoring
  if output_run:
    trec.write_run(output_run, data, reranked, scores, tag='bert_jax_rerank')
    log(f'rerank: wrote the reranked run to {output_run}')
  return {**metrics, 'queries': len(data.query_ids), 'documents': len(data.corpus_ids), 'top_k': top_k,
          'pairs': int(np.sum(np.asarray(ids_qk) != trec.EMPTY)), 'first_stage': first, 'reranker': reranker,
          'scoring_s': round(scoring, 3), 'wall_s': round(time.time() - start, 3)}
