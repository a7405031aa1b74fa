"""interrupts: a signal while the main thread is inside jax's compiler is acknowledged at once and acted on when the
compile returns; one whose handler cannot run is acknowledged by the watcher; a second one stops the process at once.

jax's compiler is stood in for by a function defined in a file named like it (jax/_src/compiler.py) that sleeps:
`interrupts` knows a compile by that file on the main thread's stack. tests/experiments/test_cli.py and
tests/train/test_preemption.py send the signals to processes inside a real compile.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bert_jax.runs import interrupts

from harness.inputs import REPO

_COMPILER = os.path.join(os.sep, 'stand-in', 'jax', '_src', 'compiler.py')
_STAND_IN = ('import time\n'
             'def backend_compile_and_load(seconds, done, say=False):\n'
             '  if say:\n'
             '    print("compiling", flush=True)\n'
             '  time.sleep(seconds)\n'
             '  done.append(time.monotonic())\n')
_namespace = {}
exec(compile(_STAND_IN, _COMPILER, 'exec'), _namespace)  # pylint: disable=exec-used
compile_for = _namespace['backend_compile_and_load']

_MAIN = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                           reason='signal handlers need the main thread')


@pytest.fixture
def handler():
  """A handler of ours for SIGTERM that notes when it ran; the previous one and the main thread's mask come back."""
  ran = []

  @interrupts.tells_watcher
  def noting(signum, frame):
    del signum, frame
    ran.append(time.monotonic())
  previous = signal.signal(signal.SIGTERM, noting)
  try:
    yield ran
  finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, previous)


@_MAIN
def test_a_ctrl_c_inside_the_compiler_is_acknowledged_at_once_and_raises_once_it_returns(capfd):
  done = []
  threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
  with pytest.raises(KeyboardInterrupt):
    with interrupts.watching():
      compile_for(1.5, done)
      time.sleep(30)  # the signal comes back here: it ends the sleep
  raised = time.monotonic()
  assert done and raised - done[0] < 5, (done, raised)  # after the compile, long before the sleep's end
  assert capfd.readouterr().err == ('SIGINT (Ctrl-C) received while jax compiles (XLA cannot be interrupted): it '
                                    'stops once that returns. Another SIGINT stops at once\n')
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@_MAIN
def test_a_handler_that_cannot_run_is_acknowledged_by_the_watcher(capfd, handler):
  then = lambda: ('step 3 finishes and is saved', ', keeping the last complete checkpoint')
  done = []
  with interrupts.watching(then=then):
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    # The kernel gives the signal to another thread (the threads started before this keep their masks): the main
    # thread sleeps on, as inside a call into XLA that runs no handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    start = time.monotonic()
    compile_for(2.0, done)
  assert len(handler) == 1 and handler[0] - start >= 2.0  # the handler ran once the "compile" had returned
  assert capfd.readouterr().err == ('SIGTERM received while jax compiles (XLA cannot be interrupted): step 3 '
                                    'finishes and is saved once that returns. Another SIGTERM stops at once, '
                                    'keeping the last complete checkpoint\n')


@_MAIN
def test_outside_a_compile_the_watcher_waits_longer_before_it_speaks(handler, monkeypatch):
  written = []
  monkeypatch.setattr(interrupts, 'BUSY_ACK_S', 1.0)
  monkeypatch.setattr(interrupts, '_write', lambda text: written.append((time.monotonic(), text)))
  sent = []
  with interrupts.watching():
    threading.Timer(0.1, lambda: sent.append(time.monotonic()) or os.kill(os.getpid(), signal.SIGTERM)).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    time.sleep(2.0)  # a step may end any moment: the watcher waits BUSY_ACK_S, not ACK_AFTER_S
  assert len(handler) == 1 and len(written) == 1 and written[0][0] - sent[0] >= 1.0, (written, sent)
  assert written[0][1] == ('SIGTERM received while the main thread is inside a call Python cannot interrupt (1 s so '
                           'far): it stops once that returns. Another SIGTERM stops at once\n')


@_MAIN
def test_a_handler_that_runs_speaks_for_itself(capfd, handler):
  with interrupts.watching():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
  assert len(handler) == 1 and capfd.readouterr().err == ''


@pytest.mark.parametrize('deliver', ['to the main thread', 'to another thread'])
def test_a_second_signal_inside_the_compiler_stops_the_process_at_once(deliver):
  """Whether the main thread's handler defers the first signal or the watcher speaks for it (the handler cannot
  run), the second one ends the process as the signal itself would, long before the compile would end."""
  block = '  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n' if deliver == 'to another thread' else ''
  code = ('import signal\nfrom bert_jax.runs import interrupts\n'
          f'stand_in = {{}}\nexec(compile({_STAND_IN!r}, {_COMPILER!r}, "exec"), stand_in)\n'
          'with interrupts.watching():\n'
          f'{block}  stand_in["backend_compile_and_load"](60, [], say=True)\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    assert proc.stdout.readline() == 'compiling\n'
    proc.send_signal(signal.SIGINT)
    first = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    proc.wait(timeout=20)
    err = first + proc.stderr.read()
  finally:
    proc.kill()
  assert proc.returncode == -signal.SIGINT and time.monotonic() - start < 10, err
  assert err == ('SIGINT (Ctrl-C) received while jax compiles (XLA cannot be interrupted): it stops once that '
                 'returns. Another SIGINT stops at once\nSIGINT (Ctrl-C) again: stopping at once\n'), err


@_MAIN
def test_a_signal_delivered_twice_before_its_handler_can_run_is_handled_by_that_run(capfd, handler, monkeypatch):
  """SLURM sends a job's SIGTERM twice (to the step's tasks and through srun), moments apart. Both come while the main
  thread is inside a call that runs no handler: CPython runs the handler once, for both (the wakeup descriptor has a
  byte for each). The second is no signal after an acknowledgement: nothing stops the process at once."""
  stopped = []
  monkeypatch.setattr(interrupts, '_die', stopped.append)
  kill = lambda: os.kill(os.getpid(), signal.SIGTERM)
  with interrupts.watching():
    threading.Timer(0.1, kill).start()
    threading.Timer(0.15, kill).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # other threads take them: a call that runs no handler
    time.sleep(1.5)  # the watcher looks at both ACK_AFTER_S after them, while they wait for the main thread
  assert stopped == [] and len(handler) == 1 and capfd.readouterr().err == ''


@_MAIN
def test_a_signal_brought_back_into_another_compile_waits_for_that_one_too(capfd, monkeypatch):
  """The watcher brings a deferred signal back when it sees the main thread outside the compiler; should that thread
  be inside a compile again by the time the handler runs, the handler defers again, silently, instead of raising
  there (which would abandon that compile)."""
  monkeypatch.setattr(interrupts, '_main_compiling', lambda: False)  # every look of the watcher comes too early
  done = []
  threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
  with pytest.raises(KeyboardInterrupt):
    with interrupts.watching():
      compile_for(1.5, done)  # the signal comes back every _POLL_S meanwhile
      time.sleep(30)
  assert len(done) == 1, done  # the compile returned; the KeyboardInterrupt came after it
  assert capfd.readouterr().err == ('SIGINT (Ctrl-C) received while jax compiles (XLA cannot be interrupted): it '
                                    'stops once that returns. Another SIGINT stops at once\n')
