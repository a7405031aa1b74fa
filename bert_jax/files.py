"""Files: atomic writes, input paths that are regular files, and lock files.

Atomic writes: a reader (or a resumed run) sees the old file or the new one, never half of one.
Inputs: a FIFO, device or socket passes `os.path.exists` (and epath's is_file) but blocks a
read forever or never ends, so every path a user gives is checked with `check_regular` first.
Remote paths: gs:// and s3:// go through fsspec (etils.epath, Orbax); `bert_jax.object_stores` checks them before any
work (the package installed, the bucket reachable) and says whether one can be written. `writable(path)` is the one
answer to whether a path can be written, local (its nearest existing ancestor is a writable directory) or remote.
The one I/O layer: nothing else in bert_jax calls `open()` or asks os.path about a file (tests/test_io_layer.py).
`open`, `exists`, `isdir`, `isfile`, `getsize`, `listdir`, `makedirs`, `remove` take a local path (the os module, as
before) or a remote one (gs://, s3://: etils.epath). `open` undoes a compression named by the path's suffix (.gz,
.bz2, .xz: `COMPRESSIONS`) on read and applies it on write, so every file a user gives may be compressed, local or
remote. `read_json` is the one reader of a JSON file that must hold an object (or a list), in one line when it
cannot. An object store has no rename and no append: remote atomic writes write the object once (GCS and S3 publish
an object whole when it is closed), and `open(path, 'a')` rewrites the object whole at most every REMOTE_FLUSH_S
seconds and on close; `copy_file` copies bytes between the two kinds.
Locks: `Lock` is a file naming its holder (host, pid and the pid's start time), so a lock left
by a process that no longer exists on this host is recognised and taken over. On a remote workdir the lock is
written when absent, which two runs starting in the same second could both do (an object store has no
exclusive create through fsspec).
"""

from __future__ import annotations

import builtins
import bz2
import datetime
import gzip
import io
import json
import lzma
import os
import socket
import stat
import sys
import time
from typing import Any, BinaryIO, Callable
import zlib

from bert_jax.errors import BertJaxError, ConfigError, DataError

# How a failed write reads in library errors that carry no errno (tensorstore reports ENOSPC as ValueError).
WRITE_FAILURES = ('No space left on device', 'Disk quota exceeded', 'Read-only file system')


# The gs:// and s3:// side (which package each needs, probes of buckets, remote writability): object_stores; the
# names its callers know from here stay here.
from bert_jax import object_stores
from bert_jax.object_stores import (  # pylint: disable=g-bad-import-order,unused-import
    check_reachable,
    check_remote,
    filesystem as _fs,
    gpath as _gpath,
    is_remote,
    refusal,
)


def _nearest_existing(path: str) -> str:
  """`path` made absolute, or its nearest ancestor that exists."""
  nearest = os.path.abspath(path)
  while not os.path.exists(nearest):
    nearest = os.path.dirname(nearest)
  return nearest


def writable(path: str, kind: str = 'directory', what: str = 'path') -> bool:
  """Whether `path` (a `kind`: 'directory' or 'file', existing or to be created) can be written.

  Local: it, or its nearest existing ancestor, is a directory this process may write in (an existing file: one it
  may write). Remote: `object_stores.writable` (the credentials in use may create and replace objects there).
  """
  if is_remote(path):
    return object_stores.writable(path, kind, what)
  nearest = _nearest_existing(path)
  if os.path.isdir(nearest):
    return os.access(nearest, os.W_OK | os.X_OK)
  return nearest == os.path.abspath(path) and os.access(nearest, os.W_OK)


def exists(path: str) -> bool:
  return _gpath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gpath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _gpath(path).is_file() if is_remote(path) else os.path.isfile(path)


def getsize(path: str) -> int:
  """The size of file `path` in bytes (its stored, compressed size); OSError when it is none."""
  if not is_remote(path):
    return os.path.getsize(path)
  size = _gpath(path).stat().length
  if size is None:
    raise FileNotFoundError(path)
  return size


def getmtime(path: str) -> float:
  """When file `path` was last written, in seconds since the epoch (a remote object: when it was written, to the
  second); OSError when it is none."""
  return _gpath(path).stat().mtime if is_remote(path) else os.path.getmtime(path)


