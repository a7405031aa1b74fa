"""bert_jax/hardware.py: the platform resolved once (and passed to the model), the huge-pages restart of a script and
its settings' checks (in every entry point, through experiments/cli.py); the CPU tricks under XLA's default compiler
configuration (the tests marked `xla_default`, run again in a process of their own)."""

import glob
import os
import re
import subprocess
import sys

from flax import nnx
import jax
import pytest

from bert_jax import config, hardware
from bert_jax.errors import ConfigError
from bert_jax.model import heads

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import REPO
from harness.processes import user_environment


def test_auto_is_the_platform_of_the_mesh_or_of_jax_s_devices():
  mesh = jax.make_mesh((jax.device_count(),), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  assert hardware.resolve('auto', mesh=mesh) == hardware.resolve() == hardware.resolve(None) == 'cpu'
  for platform in hardware.PLATFORMS:  # a platform is taken as given, whatever the devices
    assert hardware.resolve(platform, mesh=mesh) == platform
  with pytest.raises(ConfigError, match="hardware must be one of auto, cpu, gpu, rocm, tpu, got 'cuda'"):
    hardware.resolve('cuda')


def test_the_model_keeps_the_platform_it_was_built_for():
  # Resolved when the modules are built, down to every Dense: nothing asks jax while a step is traced.
  cfg = config.preset('tiny', vocab_size=50)
  built = heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0), platform='gpu')
  platforms = {m.platform for _, m in nnx.iter_graph(built) if isinstance(m, nnx.Module) and hasattr(m, 'platform')}
  assert platforms == {'gpu'}
  assert built.bert.layers[0].attention.query.platform == 'gpu'
  assert heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)).bert.layers[0].output.platform == 'cpu'
  with pytest.raises(ConfigError, match='hardware must be one of'):
    heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0), platform='cuda')


