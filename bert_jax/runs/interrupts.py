"""SIGINT and SIGTERM while the main thread is inside XLA: acknowledged at once, acted on when XLA returns.

Python runs a signal's handler on the main thread, between bytecodes. Inside a call into XLA that thread runs no
bytecode; jax >= 0.10 waits for a compile in a loop that runs pending handlers every 200 ms
(`BlockUntilReadyWithCancel` in jaxlib), so a handler does run during a compile, but an exception it raises abandons
the compile while XLA goes on with it in the background: a process that then exits is killed by a segmentation
fault when that compile ends (measured with jax 0.10.2: exit -11 instead of its own code). A call that does not run
handlers delays them until it returns. Here, for the handlers of ours (`tells_watcher`):

- A handler that would raise asks `deferred(signum, frame)` first. Inside jax's compiler it says in one line that
  the signal is received, what happens once the compile returns and that another signal stops at once; the signal
  comes to the handler again when the main thread has left the compiler (sent to that thread again), and the
  handler then acts (a KeyboardInterrupt, Preempted).
- A watcher thread (`watching()`) learns of every signal at once through Python's wakeup file descriptor
  (`signal.set_wakeup_fd`: CPython's C-level handler writes the signal's number there, whichever thread the kernel
  interrupted, before any Python handler runs). A handler that has not run ACK_AFTER_S after its signal waits for
  the main thread: the watcher acknowledges it (at once inside jax's compiler, after BUSY_ACK_S in another call).
- A signal that comes after an acknowledgement (by a handler, a deferral or the watcher) and cannot be handled at
  once (inside the compiler, or not within ACK_AFTER_S) stops the process at once: one line, then it dies of that
  signal, as with no handler (a shell sees a Ctrl-C).
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

from bert_jax.runs import stderr_filter

# A handler that has not run this long after its signal is waiting for the main thread.
ACK_AFTER_S = 0.5
# The main thread inside a call into XLA other than a compile (a long step): its acknowledgement comes this late.
BUSY_ACK_S = 10.0
_POLL_S = 0.1  # how often the watcher looks again at a signal waiting for the main thread
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOP = 0  # the byte that ends the watcher thread (no signal has the number 0)
_WAKE = 255  # the byte that makes it look at its deferred signals (no signal has this number either)
# jax's compiler module: a main thread whose stack passes through it is compiling (or reading a compiled program).
_COMPILER = os.path.join('jax', '_src', 'compiler.py')

_handled = collections.Counter()  # signal number -> runs of handlers of ours (they run in the main thread)
_then: list[Callable[[], tuple[str, str]]] = []  # what follows a signal, innermost last (`watching`)
_watcher: '_Watcher | None' = None
_redelivery = False  # a handler of ours is running for a deferred signal brought back


def tells_watcher(handler):
  """Decorates a signal handler (a function or method taking (signum, frame)): it notes each run (a run is an
  acknowledgement), and the watcher acts for its signals."""
  @functools.wraps(handler)
  def noting(*args):
    global _redelivery  # pylint: disable=global-statement
    signum, watcher = args[-2], _watcher
    _redelivery = watcher is not None and watcher.take_redelivered(signum)
    _handled[signum] += not _redelivery
    try:
      return handler(*args)
    finally:
      _redelivery = False
      if watcher is not None:
        watcher.acknowledged = True
  noting.tells_watcher = True
  return noting


@tells_watcher
def keyboard_interrupt(signum, frame):
  """Python's default SIGINT handler (KeyboardInterrupt), once jax's compile in progress has returned."""
  if deferred(signum, frame):
    return
  raise KeyboardInterrupt


def deferred(signum: int, frame) -> bool:
  """Whether a handler called with (signum, frame) must return at once instead of acting: True while the main
  thread is inside jax's compiler, where raising would abandon the compile. The signal is then acknowledged in a
  line and comes to the handler again once the compile returns. A signal that comes after an acknowledgement stops
  the process there and then. False without an active `watching` (nothing could bring the signal back)."""
  watcher = _watcher
  if watcher is None or _redelivery or not compiling(frame):  # back from a deferral: act, wherever it is now
    return False
  say = watcher.claim(signum)
  if say == 'again':
    _stop_at_once(signum)
  if say == 'received':
    _acknowledge(signum, 'jax compiles (XLA cannot be interrupted)')
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
  for signum in signums:
    handler = signal.getsignal(signum)
    if callable(handler):
      handler(signum, sys._getframe())  # pylint: disable=protected-access  # outside the compiler: it acts


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


def _write(text: str) -> None:
  try:  # os.write, not print: the main thread may be inside a print of its own (a reentrant write fails)
    os.write(2, text.encode())
  except OSError:
    pass


def _die(signum: int) -> None:
  """Ends the process as `signum` with no handler would (a shell sees a Ctrl-C), from any thread."""
  stderr_filter.stop()
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
  number: int  # this signal's arrivals so far, this one included: handled once its handler runs as often
  at: float
  look: float = 0.0  # when the watcher looks at it next

  def __post_init__(self):
    self.look = self.at + ACK_AFTER_S


class _Watcher:
  """The thread that reads the wakeup descriptor and brings deferred signals back; see the module docstring."""

  def __init__(self, read_fd: int, write_fd: int, previous_int):
    self._read, self._write, self._previous_int = read_fd, write_fd, previous_int
    self._base = collections.Counter(_handled)  # handler runs before this watcher: not its signals'
    self._arrived = collections.Counter()
    self._lock = threading.Lock()
    self._deferred: list[int] = []  # signals waiting for the main thread to leave the compiler
    self._echoes = collections.Counter()  # wakeup bytes of the deferred signals brought back (no new signals)
    self._redelivered = collections.Counter()  # deferred signals brought back, not yet at their handler
    self.acknowledged = False  # a signal was acknowledged (by a handler of ours, a deferral or this thread)
    self._spoken: set[tuple[int, int]] = set()  # (signal, arrival number) that this thread acknowledged
    self._thread = threading.Thread(target=self._run, name='bert_jax signal watcher', daemon=True)

  @classmethod
  def start(cls) -> '_Watcher | None':
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C-level handler must never block
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
    try:
      os.write(self._write, bytes([_STOP]))
    except OSError:
      pass
    self._thread.join(timeout=1.0)
    os.close(self._write)
    if not self._thread.is_alive():
      os.close(self._read)

  def defer(self, signum: int) -> None:
    """Brings `signum` back to its handler once the main thread has left jax's compiler."""
    with self._lock:
      self._deferred.append(signum)
    try:
      os.write(self._write, bytes([_WAKE]))
    except OSError:
      pass

  def claim(self, signum: int) -> str | None:
    """What a handler running now for `signum` says: 'received' (its signal is the first: acknowledge it), 'again'
    (an earlier one was acknowledged: stop at once) or None (this thread acknowledged it, the handler being late)."""
    with self._lock:
      if (signum, self._handled(signum)) in self._spoken:
        return None
      if self.acknowledged:
        return 'again'
      self.acknowledged = True
      return 'received'

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

  def _handled(self, signum: int) -> int:
    return _handled[signum] - self._base[signum]

  def _run(self) -> None:
    pending: list[_Arrival] = []
    while True:
      now = time.monotonic()
      deadlines = [a.look for a in pending] + ([now + _POLL_S] if self._deferred else [])
      ready, _, _ = select.select([self._read], [], [], max(0.0, min(deadlines) - now) if deadlines else None)
      if ready:
        data = os.read(self._read, 512)
        if _STOP in data:
          return
        now = time.monotonic()
        for signum in data:
          with self._lock:
            echo = self._echoes[signum] > 0
            self._echoes[signum] -= echo
          if not echo and signum in _SIGNALS and _ours(signum):
            self._arrived[signum] += 1
            pending.append(_Arrival(signum, self._arrived[signum], now))
      self._bring_back()
      still = []
      for arrival in pending:  # in the order they came
        now = time.monotonic()
        if now < arrival.look:
          still.append(arrival)
        elif not self._act(arrival, now, waiting=bool(still)):
          arrival.look = now + _POLL_S
          still.append(arrival)
      pending = still

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

  def _act(self, arrival: _Arrival, now: float, waiting: bool) -> bool:
    """What the watcher does for `arrival` at `now` (`waiting`: an earlier signal's handler has not run either);
    False: look again later."""
    with self._lock:
      if self._handled(arrival.signum) >= arrival.number:
        return True
      again = self.acknowledged or waiting
      doing = None
      if not again:
        if _main_compiling():
          doing = 'jax compiles (XLA cannot be interrupted)'
        elif now - arrival.at >= BUSY_ACK_S:
          doing = f'the main thread is inside a call Python cannot interrupt ({BUSY_ACK_S:g} s so far)'
        else:
          return False
        self._spoken.add((arrival.signum, arrival.number))
        self.acknowledged = True
    if again:
      _stop_at_once(arrival.signum)
    _acknowledge(arrival.signum, doing)
    return True