def listdir(path: str) -> list[str]:
  """The names in directory `path` (FileNotFoundError when it is none)."""
  if not is_remote(path):
    return os.listdir(path)
  if not isdir(path):
    raise FileNotFoundError(path)
  return [p.name for p in _gpath(path).iterdir()]


def copy_file(source: str, target: str) -> None:
  """Copies file `source` to `target`, either of them local or remote (small files: read whole), byte for byte
  (a compressed file stays compressed)."""
  with open(source, 'rb', compression='') as f:
    data = f.read()
  with open(target, 'wb', compression='') as out:
    out.write(data)


def move_tree(source: str, target: str) -> None:
  """Moves directory `source` to `target` on one object store: copies every object, then deletes the source (what
a rename is on GCS and S3)."""
  fs = _fs(source)
  fs.copy(source, target, recursive=True)
  fs.rm(source, recursive=True)


def makedirs(path: str) -> None:
  if is_remote(path):
    _gpath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  """Deletes file `path` (FileNotFoundError when absent)."""
  if is_remote(path):
    if not isfile(path):
      raise FileNotFoundError(path)
    _gpath(path).unlink()
  else:
    os.remove(path)


def rmdir(path: str) -> None:
  """Removes empty directory `path` (OSError when not empty); on an object store a directory with nothing in it
  does not exist, so there is nothing to remove."""
  if not is_remote(path):
    os.rmdir(path)


# How often an object rewritten whole (an appended text file, TensorBoard's events) is written at most: a bucket
# takes about one write per second to one object, and each write sends the whole object.
REMOTE_FLUSH_S = 30.0


class _RemoteAppend(io.StringIO):
  """A text file opened for appending on an object store: the old text, and the object rewritten whole with what
  was written since, on a flush at most every REMOTE_FLUSH_S seconds and on close (a process killed with -9 loses
  the lines of its last interval; a local file loses none)."""

  def __init__(self, path: str):
    super().__init__()
    self._path = _gpath(path)
    self._old = self._path.read_bytes().decode('utf-8', 'replace') if self._path.is_file() else ''
    self._written = float('-inf')

  def flush(self, force: bool = False) -> None:
    super().flush()
    if not self.closed and (force or time.monotonic() - self._written >= REMOTE_FLUSH_S):
      self._path.write_text(self._old + self.getvalue(), encoding='utf-8')
      self._written = time.monotonic()

  def close(self) -> None:
    if not self.closed:
      self.flush(force=True)
    super().close()


# A file's compression, named by the suffix of its path: what `open` undoes on read and applies on write.
COMPRESSIONS = {'.gz': 'gzip', '.bz2': 'bz2', '.xz': 'xz'}
# A compressed stream's first bytes (corpus files are recognised by them, whatever their names).
COMPRESSION_MAGIC = ((b'\x1f\x8b', 'gzip'), (b'BZh', 'bz2'), (b'\xfd7zXZ\x00', 'xz'))
_CODECS = {'gzip': lambda raw, mode: gzip.GzipFile(fileobj=raw, mode=mode),
           'bz2': lambda raw, mode: bz2.BZ2File(raw, mode=mode),
           'xz': lambda raw, mode: lzma.LZMAFile(raw, mode=mode)}
# What a damaged compressed stream raises (gzip and bz2 also a plain OSError without an errno).
_DAMAGED = (EOFError, zlib.error, lzma.LZMAError)


def compression_of(path: str) -> str:
  """'gzip', 'bz2' or 'xz' when `path` ends in .gz, .bz2 or .xz (`COMPRESSIONS`), else ''."""
  return COMPRESSIONS.get(os.path.splitext(str(path))[1].lower(), '')


def without_compression(path: str) -> str:
  """`path` without its compression suffix ('train.csv.gz' -> 'train.csv'): the name its format is read from."""
  path = str(path)
  return os.path.splitext(path)[0] if compression_of(path) else path


def decompressed(path: str, raw: BinaryIO, kind: str) -> BinaryIO:
  """The bytes of `raw` decompressed as `kind` ('gzip', 'bz2', 'xz'; '': `raw` itself). Closing the result leaves
  `raw` open."""
  if not kind:
    return raw
  if kind not in _CODECS:
    raise ConfigError(f'{path}: unknown compression {kind!r}; expected one of {", ".join(_CODECS)}')
  return _CODECS[kind](raw, 'rb')


def _one_line(error: BaseException) -> str:
  return ' '.join(str(error).split()) or type(error).__name__


