"""BM25 (embedding.bm25) against a direct transcription of Lucene's formula, reciprocal rank fusion by hand, and
experiments/bm25.py on the bundled BEIR sample: metrics, a run file, fusion, bad input."""

import json
import math
import os

import numpy as np
import pytest

from bert_jax.embedding import bm25
from bert_jax.embedding.trec import EMPTY

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import REPO

BEIR = os.path.join(REPO, 'data', 'samples', 'retrieval', 'beir')
DOCS = ['The castle was built in 1200.', 'A castle, a moat and a castle wall.', 'Rivers flow to the sea.',
        'Who built the castle? The king built it.']


def _lucene(query, docs, k1=0.9, b=0.4):
  """Each document's BM25 score, term by term as Lucene's BM25Similarity writes it."""
  tokens = [d.lower().replace(',', ' ').replace('.', ' ').replace('?', ' ').split() for d in docs]
  avgdl = sum(map(len, tokens)) / len(tokens)
  out = []
  for doc in tokens:
    score = 0.0
    for term in query.lower().split():
      df = sum(term in t for t in tokens)
      if not df:
        continue
      idf = math.log(1 + (len(tokens) - df + 0.5) / (df + 0.5))
      tf = doc.count(term)
      score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    out.append(score)
  return np.array(out)


def test_scores_are_lucenes_bm25_and_search_ranks_by_them():
  index = bm25.BM25(DOCS)
  for query in ('castle built', 'the sea', 'moat moat castle', 'nothing matches'):
    np.testing.assert_allclose(index.scores(query), _lucene(query, DOCS), rtol=1e-12)
  ids, scores = index.search(['castle built', 'sea', 'unknown'], k=3)
  assert ids[0].tolist() == list(np.argsort(-_lucene('castle built', DOCS), kind='stable')[:3])
  assert ids[1].tolist() == [2, EMPTY, EMPTY] and scores[1, 1] == 0  # only matching documents are retrieved
  assert (ids[2] == EMPTY).all()
  assert bm25.BM25(DOCS, k1=1.2, b=0.75).scores('castle')[1] == pytest.approx(_lucene('castle', DOCS, 1.2, 0.75)[1])


def test_reciprocal_rank_fusion_by_hand():
  a = np.array([[3, 1, 2]])
  b = np.array([[1, 4, EMPTY]])
  ids, fused = bm25.reciprocal_rank_fusion([a, b], k=60, depth=4)
  # 1: 1/62 + 1/61; 3: 1/61; 4: 1/62; 2: 1/63
  assert ids[0].tolist() == [1, 3, 4, 2]
  np.testing.assert_allclose(fused[0], [1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63])


def test_the_command_scores_writes_a_run_and_fuses(tmp_path):
  run = tmp_path / 'bm25.trec'
  first = run_main('bm25.py', f'--beir_dir={BEIR}', f'--output_run={run}')
  assert first.returncode == 0, first.stderr[-2000:]
  result = json.loads(first.stdout.strip().splitlines()[-1])
  assert 0 < result['eval_mrr_at_10'] <= 1 and 0 < result['eval_ndcg_at_10'] <= 1 and run.stat().st_size > 0
  fused = run_main('bm25.py', f'--beir_dir={BEIR}', f'--fuse={run}', f'--output_run={tmp_path / "hybrid.trec"}')
  assert fused.returncode == 0, fused.stderr[-2000:]
  both = json.loads(fused.stdout.strip().splitlines()[-1])
  # BM25 fused with its own run ranks as BM25 does.
  assert both['eval_fused_mrr_at_10'] == pytest.approx(result['eval_mrr_at_10'])
  before = run.read_bytes()
  assert_one_line_error(run_main('bm25.py', f'--beir_dir={BEIR}', f'--fuse={run}', f'--output_run={run}'),
                        'would overwrite an input')
  assert run.read_bytes() == before
  assert_one_line_error(run_main('bm25.py', f'--beir_dir={BEIR}', '--top_k=5'), '--top_k=5 must be >= 10')
