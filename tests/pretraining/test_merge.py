"""Checkpoint merging: the weighted mean of real checkpoints' parameters, a workdir every tool reads, and bad
input refused in one line with the sources untouched."""

import dataclasses
import filecmp
import json
import os
import shutil

import jax
import numpy as np
import pytest

from bert_jax import files
from bert_jax.data import tokenization
from bert_jax.errors import CheckpointError, CheckpointGone, ConfigError
from bert_jax.interop.pretrained import describe, load_pretrained
from bert_jax.pretraining import merge, pretrain_run as pretrain
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.runs.workdir import Workdir

from harness.digests import tmpfs, tree_digest
from harness.entry_points import assert_one_line_error, run_experiment, run_main
from harness.inputs import tiny_pretrain_config, write_small_corpus


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Two tiny runs of one architecture and data (two learning rates), checkpoints at steps 2, 4, 6."""
  tmp = tmp_path_factory.mktemp('merge')
  corpus = write_small_corpus(tmp)
  cfg = tiny_pretrain_config(corpus, str(tmp / 'cache'))
  a, b = str(tmp / 'a'), str(tmp / 'b')
  pretrain.train_and_evaluate(cfg, a)
  pretrain.train_and_evaluate(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, learning_rate=5e-4)), b)
  return cfg, a, b, tmp


def _params(path, step=None):
  return jax.tree.map(np.asarray, describe(path).params(step)[0])


@pytest.mark.slow
def test_the_merge_is_the_weighted_mean_and_every_tool_reads_it(runs, tmp_path):
  cfg, a, b, _ = runs
  last3 = str(tmp_path / 'last3')
  record = merge.merge(merge.parse_parts([a], last=3), last3)
  assert [p['step'] for p in record['parts']] == [2, 4, 6] and record['step'] == 6
  parts = [_params(a, s) for s in (2, 4, 6)]
  want = jax.tree.map(lambda *x: (sum(np.float64(v) for v in x) / 3).astype(np.float32), *parts)
  got = _params(last3)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):  # float64 sums: within one float32 rounding
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, w, rtol=1.2e-7, atol=1e-12)
  soup = str(tmp_path / 'soup')
  merge.merge(merge.parse_parts([a, f'{b}@4'], weights=[2.0, 1.0]), soup)
  pa, pb = _params(a), _params(b, 4)
  for x, y, g in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), jax.tree.leaves(_params(soup))):
    np.testing.assert_allclose(g, (2 * x.astype(np.float64) + y) / 3, rtol=1e-6, atol=1e-7)
  # Every reader: held-out evaluation, inference, and a run continued from it.
  result = pretrain.evaluate_checkpoint(last3)
  assert result['step'] == 6 and 0 <= result['mlm_accuracy'] <= 1
  assert load_pretrained(last3).tokenizer.encode_batch(['a test'])[0] == \
      load_pretrained(a).tokenizer.encode_batch(['a test'])[0]
  continued = pretrain.train_and_evaluate(dataclasses.replace(cfg, init_checkpoint=last3, num_train_steps=2),
                                     str(tmp_path / 'continued'))
  assert np.isfinite(continued['mlm_loss'])
  # Training in the merge itself is refused (no optimizer state), naming the way that works.
  before = tree_digest(last3)
  with pytest.raises(ConfigError, match='is a merge of checkpoints.*init_checkpoint'):
    pretrain.train_and_evaluate(cfg, last3)
  assert tree_digest(last3) == before


@pytest.mark.slow
def test_the_command_reports_each_part_and_the_merge(runs, tmp_path):
  _, a, b, _ = runs
  out = str(tmp_path / 'merged')
  result = run_main('merge.py', f'--sources={a}@4,{b}@6', f'--workdir={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  line = json.loads(result.stdout.strip().splitlines()[-1])
  assert [p['step'] for p in line['parts']] == [4, 6] and line['merge']['step'] == 6
  assert '| merge | 1 |' in result.stdout and f'| {os.path.abspath(a)}@4 | 0.5 |' in result.stdout
  # The parts' figures are those of evaluating them directly (same held-out split: one data config).
  assert line['parts'][0]['mlm_accuracy'] == pytest.approx(pretrain.evaluate_checkpoint(a, 4)['mlm_accuracy'])
  assert os.path.exists(os.path.join(out, 'merge.json')) and not os.path.exists(os.path.join(tmp_path, '.merged.merging'))
  with open(os.path.join(out, 'final_metrics.json')) as f:
    final = json.load(f)  # what a sweep tabulates
  assert final['mlm_accuracy'] == line['merge']['mlm_accuracy'] and final['main_metric'] == 'mlm_accuracy'
  assert final['parts'] == line['parts']
  # The same command again (a sweep's rerun, an interrupted evaluation): nothing written, the same figures.
  written = tree_digest(os.path.join(out, 'checkpoints'))
  again = run_main('merge.py', f'--sources={a}@4,{b}@6', f'--workdir={out}')
  assert again.returncode == 0 and 'already holds this merge' in again.stdout + again.stderr, again.stderr[-3000:]
  assert json.loads(again.stdout.strip().splitlines()[-1]) == line
  assert tree_digest(os.path.join(out, 'checkpoints')) == written
  # Another merge into it is refused, naming the merge it holds.
  assert_one_line_error(run_main('merge.py', f'--sources={a}@4,{b}@6', '--weights=2,1', f'--workdir={out}'),
                        f'already holds another merge of {os.path.abspath(a)}@4 (weight 0.5)')


@pytest.mark.slow
def test_bad_input_is_one_line_and_nothing_is_written(runs, tmp_path):
  _, a, b, tmp = runs
  # Two sources merge refuses by what it compares before it reads any parameter (the saved config, the tokenizer
  # file): copies of `a` whose config.json says another width, and whose tokenizer is another one. (This test trained
  # both, compiling a model of another width and a run of another seed: most of its time.)
  other_arch = str(tmp / 'other_arch')
  if not os.path.exists(other_arch):
    shutil.copytree(a, other_arch)
    with open(os.path.join(other_arch, 'config.json'), encoding='utf-8') as f:
      saved = json.load(f)
    saved['model']['hidden_size'] = 48
    with open(os.path.join(other_arch, 'config.json'), 'w', encoding='utf-8') as f:
      json.dump(saved, f)
  full = str(tmp_path / 'full')
  os.makedirs(full)
  with open(os.path.join(full, 'keep.txt'), 'w') as f:
    f.write('a user file')
  seed1 = str(tmp / 'seed1')  # another tokenizer: one trained on the corpus with another seed
  if not os.path.exists(seed1):
    shutil.copytree(a, seed1)
    with open(os.path.join(tmp, 'corpus.txt'), encoding='utf-8') as f:
      sentences = [line.strip() for line in f if line.strip()]
    tokenization.train_sentencepiece(sentences[::-1], Workdir(seed1).tokenizer_file(), 1000, lower_case=False, seed=1)
    assert not filecmp.cmp(Workdir(seed1).tokenizer_file(), Workdir(a).tokenizer_file(), shallow=False)
  digests = {d: tree_digest(d) for d in (a, b, full)}
  out = str(tmp_path / 'out')
  for args, pattern in (
      ([f'--sources={a}', '--last=5'], '--last=5: '),
      ([f'--sources={a}'], 'a merge needs at least two checkpoints'),
      ([f'--sources={a},{b}', '--weights=1'], '--weights has 1 value(s) for 2 checkpoints'),
      ([f'--sources={a},{b}', '--weights=1,-1'], '--weights must be positive'),
      ([f'--sources={a},{b}', '--weights=1,x'], '--weights must be numbers'),
      ([f'--sources={a}@x,{b}'], 'the step after @ must be a whole number'),
      ([f'--sources={a},{a}@6'], 'is named twice'),
      ([f'--sources={a},{b}@99'], 'no checkpoint for step 99'),
      ([f'--sources={a},{tmp}/missing'], 'is not a directory'),
      ([f'--sources={a},{other_arch}'], 'is another architecture'),
      ([f'--sources={a},{seed1}'], 'has another tokenizer'),
      ([f'--sources={a},{b}', f'--workdir={full}'], 'exists and is not empty'),
      ([f'--sources={a},{b}', f'--workdir={a}/inside'], 'a merge source'),
  ):
    args = args if any(x.startswith('--workdir') for x in args) else [*args, f'--workdir={out}']
    assert_one_line_error(run_main('merge.py', *args), pattern)
    assert not os.path.exists(out)
  assert {d: tree_digest(d) for d in digests} == digests


@pytest.mark.slow
def test_a_merge_killed_midway_leaves_nothing_and_runs_again(runs, tmp_path):
  _, a, b, _ = runs
  out = str(tmp_path / 'm')
  staging = str(tmp_path / '.m.merging')  # what a merge killed mid-write leaves
  os.makedirs(os.path.join(staging, 'checkpoints'))
  merge.merge(merge.parse_parts([a, b]), out)
  assert not os.path.exists(staging) and pretrain.evaluate_checkpoint(out)['step'] == 6
  with pytest.raises(CheckpointError, match='fine-tuning workdir|Hugging Face'):
    merge.parse_parts([a, os.path.dirname(os.path.dirname(__file__)) + '/fixtures/legacy/sst2'])


def test_a_second_merge_into_a_merge_names_it_and_the_ways_on(tmp_path):
  """Another merge into a merge's directory is one line naming the merge there (its sources, steps and weights) and
  what to do; the sources are not read (steps given) and the directory is unchanged."""
  out = tmp_path / 'soup'
  (out / 'checkpoints').mkdir(parents=True)
  held = [{'path': '/runs/a', 'step': 4, 'weight': 0.5}, {'path': '/runs/b', 'step': 6, 'weight': 0.5}]
  (out / 'merge.json').write_text(json.dumps({'parts': held, 'step': 6}))
  before = tree_digest(str(out))
  result = run_main('merge.py', f'--sources={tmp_path}/a@4,{tmp_path}/b@6', f'--workdir={out}', '--noevaluate')
  assert_one_line_error(result, f'--workdir {out} already holds another merge of /runs/a@4 (weight 0.5), /runs/b@6 '
                        f'(weight 0.5): write this one to another --workdir, or delete {out} to replace it')
  assert tree_digest(str(out)) == before
  (out / 'merge.json').write_text('{"parts": "edited"}')  # unreadable parts: where to find them
  before = tree_digest(str(out))
  assert_one_line_error(run_main('merge.py', f'--sources={tmp_path}/a@4,{tmp_path}/b@6', f'--workdir={out}'),
                        'already holds another merge (its sources are in its merge.json)')
  assert tree_digest(str(out)) == before


# --- a source that a run trains in: its checkpoint rotation races the merge --------------------------

def _live(tmp_path, source):
  """A copy of `source` whose lock this test process holds, as a run training in it would."""
  live = shutil.copytree(source, str(tmp_path / 'live'))
  assert files.Lock(os.path.join(live, '.lock')).acquire() is None
  return live


@pytest.mark.slow
def test_a_live_run_is_merged_from_pinned_steps(runs, tmp_path, capsys):
  _, a, _, _ = runs
  live, out = _live(tmp_path, a), str(tmp_path / 'out')
  with merge.pinned(merge.parse_parts([live], last=2), out) as parts:
    shutil.rmtree(os.path.join(live, 'checkpoints', '4'))  # the run's next save rotates step 4 away
    record = merge.merge(parts, out)
    results = pretrain.evaluate_in(out, [(p.where, p.step) for p in parts] + [(out, None)], as_step=record['step'])
  assert [(p['path'], p['step']) for p in record['parts']] == [(live, 4), (live, 6)] and len(results) == 3
  assert 'its step 4 is read from a pinned copy' in capsys.readouterr().out
  want = jax.tree.map(lambda x, y: ((np.float64(x) + y) / 2).astype(np.float32), _params(a, 4), _params(a, 6))
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(_params(out))):
    np.testing.assert_allclose(g, w, rtol=1.2e-7, atol=1e-12)
  assert sorted(os.listdir(tmp_path)) == ['live', 'out']  # the pins are gone


@pytest.mark.slow
def test_a_step_rotated_away_before_it_is_pinned_is_one_line(runs, tmp_path, monkeypatch):
  _, a, _, _ = runs
  live, out = _live(tmp_path, a), str(tmp_path / 'out')
  before = tree_digest(live)
  # Between listing the last two steps (4, 6) and pinning them, the run rotates step 4 away.
  link = merge._link_tree  # pylint: disable=protected-access

  def rotating(source, target):
    shutil.rmtree(source.replace('/6', '/4'), ignore_errors=True)
    link(source, target)
  monkeypatch.setattr(merge, '_link_tree', rotating)
  r = run_main('merge.py', f'--sources={live}', '--last=2', f'--workdir={out}')
  assert_one_line_error(r, f'{live} step 4 was rotated away by the run training there (pid {os.getpid()}')
  assert 'keeps steps [2, 6]' in r.stderr and 'unusable' not in r.stderr
  shutil.copytree(os.path.join(a, 'checkpoints', '4'), os.path.join(live, 'checkpoints', '4'))
  assert tree_digest(live) == before and sorted(os.listdir(tmp_path)) == ['live']  # nothing else lost or left


@pytest.mark.slow
def test_a_checkpoint_deleted_while_it_is_read_is_not_unusable(runs, tmp_path, monkeypatch):
  _, a, _, _ = runs
  src = shutil.copytree(a, str(tmp_path / 'src'))  # no lock: read in place
  try_restore = Checkpointer._try_restore

  def rotated(self, step, *args):  # listed, then deleted before its bytes are read
    shutil.rmtree(os.path.join(self.directory, str(step)))
    return try_restore(self, step, *args)

  monkeypatch.setattr(Checkpointer, '_try_restore', rotated)
  with pytest.raises(CheckpointGone, match=r'step 4 .* was deleted while it was read: rotated away') as e:
    merge.merge(merge.parse_parts([f'{src}@4', f'{src}@6']), str(tmp_path / 'out'))
  assert 'unusable' not in str(e.value) and not os.path.exists(tmp_path / 'out')


@pytest.mark.slow  # a process of its own: a failed save ends it with os._exit (Orbax's write threads)
@pytest.mark.parametrize('fault', ['read_only', 'full'])
def test_a_merge_that_cannot_be_written_says_so_in_its_own_words(fault, pretrained_run, tmp_path):
  # Not a training run's line ("the last complete checkpoint is kept ... to resume"): a merge has nothing to resume.
  import subprocess  # pylint: disable=g-import-not-at-top
  with tmpfs(tmp_path / 'disk', '1M' if fault == 'read_only' else '300K') as disk:  # the tiny run's merge: > 300 KB
    if fault == 'read_only':
      subprocess.run(['mount', '-o', 'remount,ro', disk], check=True)
    before = tree_digest(pretrained_run.workdir)
    result = run_experiment('merge.py', f'--sources={pretrained_run.workdir}', '--last=2', f'--workdir={disk}/merged')
    assert_one_line_error(result, 'nothing of the merge is left half-written')
    assert 'resume' not in result.stderr and 'checkpoint' not in result.stderr.splitlines()[-1]
    # The merge's workdir never appears; its hidden staging directory may outlive the process where Orbax's write
    # threads were still writing into it when the failed save ended it (the next merge removes it first).
    assert set(os.listdir(disk)) <= {'.merged.merging'} and tree_digest(pretrained_run.workdir) == before
