"""stderr_filter: XLA's "Very slow compile?" banner becomes one line, everything else passes as written (in order),
and nothing a process wrote is lost when it dies."""

import os
import signal
import subprocess
import sys
import time

import pytest

from bert_jax.launch import stderr_filter
from bert_jax.launch.stderr_filter import BannerFilter

from harness.inputs import REPO

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
  assert out == b'a line of ours\n' + _STILL + _ERROR + b'XLA compiled jit_f in 6m08s\n' + _FOLDING + b'no newline yet'
  assert banners.flush() == b''


# The first record in TSL's older format (a date, then the file's path as built).
_FIRED_TSL = (b'2025-03-19 07:30:02.045318: E external/xla/xla/service/slow_operation_alarm.cc:73] \n'
              + _FIRED[_FIRED.index(b'\n') + 1:])


@pytest.mark.parametrize('record, cut', [(_FIRED, 1), (_FIRED, 16), (_FIRED, 41), (_FIRED, 60), (_FIRED_TSL, 12),
                                         (_FIRED_TSL, 40), (_FIRED_TSL, 80)],
                         ids=['absl-1', 'absl-16', 'absl-41', 'absl-60', 'tsl-12', 'tsl-40', 'tsl-80'])
def test_a_line_without_its_newline_goes_out_at_once_unless_it_could_become_an_alarm_header(record, cut):
  """A progress bar redrawn after '\\r' or a prompt shows as it is written, before anything written after it; only
  text that could still become the header of an alarm record (a write cut in two) waits for the rest of its line."""
  banners = BannerFilter()
  for text in (b'\r 40%|####      |', b'\r 50%|#####     | step 12', b'Overwrite? [y/N] ',
               b'E1207 10:21:43.603112   13690 cpu_compiler.cc:1'):  # another file's record
    assert banners.feed(text) == text and not banners.holding
    assert banners.feed(b'\n') == b'\n'
  assert banners.feed(b'\r 60%|######    |') == b'\r 60%|######    |'
  assert banners.feed(record[:cut]) == b'' and banners.holding  # XLA's record after the bar, its write cut in two
  assert banners.feed(record[cut:]) == _STILL and banners.flush() == b''


@pytest.mark.parametrize('raw', [False, True])
def test_a_process_that_aborts_loses_nothing_and_shows_one_line_for_the_banner(raw):
  """The filter is a process of its own: what a process wrote just before an abort (XLA's fatal errors end so) still
  reaches the terminal. BERT_JAX_RAW_STDERR=1 leaves stderr as it is."""
  code = ('import os, sys\nfrom bert_jax.launch import stderr_filter\n'
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
  code = ('import os, sys\nfrom bert_jax.launch import stderr_filter\n'
          'stderr_filter.start()\n'
          f'os.write(2, {_ENDED!r})\n'
          'stderr_filter.stop()\n'
          'os.write(2, b"after stop\\n")\n'
          'os._exit(3)\n')  # no atexit: the order is stop's alone
  r = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, timeout=60)
  assert r.returncode == 3 and r.stderr == b'XLA compiled jit_f in 6m08s\nafter stop\n', r.stderr
  assert not stderr_filter._active  # pylint: disable=protected-access  # this process never started one


def test_on_a_terminal_stderr_stays_a_terminal_and_every_byte_passes_as_written():
  """Where descriptor 2 is a terminal the process writes to a pseudo-terminal in raw mode with the terminal's window
  size: isatty(2) stays true (libraries keep their progress bars and colours), no newline is translated twice."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top
  import termios  # pylint: disable=g-import-not-at-top
  import tty  # pylint: disable=g-import-not-at-top
  master, slave = os.openpty()
  tty.setraw(slave)  # the test reads the bytes the filter wrote, not a terminal's rendering of them
  fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 77, 0, 0))
  code = ('import os, sys\nfrom bert_jax.launch import stderr_filter\n'
          'print(stderr_filter.start(), os.isatty(2), tuple(os.get_terminal_size(2)), flush=True)\n'
          'os.write(2, b"\\r 50%|#####     |")\n'
          f'os.write(2, b"\\r100%|##########|\\n" + {_FIRED!r})\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE, stderr=slave)
  os.close(slave)
  shown = b''
  try:
    while True:  # until the process and the filter have closed the terminal
      try:
        data = os.read(master, 4096)
      except OSError:  # EIO: no writer left
        break
      if not data:
        break
      shown += data
    out = proc.communicate(timeout=60)[0]
  finally:
    proc.kill()
    os.close(master)
  assert proc.returncode == 0 and out == b'True True (77, 33)\n', out
  assert shown == b'\r 50%|#####     |\r100%|##########|\n' + _STILL, shown


def test_the_filter_outlives_a_terminal_s_ctrl_backslash():
  """The filter runs in a process group of its own: a terminal's Ctrl-C or Ctrl-\\\\, sent to the foreground group,
  never reaches it, and stderr still works after one (a dead filter: every later write raises BrokenPipeError)."""
  code = ('import os, resource, signal, sys\nfrom bert_jax.launch import stderr_filter\n'
          'resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n'
          'stderr_filter.start()\n'
          'signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # this process lives on; the filter keeps its default\n'
          'print("ready", flush=True)\n'
          'sys.stdin.readline()\n'
          'print("after Ctrl-\\\\", file=sys.stderr, flush=True)\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, process_group=0)
  try:
    assert proc.stdout.readline() == b'ready\n'
    os.killpg(proc.pid, signal.SIGQUIT)  # as a terminal sends Ctrl-\ to its foreground process group
    time.sleep(0.3)  # a filter in that group would be dead by now
    _, err = proc.communicate(b'\n', timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 0 and err == b'after Ctrl-\\\n', err


def test_stop_does_not_wait_for_the_processes_still_writing_through_the_filter():
  """A process that started others (a data loader's workers) that still hold the filter's pipe: stop returns once the
  filter has written what this process sent it (the start of a line included), not when the others end."""
  code = ('import os, subprocess, sys, time\nfrom bert_jax.launch import stderr_filter\n'
          'stderr_filter.start()\n'
          'holder = subprocess.Popen(["sleep", "60"])  # its stderr: the filter\'s pipe\n'
          'time.sleep(1.0)  # the filter\'s interpreter has started: what follows times stop alone\n'
          'os.write(2, b"last words\\nE1207 10:2")\n'
          'start = time.monotonic()\n'
          'stderr_filter.stop()\n'
          'print(time.monotonic() - start, flush=True)\n'
          'os.write(2, b"after stop\\n")\n'
          'holder.kill()\n')
  r = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, timeout=60)
  assert r.returncode == 0 and r.stderr == b'last words\nE1207 10:2after stop\n', r.stderr
  assert float(r.stdout) < 0.5, r.stdout  # the filter answers in milliseconds; waiting for `sleep` took 1 s
