"""experiments/rerank.py: a first stage (an embedding model or a TREC run file) reranked by a cross-encoder (a rerank
workdir or its Hugging Face export) on the bundled BEIR sample, against the rerank task's own evaluation; bad input
one error line each."""

import json
import os

import pytest

from bert_jax.embedding import beir, first_stage, trec
from bert_jax.finetuning import finetune_run as finetuning

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import finetune_config

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'data',
                       'samples', 'retrieval')
BEIR = os.path.join(SAMPLES, 'beir')
TOP_K = 5


@pytest.fixture(scope='module')
def reranker(tiny_checkpoint, tmp_path_factory):
  """A rerank workdir from the tiny checkpoint (3 steps of 8 sample pairs), evaluated by reranking the tiny
  checkpoint's own top 5 on the sample set: (workdir, its final metrics)."""
  root = tmp_path_factory.mktemp('reranker')
  with open(os.path.join(SAMPLES, 'pairs.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  pairs = root / 'pairs.jsonl'
  pairs.write_text(''.join(json.dumps({'query': r['query'], 'passage': p, 'label': label}) + '\n'
                           for r in rows for p, label in ((r['positive'], 1), (r['negative'], 0))), encoding='utf-8')
  cfg = finetune_config(task='rerank', init_checkpoint=tiny_checkpoint, train_file=str(pairs), max_seq_length=64,
                        max_query_length=16, batch_size=8, eval_batch_size=16, learning_rate=1e-2, num_train_steps=3,
                        beir_dir=BEIR, first_stage=tiny_checkpoint, rerank_top_k=TOP_K)
  result = finetuning.finetune(cfg, str(root / 'run'))
  return str(root / 'run'), result


def _rerank(*args):
  r = run_main('rerank.py', *args)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _metrics(result):
  return {k: v for k, v in result.items() if k.startswith('eval_') and k != 'eval_wall_s'}


@pytest.mark.slow
def test_the_two_stage_command_reports_what_the_task_evaluates_from_a_model_or_its_run(reranker, tiny_checkpoint,
                                                                                       tmp_path):
  workdir, task = reranker
  common = (f'--reranker={workdir}', f'--beir_dir={BEIR}', f'--top_k={TOP_K}', '--batch_size=16')
  ours, stderr = _rerank(f'--first_stage={tiny_checkpoint}', f'--output_run={tmp_path / "reranked.trec"}', *common)
  names = {'eval_ndcg_at_10', 'eval_mrr_at_10', f'eval_recall_at_{TOP_K}'}
  assert set(_metrics(ours)) == names | {n.replace('eval_', 'eval_first_stage_') for n in names}
  assert ours['queries'] == 8 and ours['documents'] == 24 and 'rerank: 8 queries x top 5' in stderr
  # The task's evaluation of its last step (8 devices, packed batches of the step model) is the command's (one
  # device, the predictor): one function scores and ranks both; logits may differ in the last bits.
  assert _metrics(ours) == pytest.approx(_metrics(task), abs=1e-6)
  # The first stage as a run file of what the model retrieves: the same evaluation, before and after.
  data = beir.read_beir(BEIR)
  ids, scores = first_stage.retrieve(tiny_checkpoint, data, TOP_K, batch_size=16)
  trec.write_run(str(tmp_path / 'first.trec.gz'), data, ids, scores)
  from_run, _ = _rerank(f'--first_stage={tmp_path / "first.trec.gz"}', *common)
  assert _metrics(from_run) == _metrics(ours)
  # ... and the task's own evaluation from that run file (read with the BEIR set, before the weights).
  evaluated = run_main('evaluate.py', f'--workdir={workdir}', f'--config.first_stage={tmp_path / "first.trec.gz"}',
                       f'--output_dir={tmp_path / "eval"}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert 'a TREC run, each query' in evaluated.stdout + evaluated.stderr
  assert _metrics(json.loads(evaluated.stdout.strip().splitlines()[-1])) == pytest.approx(_metrics(task), abs=1e-6)
  # The reranked run read back as a first stage: it ranks as the reranking did, and reranking it changes nothing.
  again, _ = _rerank(f'--first_stage={tmp_path / "reranked.trec"}', *common)
  assert {k.replace('first_stage_', ''): v for k, v in _metrics(again).items() if 'first_stage' in k} == \
      {k: v for k, v in _metrics(ours).items() if 'first_stage' not in k}
  # Its Hugging Face export reranks alike (a one-logit BertForSequenceClassification).
  exported = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={tmp_path / "hf"}')
  assert exported.returncode == 0, exported.stderr[-2000:]
  hf, _ = _rerank(f'--first_stage={tmp_path / "first.trec.gz"}', f'--reranker={tmp_path / "hf"}', *common[1:])
  assert _metrics(hf) == pytest.approx(_metrics(ours), abs=1e-6)


@pytest.mark.parametrize('args, message', [
    (('--top_k=0',), '--top_k and --batch_size must be positive, got 0'),
    (('--first_stage=/nonexistent/run.trec',), 'first_stage /nonexistent/run.trec does not exist; give an embedding'),
    (('--beir_dir=/nonexistent',), 'BEIR directory /nonexistent does not exist'),
    (('--first_stage={bad_run}',), "1 document id that corpus.jsonl lacks, on 1 line ('d99' line 2)"),
    (('--first_stage={run}',), 'is a BertModel, not a one-logit sequence classifier'),
    (('--first_stage={run}', '--output_run={checkpoint}/run.trec'), 'which is only read'),
])
def test_bad_input_is_one_error_line(tiny_checkpoint, tmp_path, args, message):
  (tmp_path / 'run.trec').write_text('q16 Q0 d16 1 2.0 t\nq17 Q0 d17 1 1.0 t\n', encoding='utf-8')
  (tmp_path / 'bad.trec').write_text('q16 Q0 d16 1 2.0 t\nq17 Q0 d99 1 1.0 t\n', encoding='utf-8')
  values = dict(run=tmp_path / 'run.trec', bad_run=tmp_path / 'bad.trec', checkpoint=tiny_checkpoint)
  flags = {'first_stage': f'--first_stage={tiny_checkpoint}', 'reranker': f'--reranker={tiny_checkpoint}',
           'beir_dir': f'--beir_dir={BEIR}'}
  for arg in args:
    flags[arg[2:].split('=')[0]] = arg.format(**values)
  assert_one_line_error(run_main('rerank.py', *flags.values()), message)
