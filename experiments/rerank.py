"""Two-stage retrieval on a BEIR-layout set: a first stage retrieves, a cross-encoder reranks its top k; prints the
metrics before and after.

  python experiments/rerank.py --first_stage=EMBEDDING_MODEL --reranker=/tmp/rerank \
      --beir_dir=data/samples/retrieval/beir --top_k=20 --output_run=/tmp/reranked.trec
  python experiments/rerank.py --first_stage=bm25.trec.gz --reranker=HF_CROSS_ENCODER --beir_dir=scifact

--first_stage is an embedding model directory (a retrieval workdir, a Hugging Face or sentence-transformers
directory: it embeds the queries and the corpus as experiments/embed.py does and searches exactly) or a TREC run file
of the set's ids (`qid Q0 docid rank score tag` lines, compressed or not: each query's top --top_k by score).
--reranker is a bert_jax rerank workdir (finetune.py:rerank) or a Hugging Face one-logit sequence classifier
directory of BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA or ModernBERT shape (export_hf.py's export of one, a
sentence-transformers CrossEncoder).
--beir_dir holds corpus.jsonl, queries.jsonl and qrels/<--beir_split>.tsv.

Prints one JSON line: eval_ndcg_at_10, eval_mrr_at_10, eval_recall_at_<k> after reranking and eval_first_stage_*
before (the names finetune.py:rerank reports), with the counts; progress and ETA go to stderr. --output_run writes
the reranked run (TREC, the cross-encoder's logits as scores) atomically. Every input is only read
(bert_jax/finetuning/two_stage.py; docs/reranking.md).
"""

import json
import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.finetuning import two_stage
from bert_jax.runs import reporting

import cli

_FIRST_STAGE = flags.DEFINE_string('first_stage', None, 'An embedding model directory or a TREC run file.',
                                   required=True)
_RERANKER = flags.DEFINE_string('reranker', None, 'A rerank workdir or a Hugging Face one-logit '
                                '<Family>ForSequenceClassification directory.', required=True)
_BEIR_DIR = flags.DEFINE_string('beir_dir', None, 'A BEIR-layout set: corpus.jsonl, queries.jsonl, '
                                'qrels/<split>.tsv.', required=True)
_BEIR_SPLIT = flags.DEFINE_string('beir_split', 'test', 'Which qrels file judges the queries.')
_TOP_K = flags.DEFINE_integer('top_k', 20, "Rerank each query's first k candidates.")
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 64, 'Texts (first stage) and pairs (reranker) per forward pass.')
_OUTPUT_RUN = flags.DEFINE_string('output_run', None, 'Write the reranked run here (TREC; .gz: compressed).')


def _check_output() -> None:
  path = _OUTPUT_RUN.value
  files.check_output(path, 'file', '--output_run')
  if files.is_remote(path):
    return
  out = os.path.realpath(path)
  for flag in (_RERANKER, _FIRST_STAGE, _BEIR_DIR):
    inside = os.path.realpath(flag.value)
    if out == inside or out.startswith(inside + os.sep):
      raise ConfigError(f'--output_run {path} would write into --{flag.name} {flag.value}, which is only read: write '
                        'it elsewhere')


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result line
  if _OUTPUT_RUN.value:
    _check_output()
  result = two_stage.rerank_beir(_FIRST_STAGE.value, _RERANKER.value, _BEIR_DIR.value, split=_BEIR_SPLIT.value,
                                 top_k=_TOP_K.value, batch_size=_BATCH_SIZE.value, output_run=_OUTPUT_RUN.value,
                                 log=reporting.log)
  if _OUTPUT_RUN.value:
    result['output_run'] = _OUTPUT_RUN.value
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  cli.run(main)
