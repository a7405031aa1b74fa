"""SIGINT and SIGTERM while the main thread is inside XLA: acknowledged at once, acted on when XLA returns.

Python runs a signal's handler on the main thread, between bytecodes. Inside a call into XLA that thread runs no
bytecode; jax >= 0.10 waits for a compile in a loop that runs pending handlers every 200 ms
(`BlockUntilReadyWithCancel` in jaxlib), so a handler does run during a compile, but an exception it raises abandons
the compile while XLA goes on with it in the background: a process that then exits is killed by a segmentation
fault when that compile ends (jax 0.10.2: exit -11 instead of its own code). A call that does not run
handlers delays them until it returns. Here, for the handlers of ours (`tells_watcher`):

- A handler that would raise asks `deferred(signum, frame)` first. Inside jax's compiler it says in one line that
  the signal is received, what happens once the compile returns and that another signal stops at once; the signal
  comes to the handler again when the main thread has left the compiler (sent to that thread again), and the
  handler then acts (a KeyboardInterrupt, Preempted); should that thread be inside a compile again by then, the
  signal waits for that one too, silently.
- A watcher thread (`watching()`) learns of every signal at once through Python's wakeup file descriptor
  (`signal.set_wakeup_fd`: CPython's C-level handler writes the signal's number there, whichever thread the kernel
  interrupted, before any Python handler runs). A handler that has not run ACK_AFTER_S after its signal waits for
  the main thread: the watcher acknowledges it (at once inside jax's compiler, after BUSY_ACK_S in another call).
- One run of a handler handles every arrival of its signal before it: CPython runs a handler once for signals that
  came while it could not run (the wakeup descriptor has one byte for each), and SLURM sends a job's SIGTERM twice
  (to the step's tasks and through srun) within moments. Each run first reads the bytes the watcher has not read
  yet, so the arrivals it handles are those read before it.
- A signal that comes after an acknowledgement was given (by a handler's run, a deferral or the watcher) and cannot
  be handled at once (inside the compiler, or not within ACK_AFTER_S) stops the process at once: one line, then it
  dies of that signal, as with no handler (a shell sees a Ctrl-C). A signal that came before the acknowledgement is
  covered by it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import functools
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Iterator


# A handler that has not run this long after its signal is waiting for the main thread.
ACK_AFTER_S = 0.5
# The main thread inside a call into XLA other than a compile (a long step): its acknowledgement comes this late.
BUSY_ACK_S = 10.0
_POLL_S = 0.1  # how often the watcher looks again at a signal waiting for the main thread
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOP = b'\0'  # on the watcher's control pipe: end the thread
_WAKE = b'\1'  # on the watcher's control pipe: look at the signals waiting (a handler's run read new ones)
# jax's compiler module: a main thread whose stack passes through it is compiling (or reading a compiled program).
_COMPILER = os.path.join('jax', '_src', 'compiler.py')

# What a run of a handler of ours says if it defers (`_Watcher.ran`), for `deferred`; _BROUGHT_BACK: the run is a
# deferred signal brought back (no new signal).
_RECEIVED, _AGAIN, _COVERED, _BROUGHT_BACK = 'received', 'again', 'covered', 'brought back'
_verdict = _COVERED  # the verdict of the handler's run in progress in the main thread
_bringing_back = False  # `_to_handlers` is calling handlers itself (deferred signals, no new ones)
_then: list[Callable[[], tuple[str, str]]] = []  # what follows a signal, innermost last (`watching`)
_watcher: '_Watcher | None' = None


def tells_watcher(handler):
  """Decorates a signal handler (a function or method taking (signum, frame)): each run tells the watcher which
  arrivals of its signal it handles (a run is an acknowledgement), and the watcher acts for the others."""
  @functools.wraps(handler)
  def noting(*args):
    global _verdict  # pylint: disable=global-statement
    signum, watcher, outer = args[-2], _watcher, _verdict
    if watcher is None:
      _verdict = _RECEIVED
    elif _bringing_back or watcher.take_redelivered(signum):
      _verdict = _BROUGHT_BACK
    else:
      _verdict = watcher.ran(signum)
    try:
      return handler(*args)
    finally:
      _verdict = outer
      if watcher is not None:
        watcher.acknowledge()
  noting.tells_watcher = True
  return noting


@tells_watcher
def keyboard_interrupt(signum, frame):
  """Python's default SIGINT handler (KeyboardInterrupt), once jax's compile in progress has returned."""
  if deferred(signum, frame):
    return
  raise KeyboardInterrupt


def restorable(handler):
  """The handler to put back when a block that replaced `handler` ends: `keyboard_interrupt` stands for Python's
  default SIGINT handler only while a watcher runs (a block inside `watching` found it there), so once none does,
  Python's own comes back instead."""
  if handler is keyboard_interrupt and _watcher is None:
    return signal.default_int_handler
  return handler


