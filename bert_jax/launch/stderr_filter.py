"""XLA's "Very slow compile?" banner on stderr replaced by one line; every other byte passes as written, in order.

XLA's slow-compilation alarm (xla/service/slow_operation_alarm.cc, armed around the backend of every CPU and GPU
compile) logs at ERROR level two minutes into a compile, and again when that compile ends:

  E1207 10:15:35.478499   13690 slow_operation_alarm.cc:73]
  ********************************
  [Compiling module jit_f for CPU] Very slow compile? If you want to file a bug, run with envvar XLA_FLAGS=...
  ********************************

(the second record starts '... slow_operation_alarm.cc:140] The operation took 6m8.1s', then an empty line). On a
busy machine a compile takes that long without anything being wrong, and the banner reads as a request to file a
bug. No flag or environment variable turns it off: the two minutes are a constant of XLA's optimised build, and the
switches that hide it (TF_CPP_MIN_LOG_LEVEL=3, absl's minimum log level) hide every error XLA logs. So `start` puts
a filter process between the process's file descriptor 2 and where it pointed: a record of slow_operation_alarm.cc
holding the banner becomes one line (`replacement`); everything else goes through unchanged, other records of that
file (constant folding taking long) included. The filter is a process of its own so that nothing is lost when this
one dies (an abort's last message, a kill): it forwards what is left and ends when the last writer closes its end.
It runs in a process group of its own: a terminal's Ctrl-C or Ctrl-\\ (sent to the foreground group) never reaches
it. `stop` points descriptor 2 back once the filter has written what this process sent (the processes it started
may still write through the filter). BERT_JAX_RAW_STDERR=1 leaves stderr alone.

What a user sees stays what was written:
- A line without its newline yet (a progress bar redrawn after '\\r', a prompt) goes out at once, unless it could
  still become the header of an alarm record (a prefix of absl's 'E1207 10:15:35.478499   13690
  slow_operation_alarm.cc:73]' or of TSL's '2025-03-19 07:30:02.045318: E .../slow_operation_alarm.cc:73]'): such
  text is held until its line is complete, or IDLE_S passes without new bytes.
- Where descriptor 2 is a terminal, the process writes to a pseudo-terminal in raw mode (no newline translation;
  the real terminal translates as it would) with the terminal's window size, so that isatty(2) stays true: colours,
  progress bars and prompts that libraries show on a terminal only are still shown. The trade-offs: a window
  resized later is not seen through it (its size is the one at start), terminal settings changed through
  descriptor 2 change the pseudo-terminal's, not the terminal's, and, as through a pipe, a line to stderr and one to
  stdout written moments apart may appear in the other order (the filter passes each on within milliseconds).
  Where no pseudo-terminal can be opened, stderr is left alone.

This file is also the filter's program (`python3 -I -S stderr_filter.py CONTROL_FD REPLY_FD`): it imports nothing
but the standard library.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import subprocess
import sys

# The header of a log record of the alarm's file, in absl's format ('E1207 10:15:35.478499   13690
# slow_operation_alarm.cc:73] ') and TSL's older one ('2025-03-19 07:30:02.045318: E external/xla/xla/service/...').
_ALARM_HEADER = re.compile(rb'slow_operation_alarm\.cc:\d+\] ?(.*)$')
_SEPARATOR = b'*' * 32
_BANNER = b'Very slow compile?'
_MODULE = re.compile(rb'Compiling module (\S+?)\]?(?:\s|$)')
_TOOK = re.compile(rb'The operation took (\S+)')
_RECORD_LINES = 6  # a banner record's lines at most (header, an empty line, separator, text, separator)
IDLE_S = 0.5  # a record still incomplete after this long without new bytes goes through as it is


def _prefixes(atoms: list[bytes]) -> re.Pattern:
  """A pattern whose full matches are the prefixes of the texts `atoms` (regular expressions, one after another)
  match, where any prefix of an atom's match is a match of that atom (a character, '\\d+', ' +')."""
  pattern = b''
  for atom in reversed(atoms):
    pattern = b'(?:' + atom + pattern + b')?'
  return re.compile(pattern)


_TIME = [rb'\d', rb'\d', b':', rb'\d', rb'\d', b':', rb'\d', rb'\d', rb'\.'] + [rb'\d'] * 6
_ABSL_STAMP = [rb'[IWEF]'] + [rb'\d'] * 4 + [b' '] + _TIME + [b' +', rb'\d+', b' ']  # 'E1207 10:15:35.478499   13690 '
_TSL_STAMP = [rb'\d'] * 4 + [b'-', rb'\d', rb'\d', b'-', rb'\d', rb'\d', b' '] + _TIME + [b':', b' ', rb'[IWEF]', b' ']
_FILE = [re.escape(bytes([c])) for c in b'slow_operation_alarm.cc:'] + [rb'\d+', rb'\]']
# Texts that could still become an alarm record's header line: absl names the file alone, TSL its path as built
# ('external/xla/xla/service/slow_operation_alarm.cc'), so after TSL's stamp any path could follow.
_HEADER_STARTS = (_prefixes(_ABSL_STAMP + _FILE), _prefixes(_TSL_STAMP + [rb'[^\s\]]*']))
_HEADERS = (re.compile(b''.join(_ABSL_STAMP + _FILE)),
            re.compile(b''.join(_TSL_STAMP) + rb'\S*slow_operation_alarm\.cc:\d+\]'))