class _Compressed(io.RawIOBase):
  """The uncompressed bytes of a file opened as `raw`: read (damaged data: one DataError naming the file) or
  written. Closing it finishes the compressed stream and closes `raw`."""

  def __init__(self, path: str, raw: BinaryIO, kind: str, mode: str):
    super().__init__()
    self._path, self._raw, self._kind, self._mode = path, raw, kind, mode
    self._codec = _CODECS[kind](raw, mode)

  def readable(self) -> bool:
    return self._mode == 'rb'

  def writable(self) -> bool:
    return self._mode != 'rb'

  def readinto(self, buffer) -> int:
    try:
      data = self._codec.read(len(buffer))
    except _DAMAGED as e:
      raise DataError(f'{self._path}: corrupt {self._kind} data ({_one_line(e)})') from None
    except OSError as e:
      if e.errno is not None:  # the file's own read failed
        raise
      raise DataError(f'{self._path}: corrupt {self._kind} data ({_one_line(e)})') from None
    buffer[:len(data)] = data
    return len(data)

  def write(self, data) -> int:
    return self._codec.write(data)

  def close(self) -> None:
    if not self.closed:
      try:
        self._codec.close()
      finally:
        self._raw.close()
    super().close()


def open(path: str, mode: str = 'r', *, compression: str | None = None,  # pylint: disable=redefined-builtin
         **kwargs: Any):
  """`open(path, mode, ...)` of a local or remote (gs://, s3://) file, compressed or not.

  Args:
    path: a local path or a remote one.
    mode: 'r', 'w', 'a' or 'x', with 'b' for bytes ('a' on a remote file: the object rewritten whole,
      `_RemoteAppend`).
    compression: 'gzip', 'bz2', 'xz' or '' (none); None: from the path's suffix (`COMPRESSIONS`). A compressed
      file is decompressed as it is read (damaged data: a DataError naming the file) and compressed as it is
      written (appending adds a compressed stream, which readers join; not on a remote file).
    **kwargs: what open() takes: encoding (a remote or compressed text file: UTF-8 unless given), errors,
      newline, ...

  Returns:
    A file object: text, or bytes for a 'b' mode.
  """
  path = str(path)
  kind = compression_of(path) if compression is None else compression
  if not kind:
    return _open(path, mode, **kwargs)
  if kind not in _CODECS:
    raise ConfigError(f'{path}: unknown compression {kind!r}; expected one of {", ".join(_CODECS)}')
  base = mode.replace('b', '').replace('t', '')
  if base not in ('r', 'w', 'a', 'x'):
    raise ValueError(f'mode {mode!r} of a compressed file {path}: read, write or append it')
  if base == 'a' and is_remote(path):
    raise ValueError(f'{path}: a compressed object cannot be appended to')
  stream = _Compressed(path, _open(path, base + 'b'), kind, 'rb' if base == 'r' else 'wb')
  buffered = io.BufferedReader(stream) if base == 'r' else io.BufferedWriter(stream)
  if 'b' in mode:
    return buffered
  return io.TextIOWrapper(buffered, encoding=kwargs.get('encoding') or 'utf-8', errors=kwargs.get('errors'),
                          newline=kwargs.get('newline'))


def _open(path: str, mode: str, **kwargs: Any):
  """open() of a local file, or its remote counterpart (a text file read through one decoder, as a local one)."""
  if not is_remote(path):
    return builtins.open(path, mode, **kwargs)  # pylint: disable=unspecified-encoding  # the caller's encoding
  if mode == 'a':
    return _RemoteAppend(path)
  if mode in ('r', 'rt'):  # epath's text files take no errors= or newline=: the decoder is ours
    return io.TextIOWrapper(_gpath(path).open('rb'), encoding=kwargs.get('encoding') or 'utf-8',
                            errors=kwargs.get('errors'), newline=kwargs.get('newline'))
  kwargs.pop('newline', None)
  return _gpath(path).open(mode, **kwargs)