def deferred(signum: int, frame) -> bool:
  """Whether a handler of ours (`tells_watcher`) called with (signum, frame) must return at once instead of acting:
  True while the main thread is inside jax's compiler, where raising would abandon the compile. The signal is then
  acknowledged in a line and comes to the handler again once the compile returns. A signal that comes after an
  acknowledgement stops the process there and then. False without an active `watching` (nothing could bring the
  signal back)."""
  watcher, verdict = _watcher, _verdict
  if watcher is None or not compiling(frame):  # a signal brought back acts here, outside the compiler
    return False
  if verdict == _AGAIN:
    _stop_at_once(signum)
  if verdict == _RECEIVED:
    watcher.acknowledge()
    _acknowledge(signum, 'jax compiles (XLA cannot be interrupted)')
  # A signal before an acknowledgement, or one brought back into another compile, waits for it too, silently.
  watcher.defer(signum)
  return True


@contextlib.contextmanager
def watching(then: Callable[[], tuple[str, str]] | None = None) -> Iterator[None]:
  """Watches SIGINT and SIGTERM for the block (from the main thread; elsewhere, and where another part of the
  program already uses the wakeup descriptor, it watches nothing). Python's default SIGINT handler is
  `keyboard_interrupt` meanwhile. Blocks may nest: the outermost starts and ends the watcher.

  Args:
    then: () -> (what happens when the main thread returns, what a stop at once keeps), for the acknowledgement
      ('step 5 finishes and is saved', ', keeping the last complete checkpoint'); the innermost block's is used.
  """
  global _watcher  # pylint: disable=global-statement
  started = None
  if _watcher is None and threading.current_thread() is threading.main_thread():
    started = _watcher = _Watcher.start()
  if then is not None:
    _then.append(then)
  try:
    yield
  finally:
    # A signal deferred in the block whose compile returned just before the block ended: its handler now, from here
    # (after the outermost block, Python's own: a KeyboardInterrupt).
    back = _watcher.take_deferred() if _watcher is not None else []
    if then is not None:
      _then.remove(then)
    if started is not None:
      started.stop()
      _watcher = None
    _to_handlers(back)


def bring_back() -> None:
  """Runs the handlers of the signals deferred so far, here and now: for a block that ends, where a signal meant
  something else than it will after it (Preemption.immediately)."""
  _to_handlers(_watcher.take_deferred() if _watcher is not None else [])


def _to_handlers(signums: list[int]) -> None:
  global _bringing_back  # pylint: disable=global-statement
  outer, _bringing_back = _bringing_back, True
  try:
    for signum in signums:
      handler = signal.getsignal(signum)
      if callable(handler):
        handler(signum, sys._getframe())  # pylint: disable=protected-access  # outside the compiler: it acts
  finally:
    _bringing_back = outer


def compiling(frame) -> bool:
  """Whether `frame` (a stack of the main thread) is inside jax's compiler."""
  while frame is not None:
    if frame.f_code.co_filename.endswith(_COMPILER):
      return True
    frame = frame.f_back
  return False


def _main_compiling() -> bool:
  return compiling(sys._current_frames().get(threading.main_thread().ident))  # pylint: disable=protected-access


def _ours(signum: int) -> bool:
  return getattr(signal.getsignal(signum), 'tells_watcher', False)


def _name(signum: int) -> str:
  return 'SIGINT (Ctrl-C)' if signum == signal.SIGINT else signal.Signals(signum).name


def _acknowledge(signum: int, doing: str) -> None:
  then, kept = _then[-1]() if _then else ('it stops', '')
  name = _name(signum)
  _write(f'{name} received while {doing}: {then} once that returns. Another {name.split()[0]} stops at once'
         f'{kept}\n')


def _stop_at_once(signum: int) -> None:
  kept = _then[-1]()[1] if _then else ''
  _write(f'{_name(signum)} again: stopping at once{kept}\n')
  _die(signum)


# What runs before a signal ends the process (`_die`): `before_dying` adds to it.
_BEFORE_DYING: list[Callable[[], None]] = []


def before_dying(flush: Callable[[], None]) -> None:
  """Runs `flush` (quick, and safe from any thread) before a signal ends the process: `launch.stderr_filter`
  registers the flush of its filter process, so that what was written reaches the terminal first."""
  if flush not in _BEFORE_DYING:
    _BEFORE_DYING.append(flush)