def test_a_script_restarts_itself_with_huge_pages_as_the_same_process(tmp_path):
  reason = hardware.huge_pages_unavailable()
  if reason:
    pytest.skip(reason)
  # A script of a user's (the library call) and an entry point (experiments/cli.py makes the same call).
  script = tmp_path / 'script.py'
  script.write_text('import os, sys\nsys.path[:0] = [%r]\nfrom bert_jax import hardware\n'
                    'on = hardware.prepare_process()\nprint(os.getpid(), os.environ.get("GLIBC_TUNABLES"), on, '
                    'sys.argv[1:])\n' % REPO)
  entry = tmp_path / 'entry.py'
  entry.write_text('import os, sys\nsys.path[:0] = [%r, %r]\nimport cli\n'
                   'def main(argv):\n  print(os.getpid(), os.environ.get("GLIBC_TUNABLES"), None, argv[1:])\n'
                   'cli.run(main, allow_args=True, multihost=False)\n' % (REPO, os.path.join(REPO, 'experiments')))
  env = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', 'BERT_JAX_HUGE_PAGES')}
  def started(*interpreter_flags, script=script, **extra):
    p = subprocess.Popen([sys.executable, *interpreter_flags, str(script), 'a b', 'c'], env={**env, **extra},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    pid, tunables, on, args = out.split(' ', 3)
    assert int(pid) == p.pid and args.strip() == "['a b', 'c']"  # execve: the same process, the same arguments
    assert on == 'None' or on == str(tunables not in ('None', 'glibc.malloc.hugetlb=0')), out
    return tunables
  assert started() == 'glibc.malloc.hugetlb=1'
  assert started(script=entry) == 'glibc.malloc.hugetlb=1'
  assert started('-u') == 'glibc.malloc.hugetlb=1'  # interpreter options kept
  assert started(GLIBC_TUNABLES='glibc.malloc.arena_max=2') == 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'
  assert started(GLIBC_TUNABLES='glibc.malloc.hugetlb=0') == 'glibc.malloc.hugetlb=0'  # the user's choice stands
  assert started(BERT_JAX_HUGE_PAGES='0') == 'None'
  assert started(BERT_JAX_HUGE_PAGES='restarted') == 'None'  # once only, even where the loader drops the tunable
  stdin = subprocess.run([sys.executable, '-', 'a'], input=script.read_text(), env=env, capture_output=True, text=True,
                         timeout=60, check=True)  # a script read from stdin cannot be read again: it runs as started
  assert stdin.stdout.split(' ', 2)[1:] == ['None', "False ['a']\n"], stdin


def test_a_process_that_cannot_restart_goes_on_as_started_and_says_so(monkeypatch):
  # This test runner is not a script of its own (as a notebook's kernel): it is never re-executed.
  assert not hardware.started_as_script()
  monkeypatch.delenv('BERT_JAX_HUGE_PAGES', raising=False)
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.arena_max=2')
  assert hardware.prepare_process() is False
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.hugetlb=1')
  assert hardware.prepare_process() is True
  monkeypatch.setenv('BERT_JAX_HUGE_PAGES', 'yes')
  for restart in (True, False):  # checked either way
    with pytest.raises(ConfigError, match='BERT_JAX_HUGE_PAGES=yes is neither 0'):
      hardware.prepare_process(restart=restart)


@pytest.mark.parametrize('tunables, expected', [
    ('glibc.malloc.hugetlb=0', False), ('glibc.malloc.hugetlb=1', True), ('glibc.malloc.hugetlb=2', True),
    ('glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2097152', True), ('glibc.malloc.hugetlb=0x200000', True),
    ('glibc.malloc.arena_max=2', None), ('', None),
])
def test_the_huge_pages_tunable_as_glibc_reads_it(tunables, expected):
  assert hardware.given_huge_pages({'GLIBC_TUNABLES': tunables}) is expected
  if expected is not None:  # the tunable decides, whatever BERT_JAX_HUGE_PAGES allows
    for allowed in ('0', '1', ''):
      assert hardware.runs_on_huge_pages({'GLIBC_TUNABLES': tunables, 'BERT_JAX_HUGE_PAGES': allowed}) is expected
  assert hardware.runs_on_huge_pages({'GLIBC_TUNABLES': tunables, 'BERT_JAX_HUGE_PAGES': '0'}) is bool(expected)


@pytest.mark.parametrize('variable, value, pattern', [
    ('GLIBC_TUNABLES', 'glibc.malloc.hugetlb=bogus', 'GLIBC_TUNABLES: glibc.malloc.hugetlb=bogus is not a value glibc '
                                                     'reads (it would ignore it): give 0 (off), 1 '),
    ('GLIBC_TUNABLES', 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=', 'glibc.malloc.hugetlb= is not a value'),
    ('GLIBC_TUNABLES', 'glibc.malloc.hugetlb=-1', 'glibc.malloc.hugetlb=-1 is not a value'),
    ('BERT_JAX_HUGE_PAGES', 'garbage', 'BERT_JAX_HUGE_PAGES=garbage is neither 0 (keep the allocator the process '
                                       'started with) nor 1'),
    ('BERT_JAX_HUGE_PAGES', 'yes', 'BERT_JAX_HUGE_PAGES=yes is neither 0'),
])
def test_a_huge_pages_setting_no_reader_takes_is_one_line(tmp_path, monkeypatch, variable, value, pattern):
  # glibc ignores a tunable value it cannot read, silently: the run's labels would say huge pages it never had.
  monkeypatch.setenv(variable, value)
  with pytest.raises(ConfigError):
    hardware.runs_on_huge_pages(os.environ)
  (tmp_path / 'texts.txt').write_text('a text\n')
  before = tree_digest(str(tmp_path))
  result = run_main('embed.py', f'--checkpoint={tmp_path}/none', f'--input={tmp_path}/texts.txt',
                    f'--output={tmp_path}/out.npz')
  assert_one_line_error(result, pattern)
  assert tree_digest(str(tmp_path)) == before


@pytest.mark.parametrize('variable, value', [('BERT_JAX_HUGE_PAGES', 'bogus'),
                                             ('GLIBC_TUNABLES', 'glibc.malloc.hugetlb=bogus')])
def test_a_bad_huge_pages_setting_fails_first_where_the_entry_point_keeps_its_allocator(tmp_path, monkeypatch,
                                                                                        variable, value):
  """benchmark_retrieval.py keeps the allocator it was started with (its peer trains in its process): a huge-pages
  setting no reader takes is one error line before any work there too, not after a run of both trainers; --help is
  shown whatever the environment."""
  monkeypatch.setenv(variable, value)
  (tmp_path / 'pairs.jsonl').write_text('{"query": "a", "positive": "b"}\n')
  before = tree_digest(str(tmp_path))
  result = run_main('benchmark_retrieval.py', f'--train_file={tmp_path}/pairs.jsonl', f'--beir_dir={tmp_path}/beir',
                    f'--workdir={tmp_path}/w')
  assert_one_line_error(result, f'{value} is ')
  assert tree_digest(str(tmp_path)) == before
  for script, flag in (('benchmark_retrieval.py', '--train_file'), ('embed.py', '--input')):  # huge_pages False, True
    shown = run_main(script, '--help')
    assert f'  {flag}: ' in shown.stdout and 'error' not in shown.stderr, shown


@pytest.mark.slow
def test_the_cpu_tricks_hold_under_xla_s_default_compiler_configuration():
  """The suite compiles under its fast profile (tests/conftest.py); what bert_jax tunes for XLA:CPU's defaults (the
  tests marked `xla_default`: the layouts of Dense's bfloat16 backward, its float32 bias sum) is checked again here,
  in a test run of its own under the default profile: XLA's own flags, as users run."""
  marked = sorted(p for p in glob.glob(os.path.join(REPO, 'tests', '**', 'test_*.py'), recursive=True)
                  if re.search(r'^@pytest\.mark\.xla_default$', open(p, encoding='utf-8').read(), re.M))
  assert marked, 'no test is marked xla_default'
  env = {k: v for k, v in user_environment().items()
         if k not in ('BERT_JAX_TEST_XLA_FLAGS', 'JAX_COMPILATION_CACHE_DIR', 'PYTEST_XDIST_WORKER')}
  env['BERT_JAX_TEST_XLA_PROFILE'] = 'default'
  r = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:xdist', '-m', 'xla_default', *marked],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
  header = re.search(r'^XLA profile: (\w+) \(XLA_FLAGS=(.*)\)$', r.stdout, re.M)
  assert header and header.group(1) == 'default', r.stdout[:3000]
  assert not {'--xla_backend_optimization_level=0', '--xla_cpu_use_fusion_emitters=false'} & set(
      header.group(2).split()), header.group(2)
  passed = re.search(r'(\d+) passed', r.stdout)
  assert passed and int(passed.group(1)) >= 3 and ' skipped' not in r.stdout, r.stdout[-3000:]
