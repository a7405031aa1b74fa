"""A mixture of corpora (data.train_weights): exact shares per period, every corpus through its records once per
epoch of its own, rows a pure function of the stream position; a run in phases switches to a mixture, and
kill -9 in the mixture's phase resumes as if uninterrupted."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config
from bert_jax.data import loader, mixture
from bert_jax.errors import ConfigError

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.faults import kill_after_save
from harness.inputs import REPO, WIKITEXT
from harness.processes import script_code


def test_quotas_apportion_the_period_by_the_shares():
  assert mixture.quotas([0.75, 0.25]).tolist() == [7500, 2500]
  assert mixture.quotas([1 / 3] * 3).tolist() == [3334, 3333, 3333]
  tiny = mixture.quotas([1 - 1e-7, 1e-7])
  assert tiny.tolist() == [9999, 1] and tiny.sum() == mixture.PERIOD  # every corpus keeps a slot
  shares = np.array([1e6, 1, 1]) / (1e6 + 2)  # two corpora raised to a slot each: the largest gives them back
  assert mixture.quotas(shares).tolist() == [9998, 1, 1]
  assert mixture.quotas([0.9999, 5e-5, 5e-5]).sum() == mixture.PERIOD


@pytest.fixture(scope='module')
def mixed(prepared):
  _, data = prepared
  # The same cache twice: the indices tell the corpora apart (the second's are offset by its size).
  return mixture.MixtureDataset(mixture.Mixture((data, data), (0.75, 0.25), ('a', 'b')), 'train')


def test_draws_follow_the_shares_and_each_corpus_goes_through_its_records(mixed):
  n = len(mixed.parts[0])
  positions = np.arange(3 * mixture.PERIOD)
  np.testing.assert_array_equal(mixed.record_lengths(np.array([5, n + 5])), mixed.parts[0].lengths[[5, 5]])
  corpus, draws = mixed.corpus_draws(positions, seed=7)
  for t in range(3):  # exact shares over every period
    assert np.bincount(corpus[t * mixture.PERIOD:(t + 1) * mixture.PERIOD]).tolist() == [7500, 2500]
  for c in (0, 1):  # the c-th corpus's draws are its ranks 0, 1, 2, ... each once
    assert sorted(draws[corpus == c].tolist()) == list(range(int((corpus == c).sum())))
  records = mixed.record_indices(positions, seed=7)
  assert ((records < n) == (corpus == 0)).all() and records.max() < 2 * n
  for c in (0, 1):  # every epoch of a corpus visits each of its records once
    mine = records[corpus == c][np.argsort(draws[corpus == c])] - c * n
    for epoch in range(len(mine) // n):
      assert sorted(mine[epoch * n:(epoch + 1) * n].tolist()) == list(range(n))
  # A pure function of (seed, position): any slice asks the same; another seed orders otherwise.
  np.testing.assert_array_equal(mixed.record_indices(positions[12345:12400], seed=7), records[12345:12400])
  assert (mixed.record_indices(positions[:100], seed=8) != records[:100]).any()


def test_batches_read_the_mixtures_records(mixed, prepared):
  cfg, _ = prepared
  from bert_jax.data import tokenization  # pylint: disable=g-import-not-at-top
  vocab = loader.Vocab.from_tokenizer(tokenization.load_tokenizer(mixed.data.tokenizer_path), mixed.data.special_ids,
                                      cfg.masking)
  maker = loader.BatchMaker(mixed, global_batch_size=8, seed=3, cfg=cfg, vocab=vocab)
  np.testing.assert_array_equal(maker.record_indices(np.arange(16, 24)), mixed.record_indices(np.arange(16, 24), 3))
  indices = mixed.record_indices(np.arange(16, 24), 3)
  rows, part = mixed.gather(indices, cfg.max_seq_length), mixed.parts[0].gather(indices % len(mixed.parts[0]),
                                                                                cfg.max_seq_length)
  np.testing.assert_array_equal(rows.tokens, part.tokens)
  np.testing.assert_array_equal(rows.lengths, part.lengths)
  batch = maker(2)
  assert batch['input_ids'].shape == (8, cfg.max_seq_length)


@pytest.mark.parametrize('weights,pattern', [
    ('1', 'gives 1 weight(s) for 2 data.train_files entries'),
    ('1,x', 'must be comma-separated numbers'),
    ('1,0', 'each weight must be a positive number'),
])
def test_bad_weights_are_refused_when_the_config_is_built(weights, pattern):
  with pytest.raises(ConfigError, match=pattern.replace('(', r'\(').replace(')', r'\)')):
    config.DataConfig(train_files='a,b', train_weights=weights)


def test_a_mixture_counts_its_corpora_as_the_check_does_and_takes_no_epochs():
  assert config.DataConfig(train_files=',a, b', train_weights='1,3').mixture() == [('a', 0.25), ('b', 0.75)]
  d = config.PretrainConfig().to_dict()
  d['data'].update(train_files='a,b', train_weights='1,1')
  d.update(num_train_steps=0, num_train_epochs=2)
  with pytest.raises(ConfigError, match='an epoch of a mixture'):
    config.PretrainConfig.from_dict(d)


def _corpora(tmp):
  """Two corpora of different sizes and text: WikiText-2 validation's first 600 lines, and 300 later ones."""
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = f.readlines()
  paths = []
  for name, part in (('a.txt', lines[:600]), ('b.txt', lines[1200:1500])):
    paths.append(os.path.join(tmp, name))
    with open(paths[-1], 'w', encoding='utf-8') as f:
      f.writelines(part)
  return paths


@pytest.mark.slow
@pytest.mark.e2e
def test_a_phase_switches_to_a_mixture_and_resumes_bitwise_after_kill_9(tmp_path):
  a, b = _corpora(str(tmp_path))
  cache = str(tmp_path / 'cache')
  argv = lambda w: ['pretrain.py', f'--workdir={w}', '--config=experiments/configs/pretrain.py:recipe_tiny',  # pylint: disable=unnecessary-lambda-assignment
                    f'--config.data.train_files={a}', f'--config.data.cache_dir={cache}',
                    '--config.data.eval_fraction=0.4', f'--config.phases.extend.train_files={a},{b}',
                    '--config.phases.extend.train_weights=1,3']
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  # The kill -9 needs a process of its own; the uninterrupted run, the resume and the refusal run in this one (the
  # same command lines, through run_main): no Python start and JAX import each.
  first = run_main(*argv(straight))
  assert first.returncode == 0, first.stderr[-3000:]
  # Corpus a alone (stable), then a and b each prepared on their own at the extension's length.
  assert first.stdout.count('prepared data written to') == 3, first.stdout
  kill = kill_after_save(6)
  killed = subprocess.run([sys.executable, '-c', script_code(argv(resumed), kill)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  again = run_main(*argv(resumed))
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'at step 6' in again.stdout
  losses = lambda w: {r['step']: r['loss'] for r in map(json.loads, open(os.path.join(w, 'metrics_train.jsonl')))}  # pylint: disable=unnecessary-lambda-assignment
  assert losses(resumed) == losses(straight)
  final = lambda w: json.load(open(os.path.join(w, 'final_metrics.json')))  # pylint: disable=unnecessary-lambda-assignment
  assert final(resumed)['mlm_loss'] == final(straight)['mlm_loss']
  # Other weights are other data: the run refuses to resume on them, in one line, touching nothing.
  before = tree_digest(resumed)
  other = run_main(*argv(resumed)[:-1], '--config.phases.extend.train_weights=3,1')
  assert_one_line_error(other, 'phases')
  assert tree_digest(resumed) == before