def could_start_alarm(text: bytes) -> bool:
  """Whether a line that starts with `text` could be the header line of one of the alarm's records."""
  return any(p.fullmatch(text) for p in _HEADER_STARTS) or any(h.match(text) for h in _HEADERS)


def _duration(text: str) -> str:
  """absl's duration ('6m8.125s', '1h2m3s', '850ms') as '6m08s' (whole seconds)."""
  parts = dict((unit, float(value)) for value, unit in re.findall(r'([\d.]+)(h|ms|m|s)', text))
  seconds = int(parts.get('h', 0) * 3600 + parts.get('m', 0) * 60 + parts.get('s', 0) + parts.get('ms', 0) / 1000)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else f'{m}m{s:02d}s' if m else f'{s}s'


def replacement(record: bytes) -> bytes | None:
  """The line that replaces an alarm `record` (its lines, as written), or None when it is no slow-compile banner."""
  if _BANNER not in record:
    return None
  module = _MODULE.search(record)
  name = module.group(1).decode('utf-8', 'replace') if module else 'a program'
  took = _TOOK.search(record)
  if took:
    return f'XLA compiled {name} in {_duration(took.group(1).decode("ascii", "replace"))}\n'.encode()
  return (f'XLA is still compiling {name} after 2 minutes: compiling is slow on a busy machine (XLA logs this as '
          'an error; it is not one)\n').encode()


class BannerFilter:
  """Bytes in, the same bytes out but for slow-compile banners, each replaced by its line (`replacement`).

  Complete lines go out as they come, and so does a line without its newline yet (a progress bar, a prompt) unless
  it could still become an alarm record's header (`could_start_alarm`: a write cut in two); the lines of an alarm
  record are held until the record is complete (its second separator) or another record starts. `flush` gives what
  is held (the filter calls it after IDLE_S without new bytes).
  """

  def __init__(self):
    self._partial = b''  # the start of a line
    self._record: list[bytes] | None = None  # an alarm record's lines so far
    self._separators = 0

  @property
  def holding(self) -> bool:
    return self._record is not None or bool(self._partial)

  def feed(self, data: bytes) -> bytes:
    lines = (self._partial + data).split(b'\n')
    partial, self._partial = lines.pop(), b''
    out = b''.join(self._line(line + b'\n') for line in lines)
    if self._record is None and not could_start_alarm(partial):
      return out + partial  # the rest of its line follows it as a line of its own
    self._partial = partial
    return out

  def flush(self) -> bytes:
    """Whatever is held, as it was written."""
    out = b''.join(self._record or []) + self._partial
    self._record, self._partial, self._separators = None, b'', 0
    return out

  def _line(self, line: bytes) -> bytes:
    header = _ALARM_HEADER.search(line.rstrip(b'\n'))
    # A banner's record: nothing after the header (the alarm fired), or the time the compile took (it ended).
    if header and (not header.group(1).strip() or header.group(1).startswith(b'The operation took')):
      held = self.flush()  # an unfinished record before it: as it was
      self._record = [line]
      return held
    if self._record is None:
      return line
    self._record.append(line)
    self._separators += line.strip() == _SEPARATOR
    if self._separators < 2 and len(self._record) < _RECORD_LINES:
      return b''
    record = b''.join(self._record)
    self._record, self._separators = None, 0
    return replacement(record) or record


def _serve(source: int = 0, dest: int = 1, control: int | None = None, reply: int | None = None) -> None:
  """The filter process: `source` to `dest` through a BannerFilter until every writer has closed `source`. A byte on
  `control` asks for what `source` holds now, and what the filter holds, to be written out, then one byte on
  `reply` (`stop`)."""
  # Ctrl-C and Ctrl-\ go to the terminal's foreground group, which the filter is not in; a job's SIGTERM may reach it
  # still: it lives on until its writers end, and forwards what they wrote last. Where the terminal stops background
  # writers (stty tostop), it writes on.
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGTTOU):
    signal.signal(sig, signal.SIG_IGN)
  os.set_blocking(source, False)  # a request for what the source holds reads it until it is empty
  banners, writable = BannerFilter(), True
  watched = [source] + ([control] if control is not None else [])

  def write(out: bytes) -> None:
    nonlocal writable
    while out and writable:
      try:
        out = out[os.write(dest, out):]
      except InterruptedError:
        continue
      except OSError:  # stderr closed: read on and drop, so that the writers never block on a full pipe
        writable = False

  def read_all(once: bool) -> bool:
    """Forwards what `source` holds (`once`: one read's worth); False once every writer has closed it."""
    while True:
      try:
        data = os.read(source, 1 << 16)
      except BlockingIOError:
        return True
      except OSError:  # EIO: a pseudo-terminal whose last writer closed it
        data = b''
      if not data:
        write(banners.flush())
        return False
      write(banners.feed(data))
      if once:
        return True

  while True:
    ready, _, _ = select.select(watched, [], [], IDLE_S if banners.holding else None)
    requested = control is not None and control in ready
    if requested and not os.read(control, 64):  # the process that could ask is gone
      watched.remove(control)
      requested = False
    if not ready:
      write(banners.flush())
    elif (source in ready or requested) and not read_all(once=not requested):
      return
    if requested:
      write(banners.flush())
      try:
        os.write(reply, b'.')
      except OSError:
        pass


