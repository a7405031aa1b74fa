"""experiments/cli.py in process: a mistyped --config field or a value of the wrong type is one line naming the field;
--help lists the config's variants and main fields; --print_config prints the resolved config and touches nothing.
In processes of their own: Ctrl-C during a compile, XLA's slow-compile banner on stderr."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.faults import SignalledRun, compiling_entry
from harness.inputs import REPO, minilm_dir_or_skip


@pytest.mark.parametrize('script,flag,want', [
    ('pretrain.py', '--config.optim.learnin_rate=1e-3',
     'unknown field optim.learnin_rate in --config.optim.learnin_rate; did you mean optim.learning_rate?'),
    ('pretrain.py', '--config.optm.learning_rate=1e-3',
     'unknown field optm.learning_rate in --config.optm.learning_rate; did you mean optim.learning_rate?'),
    ('finetune.py', '--config.num_train_step=5',
     'unknown field num_train_step in --config.num_train_step; did you mean num_train_steps?'),
    ('pretrain.py', '--config.zzz=1', 'unknown field zzz in --config.zzz (the config file\'s fields'),
])
def test_a_mistyped_field_is_one_clean_line(tmp_path, script, flag, want):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  result = run_main(script, f'--workdir={workdir}', flag)
  assert_one_line_error(result, want)
  assert '\\' not in result.stderr  # no escaped quotes or literal \n
  assert tree_digest(str(workdir)) == before and os.listdir(workdir) == ['notes.txt']


@pytest.mark.parametrize('flag,want', [
    ('--config.num_train_steps=abc', "--config.num_train_steps: expected int, got 'abc'"),
    ('--config.optim.learning_rate=fast', "--config.optim.learning_rate: expected float, got 'fast'"),
    ('--config.data.lower_case=maybe', "--config.data.lower_case: expected bool, got 'maybe'"),
])
def test_a_value_of_the_wrong_type_names_the_field_and_the_type(tmp_path, flag, want):
  result = run_main('pretrain.py', f'--workdir={tmp_path / "w"}', flag)
  assert_one_line_error(result, want)
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('script,variants,fields', [
    ('pretrain.py', ('cpu', 'tiny', 'base', 'recipe', 'sop, mlm_only, span, mask_schedule, modern'),
     ('optim.learning_rate = 0.002', 'batch_size = 32', 'data.train_files', 'num_train_steps = 1000')),
    ('finetune.py', ('sst2, rte', 'squad_v2', 'conll2003'),
     ('task = \'sst2\'', 'init_checkpoint', 'optim.learning_rate', 'num_seeds = 1', 'max_seq_length = 64')),
])
def test_help_lists_the_config_variants_and_main_fields(script, variants, fields):
  out = run_main(script, '--help').stdout
  listed, main = out.split('Config variants')[1].split('Main fields')
  lines = {l.split('  ')[1].strip() for l in listed.splitlines()[1:] if l.strip() and l.startswith('  ') and
           not l.startswith('   ')}
  assert set(variants) <= lines, lines
  for field in fields:
    line = next((l for l in main.splitlines() if l.startswith(f'  {field}')), None)
    assert line and len(line.split(maxsplit=3)) == 4, (field, main)  # name = value, then its one-line help
  assert '--print_config' in out and '%%' not in out


def test_print_config_shows_the_changes_parameters_and_tokens_and_touches_nothing(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a user file')
  before = tree_digest(str(workdir))
  result = run_main('pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
                    '--config.optim.learning_rate=3e-3', '--config.batch_size=8', '--print_config')
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert '"learning_rate": 0.003' in out  # the resolved config, as the run uses it
  assert '# changed by --config.* flags (2):\n  batch_size: 16 -> 8\n  optim.learning_rate: 0.001 -> 0.003' in out
  # tiny: L2/H64/A2/I?, vocab 1000 (the count is eval_shape's; a closed form would drift with the architecture)
  assert '# parameters: 206,570 (' in out and '# tokens per step: 512 row tokens (8 x 64)' in out
  assert tree_digest(str(workdir)) == before and os.listdir(workdir) == ['notes.txt']
  missing = tmp_path / 'missing'
  assert run_main('pretrain.py', f'--workdir={missing}', '--config=experiments/configs/pretrain.py:tiny',
                  '--print_config').returncode == 0
  assert not missing.exists()
  alone = run_main('pretrain.py', '--config=experiments/configs/pretrain.py:tiny', '--print_config')
  assert alone.returncode == 0 and '# parameters: ' in alone.stdout, alone.stderr  # no --workdir needed to look
  assert 'must have a value' in run_main('pretrain.py', '--config=experiments/configs/pretrain.py:tiny').stderr


def test_print_config_of_a_finetuning_run_counts_its_task_head(tmp_path):
  minilm_dir_or_skip()  # the default init_checkpoint, whose architecture it prints
  result = run_main('finetune.py', f'--workdir={tmp_path / "w"}', '--config=experiments/configs/finetune.py:rte',
                    '--config.batch_size=8', '--print_config')
  assert result.returncode == 0, result.stderr[-3000:]
  assert '  batch_size: 16 -> 8' in result.stdout and '# tokens per step: 1,024 row tokens (8 x 128)' in result.stdout
  assert 'encoder + classification head, rte' in result.stdout  # all-MiniLM-L6-v2's architecture, not the config's
  assert not (tmp_path / 'w').exists()


def test_the_distributed_modes_are_the_library_s():
  import cli  # pylint: disable=g-import-not-at-top
  from bert_jax import distributed  # pylint: disable=g-import-not-at-top
  assert cli._MODES == distributed.MODES  # pylint: disable=protected-access  # cli keeps a copy: no jax import


@pytest.mark.slow
def test_a_config_error_comes_before_jax_is_imported(tmp_path):
  """The first line of a mistyped or mistyped-value flag comes in about a second: jax, flax and orbax (10-20 s on
  2 cores) are imported only after the flags and the config are checked."""
  for script, flag in (('pretrain', '--config.optim.learnin_rate=1'), ('pretrain', '--config.num_train_steps=abc'),
                       ('finetune', '--config.optim.learnin_rate=1'), ('evaluate', '--config.eval_batch_size=abc'),
                       ('prepare_data', '--config.data.max_seq_lenght=64')):
    code = ('import runpy, sys; sys.path.insert(0, "experiments")\n'
            'sys.argv = ["experiments/%s.py", "--workdir=%s", "%s"]\n'
            'try:\n  runpy.run_path(sys.argv[0], run_name="__main__")\n'
            'finally:\n  print("jax imported:", "jax" in sys.modules, file=sys.stderr)') % (script, tmp_path / 'w', flag)
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, 'PYTHONPATH': REPO})
    assert result.returncode == 1 and result.stderr.startswith('error: '), (script, result.stderr[-3000:])
    assert 'jax imported: False' in result.stderr and flag.split('=')[0] in result.stderr, (script, result.stderr)


@pytest.mark.parametrize('script', ['sweep.py', 'ladder.py'])
def test_the_cell_runners_help_lists_their_launcher_flags_not_the_multi_host_ones(script):
  out = run_main(script, '--help').stdout
  listed = set(re.findall(r'^\s+--(?:\[no\])?(\w+):', out, re.M))
  assert {'launcher', 'gather', 'slurm_sbatch', 'slurm_submit', 'slurm_template', 'dry_run'} <= listed, listed
  assert not listed & {'coordinator_address', 'num_processes', 'process_id', 'distributed'}, listed


@pytest.mark.slow
def test_ctrl_c_during_a_compile_says_so_at_once_and_a_second_one_stops_at_once(tmp_path):
  """jax runs Python's signal handlers while it compiles, but a KeyboardInterrupt raised there would abandon the
  compile and crash the process at its exit: the first Ctrl-C is acknowledged at once instead, the second one ends
  the process then and there, as Ctrl-C with no handler would (a compile of about 40 s here)."""
  run = SignalledRun(compiling_entry(tmp_path, 3000))
  run.started()
  time.sleep(0.5)  # inside the compile
  sent = run.send(signal.SIGINT)
  acknowledged = run.line('SIGINT (Ctrl-C) received while jax compiles (XLA cannot be interrupted): it stops once that '
                          'returns. Another SIGINT stops at once')
  assert acknowledged - sent < 2.0 and 'compiled' not in run.stderr, (acknowledged - sent, run.stderr)
  sent = run.send(signal.SIGINT)
  assert run.wait(timeout=30) == -signal.SIGINT and run.line('SIGINT (Ctrl-C) again: stopping at once') - sent < 5
  assert 'compiled' not in run.stderr and 'Traceback' not in run.stderr, run.stderr


def test_xla_s_slow_compile_banner_is_one_line_on_an_entry_point_s_stderr(tmp_path):
  banner = ('E1207 10:15:35.478499   13690 slow_operation_alarm.cc:73] \n********************************\n'
            '[Compiling module jit_train_step for CPU] Very slow compile? If you want to file a bug, run with envvar '
            'XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n********************************\n')
  script = tmp_path / 'entry.py'
  script.write_text('import os, sys\nsys.path[:0] = [%r, %r]\nimport cli\n'
                    'def main(argv):\n  os.write(2, %r)\n  raise cli.ConfigError("a real error")\n'
                    'cli.run(main, multihost=False)\n' % (REPO, os.path.join(REPO, 'experiments'), banner.encode()))
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
  assert r.returncode == 1 and r.stderr == (
      'XLA is still compiling jit_train_step after 2 minutes: compiling is slow on a busy machine (XLA logs this as an '
      'error; it is not one)\nerror: a real error\n'), r.stderr
