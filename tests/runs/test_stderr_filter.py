"""stderr_filter: XLA's "Very slow compile?" banner becomes one line, everything else passes as written (in order),
and nothing a process wrote is lost when it dies."""

import os
import signal
import subprocess
import sys

import pytest

from bert_jax.runs import stderr_filter
from bert_jax.runs.stderr_filter import BannerFilter

from helpers import REPO

# XLA's two records, as jax 0.10.2's CPU compiler wrote the first on this machine (2 minutes into a compile) and
# slow_operation_alarm.cc writes the second when that compile ends.
_FIRED = (b'E1207 10:15:35.478499   13690 slow_operation_alarm.cc:73] \n'
          b'********************************\n'
          b'[Compiling module jit_f for CPU] Very slow compile? If you want to file a bug, run with envvar '
          b'XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n'
          b'********************************\n')
_ENDED = (b'E1207 10:21:43.603112   13690 slow_operation_alarm.cc:140] The operation took 6m8.124613s\n\n'
          b'********************************\n'
          b'[Compiling module jit_f for CPU] Very slow compile? If you want to file a bug, run with envvar '
          b'XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n'
          b'********************************\n')
_STILL = (b'XLA is still compiling jit_f after 2 minutes: compiling is slow on a busy machine (XLA logs this as an '
          b'error; it is not one)\n')
# Another record of the alarm's file, and an error of XLA's: both pass unchanged.
_FOLDING = (b'E1207 10:30:00.000001   13690 slow_operation_alarm.cc:73] Constant folding an instruction is taking > 1s:'
            b'\n\n  %reduce = f32[] reduce(...)\n\nThis isn\'t necessarily a bug.\n')
_ERROR = b'E1207 10:30:01.000001   13690 pjrt_client.cc:12] INTERNAL: something real\n'


def test_the_banner_becomes_one_line_and_everything_else_passes_unchanged():
  banners = BannerFilter()
  out = banners.feed(b'a line of ours\n' + _FIRED + _ERROR)
  out += banners.feed(_ENDED[:41])  # a write cut inside the record's first line
  out += banners.feed(_ENDED[41:] + _FOLDING + b'no newline yet')
  assert out == b'a line of ours\n' + _STILL + _ERROR + b'XLA compiled jit_f in 6m08s\n' + _FOLDING
  assert banners.flush() == b'no newline yet'  # what the filter writes once no byte has come for a moment
  assert banners.flush() == b''


def test_an_unfinished_record_goes_out_as_it_was():
  banners = BannerFilter()
  assert banners.feed(_FIRED[:120]) == b''
  assert banners.flush() == _FIRED[:120]  # XLA died inside its own record: its bytes, not a line of ours


@pytest.mark.parametrize('raw', [False, True])
def test_a_process_that_aborts_loses_nothing_and_shows_one_line_for_the_banner(raw):
  """The filter is a process of its own: what a process wrote just before an abort (XLA's fatal errors end so) still
  reaches the terminal. BERT_JAX_RAW_STDERR=1 leaves stderr as it is."""
  code = ('import os, sys\nfrom bert_jax.runs import stderr_filter\n'
          'print("started" if stderr_filter.start() else "not started", flush=True)\n'
          f'os.write(2, {_FIRED!r})\n'
          'print("a Python line", file=sys.stderr, flush=True)\n'
          'os.write(2, b"F1207 10:15:36.000000   13690 cpu_compiler.cc:1] Check failed: the last words\\n")\n'
          'os.abort()\n')
  env = dict(os.environ, BERT_JAX_RAW_STDERR='1' if raw else '0')
  r = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, timeout=60, env=env)
  assert r.returncode == -signal.SIGABRT and r.stdout.decode().strip() == ('not started' if raw else 'started')
  shown = _FIRED if raw else _STILL
  assert r.stderr == shown + b'a Python line\nF1207 10:15:36.000000   13690 cpu_compiler.cc:1] Check failed: the last ' \
                              b'words\n', r.stderr


def test_stop_points_stderr_back_and_waits_for_what_was_sent():
  code = ('import os, sys\nfrom bert_jax.runs import stderr_filter\n'
          'stderr_filter.start()\n'
          f'os.write(2, {_ENDED!r})\n'
          'stderr_filter.stop()\n'
          'os.write(2, b"after stop\\n")\n'
          'os._exit(3)\n')  # no atexit: the order is stop's alone
  r = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, timeout=60)
  assert r.returncode == 3 and r.stderr == b'XLA compiled jit_f in 6m08s\nafter stop\n', r.stderr
  assert not stderr_filter._active  # pylint: disable=protected-access  # this process never started one
