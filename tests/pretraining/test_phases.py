"""A run in phases (the modern recipe): phases resolve from the config, one process goes through them with the
optimizer state carried, each phase on its own data and model, resume anywhere is bitwise, and the result
evaluates and exports as its last phase's model."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import config, sharding
from bert_jax.errors import ConfigError
from bert_jax.pretraining import pretrain_run as pretrain
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.train import optim, preemption

from harness.digests import restore_pretraining_state, tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.faults import kill_after_save, sigterm_at_pretraining_batch
from harness.inputs import REPO, write_small_corpus
from harness.processes import script_code

sys.path.insert(0, os.path.join(REPO, 'experiments'))
from configs import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top,wrong-import-position


def _recipe(corpus=None, cache=None, **fields):
  d = pretrain_configs.get_config('recipe_tiny').to_dict()
  if corpus:
    d['data'].update(train_files=corpus, cache_dir=cache, eval_fraction=0.4)
  d.update(fields)
  return config.PretrainConfig.from_dict(d)


def test_phases_resolve_in_their_order_with_what_changes():
  cfg = _recipe()
  phases = cfg.phase_list()
  assert [(p.label, p.start, p.end) for p in phases] == [('phase 1/3 stable', 0, 4), ('phase 2/3 extend', 4, 8),
                                                         ('phase 3/3 decay', 8, 12)]
  assert cfg.num_train_steps == 12 and cfg.decay_start() == 8
  data = [p.cfg.data for p in phases]
  assert [d.max_seq_length for d in data] == [32, 64, 64]  # the extension carries into the decay
  assert [d.masked_lm_prob for d in data] == [0.3, 0.3, 0.15] and [d.max_predictions_per_seq for d in data] == [10, 20, 10]
  assert [p.cfg.model.rope_theta for p in phases] == [10000.0, 160000.0, 160000.0]
  assert all(p.cfg.model.local_rope_theta == 10000.0 for p in phases)
  assert (cfg.phase_at(3).name, cfg.phase_at(4).name, cfg.phase_before(4).name, cfg.phase_at(12).name) == (
      'stable', 'extend', 'stable', 'decay')
  # A phase ramping its masking rate; the next one masks at the rate it ended with.
  ramp = _recipe(phases={'a': dict(order=1, steps=3, masked_lm_prob=0.4, masked_lm_prob_end=0.2),
                         'b': dict(order=2, steps=2)}, num_train_steps=0)
  assert [(p.cfg.data.masked_lm_prob, p.cfg.data.masked_lm_prob_end) for p in ramp.phase_list()] == [(0.4, 0.2),
                                                                                                     (0.2, 0.0)]
  # Saved and loaded: the same run; the order is the phases' own, whatever order a dict gives them in.
  again = config.PretrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
  assert again == cfg and list(again.phases) == ['stable', 'extend', 'decay']
  shuffled = cfg.to_dict()
  shuffled['phases'] = dict(reversed(list(shuffled['phases'].items())))
  assert list(config.PretrainConfig.from_dict(shuffled).phases) == ['stable', 'extend', 'decay']
  assert config.PretrainConfig().phase_list()[0].cfg is not None  # no phases: one, the run itself


@pytest.mark.parametrize('change,pattern', [
    (dict(extend=dict(order=5)), 'order=1, 2, ...'),
    (dict(extend=dict(steps=0)), 'phases.extend.steps must be a positive number'),
    (dict(extend=dict(bogus=1)), 'phases.extend: unknown key(s) bogus'),
    (dict(extend=dict(lr='cosine')), "phases.extend.lr must be '' or 'decay'"),
    (dict(stable=dict(lr='decay')), 'phases.extend.lr: the phases after the first decay phase (stable) decay too'),
    (dict(extend=dict(max_seq_length=4)), 'phases.extend: data.max_seq_length=4'),
])
def test_bad_phases_are_refused_when_the_config_is_built(change, pattern):
  d = _recipe().to_dict()
  d['num_train_steps'] = 0
  for name, fields in change.items():
    d['phases'][name].update(fields)
  with pytest.raises(ConfigError, match=pattern.replace('(', r'\(').replace(')', r'\)')):
    config.PretrainConfig.from_dict(d)


def test_phase_lengths_and_the_schedule_must_agree():
  d = _recipe().to_dict()
  with pytest.raises(ConfigError, match=r'sum of their steps \(12\); set num_train_steps=0'):
    config.PretrainConfig.from_dict({**d, 'num_train_steps': 20})
  with pytest.raises(ConfigError, match="lr='decay' needs optim.schedule='wsd'"):
    config.PretrainConfig.from_dict({**d, 'optim': {**d['optim'], 'schedule': 'linear'}})


@pytest.fixture(scope='module')
def phased(built_once):
  """The recipe_tiny run on a small corpus, straight through: (config, corpus, cache, workdir, final metrics), built
  once per test run (conftest.built_once). Its workdir is read-only; the tests that prepare other lengths of its
  corpus write into its data cache (the library's locks keep two workers' preparations apart)."""
  def build(root):
    corpus = write_small_corpus(root)
    pretrain.train_and_evaluate(_recipe(corpus, str(root / 'cache')), str(root / 'straight'))

  root = built_once('phased', build)
  corpus, cache, workdir = str(root / 'corpus.txt'), str(root / 'cache'), str(root / 'straight')
  with open(os.path.join(workdir, 'final_metrics.json'), encoding='utf-8') as f:
    return _recipe(corpus, cache), corpus, cache, workdir, json.load(f)


@pytest.mark.slow
def test_one_run_goes_through_its_phases(phased):
  cfg, _, _, workdir, result = phased
  evals = [json.loads(l) for l in open(os.path.join(workdir, 'metrics_eval.jsonl'))]
  assert [(e['step'], e['phase']) for e in evals] == [(4, 1), (8, 2), (12, 3)]  # held-out MLM after each phase
  train = [json.loads(l) for l in open(os.path.join(workdir, 'metrics_train.jsonl'))]
  assert [(t['step'], t['phase']) for t in train] == [(2, 1), (4, 1), (6, 2), (8, 2), (10, 3), (12, 3)]
  # One optimizer over the whole run: warmup, stable, then the decay from the decay phase's first step.
  schedule = optim.learning_rate_schedule(cfg.optim, 12, 8)
  for t in train:
    assert t['learning_rate'] == pytest.approx(float(np.mean([schedule(s) for s in (t['step'] - 2, t['step'] - 1)])))
  assert train[-1]['learning_rate'] < train[-2]['learning_rate'] < train[-3]['learning_rate']
  # Each phase's checkpoint evaluates again as that phase's model on its data: the numbers the run logged.
  assert Checkpointer(workdir, read_only=True).all_steps() == [8, 10, 12]
  again = {r['step']: r for r in pretrain.evaluate_checkpoints(workdir, [8, 12])}
  assert again[8]['mlm_loss'] == evals[1]['mlm_loss'] and again[12]['mlm_loss'] == result['mlm_loss']
  assert again[8]['num_masked_tokens'] > again[12]['num_masked_tokens']  # 30% masking, then 15%


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize('stop,code,at', [
    ('kill_9', -signal.SIGKILL, 6),  # kill -9 in the middle of the extension phase: a process of its own
    ('sigterm', preemption.EXIT_CODE, 4),  # SIGTERM in the stable phase's last step: saved at the boundary
])
def test_resume_anywhere_continues_as_if_uninterrupted(phased, tmp_path, monkeypatch, stop, code, at):
  cfg, corpus, cache, straight, result = phased
  workdir = str(tmp_path / 'resumed')
  argv = ['pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:recipe_tiny',
          f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}', '--config.data.eval_fraction=0.4']
  if stop == 'kill_9':
    first = subprocess.run([sys.executable, '-c', script_code(argv, kill_after_save(at))], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
  else:  # in this process (tests/test_faults.py stops a process of its own with SIGTERM)
    with sigterm_at_pretraining_batch(monkeypatch, at):
      first = run_main(*argv)
  assert first.returncode == code, first.stderr[-3000:]
  assert Checkpointer(workdir, read_only=True).latest_step() == at
  second = run_main(*argv)  # the resume: the same command again, in this process (no Python start, no JAX import)
  assert second.returncode == 0, second.stderr[-3000:]
  assert f'resumed from {workdir}/checkpoints at step {at}' in second.stdout
  assert ('phase 2/3 extend: training' in second.stdout) and 'phase 1/3 stable: training' not in second.stdout
  a, meta_a = restore_pretraining_state(straight, cfg, 12)
  b, meta_b = restore_pretraining_state(workdir, cfg, 12)
  assert meta_a['data_position'] == meta_b['data_position'] == 12
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)  # params, both moments, step, RNG
  final = json.load(open(os.path.join(workdir, 'final_metrics.json')))
  assert final['mlm_loss'] == result['mlm_loss']
  losses = lambda w: {r['step']: r['loss'] for r in map(json.loads, open(os.path.join(w, 'metrics_train.jsonl')))}  # pylint: disable=unnecessary-lambda-assignment
  assert losses(workdir) == losses(straight)  # every logged step's loss, before and after the interruption


@pytest.mark.slow
def test_the_result_exports_as_its_last_phase_and_transformers_computes_it(phased, tmp_path):
  torch, transformers = pytest.importorskip('torch'), pytest.importorskip('transformers')
  _, _, _, workdir, _ = phased
  out = str(tmp_path / 'hf')
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  exported = json.load(open(os.path.join(out, 'config.json')))
  assert exported['architectures'] == ['ModernBertForMaskedLM'] and exported['global_rope_theta'] == 160000.0
  assert exported['local_rope_theta'] == 10000.0
  from bert_jax.interop.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  ours = load_pretrained(workdir)
  assert ours.config.rope_theta == 160000.0
  text = ' '.join(['the history of the city and its people'] * 6)  # longer than the local window: the band path
  ids = np.asarray([ours.tokenizer.encode_inputs(text, None, max_length=64)[0]], np.int32)
  mlm = transformers.ModernBertForMaskedLM.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = mlm(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax.model.heads import BertForPreTraining  # pylint: disable=g-import-not-at-top
  model = BertForPreTraining(ours.config, rngs=nnx.Rngs(0), nsp_head=False)
  nnx.update(model, ours.params)
  logits, _ = model(ids, None, np.ones_like(ids), np.arange(ids.shape[1])[None])
  assert ids.shape[1] > 16 and np.abs(theirs - np.asarray(logits)).max() <= 1e-4


@pytest.mark.slow
def test_bad_phase_flags_are_one_line_and_touch_nothing(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  for flag, pattern in (('--config.phases.extend.order=7', 'order=1, 2, ...'),
                        ('--config.phases.decay.lr=stable', "phases.decay.lr must be '' or 'decay'"),
                        ('--config.num_train_steps=50', 'the sum of their steps (12)')):
    assert_one_line_error(run_main('pretrain.py', f'--workdir={workdir}',
                                   '--config=experiments/configs/pretrain.py:recipe_tiny', flag), pattern)
  assert tree_digest(str(workdir)) == before


def test_a_missing_branch_source_and_keep_best_with_phases_say_what_is_wrong(tmp_path):
  """A branch_from that does not exist says so (it is no workdir of another kind); keep_best with phases is refused
  for the phases, before its own need of eval_every > 0."""
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  missing = str(tmp_path / 'missing')
  for flags, pattern in (
      (['--config=experiments/configs/pretrain.py:tiny', f'--config.branch_from={missing}'],
       f'branch_from {missing} does not exist: give the workdir'),
      (['--config=experiments/configs/pretrain.py:recipe_tiny', '--config.keep_best=true', '--config.eval_every=0'],
       'keep_best ranks checkpoints by one held-out metric, but each phase evaluates on its own records')):
    assert_one_line_error(run_main('pretrain.py', f'--workdir={workdir}', *flags), pattern)
  assert tree_digest(str(workdir)) == before


@pytest.mark.slow
def test_modernbert_base_lowers_every_phase_on_8_devices():
  """The accelerator recipe as stated (22 layers of ModernBERT-base's shape, bfloat16, scan, remat, phases at
  1,024 then 8,192 tokens), at tiny width: each phase's train step lowers on a 2 x 2 x 2 mesh of 8 devices with
  packed rows, its local layers on the blockwise path."""
  from harness.inputs import random_pretraining_batch  # pylint: disable=g-import-not-at-top
  d = pretrain_configs.get_config('modernbert_base').to_dict()
  assert (d['model']['num_layers'], d['model']['hidden_size'], d['model']['attention_window']) == (22, 768, 128)
  d['model'].update(hidden_size=64, num_heads=4, intermediate_size=96, vocab_size=512)
  d['mesh'].update(data=2, fsdp=2, tensor=2)
  cfg = config.PretrainConfig.from_dict(d)
  phases = cfg.phase_list()
  assert [(p.cfg.batch_size, p.cfg.data.max_seq_length, p.cfg.model.rope_theta) for p in phases] == [
      (768, 1024, 1e4), (1536, 1024, 1e4), (3072, 1024, 1e4), (4608, 1024, 1e4), (576, 8192, 1.6e5), (576, 8192, 1.6e5)]
  assert round(sum(p.tokens for p in phases[:4]) / 1e9) == 1700 and round(phases[4].tokens / 1e9) == 250
  assert cfg.decay_start() == phases[-1].start and cfg.optim.name == 'stable_adamw' and cfg.data.masked_lm_prob == 0.3
  assert [p.cfg.optim.learning_rate for p in phases[3:]] == [8e-4, 3e-4, 3e-4]  # the extension's lower peak
  mesh = sharding.make_mesh(cfg.mesh)
  for phase in (phases[3], phases[4]):
    model = pretrain.build_model(dataclasses.replace(cfg, model=phase.cfg.model), mesh, cfg.num_train_steps)
    seq = phase.cfg.data.max_seq_length
    batch = random_pretraining_batch(batch_size=8, seq_len=seq, num_predictions=phase.cfg.data.max_predictions_per_seq,
                                     vocab_size=512, num_pad=seq // 4)
    batch['segment_ids'] = np.where(np.arange(seq)[None] < seq // 2, 1, 2).astype(np.int32) * batch['attention_mask']
    batch['position_ids'] = np.where(np.arange(seq) < seq // 2, np.arange(seq), np.arange(seq) - seq // 2)[None].repeat(
        8, 0).astype(np.int32)
    lowered = model.train_step.lower(model.abstract_state, model.global_batch(batch), model.rest)
    text = lowered.as_text()
    assert 'bf16' in text and text.count('while') >= 1  # bfloat16 compute, the scanned layers


@pytest.mark.slow
def test_a_branch_run_continues_another_runs_state_without_touching_it(phased, tmp_path):
  cfg, _, _, straight, result = phased
  before = tree_digest(straight)
  # The same run branched at step 8: it ends exactly where the straight run ended.
  same = pretrain.train_and_evaluate(dataclasses.replace(cfg, branch_from=straight, branch_step=8), str(tmp_path / 'same'))
  assert same['mlm_loss'] == result['mlm_loss']
  a, _ = restore_pretraining_state(straight, cfg, 12)
  b, _ = restore_pretraining_state(str(tmp_path / 'same'), cfg, 12)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  # A decay variant: a shorter decay from the same checkpoint (as decay variants are released).
  d = cfg.to_dict()
  d['phases']['decay'].update(steps=2)
  variant = config.PretrainConfig.from_dict({**d, 'num_train_steps': 0, 'branch_from': straight, 'branch_step': 8})
  out = pretrain.train_and_evaluate(variant, str(tmp_path / 'short_decay'))
  rows = [json.loads(l) for l in open(tmp_path / 'short_decay' / 'metrics_train.jsonl')]
  assert [r['step'] for r in rows] == [10] and out['step'] == 10  # only the branch's own steps were trained
  assert rows[0]['learning_rate'] == pytest.approx(float(np.mean(
      [optim.learning_rate_schedule(variant.optim, 10, 8)(s) for s in (8, 9)])))
  assert tree_digest(straight) == before  # the other run is only read
  # What a branch cannot change, and a branch point past the end, are refused before anything trains.
  other = dataclasses.replace(cfg, branch_from=straight, branch_step=8,
                              optim=dataclasses.replace(cfg.optim, learning_rate=5e-4))
  with pytest.raises(Exception, match='optim.learning_rate'):
    pretrain.train_and_evaluate(other, str(tmp_path / 'other'))
  with pytest.raises(Exception, match='no checkpoint for step 5'):
    pretrain.train_and_evaluate(dataclasses.replace(cfg, branch_from=straight, branch_step=5), str(tmp_path / 'b5'))
  with pytest.raises(ConfigError, match='give one of them'):
    dataclasses.replace(cfg, branch_from=straight, init_checkpoint=straight)
  with pytest.raises(ConfigError, match='is not before this run'):
    pretrain.train_and_evaluate(dataclasses.replace(cfg, branch_from=straight), str(tmp_path / 'b12'))
  assert not os.path.exists(tmp_path / 'b12' / 'checkpoints')


def _ramped(corpus=None, cache=None):
  """recipe_tiny with a batch-size ramp in its stable phase: 4 rows for one step, 8 for one, then 16."""
  cfg = _recipe(corpus, cache)
  d = cfg.to_dict()
  d['phases']['stable'].update(ramp_batch_size=4, ramp_tokens=2 * 4 * 32)
  return config.PretrainConfig.from_dict({**d, 'num_train_steps': 0})


def test_a_batch_size_ramp_counts_every_example_and_token():
  cfg = _ramped()
  parts = cfg.phase_list()
  assert [(p.label, p.start, p.end, p.cfg.batch_size) for p in parts[:3]] == [
      ('phase 1/3 stable (batch 4)', 0, 1, 4), ('phase 1/3 stable (batch 8)', 1, 2, 8), ('phase 1/3 stable', 2, 4, 16)]
  assert [p.tokens for p in parts[:3]] == [4 * 32, 8 * 32, 2 * 16 * 32] and cfg.num_train_steps == 12
  # The stream of examples goes on across batch sizes and phases: no example skipped or read twice.
  read = []
  for p in parts:
    for k in range(p.start, p.end):
      start = p.first_example + (k - p.start) * p.cfg.batch_size
      read.extend(range(start, start + p.cfg.batch_size))
  assert read == list(range(sum(p.cfg.batch_size * (p.end - p.start) for p in parts)))
  # The mask-rate schedule and the evaluation belong to the whole phase, not to a batch size of its ramp.
  assert {(p.schedule_start, p.schedule_steps) for p in parts[:3]} == {(0, 4)}
  for bad, pattern in ((dict(ramp_batch_size=16), 'ramp_batch_size (16) < batch_size (16)'),
                       (dict(ramp_tokens=10 ** 6), 'its batch-size ramp takes')):
    d = cfg.to_dict()
    d['phases']['stable'].update(bad)
    with pytest.raises(ConfigError, match=re.escape(pattern)):
      config.PretrainConfig.from_dict(d)


def test_a_phase_sets_its_own_peak_learning_rate_and_the_decay_starts_from_it():
  d = _recipe().to_dict()
  d['phases']['extend']['learning_rate'] = 5e-4  # the run's peak is 1e-3
  cfg = config.PretrainConfig.from_dict(d)
  assert [p.cfg.optim.learning_rate for p in cfg.phase_list()] == [1e-3, 5e-4, 5e-4]  # the decay inherits it
  assert cfg.learning_rate_levels() == [(0, 1.0), (4, 0.5), (8, 0.5)] and _recipe().learning_rate_levels() is None
  run_schedule = optim.learning_rate_schedule(cfg.optim, 12, 8)
  schedule = optim.learning_rate_schedule(cfg.optim, 12, 8, cfg.learning_rate_levels())
  for step in range(13):
    assert float(schedule(step)) == pytest.approx(float(run_schedule(step)) * (0.5 if step >= 4 else 1.0))
  # The optimizer moves at that rate: Adam's update on a constant gradient is the rate itself.
  plain = dataclasses.replace(cfg.optim, weight_decay=0.0, clip_norm=0.0, name='adamw')
  tx = optim.make_optimizer(plain, 12, 8, cfg.learning_rate_levels())
  params = {'w': jax.numpy.zeros(3)}
  state, sizes = tx.init(params), []
  for _ in range(12):
    update, state = tx.update({'w': jax.numpy.ones(3)}, state, params)
    sizes.append(-float(update['w'][0]))
  np.testing.assert_allclose(sizes, [float(schedule(k)) for k in range(12)], rtol=1e-3, atol=1e-9)
  d['phases']['extend']['learning_rate'] = -1.0
  with pytest.raises(ConfigError, match=re.escape('phases.extend.learning_rate must be > 0')):
    config.PretrainConfig.from_dict(d)


def test_phase_lengths_in_tokens_resolve_to_the_fewest_steps_that_hold_them():
  cfg = _ramped()
  d = cfg.to_dict()
  # stable: a ramp of 4 and 8 rows (1 step each, 384 tokens), then 16 x 32 rows; extend at 16 x 64.
  d['phases']['stable'].update(steps=0, tokens=384 + 3 * 512 + 1)
  d['phases']['extend'].update(steps=0, tokens=2 * 1024)
  d['num_train_steps'] = 0
  tokens = config.PretrainConfig.from_dict(d)
  assert [(p.name, p.end - p.start, p.cfg.batch_size) for p in tokens.phase_list()] == [
      ('stable', 1, 4), ('stable', 1, 8), ('stable', 4, 16), ('extend', 2, 16), ('decay', 4, 16)]
  assert tokens.phases['stable'].steps == 6 and tokens.phases['stable'].tokens == 384 + 3 * 512 + 1
  again = config.PretrainConfig.from_dict(json.loads(json.dumps(tokens.to_dict())))  # saved: steps beside tokens
  assert again == tokens
  for bad, pattern in ((dict(steps=3, tokens=4096), 'its length is steps=3 or tokens=4096 (4 steps of 16 x 64), not'),
                       (dict(steps=0, tokens=-5), 'phases.extend.tokens must be a whole number of tokens >= 0'),
                       (dict(steps=0, tokens=0), 'phases.extend.steps must be a positive number of steps (or give')):
    d2 = cfg.to_dict()
    d2['phases']['extend'].update(bad)
    d2['num_train_steps'] = 0
    with pytest.raises(ConfigError, match=re.escape(pattern)):
      config.PretrainConfig.from_dict(d2)
  d2 = cfg.to_dict()
  d2['phases']['stable'].update(steps=0, tokens=300)
  with pytest.raises(ConfigError, match=re.escape('its batch-size ramp alone trains 384 of its 300 tokens')):
    config.PretrainConfig.from_dict(d2)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_ramp_trains_its_batch_sizes_and_resumes_bitwise_in_the_middle(phased, tmp_path, monkeypatch):
  _, corpus, cache, _, _ = phased
  d = _recipe(corpus, cache).to_dict()
  d['phases']['stable'].update(ramp_batch_size=8, ramp_tokens=2 * 8 * 32)  # 2 steps of 8 rows (8 devices), 2 of 16
  cfg = config.PretrainConfig.from_dict({**d, 'num_train_steps': 0})
  straight = str(tmp_path / 'straight')
  pretrain.train_and_evaluate(cfg, straight)
  rows = [json.loads(l) for l in open(os.path.join(straight, 'metrics_train.jsonl'))]
  assert [r['rows_per_step'] for r in rows[:2]] == [8.0, 16.0]
  evals = [json.loads(l)['step'] for l in open(os.path.join(straight, 'metrics_eval.jsonl'))]
  assert evals == [4, 8, 12]  # after each phase, not at each batch size
  workdir = str(tmp_path / 'resumed')
  argv = ['pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:recipe_tiny',
          f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}', '--config.data.eval_fraction=0.4',
          '--config.phases.stable.ramp_batch_size=8', f'--config.phases.stable.ramp_tokens={2 * 8 * 32}']
  with sigterm_at_pretraining_batch(monkeypatch, 1):
    first = run_main(*argv)
  assert first.returncode == preemption.EXIT_CODE, first.stderr[-3000:]
  assert Checkpointer(workdir, read_only=True).latest_step() == 1  # saved in the middle of the ramp
  second = run_main(*argv)  # the resume, in this process
  assert second.returncode == 0, second.stderr[-3000:]
  a, _ = restore_pretraining_state(straight, cfg, 12)
  b, _ = restore_pretraining_state(workdir, cfg, 12)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_review_cases_of_phases_are_refused_or_kept(tmp_path):
  """A first phase's RoPE theta is its model's; phases added to a run, keep_best across phases, a phase's bad
  batch size and a branch whose layout before its branch point differs are refused, naming what."""
  d = _recipe().to_dict()
  d['phases']['stable']['rope_theta'] = 5000.0
  first = config.PretrainConfig.from_dict({**d, 'num_train_steps': 0}).phase_list()[0]
  assert first.cfg.model.rope_theta == 5000.0
  old = config.PretrainConfig(num_train_steps=12).to_dict()
  new = _recipe().to_dict()
  assert any(diff.startswith('phases:') for diff in config.config_diffs(old, new, ()))
  with pytest.raises(ConfigError, match='keep_best ranks checkpoints'):
    config.PretrainConfig.from_dict({**_recipe().to_dict(), 'keep_best': True, 'eval_every': 2})
  d = _recipe().to_dict()
  d['optim']['grad_accum_steps'] = 4
  d['phases']['extend']['batch_size'] = 6
  with pytest.raises(ConfigError, match=r'phases.extend: batch_size=6 must be a multiple'):
    config.PretrainConfig.from_dict(d)


@pytest.mark.slow
def test_a_branch_must_share_the_layout_before_its_branch_point(phased, tmp_path):
  cfg, _, _, straight, _ = phased
  d = cfg.to_dict()
  d['phases']['stable']['batch_size'] = 8  # the stable phase read other examples than the run branched from
  other = config.PretrainConfig.from_dict({**d, 'num_train_steps': 0, 'branch_from': straight, 'branch_step': 8})
  with pytest.raises(Exception, match='its phases up to that step differ'):
    pretrain.train_and_evaluate(other, str(tmp_path / 'b'))
