"""Continued pretraining (--config.init_checkpoint): from a Hugging Face directory with or without
heads, from a pretraining workdir (BERT's phase 2 at a longer sequence) and from a fine-tuning
workdir; the source is only read, a resumed continued run is bitwise like any other, and bad
inputs give one error line and write nothing."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.config import PretrainConfig
from bert_jax.data import tokenization
from bert_jax.interop import families, pretrained
from bert_jax.interop.hf import model_dir
from bert_jax.pretraining import init, pretrain_run as pretraining
from bert_jax.pretraining.pretrain_run import pretraining_model
from bert_jax.train import optim

from harness.digests import restore_pretraining_state, tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.faults import sigterm_at_pretraining_batch
from harness.inputs import REPO, WIKITEXT, finetune_config, tiny_pretrain_config as tiny_config
from harness.processes import pretrain_flags

HEADS_FIXTURE = os.path.join(REPO, 'tests', 'fixtures', 'hf_pretraining')  # BertForPreTraining, vocab 128


def _sentences(n=3000):
  with open(WIKITEXT, encoding='utf-8') as f:
    return [line.strip() for line, _ in zip(f, range(n)) if line.strip() and not line.startswith(' =')]


@pytest.fixture(scope='module')
def hf_heads(tmp_path_factory):
  """transformers' BertForPreTraining fixture (MLM and NSP heads, 64 positions) with a 128-piece
  SentencePiece tokenizer, as bert_jax exports one (spiece.model)."""
  directory = str(tmp_path_factory.mktemp('hf_heads') / 'model')
  os.makedirs(directory)
  for name in ('config.json', 'model.safetensors'):
    shutil.copy(os.path.join(HEADS_FIXTURE, name), directory)
  tokenization.train_sentencepiece(_sentences(), os.path.join(directory, model_dir.SPIECE_FILE), 128, lower_case=True)
  return directory


def _model(cfg: PretrainConfig):
  return pretraining_model(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps),
                          sharding.make_mesh(cfg.mesh), objective=cfg.data.objective)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _eval_steps(workdir):
  with open(os.path.join(workdir, 'metrics_eval.jsonl'), encoding='utf-8') as f:
    return [json.loads(line)['step'] for line in f]


@pytest.mark.slow
def test_from_hugging_face_with_heads(small_corpus, tmp_path, hf_heads):
  before = tree_digest(hf_heads)
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'), init_checkpoint=hf_heads, num_train_steps=2,
                    eval_every=2)
  resolved, source = init.resolve_init_checkpoint(cfg)
  m = resolved.model
  assert (m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.max_position_embeddings) == (128, 32, 2, 4, 64)
  assert resolved.data.tokenizer == os.path.join(hf_heads, model_dir.SPIECE_FILE)
  state = _model(resolved).init_state(init.initial_params(resolved, source), seed=resolved.seed)
  _, reference, has_mlm, has_nsp = families.load_hf_checkpoint(hf_heads)
  assert has_mlm and has_nsp
  _assert_trees_equal(jax.device_get(state['params']), reference)  # encoder and both heads, exactly
  assert int(state['step']) == 0

  workdir = str(tmp_path / 'run')
  result = pretraining.train_and_evaluate(cfg, workdir)
  assert result['step'] == 2 and _eval_steps(workdir) == [0, 2]  # step 0: the loaded weights
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['model']['hidden_size'] == 32 and saved['init_checkpoint'] == hf_heads
  assert tree_digest(hf_heads) == before  # only ever read


@pytest.mark.slow
def test_from_an_encoder_only_checkpoint_heads_are_fresh(small_corpus, tmp_path, tiny_checkpoint):
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'), init_checkpoint=tiny_checkpoint, num_train_steps=2)
  resolved, source = init.resolve_init_checkpoint(cfg)
  assert resolved.model.vocab_size == 30522 and resolved.data.tokenizer == tiny_checkpoint  # its WordPiece
  model = _model(resolved)
  state = jax.device_get(model.init_state(init.initial_params(resolved, source), seed=resolved.seed))
  _, reference, has_mlm, _ = families.load_hf_checkpoint(tiny_checkpoint)
  assert not has_mlm
  _assert_trees_equal(state['params']['bert'], reference['bert'])
  fresh = jax.device_get(model.init_state())['params']
  _assert_trees_equal({k: state['params'][k] for k in ('mlm', 'nsp')}, {k: fresh[k] for k in ('mlm', 'nsp')})
  workdir = str(tmp_path / 'run')
  pretraining.train_and_evaluate(cfg, workdir)
  assert os.path.exists(os.path.join(workdir, 'tokenizer.json'))  # the corpus used MiniLM's own ids


@pytest.mark.slow
@pytest.mark.e2e
def test_phase_two_starts_from_phase_one_and_resumes_bitwise(pretrained_run, tmp_path, monkeypatch):
  # Phase one is the shared tiny run (seq 64), read-only: phase two prepares its length in a cache of its own.
  small_corpus, cache = pretrained_run.corpus, str(tmp_path / 'cache')
  phase1, cfg1 = pretrained_run.workdir, pretrained_run.cfg
  before = tree_digest(phase1)
  final1, _ = restore_pretraining_state(phase1, cfg1)

  cfg2 = tiny_config(small_corpus, cache, init_checkpoint=phase1, num_train_steps=20)
  cfg2 = cfg2.from_dict({**cfg2.to_dict(), 'data': {**cfg2.to_dict()['data'], 'max_seq_length': 128}})
  resolved, source = init.resolve_init_checkpoint(cfg2)
  state = _model(resolved).init_state(init.initial_params(resolved, source), seed=resolved.seed)
  _assert_trees_equal(jax.device_get(state['params']), final1['params'])  # phase 1's final parameters, exactly

  extra = (f'--config.init_checkpoint={phase1}', '--config.data.max_seq_length=128')
  straight, preempted = str(tmp_path / 'straight'), str(tmp_path / 'preempted')
  # All three runs in this process, through run_main (the same command line; tests/test_faults.py stops a process of
  # its own with SIGTERM): the stopped one saves step 13 and exits 75.
  r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, straight, 20, extra=extra))
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'initialised from pretraining checkpoint' in r.stdout and 'eval step 0 |' in r.stdout
  with sigterm_at_pretraining_batch(monkeypatch, 13):
    r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, preempted, 20, extra=extra))
  assert r.returncode == 75, r.stderr[-2000:]
  r = run_main('pretrain.py', *pretrain_flags(small_corpus, cache, preempted, 20, extra=extra))
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'resumed from' in r.stdout and 'initialised from' not in r.stdout  # a resume never reloads the source
  saved = PretrainConfig.from_dict(json.load(open(os.path.join(straight, 'config.json'), encoding='utf-8')))
  a, _ = restore_pretraining_state(straight, saved, 20)
  b, _ = restore_pretraining_state(preempted, saved, 20)
  _assert_trees_equal(a, b)  # bitwise: params, both Adam moments, step, rng
  assert tree_digest(phase1) == before


@pytest.mark.slow
def test_from_a_fine_tuning_workdir(small_corpus, tmp_path, tiny_checkpoint):
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top

  from harness.inputs import shared_data_or_skip  # pylint: disable=g-import-not-at-top
  tuned = str(tmp_path / 'sst2')
  finetuning.finetune(finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=shared_data_or_skip('sst2'),
                                      max_seq_length=32, batch_size=16, num_train_steps=3, max_train_samples=48,
                                      learning_rate=1e-2), tuned)
  encoder, step = pretrained.describe(tuned).params()
  _, original, _, _ = families.load_hf_checkpoint(tiny_checkpoint)
  assert step == 3 and not np.array_equal(encoder['bert']['pooler']['kernel'], original['bert']['pooler']['kernel'])
  cfg = tiny_config(small_corpus, str(tmp_path / 'cache'), init_checkpoint=tuned)
  resolved, source = init.resolve_init_checkpoint(cfg)
  assert source.kind == 'finetuning' and resolved.data.tokenizer == os.path.join(tuned, 'tokenizer.json')  # its own copy
  state = _model(resolved).init_state(init.initial_params(resolved, source), seed=resolved.seed)
  _assert_trees_equal(jax.device_get(state['params']['bert']), encoder['bert'])


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize('case', ['architecture', 'positions', 'tokenizer', 'vocab_size', 'inside', 'missing'])
def test_bad_input_is_one_error_line_and_writes_nothing(case, small_corpus, tmp_path, hf_heads):
  source = hf_heads
  args = ['--config=experiments/configs/pretrain.py:tiny', f'--config.data.train_files={small_corpus}',
          f'--config.data.cache_dir={tmp_path / "cache"}', f'--workdir={tmp_path / "run"}']
  other = str(tmp_path / 'other.model')  # another vocabulary of the same size
  if case in ('tokenizer', 'vocab_size'):
    tokenization.train_sentencepiece(_sentences()[::-1], other, 128 if case == 'tokenizer' else 300, lower_case=False)
  if case == 'vocab_size':  # a directory whose tokenizer is larger than its embeddings
    source = str(tmp_path / 'bigger_vocab')
    shutil.copytree(hf_heads, source)
    shutil.copy(other, os.path.join(source, model_dir.SPIECE_FILE))
  extra, pattern = {
      'architecture': (['--config.model.hidden_size=64'], 'fixes the architecture, but model.hidden_size=64'),
      'positions': (['--config.data.max_seq_length=128'], 'exceeds model.max_position_embeddings=64 of init_checkpoint'),
      'tokenizer': ([f'--config.data.tokenizer={other}'], 'is not the tokenizer of init_checkpoint'),
      'vocab_size': ([], 'has 300 tokens but the model only 128 embeddings'),
      'inside': ([f'--workdir={source}/run'], 'is inside init_checkpoint'),
      'missing': ([], 'is not a directory'),
  }[case]
  if case == 'missing':
    source = str(tmp_path / 'nowhere')
  before = tree_digest(source) if os.path.isdir(source) else None
  result = run_main('pretrain.py', *args, f'--config.init_checkpoint={source}', *extra)
  assert_one_line_error(result, pattern)
  assert not os.path.exists(tmp_path / 'run') and not os.path.exists(os.path.join(source, 'run'))
  assert (tree_digest(source) if os.path.isdir(source) else None) == before
  assert not os.path.isdir(tmp_path / 'cache') or not os.listdir(tmp_path / 'cache')