class _Filter:
  """A running filter: the descriptor 2 this process was given, the filter process, and the pipes to ask it for what
  it was sent (`_serve`)."""

  def __init__(self, given: int, proc: subprocess.Popen, control: int, reply: int):
    self.given, self.proc, self.control, self.reply = given, proc, control, reply


_active: _Filter | None = None


def start() -> bool:
  """Routes this process's file descriptor 2 (and that of the processes it starts) through a filter process (a
  pseudo-terminal where descriptor 2 is a terminal); False where it is not (BERT_JAX_RAW_STDERR=1, no descriptor 2,
  not POSIX, already done, the filter or its pseudo-terminal failed to start)."""
  global _active  # pylint: disable=global-statement
  if _active or os.environ.get('BERT_JAX_RAW_STDERR') == '1' or os.name != 'posix':
    return False
  try:
    os.fstat(2)
  except OSError:
    return False
  try:
    read_fd, write_fd = _terminal() if os.isatty(2) else os.pipe()
  except OSError:
    return False
  control_read, control_write = os.pipe()
  reply_read, reply_write = os.pipe()
  given = os.dup(2)
  try:
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, '-I', '-S', os.path.abspath(__file__), str(control_read), str(reply_write)], stdin=read_fd,
        stdout=given, stderr=given, pass_fds=(control_read, reply_write), process_group=0)
  except OSError:
    proc = None
  for fd in (read_fd, control_read, reply_write):
    os.close(fd)
  if proc is None:
    for fd in (write_fd, control_write, reply_read, given):
      os.close(fd)
    return False
  os.set_blocking(control_write, False)
  _flush_streams()
  os.dup2(write_fd, 2)
  os.close(write_fd)
  _active = _Filter(given, proc, control_write, reply_read)
  atexit.register(stop)
  # Imported here: the filter process runs this file alone (python -I -S), without bert_jax.
  from bert_jax.runs import interrupts  # pylint: disable=g-import-not-at-top
  interrupts.before_dying(_stop_quickly)
  return True


def _stop_quickly() -> None:
  stop(wait_s=0.2)  # a signal ends the process: what was written reaches the terminal, unless that takes long


def _terminal() -> tuple[int, int]:
  """A pseudo-terminal (its reading end, its writing end) in raw mode with the window size of descriptor 2's."""
  import fcntl  # pylint: disable=g-import-not-at-top  # not in the filter's program
  import termios  # pylint: disable=g-import-not-at-top
  import tty  # pylint: disable=g-import-not-at-top
  master, slave = os.openpty()
  try:
    tty.setraw(slave)  # bytes pass as written: the terminal behind the filter translates newlines itself
    fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(2, termios.TIOCGWINSZ, b'\0' * 8))
  except (OSError, termios.error):
    os.close(master)
    os.close(slave)
    raise OSError('the pseudo-terminal cannot be set up') from None
  return master, slave


def stop(wait_s: float = 1.0) -> None:
  """Points file descriptor 2 back where it was given once the filter has written what this process sent it (at
  most `wait_s`: the filter is stuck where its output is, e.g. a terminal paused with Ctrl-S). The processes this one
  started may still write through the filter: it lives on until they end, and is not waited for."""
  global _active  # pylint: disable=global-statement
  if not _active:
    return
  active, _active = _active, None
  _flush_streams()
  os.dup2(active.given, 2)  # this process's next writes go where stderr was given
  os.close(active.given)
  try:
    os.write(active.control, b'.')  # after every byte this process wrote through the filter
    if select.select([active.reply], [], [], wait_s)[0]:
      os.read(active.reply, 64)
  except OSError:  # the filter is gone
    pass
  for fd in (active.control, active.reply):
    os.close(fd)
  active.proc.poll()


def _flush_streams() -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      if stream is not None:
        stream.flush()
    except (OSError, ValueError):
      pass


if __name__ == '__main__':
  if len(sys.argv) == 3:
    _serve(control=int(sys.argv[1]), reply=int(sys.argv[2]))
  else:
    _serve()