def read_json(path: str, what: str = '', kind: type = dict, error: type[BertJaxError] = DataError,
              missing: str | None = None) -> Any:
  """The JSON value of file `path` (local or remote, compressed or not), which must be a `kind` (dict: an object;
  list; object: any value).

  Raises:
    `error` (DataError unless given) in one line naming `what` and the file: it does not exist (`missing`, when
    given, is the whole message), is a FIFO or device, cannot be read, is not UTF-8 JSON, or holds another kind of
    value.
  """
  name = f'{what} {path}' if what else str(path)
  check_regular(path, what or 'JSON file')
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except FileNotFoundError:
    raise error(missing or f'{name} does not exist') from None
  except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
    raise error(f'{name} is not valid JSON ({e})') from None
  except OSError as e:
    raise error(f'{name} cannot be read ({e.strerror or _one_line(e)})') from None
  if kind is not object and not isinstance(value, kind):
    wanted = {dict: 'an object', list: 'a list'}.get(kind, f'a {kind.__name__}')
    raise error(f'{name} holds a JSON {type(value).__name__}, not {wanted}')
  return value


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through `path.tmp` and os.replace, creating the directory (a remote object is
  written once: the store publishes it whole)."""
  if is_remote(path):
    makedirs(os.path.dirname(path))
    _gpath(path).write_text(text, encoding='utf-8')
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with builtins.open(tmp, 'w', encoding='utf-8', newline='') as f:
    f.write(text)
  os.replace(tmp, path)


def write_bytes_atomic(path: str, data: bytes, *, compress: bool = False) -> None:
  """Writes `data` to `path` through `path.tmp` and os.replace, creating the directory (a remote object is written
  once: the store publishes it whole); with `compress`, compressed as the path's suffix names (`COMPRESSIONS`)."""
  kind = compression_of(path) if compress else ''
  if is_remote(path):
    makedirs(os.path.dirname(path))
    with open(path, 'wb', compression=kind) as f:
      f.write(data)
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'wb', compression=kind) as f:
    f.write(data)
  os.replace(tmp, path)


def write_json_atomic(path: str, obj: Any, **dump_kwargs: Any) -> None:
  """Writes `obj` as indented JSON to `path` atomically."""
  write_text_atomic(path, json.dumps(obj, indent=2, **dump_kwargs))


def check_output(path: str, kind: str, what: str = 'output') -> None:
  """Checks, before any work, that `path` can be written as a `kind` ('file' or 'directory').

  ConfigError when it exists as the other kind, or cannot be written (`writable`): its nearest existing parent
  is not a writable directory, or a remote path's store or bucket cannot be used, or refuses the credentials in
  use a write where it is (a file: in its directory).
  """
  if is_remote(path):
    check_reachable(path, what)
    if object_stores.read_confirmed(path) and (kind == 'file' and isdir(path) or kind == 'directory' and isfile(path)):
      raise ConfigError(f'{what} {path} is a {"directory" if kind == "file" else "file"}; give a {kind} path')
    if not writable(path, kind, what):
      raise ConfigError(f'{what} {path} cannot be written: {object_stores.not_writable(path, kind)}')
    return
  if kind == 'file' and os.path.isdir(path):
    raise ConfigError(f'{what} {path} is a directory; give a file path')
  if kind == 'directory' and os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'{what} {path} is a file; give a directory')
  parent = _nearest_existing(path if kind == 'directory' else os.path.dirname(os.path.abspath(path)))
  if not os.path.isdir(parent):
    raise ConfigError(f'{what} {path} cannot be created: {parent} is a file')
  if not writable(parent):
    raise ConfigError(f'{what} {path} cannot be written: {parent} is not writable')


def _file_kind(mode: int) -> str:
  for test, name in ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO (named pipe)'),
                     (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
                     (stat.S_ISSOCK, 'a socket')):
    if test(mode):
      return name
  return 'not a regular file'


def check_regular(path: str, what: str) -> None:
  """DataError when `path` exists but is not a regular file, before anything opens it.

  Missing paths are left to the caller's own message; remote paths (gs://...) are not checked.
  Symbolic links are followed: a link to a FIFO is refused too.
  """
  if '://' in str(path):
    return
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return
  if not stat.S_ISREG(mode):
    raise DataError(f'{what} {path} is {_file_kind(mode)}, not a regular file: give a file of text or data '
                    '(a pipe or device would block or never end)')


