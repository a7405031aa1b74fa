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
one dies (an abort's last message, a kill): it forwards what is left and ends when the last writer closes the pipe.
`stop` points descriptor 2 back and waits for the filter to finish. BERT_JAX_RAW_STDERR=1 leaves stderr alone.

This file is also the filter's program (`python3 -I -S stderr_filter.py`): it imports nothing but the standard
library.
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

  Complete lines go out as they come; the lines of an alarm record are held until the record is complete (its second
  separator) or another record starts, and a line without its newline yet (a prompt, or a write cut in two) until
  its newline comes. `flush` gives what is held (the filter calls it after IDLE_S without new bytes).
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


def _serve(source: int = 0, dest: int = 1) -> None:
  """The filter process: `source` to `dest` through a BannerFilter until every writer has closed `source`."""
  for sig in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C or a job's SIGTERM reaches the whole process group: the
    signal.signal(sig, signal.SIG_IGN)  # filter lives on until its writers end, and forwards what they wrote last
  banners, writable = BannerFilter(), True
  while True:
    ready, _, _ = select.select([source], [], [], IDLE_S if banners.holding else None)
    data = os.read(source, 1 << 16) if ready else b''
    out = banners.feed(data) if data else banners.flush()
    while out and writable:
      try:
        out = out[os.write(dest, out):]
      except InterruptedError:
        continue
      except OSError:  # stderr closed: read on and drop, so that the writers never block on a full pipe
        writable = False
    if ready and not data:
      return


_active: tuple[int, subprocess.Popen] | None = None  # (the descriptor 2 this process was given, the filter)


def start() -> bool:
  """Routes this process's file descriptor 2 (and that of the processes it starts) through a filter process;
  False where it is not (BERT_JAX_RAW_STDERR=1, no descriptor 2, not POSIX, already done, the filter failed to
  start)."""
  global _active  # pylint: disable=global-statement
  if _active or os.environ.get('BERT_JAX_RAW_STDERR') == '1' or os.name != 'posix':
    return False
  try:
    os.fstat(2)
  except OSError:
    return False
  read_fd, write_fd = os.pipe()
  given = os.dup(2)
  try:
    proc = subprocess.Popen([sys.executable, '-I', '-S', os.path.abspath(__file__)], stdin=read_fd, stdout=given,
                            stderr=given)
  except OSError:
    for fd in (read_fd, write_fd, given):
      os.close(fd)
    return False
  os.close(read_fd)
  _flush_streams()
  os.dup2(write_fd, 2)
  os.close(write_fd)
  _active = (given, proc)
  atexit.register(stop)
  return True


def stop(timeout_s: float = 1.0) -> None:
  """Points file descriptor 2 back where it was given and waits (at most `timeout_s`; the processes this one
  started may still hold the filter's pipe) for the filter to write what it was sent."""
  global _active  # pylint: disable=global-statement
  if not _active:
    return
  given, proc = _active
  _active = None
  _flush_streams()
  os.dup2(given, 2)
  os.close(given)
  try:
    proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    pass


def _flush_streams() -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      if stream is not None:
        stream.flush()
    except (OSError, ValueError):
      pass


if __name__ == '__main__':
  _serve()