def _write(text: str) -> None:
  try:  # os.write, not print: the main thread may be inside a print of its own (a reentrant write fails)
    os.write(2, text.encode())
  except OSError:
    pass


def _die(signum: int) -> None:
  """Ends the process as `signum` with no handler would (a shell sees a Ctrl-C), from any thread."""
  for flush in _BEFORE_DYING:  # e.g. the stderr filter: what was written reaches the terminal first
    flush()
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signum, None)  # SIG_DFL, beneath Python's handler
    os.kill(os.getpid(), signum)
    time.sleep(1.0)
  finally:
    os._exit(128 + signum)  # pylint: disable=protected-access  # where the signal could not end it


@dataclasses.dataclass
class _Arrival:
  signum: int
  number: int  # this signal's arrivals under this watcher, this one included
  at: float  # when its byte was read from the wakeup descriptor (by the watcher or a handler's run)
  look: float = 0.0  # when the watcher looks at it next

  def __post_init__(self):
    self.look = self.at + ACK_AFTER_S


class _Watcher:
  """The thread that reads the wakeup descriptor and brings deferred signals back; see the module docstring.

  Its state is shared with the handlers' runs in the main thread under `_lock`, reentrant: a handler may run in the
  main thread while that thread holds it."""

  def __init__(self, read_fd: int, write_fd: int, previous_int):
    self._read, self._write, self._previous_int = read_fd, write_fd, previous_int
    self._control_read, self._control_write = os.pipe()  # _STOP and _WAKE
    os.set_blocking(self._control_write, False)
    self._lock = threading.RLock()
    self._arrivals: list[_Arrival] = []  # signals whose handler has not run yet, in the order they came
    self._arrived = collections.Counter()  # signal -> its arrivals so far
    self._runs = collections.Counter()  # signal -> runs of its handler for new signals (not brought back)
    self._last_run: dict[int, float] = {}  # signal -> when its handler last ran for new signals
    self._acknowledged_at: float | None = None  # when the first acknowledgement was given
    self._deferred: list[int] = []  # signals waiting for the main thread to leave the compiler
    self._echoes = collections.Counter()  # wakeup bytes of the deferred signals brought back (no new signals)
    self._redelivered = collections.Counter()  # deferred signals brought back, not yet at their handler
    self._closed = False
    self._thread = threading.Thread(target=self._run, name='bert_jax signal watcher', daemon=True)

  @classmethod
  def start(cls) -> '_Watcher | None':
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C-level handler must never block
    os.set_blocking(read_fd, False)  # the watcher and the handlers' runs both read it, whoever comes first
    try:
      previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
      previous = None
    if previous != -1:  # not the main interpreter's main thread, or another part of the program reads it
      if previous is not None:
        signal.set_wakeup_fd(previous)
      os.close(read_fd)
      os.close(write_fd)
      return None
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
      signal.signal(signal.SIGINT, keyboard_interrupt)
    watcher = cls(read_fd, write_fd, previous_int)
    watcher._thread.start()  # pylint: disable=protected-access
    return watcher

  def stop(self) -> None:
    signal.set_wakeup_fd(-1)
    if signal.getsignal(signal.SIGINT) is keyboard_interrupt and self._previous_int is signal.default_int_handler:
      signal.signal(signal.SIGINT, signal.default_int_handler)
    self._control(_STOP)
    self._thread.join(timeout=1.0)
    with self._lock:
      self._closed = True  # a handler's run reads the descriptor no more
      os.close(self._write)
      os.close(self._control_write)
      if not self._thread.is_alive():
        os.close(self._read)
        os.close(self._control_read)

  def ran(self, signum: int) -> str:
    """A run of `signum`'s handler for new signals, starting now in the main thread: it handles every arrival of
    `signum` before it. What it says if it defers: _RECEIVED (the first acknowledgement), _AGAIN (one of its
    signals came after an acknowledgement) or _COVERED (its signals came before one)."""
    with self._lock:
      self._take()  # the bytes written before this run and not read yet: their signals are this run's
      self._runs[signum] += 1
      self._last_run[signum] = time.monotonic()
      ours = [a for a in self._arrivals if a.signum == signum and self._handled(a)]
      self._arrivals = [a for a in self._arrivals if a not in ours]
      others = bool(self._arrivals)
      if self._acknowledged_at is None:
        verdict = _RECEIVED
      else:
        verdict = _AGAIN if any(a.at > self._acknowledged_at for a in ours) else _COVERED
    if others:  # another signal's arrivals this run read: the watcher times them
      self._control(_WAKE)
    return verdict

  def acknowledge(self) -> None:
    """Notes an acknowledgement given now (a handler's run, or its line), unless one was given before."""
    with self._lock:
      if self._acknowledged_at is None:
        self._acknowledged_at = time.monotonic()

  def defer(self, signum: int) -> None:
    """Brings `signum` back to its handler once the main thread has left jax's compiler."""
    with self._lock:
      self._deferred.append(signum)
    self._control(_WAKE)

  def take_deferred(self) -> list[int]:
    """The deferred signals not brought back yet, which the caller brings back itself."""
    with self._lock:
      back, self._deferred = self._deferred, []
    return back

  def take_redelivered(self, signum: int) -> bool:
    """Whether a handler's run for `signum` is a deferred signal brought back (counted off)."""
    with self._lock:
      back = self._redelivered[signum] > 0
      self._redelivered[signum] -= back
    return back

  def _control(self, byte: bytes) -> None:
    try:
      os.write(self._control_write, byte)
    except OSError:  # closed, or full of bytes the thread has not read yet (one is enough)
      pass

  def _handled(self, arrival: _Arrival) -> bool:
    """Whether a handler's run came after `arrival` (read before the run), or as many runs as arrivals did (a run
    whose signal's byte the watcher read after it)."""
    return (self._last_run.get(arrival.signum, -1.0) >= arrival.at
            or self._runs[arrival.signum] >= arrival.number)

  def _take(self) -> None:
    """Reads the wakeup descriptor's bytes (under the lock): each a signal's arrival, or the echo of a deferred
    signal brought back."""
    while not self._closed:
      try:
        data = os.read(self._read, 512)
      except OSError:  # empty (BlockingIOError), or closed
        return
      if not data:
        return
      now = time.monotonic()
      for signum in data:
        if self._echoes[signum] > 0:
          self._echoes[signum] -= 1
        elif signum in _SIGNALS and _ours(signum):
          self._arrived[signum] += 1
          self._arrivals.append(_Arrival(signum, self._arrived[signum], now))

  def _run(self) -> None:
    while True:
      with self._lock:
        now = time.monotonic()
        deadlines = [a.look for a in self._arrivals] + ([now + _POLL_S] if self._deferred else [])
      timeout = max(0.0, min(deadlines) - now) if deadlines else None
      ready, _, _ = select.select([self._read, self._control_read], [], [], timeout)
      if self._control_read in ready and _STOP in os.read(self._control_read, 512):
        return
      if self._read in ready:
        with self._lock:
          self._take()
      self._bring_back()
      self._look()

  def _bring_back(self) -> None:
    """Deferred signals to their handlers again, once the main thread has left jax's compiler."""
    if not self._deferred or _main_compiling():
      return
    with self._lock:
      signums = [s for s in self._deferred if _ours(s)]  # a handler that is gone: nothing to bring it back to
      self._deferred = []
      for signum in signums:
        self._echoes[signum] += 1  # its byte on the wakeup descriptor is no new signal
        self._redelivered[signum] += 1
    for signum in signums:  # a signal of its own, to the main thread: it ends a sleep or a wait there, as the first
      signal.pthread_kill(threading.main_thread().ident, signum)

  def _look(self) -> None:
    """What the watcher does for the arrivals whose handler has not run ACK_AFTER_S after them: acknowledges the
    first (inside the compiler, or after BUSY_ACK_S), covers those before an acknowledgement, stops at once for one
    after it."""
    said, again = [], None
    with self._lock:
      still = []
      for arrival in self._arrivals:  # in the order they came
        now = time.monotonic()
        if self._handled(arrival):
          continue
        if now < arrival.look:
          still.append(arrival)
        elif self._acknowledged_at is not None:
          if arrival.at > self._acknowledged_at:
            again = again or arrival.signum
          # else covered by that acknowledgement: its handler acts once the main thread lets it
        elif _main_compiling():
          said.append((arrival.signum, 'jax compiles (XLA cannot be interrupted)'))
          self._acknowledged_at = now
        elif now - arrival.at >= BUSY_ACK_S:
          said.append((arrival.signum,
                       f'the main thread is inside a call Python cannot interrupt ({BUSY_ACK_S:g} s so far)'))
          self._acknowledged_at = now
        else:
          arrival.look = now + _POLL_S
          still.append(arrival)
      self._arrivals = still
    for signum, doing in said:
      _acknowledge(signum, doing)
    if again is not None:
      _stop_at_once(again)
