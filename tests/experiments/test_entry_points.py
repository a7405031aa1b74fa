"""Entry points smoke-run with tiny configs; bad input gives one 'error:' line, exit 1, workdir untouched."""

import json
import os
import shutil
import subprocess

import pytest

# The entry points run in this process (their main through cli.run: flags, output, error lines, exit code): no
# check here is about a process of their own.
from harness.digests import tmpfs
from harness.entry_points import assert_one_line_error, run_main as run
from harness.inputs import write_small_corpus

pytestmark = pytest.mark.slow  # the entry points on real runs


def tiny_args(corpus, cache, workdir, *extra):
  return [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
          f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}',
          '--config.data.eval_fraction=0.4', *extra]


def last_json(stdout):
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """One tiny pretraining run through the CLI (its output is tested), shared by the tests below; not the shared
  pretrained_run of conftest.py: this one's workdir is written (evaluate.py --all_steps)."""
  root = tmp_path_factory.mktemp('cli')
  corpus = write_small_corpus(root)
  workdir, cache = root / 'run', root / 'cache'
  result = run('pretrain.py', *tiny_args(corpus, cache, workdir))
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(corpus=str(corpus), cache=str(cache), workdir=str(workdir), stdout=result.stdout)


def test_pretrain_prints_progress_baselines_and_json(trained):
  out = trained['stdout']
  assert 'step 2/8' in out and 'tok/s' in out and 'ETA' in out
  assert 'most-frequent-token baseline' in out and 'majority-class baseline' in out
  metrics = last_json(out)
  assert metrics['step'] == 8 and 0 <= metrics['mlm_accuracy'] <= 1
  assert os.path.exists(os.path.join(trained['workdir'], 'config.json'))
  with open(os.path.join(trained['workdir'], 'curves.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'  # drawn at the evaluations of steps 4 and 8


def test_evaluate_restores_latest_and_given_step(trained):
  latest = run('evaluate.py', f'--workdir={trained["workdir"]}')
  assert latest.returncode == 0, latest.stderr[-3000:]
  metrics = last_json(latest.stdout)
  assert metrics['step'] == 8
  assert metrics['mlm_accuracy'] == pytest.approx(last_json(trained['stdout'])['mlm_accuracy'], abs=1e-6)
  for key in ('mlm_loss', 'nsp_accuracy', 'nsp_loss'):
    assert key in metrics
  step4 = last_json(run('evaluate.py', f'--workdir={trained["workdir"]}', '--step=4').stdout)
  assert step4['step'] == 4
  assert_one_line_error(run('evaluate.py', f'--workdir={trained["workdir"]}', '--step=3'),
                        'no checkpoint for step 3')
  # --all_steps: a row per checkpoint, and per step exactly what --step=N prints.
  every = run('evaluate.py', f'--workdir={trained["workdir"]}', '--all_steps')
  assert every.returncode == 0, every.stderr[-3000:]
  rows = [l.split() for l in every.stdout.splitlines() if l.split() and l.split()[0].isdigit()]
  assert [r[0] for r in rows] == ['4', '8']
  header = [l.split() for l in every.stdout.splitlines() if l.startswith(' ') and 'step' in l.split()]
  assert header[0][:4] == ['step', 'mlm_accuracy', 'mlm_loss', 'nsp_accuracy']
  with open(os.path.join(trained['workdir'], 'eval_all_steps.jsonl'), encoding='utf-8') as f:
    assert [json.loads(l) for l in f] == [step4, metrics]
  with open(os.path.join(trained['workdir'], 'eval_all_steps.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_evaluate_reads_at_most_max_eval_batches(trained):
  whole = last_json(run('evaluate.py', f'--workdir={trained["workdir"]}').stdout)
  capped = run('evaluate.py', f'--workdir={trained["workdir"]}', '--config.max_eval_batches=1')
  assert capped.returncode == 0, capped.stderr[-3000:]
  metrics = last_json(capped.stdout)
  assert metrics['step'] == whole['step'] == 8
  assert metrics['num_examples'] == 16 < whole['num_examples']  # one batch of the tiny config's eval_batch_size
  assert_one_line_error(run('evaluate.py', f'--workdir={trained["workdir"]}', '--config.max_eval_batches=-1'),
                        'max_eval_batches must be >= 0')


def test_evaluate_all_steps_bad_flags_before_any_work(trained, tmp_path):
  workdir = trained['workdir']
  assert_one_line_error(run('evaluate.py', f'--workdir={workdir}', '--all_steps', '--step=4'), 'drop --step')
  assert_one_line_error(run('evaluate.py', f'--workdir={workdir}', '--all_steps', f'--output_plot={tmp_path}'),
                        f'--output_plot {tmp_path} is a directory')
  assert_one_line_error(run('evaluate.py', f'--workdir={workdir}', f'--output_jsonl={tmp_path / "a.jsonl"}'),
                        'only apply with --all_steps')
  assert not os.listdir(tmp_path)


@pytest.mark.e2e
def test_evaluate_all_steps_in_a_read_only_workdir(trained, tmp_path):
  with tmpfs(tmp_path / 'rofs', '64M') as fs:
    workdir = shutil.copytree(trained['workdir'], os.path.join(fs, 'run'),
                              ignore=shutil.ignore_patterns('eval_all_steps.*'))
    subprocess.run(['mount', '-o', 'remount,ro', fs], check=True)
    before = _snapshot(fs)
    # The table, the JSONL where asked; the default plot left out with a warning, not an error.
    r = run('evaluate.py', f'--workdir={workdir}', '--all_steps', f'--output_jsonl={tmp_path / "steps.jsonl"}')
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'eval_all_steps.png is not written (give --output_plot=PATH)' in r.stdout
    with open(tmp_path / 'steps.jsonl', encoding='utf-8') as f:
      assert [json.loads(l)['step'] for l in f] == [4, 8]
    assert _snapshot(fs) == before


def test_benchmark_prints_table_and_json():
  result = run('benchmark.py', '--preset=tiny', '--batch_size=8', '--seq_len=32', '--vocab_size=200',
               '--steps=2')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'median step time' in result.stdout
  metrics = last_json(result.stdout)
  assert metrics['step_time_s'] > 0 and metrics['tokens_per_s'] > 0


def _snapshot(workdir):
  return {os.path.join(r, f): open(os.path.join(r, f), 'rb').read()
          for r, _, fs in os.walk(workdir) for f in fs}


@pytest.mark.parametrize('extra,pattern', [
    (['--config.data.max_seq_length=1024'], 'exceeds model.max_position_embeddings=512'),
    (['--config.model.hidden_size=32'], 'holds checkpoints of another model'),
    (['--config.max_eval_batches=-2'], 'max_eval_batches must be >= 0'),
])
def test_bad_config_keeps_workdir(trained, extra, pattern):
  before = _snapshot(trained['workdir'])
  result = run('pretrain.py', *tiny_args(trained['corpus'], trained['cache'], trained['workdir'], *extra))
  assert_one_line_error(result, pattern)
  assert _snapshot(trained['workdir']) == before


def test_tokenizer_of_another_vocab_size_is_refused(trained, tmp_path):
  tokenizer = [os.path.join(trained['cache'], d, 'tokenizer.model') for d in os.listdir(trained['cache'])][0]
  result = run('pretrain.py', *tiny_args(trained['corpus'], tmp_path / 'cache', tmp_path / 'w',
                                         '--config.model.vocab_size=1200', f'--config.data.tokenizer={tokenizer}'))
  assert_one_line_error(result, 'model.vocab_size=1200 but tokenizer')
  assert not os.path.exists(tmp_path / 'w')


def test_unknown_config_key_is_refused(tmp_path):
  result = run('pretrain.py', f'--workdir={tmp_path / "w"}', '--config.model.hiden_size=3')
  assert result.returncode != 0
  assert 'hiden_size' in result.stderr
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.parametrize('content,pattern', [
    (None, 'does not exist'),
    ('', 'has no text'),
    # The tokenizer is trained before pairs are built: this tiny corpus fails there first.
    ('One short document.\n\nAnother one.\n\nA third.\n', 'too large for this corpus'),
])
def test_bad_corpus(tmp_path, content, pattern):
  corpus = tmp_path / 'corpus.txt'
  if content is not None:
    corpus.write_text(content, encoding='utf-8')
  workdir = tmp_path / 'w'
  result = run('pretrain.py', *tiny_args(corpus, tmp_path / 'cache', workdir))
  assert_one_line_error(result, pattern)
  assert not os.path.exists(workdir)
