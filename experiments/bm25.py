"""BM25 on a BEIR-layout set, and hybrid search: BM25 fused with other runs by reciprocal rank fusion.

  python experiments/bm25.py --beir_dir=data/samples/retrieval/beir --output_run=/tmp/bm25.trec
  python experiments/bm25.py --beir_dir=DIR --fuse=/tmp/retrieval,/tmp/other.trec --output_run=/tmp/hybrid.trec

Prints one JSON line: eval_ndcg_at_10, eval_mrr_at_10, eval_recall_at_<k> of BM25 (Lucene's, k1=0.9, b=0.4,
lower-cased words; bert_jax/embedding/bm25.py) and, with --fuse (embedding model directories, searched exactly as
rerank.py's first stage searches, or TREC run files of the set's ids), eval_fused_* of BM25 and those rankings
together (reciprocal rank fusion, k=60), each one's top --top_k. --output_run writes BM25's run (or the fused one) atomically, for rerank.py --first_stage.
"""

import json
import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.embedding import beir, bm25, first_stage, ranking, trec
from bert_jax.errors import ConfigError
from bert_jax.runs import reporting

import cli

_BEIR_DIR = flags.DEFINE_string('beir_dir', None, 'A BEIR-layout set: corpus.jsonl, queries.jsonl, '
                                'qrels/<split>.tsv.', required=True)
_SPLIT = flags.DEFINE_string('beir_split', 'test', 'The qrels split.')
_TOP_K = flags.DEFINE_integer('top_k', 100, 'Documents retrieved per query (and read from each --fuse run).')
_K1 = flags.DEFINE_float('k1', 0.9, 'BM25 term-frequency saturation.')
_B = flags.DEFINE_float('b', 0.4, 'BM25 length normalisation (0: none, 1: full).')
_FUSE = flags.DEFINE_list('fuse', [], 'Embedding model directories or TREC run files fused with BM25 by reciprocal '
                          'rank fusion.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 64, 'Texts per encoder call of a --fuse embedding model.')
_RRF_K = flags.DEFINE_integer('rrf_k', 60, 'Reciprocal rank fusion constant: 1 / (k + rank).')
_OUTPUT_RUN = flags.DEFINE_string('output_run', None, 'Writes the BM25 (or, with --fuse, the fused) run here.')


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result line
  if _TOP_K.value < 10 or _K1.value < 0 or not 0 <= _B.value <= 1 or _RRF_K.value < 1:
    raise ConfigError(f'--top_k={_TOP_K.value} must be >= 10, --k1={_K1.value} >= 0, --b={_B.value} in [0, 1] '
                      f'and --rrf_k={_RRF_K.value} >= 1')
  if _OUTPUT_RUN.value:
    files.check_output(_OUTPUT_RUN.value, 'file', '--output_run')
    if _OUTPUT_RUN.value in _FUSE.value or files.isdir(_BEIR_DIR.value) and not files.is_remote(_OUTPUT_RUN.value) \
        and os.path.realpath(_OUTPUT_RUN.value).startswith(os.path.realpath(_BEIR_DIR.value) + os.sep):
      raise ConfigError(f'--output_run {_OUTPUT_RUN.value} would overwrite an input (--fuse or --beir_dir): write it '
                        'elsewhere')
  data = beir.read_beir(_BEIR_DIR.value, _SPLIT.value)
  runs = [first_stage.ranking(path, data, _TOP_K.value, _BATCH_SIZE.value) for path in _FUSE.value]
  index = bm25.BM25(data.passages(), k1=_K1.value, b=_B.value)
  ids, scores = index.search(data.queries, _TOP_K.value)
  out = {f'eval_{k.replace("@", "_at_")}': v for k, v in ranking.ranking_metrics(ids, data.qrels).items()}
  if runs:
    ids, scores = bm25.reciprocal_rank_fusion([ids, *runs], k=_RRF_K.value, depth=_TOP_K.value)
    out.update({f'eval_fused_{k.replace("@", "_at_")}': v
                for k, v in ranking.ranking_metrics(ids, data.qrels).items()})
  if _OUTPUT_RUN.value:
    trec.write_run(_OUTPUT_RUN.value, data, ids, scores, tag='bm25_rrf' if runs else 'bm25')
  print(json.dumps({**out, 'queries': len(data.queries), 'documents': len(data.texts), 'fused': list(_FUSE.value),
                    'output_run': _OUTPUT_RUN.value}), flush=True)


if __name__ == '__main__':
  cli.run(main)