def not_utf8(path: str, what: str = '') -> DataError:
  """The error for a text file that does not decode as UTF-8: `what path:LINE:COLUMN` (1-based; the column in
  characters) of its first undecodable byte, as every other error in a data file names its line. A decoder's own
  byte position counts from the start of the buffer it was given, not of the file."""
  name = f'{what} {path}' if what else path
  with open(path, 'rb') as f:
    for line, raw in enumerate(f, 1):  # '\n' never occurs inside a UTF-8 sequence: each line decodes alone
      try:
        raw.decode('utf-8')
      except UnicodeDecodeError as e:
        before = raw[:e.start].decode('utf-8')
        column = len(before.removeprefix('\ufeff') if line == 1 else before) + 1  # a byte order mark is no text
        return DataError(f'{name}:{line}:{column}: not UTF-8 text (byte 0x{raw[e.start]:02x}: {e.reason}); '
                         'convert it, e.g. with iconv -f latin1 -t utf-8')
  return DataError(f'{name} is not UTF-8 text')


def _start_time(pid: int) -> str | None:
  # Field 22 of /proc/<pid>/stat: ticks since boot when the process started; tells a reused pid apart.
  try:
    with builtins.open(f'/proc/{pid}/stat', encoding='ascii') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(owner: dict[str, Any]) -> bool:
  pid = int(owner.get('pid', -1))
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except (PermissionError, OverflowError, ValueError):
    return pid > 0
  started = _start_time(pid)
  return started is None or owner.get('start') in (None, started)


class Lock:
  """A lock file that names its holder: {host, pid, start, time, command}.

  `acquire()` takes it (returning None) or returns the holder's record when a live process on this
  host, or any process on another host, holds it; a lock whose process no longer runs on this host
  (kill -9, a crash) is taken over, with a warning through `log`.
  """

  def __init__(self, path: str, log: Callable[[str], None] = print):
    self.path, self.log = path, log
    self.me = {'host': socket.gethostname(), 'pid': os.getpid(), 'start': _start_time(os.getpid()),
               'time': datetime.datetime.now().isoformat(timespec='seconds'), 'command': ' '.join(sys.argv)}

  def acquire(self) -> dict[str, Any] | None:
    """None when this process now holds the lock, else the holder's record ('remote': another host)."""
    for _ in range(3):
      if self._create():
        return None
      try:
        held = _record(self.path)
      except FileNotFoundError:
        continue  # released meanwhile
      live = _live(held)
      if live:
        return live
      self.log(f'warning: taking over the lock {self.path} from pid {held.get("pid")}, which no longer runs '
               '(killed or crashed)')
      try:
        remove(self.path)
      except FileNotFoundError:
        pass
    return {'pid': '?', 'host': '?', 'time': '?', 'note': 'another process keeps taking it'}

  def _create(self) -> bool:
    """Writes this process's record unless a lock file exists (exclusive on a local filesystem)."""
    if is_remote(self.path):
      if isfile(self.path):
        return False
      write_text_atomic(self.path, json.dumps(self.me))
      return True
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      json.dump(self.me, f)
    return True

  def release(self) -> None:
    """Removes the lock file if this process holds it."""
    try:
      with open(self.path, encoding='utf-8') as f:
        held = json.load(f)
      if held.get('pid') == self.me['pid'] and held.get('host') == self.me['host']:
        remove(self.path)
    except (OSError, ValueError, AttributeError):
      pass


def _record(path: str) -> dict[str, Any]:
  """A lock file's holder record; {} when it cannot be read or is no record (FileNotFoundError: no lock)."""
  try:
    with open(path, encoding='utf-8') as f:
      held = json.load(f)
  except FileNotFoundError:
    raise
  except (OSError, ValueError):
    return {}
  return held if isinstance(held, dict) else {}


def _live(held: dict[str, Any]) -> dict[str, Any] | None:
  """`held` when its process may still hold the lock: alive on this host, or on another host (marked 'remote',
  which this host cannot check); None when the record is empty or its process is gone."""
  if not held:
    return None
  if held.get('host') != socket.gethostname():
    return {**held, 'remote': True}
  return held if _alive(held) else None


def holder(path: str) -> dict[str, Any] | None:
  """The record of the process holding the lock file `path` (`_live`), None when it is free or its holder is
  gone. Reads only: the lock is not taken."""
  try:
    return _live(_record(path))
  except FileNotFoundError:
    return None


def describe_holder(held: dict[str, Any]) -> str:
  """'pid N on HOST (since TIME)' of a lock holder's record."""
  return f'pid {held.get("pid")} on {held.get("host")} (since {held.get("time", "?")})'
