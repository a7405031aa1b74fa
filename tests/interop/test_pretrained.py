"""load_pretrained on a bert_jax workdir: the restored weights, heads and tokenizer; bad directories."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.data.tokenization import SentencePieceTokenizer
from bert_jax.errors import CheckpointError
from bert_jax.interop.pretrained import load_pretrained

from harness.entry_points import run_main

pytestmark = pytest.mark.slow  # a trained workdir


@pytest.fixture
def workdir(pretrained_run):
  """The shared tiny pretraining run's workdir (conftest.py: checkpoints of steps 2 and 4), read-only."""
  return pretrained_run.workdir


def test_loads_latest_or_given_step_with_heads_and_tokenizer(workdir):
  latest = load_pretrained(workdir)
  assert latest.source == 'bert_jax' and latest.step == 4 and latest.has_mlm_head
  assert isinstance(latest.tokenizer, SentencePieceTokenizer)
  assert latest.tokenizer.vocab_size == latest.config.vocab_size == 1000
  early = load_pretrained(workdir, step=2)
  assert early.step == 2
  a = latest.params['bert']['pooler']['kernel']
  assert not np.array_equal(a, early.params['bert']['pooler']['kernel'])


def test_modules_carry_the_checkpoint_weights(workdir):
  pre = load_pretrained(workdir)
  ids, types, _ = pre.tokenizer.encode_inputs('the first text .', 'and a second one .', max_length=32)
  ids, types = jnp.array([ids]), jnp.array([types])
  mask = jnp.ones_like(ids)
  seq, pooled = pre.encoder()(ids, types, mask)
  model = pre.pretraining_model()
  seq2, pooled2 = model.bert(ids, types, mask)
  np.testing.assert_array_equal(seq, seq2)
  np.testing.assert_array_equal(pooled, pooled2)
  np.testing.assert_array_equal(model.mlm.bias[...], pre.params['mlm']['bias'])
  assert jax.tree.leaves(pre.params)[0].dtype == np.float32


def test_bad_directories(workdir, tmp_path):
  with pytest.raises(CheckpointError, match='does not exist'):
    load_pretrained(str(tmp_path / 'missing'))
  with pytest.raises(CheckpointError, match='neither a Hugging Face checkpoint'):
    load_pretrained(str(tmp_path))
  with pytest.raises(CheckpointError, match='no checkpoint for step 3'):
    load_pretrained(workdir, step=3)
  os.makedirs(tmp_path / 'w' / 'checkpoints')
  with pytest.raises(CheckpointError, match='config.json is missing'):
    load_pretrained(str(tmp_path / 'w'))


@pytest.mark.e2e
def test_export_cli_round_trips_a_workdir_bit_exactly(workdir, tmp_path):
  out = str(tmp_path / 'hf')
  args = ('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  result = run_main(*args)  # in this process: the command's flags, output and exit code, not a process, are tested
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stderr.splitlines() == [f'export: loading {workdir} ...',  # each phase, as it starts
                                        f'export: writing a Hugging Face directory to {out} ...'], result.stderr
  assert {'config.json', 'model.safetensors'} <= set(os.listdir(out))
  original, exported = load_pretrained(workdir), load_pretrained(out)
  assert exported.source == 'hf' and exported.has_mlm_head and exported.config == original.config
  for a, b in zip(jax.tree.leaves(original.params), jax.tree.leaves(exported.params)):
    np.testing.assert_array_equal(a, b)
  assert exported.tokenizer.encode('a test sentence .') == original.tokenizer.encode('a test sentence .')
  again = run_main(*args)
  assert again.returncode == 1 and again.stderr.strip().splitlines()[-1].startswith('error:')
