"""Files: atomic writes, input paths that are regular files, and lock files.

Atomic writes: a reader (or a resumed run) sees the old file or the new one, never half of one.
Inputs: a FIFO, device or socket passes `os.path.exists` (and epath's is_file) but blocks a
read forever or never ends, so every path a user gives is checked with `check_regular` first.
Remote paths: gs:// and s3:// go through fsspec (etils.epath, Orbax), whose backend for each is an optional
install; `check_remote` names it in one line before any work, instead of a traceback from deep inside a save.
`check_reachable` then asks the bucket once, with one try of at most PROBE_TIMEOUT_S (gcsfs alone tries six times over
about a minute): a store that cannot be reached or a bucket that does not exist is one line naming the path and what
to check. A bucket that refuses the credentials (401, 403) or grants them no read does not refuse a path by itself
(grants on objects, managed folders and prefixes, and anonymous reads of a public bucket, do not show at bucket
level): a file the run reads is then asked for itself and refused only when it cannot be read either; any other path
gets a warning line. `writable(path)` is the one answer to whether a path can be written, local (its nearest existing
ancestor is a writable directory) or remote (the credentials in use may create and replace objects where it is: a
GCS bucket's policy may say so without a write; otherwise a probe object is written there and removed).
Paths of workdirs: `exists`, `isdir`, `listdir`, `makedirs`, `open_file`, `remove` take a local path (the os
module, as before) or a remote one (gs://, s3://: etils.epath). An object store has no rename and no append:
remote atomic writes write the object once (GCS and S3 publish an object whole when it is closed), and
`open_file(path, 'a')` rewrites the object whole at most every REMOTE_FLUSH_S seconds and on close; `copy_file`
copies bytes between the two kinds.
Locks: `Lock` is a file naming its holder (host, pid and the pid's start time), so a lock left
by a process that no longer exists on this host is recognised and taken over. On a remote workdir the lock is
written when absent, which two runs starting in the same second could both do (an object store has no
exclusive create through fsspec).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import json
import os
import re
import socket
import stat
import sys
import time
from typing import Any, Callable

from bert_jax.errors import ConfigError, DataError

# How a failed write reads in library errors that carry no errno (tensorstore reports ENOSPC as ValueError).
WRITE_FAILURES = ('No space left on device', 'Disk quota exceeded', 'Read-only file system')


# scheme -> (the package fsspec needs for it, the bert_jax extra that installs it: setup.cfg extras_require).
REMOTE_PACKAGES = {'gs': ('gcsfs', 'gcs'), 'gcs': ('gcsfs', 'gcs'), 's3': ('s3fs', 's3'), 's3a': ('s3fs', 's3')}
_REMOTE = re.compile(r'(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*)://')


def check_remote(text: str, what: str) -> None:
  """ConfigError naming the install command when `text` (a path, or paths separated by commas) is on a
  gs:// or s3:// filesystem whose fsspec package is not installed."""
  for scheme in dict.fromkeys(m.group(1).lower() for m in _REMOTE.finditer(str(text))):
    package, extra = REMOTE_PACKAGES.get(scheme, (None, None))
    if package is None:
      continue
    try:
      importlib.import_module(package)
    except ImportError:
      raise ConfigError(f'{what} {text} is on {scheme}://, which needs the {package} package: '
                        f'python3 -m pip install -e ".[{extra}]" (in the checkout; or pip install {package})'
                        ) from None


def is_remote(path: Any) -> bool:
  """Whether `path` is on an object store (gs://, s3://) rather than a local filesystem."""
  match = _REMOTE.match(str(path))
  return bool(match) and match.group(1).lower() in REMOTE_PACKAGES


def _gpath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _fs(path: str):
  """The fsspec filesystem that etils.epath reads and writes `path` with: one instance for every remote path of a
  scheme, so gcsfs searches for credentials once (seconds off Google Cloud where there are none)."""
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  return backend.fsspec_backend.fs(path)


# How long a probe of a bucket or an object waits for one answer: a store answers in well under a second; a firewall
# that drops packets would otherwise hold a run for aiohttp's default 5 minutes.
PROBE_TIMEOUT_S = 10.0
# What a workdir needs of a GCS bucket: to read or list its objects, and to create and replace them (a replaced
# object is deleted first: the metrics rewritten, the lock removed).
_GCS_READ = ('storage.objects.get', 'storage.objects.list')
_GCS_WRITE = ('storage.objects.create', 'storage.objects.delete')
# Characters of a glob pattern (corpus files): such a path names no one object to probe.
_GLOB = re.compile(r'[*?[]')


@dataclasses.dataclass(frozen=True)
class _Access:
  """What the probe of a bucket found.

  Attributes:
    problem: why no path in the bucket can be used, in words (the store cannot be reached, the bucket does not
      exist, the credentials cannot be sent); None: the bucket is there.
    unconfirmed: why the bucket's answer does not confirm that the credentials in use may read it (a 401 or 403, or
      its IAM policy grants no read), in words; None: it does. Its objects may still be readable: grants on
      objects, on managed folders or on a prefix (s3:GetObject on bucket/prefix/* without s3:ListBucket), and
      anonymous reads of a public bucket, do not show at bucket level.
    writable: True: the bucket's policy lets the credentials create and replace objects; None: only a write can
      tell (S3 always; GCS where the bucket's policy does not grant it).
    who: the credentials in use, as a message names them.
  """

  problem: str | None = None
  unconfirmed: str | None = None
  writable: bool | None = None
  who: str = 'the credentials in use'


# (scheme, bucket, endpoint) -> what its probe found: each bucket is asked once a process.
_ACCESS: dict[tuple[str, str, str], _Access] = {}
# (remote path, endpoint) -> None when the object at the path can be read, else the store's answer in words.
_OBJECTS: dict[tuple[str, str], str | None] = {}
# (remote directory, endpoint) -> None when a probe object could be written in it and removed, else why not.
_WRITABLE: dict[tuple[str, str], str | None] = {}
# Remote paths a warning line was given for: one line each a process.
_WARNED: set[str] = set()


def _bucket(url: str) -> tuple[str, str]:
  """('gs' or 's3', bucket) of a remote path (gcs:// is gs://, s3a:// is s3://)."""
  scheme, rest = str(url).split('://', 1)
  return ('gs' if REMOTE_PACKAGES[scheme.lower()][0] == 'gcsfs' else 's3'), rest.split('/', 1)[0]


def _object_name(url: str) -> str:
  """The object name of a remote path within its bucket ('' for the bucket itself)."""
  rest = str(url).split('://', 1)[1]
  return rest.split('/', 1)[1].strip('/') if '/' in rest else ''


def _endpoint(scheme: str) -> str:
  """The endpoint override in force for `scheme` (an emulator, MinIO), '' for the store's own."""
  names = ('STORAGE_EMULATOR_HOST',) if scheme == 'gs' else ('AWS_ENDPOINT_URL_S3', 'AWS_ENDPOINT_URL')
  return next((os.environ[n] for n in names if os.environ.get(n)), '')


def _access(url: str) -> _Access:
  """What the bucket of remote path `url` allows, probed on first use."""
  scheme, bucket = _bucket(url)
  key = (scheme, bucket, _endpoint(scheme))
  if key not in _ACCESS:
    if not bucket:
      _ACCESS[key] = _Access(problem=f'names no bucket: give {scheme}://BUCKET/PATH')
    else:
      _ACCESS[key] = _probe_gcs(bucket) if scheme == 'gs' else _probe_s3(bucket)
  return _ACCESS[key]


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return (text.splitlines() or [type(error).__name__])[0][:200]


def _unreachable(error: BaseException, scheme: str) -> str | None:
  """What to say of a failure to reach the store (None: it answered)."""
  endpoint = _endpoint(scheme)
  hint = (f', and the endpoint {endpoint} ({"STORAGE_EMULATOR_HOST" if scheme == "gs" else "AWS_ENDPOINT_URL"})'
          if endpoint else '')
  if isinstance(error, TimeoutError) or type(error).__name__ in ('FSTimeoutError', 'ConnectTimeoutError',
                                                                   'ReadTimeoutError'):
    return f'no answer from the store within {PROBE_TIMEOUT_S:g} s: check the network connection and proxy{hint}'
  host = getattr(error, 'host', None)
  cause = getattr(error, 'os_error', None) or error.__cause__ or error
  if host is not None or isinstance(error, (ConnectionError, socket.gaierror)) or type(error).__name__ in (
      'EndpointConnectionError', 'ConnectionClosedError'):
    port = getattr(error, 'port', None)
    where = 'the store' if host is None else f'{host}:{port}' if port is not None else str(host)
    reason = getattr(cause, 'strerror', None) or _first_line(cause)
    return f'cannot reach {where} ({reason}): check the network connection and proxy{hint}'
  return None


def _is_refusal(error: BaseException) -> bool:
  """Whether `error` is the store refusing the credentials in use a request (HTTP 401 or 403): s3fs raises
  PermissionError, gcsfs an OSError starting 'Forbidden' (403) or an HttpError with the code (401)."""
  return (isinstance(error, PermissionError) or str(error).startswith('Forbidden')
          or getattr(error, 'code', None) in (401, 403, '401', '403') or type(error).__name__ == 'NonRetryableError')


def refusal(error: BaseException) -> str | None:
  """One line for an object store refusing the credentials in use a read or write that the probes let through (a
  bucket that did not confirm access: `check_reachable`'s warning), None for any other error. gcsfs raises an
  OSError starting 'Forbidden', s3fs a PermissionError, each from its own code and without the errno of a local
  refusal."""
  innermost = error.__traceback__
  while innermost is not None and innermost.tb_next is not None:
    innermost = innermost.tb_next
  raised_in = innermost.tb_frame.f_code.co_filename if innermost is not None else ''
  if (not isinstance(error, OSError) or error.errno is not None or not _is_refusal(error)
      or not any(f'{os.sep}{client}{os.sep}' in raised_in for client in ('gcsfs', 's3fs'))):
    return None
  return (f'the store refused the credentials in use ({_first_line(error)}): check their access to the bucket, '
          'or the credentials (GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login; AWS_PROFILE '
          'or AWS_ACCESS_KEY_ID)')


def _answer(error: BaseException, scheme: str) -> str:
  """What the store's failure to serve one object request says, in words."""
  unreachable = _unreachable(error, scheme)
  if unreachable:
    return unreachable
  if isinstance(error, FileNotFoundError):
    return 'no such object'
  if _is_refusal(error):
    return f'refused ({_first_line(error)})'
  return f'the store answered {type(error).__name__}: {_first_line(error)}'


def _gcs_request(fs, method: str, path: str, *args, **kwargs):
  """gcsfs's request in one try (without its retry decorator, whose six tries take about a minute to give up on a
  store that cannot be reached), waiting at most PROBE_TIMEOUT_S; the store's errors as gcsfs raises them."""
  from fsspec import asyn  # pylint: disable=g-import-not-at-top
  request = type(fs)._request  # pylint: disable=protected-access
  request = getattr(request, '__wrapped__', request)
  return asyn.sync(fs.loop, request, fs, method, path, *args, timeout=PROBE_TIMEOUT_S, **kwargs)


def _probe_gcs(bucket: str) -> _Access:
  """Asks GCS which object permissions the credentials in use have on `bucket` (testIamPermissions: one request
  that needs no permission itself), in one try."""
  try:
    fs = _fs(f'gs://{bucket}')
  except Exception as e:  # pylint: disable=broad-except  (gcsfs found credentials it cannot use)
    return _Access(problem=f'the Google credentials cannot be used ({_first_line(e)}): check '
                   'GOOGLE_APPLICATION_CREDENTIALS or run gcloud auth application-default login')
  who = 'the Google credentials in use'
  if getattr(getattr(fs, 'credentials', None), 'method', None) == 'anon':
    given = os.environ.get('GOOGLE_APPLICATION_CREDENTIALS')
    who = ('anonymous access (no Google credentials were found' +
           (f'; GOOGLE_APPLICATION_CREDENTIALS={given} could not be used)' if given else ')'))
  try:
    body = _gcs_request(fs, 'GET', 'b/{}/iam/testPermissions', bucket, permissions=list(_GCS_READ + _GCS_WRITE))[3]
    granted = set(json.loads(body).get('permissions', ()))
  except Exception as e:  # pylint: disable=broad-except  (aiohttp's, gcsfs's and the store's errors alike)
    unreachable = _unreachable(e, 'gs')
    if unreachable:
      return _Access(problem=unreachable, who=who)
    if isinstance(e, FileNotFoundError):
      return _Access(problem=f'bucket {bucket} does not exist: check its name', who=who)
    return _Access(unconfirmed=_gcs_refusal(e, bucket, who), who=who)
  unconfirmed = None if granted & set(_GCS_READ) else (
      f'the IAM policy of bucket {bucket} grants {who} neither storage.objects.get nor storage.objects.list: grant '
      'the account roles/storage.objectViewer, or use other credentials')
  return _Access(unconfirmed=unconfirmed, writable=True if set(_GCS_WRITE) <= granted else None, who=who)


def _gcs_refusal(error: Exception, bucket: str, who: str) -> str:
  """What a GCS bucket's answer other than its permissions says (a 401 or 403: `who` may not use it)."""
  text = _first_line(error)
  if getattr(error, 'code', None) == 401 or type(error).__name__ == 'NonRetryableError':
    return (f'the store refused {who} for bucket {bucket} ({text}): run gcloud auth application-default login, or '
            'set GOOGLE_APPLICATION_CREDENTIALS to a service account key')
  if text.startswith('Forbidden'):
    return (f'{who} may not use bucket {bucket} ({text}): check the account\'s roles on the bucket, or the '
            'credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login)')
  return f'the store answered {type(error).__name__} for bucket {bucket}: {text}'


def _s3():
  """An s3fs filesystem that tries each request once, waiting at most PROBE_TIMEOUT_S."""
  import s3fs  # pylint: disable=g-import-not-at-top
  fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs={
      'connect_timeout': PROBE_TIMEOUT_S, 'read_timeout': PROBE_TIMEOUT_S, 'retries': {'max_attempts': 1}})
  fs.retries = 1  # s3fs's own tries around botocore's (a class attribute, not an argument)
  return fs


def _probe_s3(bucket: str) -> _Access:
  """HEAD of `bucket` in one try: reachable and present. HeadBucket needs s3:ListBucket, which credentials that
  may read the objects under a prefix often lack: its 403 leaves reading unconfirmed. S3 has no request that tells
  a permission without using it: whether objects can be written is left to `writable` (None)."""
  who = 'the AWS credentials in use'
  try:
    _s3().call_s3('head_bucket', Bucket=bucket)
  except Exception as e:  # pylint: disable=broad-except  (botocore's, aiohttp's and the store's errors alike)
    unreachable = _unreachable(e, 's3')
    if unreachable:
      return _Access(problem=unreachable, who=who)
    name = type(e).__name__
    if isinstance(e, FileNotFoundError):
      return _Access(problem=f'bucket {bucket} does not exist: check its name (and region)', who=who)
    if name in ('NoCredentialsError', 'PartialCredentialsError', 'CredentialRetrievalError'):
      return _Access(problem=f'no AWS credentials were found ({_first_line(e)}): set AWS_PROFILE or '
                     'AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run aws configure', who=who)
    if isinstance(e, PermissionError):
      return _Access(unconfirmed=f'{who} may not use bucket {bucket} (HeadBucket, which needs s3:ListBucket: '
                     f'{_first_line(e)}): check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID) and the bucket\'s '
                     'policy', who=who)
    return _Access(unconfirmed=f'the store answered {name} for bucket {bucket}: {_first_line(e)}', who=who)
  return _Access(who=who)


def _object_answer(url: str) -> str | None:
  """None when the object at remote `url` can be read (its metadata, in one try of at most PROBE_TIMEOUT_S), else
  the store's answer in words; asked once a process."""
  scheme, bucket = _bucket(url)
  key = (url, _endpoint(scheme))
  if key not in _OBJECTS:
    name = _object_name(url)
    try:
      if not name:
        raise FileNotFoundError(url)
      if scheme == 'gs':
        _gcs_request(_fs(url), 'GET', 'b/{}/o/{}', bucket, name)
      else:
        _s3().call_s3('head_object', Bucket=bucket, Key=name)
      _OBJECTS[key] = None
    except Exception as e:  # pylint: disable=broad-except  (aiohttp's, botocore's and the store's errors alike)
      _OBJECTS[key] = _answer(e, scheme)
  return _OBJECTS[key]


def _remote_paths(text: str) -> list[str]:
  """The gs:// and s3:// paths in `text`: a path, or paths separated by commas."""
  return [part.strip() for part in str(text).split(',') if is_remote(part.strip())]


def check_reachable(text: str, what: str, reads_files: bool = False) -> None:
  """ConfigError in one line, before any work, when a gs:// or s3:// path in `text` (a path, or paths separated by
  commas) cannot be used: its store cannot be reached or its bucket does not exist. Each bucket is asked once a
  process, in one try (`check_remote` first: the package is installed).

  A bucket that does not confirm that the credentials may read it (401, 403, no read granted on the bucket) does
  not refuse a path by itself, as grants on objects, managed folders or prefixes do not show at bucket level: the
  object at the path is asked for (one try). When it cannot be read either, a path that `reads_files` (each path
  is a file the run reads, not a glob) is refused in one line naming both answers; any other path (a directory, a
  glob, a workdir, an output) gets one warning line on stdout, and the run goes on: writing is checked by
  `writable`, where it is needed.
  """
  for url in _remote_paths(text):
    access = _access(url)
    if access.problem:
      raise ConfigError(f'{what} {url}: {access.problem}')
    if access.unconfirmed is None:
      continue
    pattern = bool(_GLOB.search(_object_name(url)))  # names no one object to ask for
    if not pattern and _object_answer(url) is None:
      continue
    if reads_files and not pattern:
      raise ConfigError(f'{what} {url} cannot be read: the object: {_object_answer(url)}; the bucket: '
                        f'{access.unconfirmed}')
    if url not in _WARNED:
      _WARNED.add(url)
      print(f'warning: {what} {url}: {access.unconfirmed}; going on, as grants on objects, managed folders or '
            'prefixes do not show at bucket level', flush=True)


def _nearest_existing(path: str) -> str:
  """`path` made absolute, or its nearest ancestor that exists."""
  nearest = os.path.abspath(path)
  while not os.path.exists(nearest):
    nearest = os.path.dirname(nearest)
  return nearest


def _write_refusal(directory: str, what: str) -> str | None:
  """None when a probe object can be written in remote `directory` and removed again (one try each, at most
  PROBE_TIMEOUT_S), else the store's refusal in words; asked once a process. ConfigError in one line when the
  store fails otherwise (unreachable, a timeout, an Object Lock or encryption key it cannot apply)."""
  scheme, bucket = _bucket(directory)
  key = (directory.rstrip('/'), _endpoint(scheme))
  if key not in _WRITABLE:
    probe = f'{key[0]}/.write-probe-{socket.gethostname()}-{os.getpid()}'
    name = _object_name(probe)
    fs = _fs(probe) if scheme == 'gs' else _s3()

    def request(doing: str) -> None:
      if scheme == 's3':
        fs.call_s3('put_object' if doing == 'writing' else 'delete_object', Bucket=bucket, Key=name,
                   **({'Body': b'probe'} if doing == 'writing' else {}))
      elif doing == 'writing':  # a media upload to the store's upload endpoint
        upload = f'{fs._location}/upload/storage/v1/b/{{}}/o'  # pylint: disable=protected-access
        _gcs_request(fs, 'POST', upload, bucket, uploadType='media', name=name, data=b'probe',
                     headers={'Content-Type': 'application/octet-stream'})
      else:
        _gcs_request(fs, 'DELETE', 'b/{}/o/{}', bucket, name)

    for doing in ('writing', 'removing'):
      try:
        request(doing)
      except Exception as e:  # pylint: disable=broad-except  (aiohttp's, botocore's and the store's errors alike)
        if not _is_refusal(e):
          raise ConfigError(f'{what} {directory} cannot be written: {doing} the probe object {probe} failed: '
                            f'{_answer(e, scheme)}') from None
        _WRITABLE[key] = (f'{doing} an object was refused ({_first_line(e)})' +
                          (f'; delete the probe object {probe}' if doing == 'removing' else ''))
        break
    else:
      _WRITABLE[key] = None
  return _WRITABLE[key]


def _directory(path: str, kind: str) -> str:
  """The directory a `kind` ('file' or 'directory') at remote `path` is written in."""
  path = path.rstrip('/')
  return path.rsplit('/', 1)[0] if kind == 'file' and _object_name(path) else path


def writable(path: str, kind: str = 'directory', what: str = 'path') -> bool:
  """Whether `path` (a `kind`: 'directory' or 'file', existing or to be created) can be written.

  Local: it, or its nearest existing ancestor, is a directory this process may write in (an existing file: one it
  may write). Remote: the credentials in use may create and replace objects where it is (in it, or beside the
  file): GCS's bucket policy grants it (asked once per bucket), else a probe object is written there and removed
  (once per directory). ConfigError naming `what` when a remote path's store cannot be used at all (unreachable,
  no such bucket: `check_reachable`) or fails a write otherwise than by refusing it.
  """
  if is_remote(path):
    access = _access(path)
    if access.problem:
      raise ConfigError(f'{what} {path}: {access.problem}')
    return bool(access.writable) or _write_refusal(_directory(path, kind), what) is None
  nearest = _nearest_existing(path)
  if os.path.isdir(nearest):
    return os.access(nearest, os.W_OK | os.X_OK)
  return nearest == os.path.abspath(path) and os.access(nearest, os.W_OK)


def _not_writable(path: str, kind: str) -> str:
  """Why remote `path` cannot be written, for a message (after `writable` said so)."""
  scheme, bucket = _bucket(path)
  access = _access(path)
  why = _WRITABLE.get((_directory(path, kind).rstrip('/'), _endpoint(scheme))) or 'no write was tried'
  if scheme == 'gs':
    return (f'{access.who} may not create and replace objects in {scheme}://{bucket} ({why}; that needs '
            'storage.objects.create and .delete): grant the account roles/storage.objectUser on the bucket or its '
            'managed folder, or use other credentials')
  return (f'{access.who} may not write objects under it ({why}; that needs s3:PutObject and s3:DeleteObject): '
          'check the bucket\'s policy or the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID)')


def exists(path: str) -> bool:
  return _gpath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gpath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _gpath(path).is_file() if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """The names in directory `path` (FileNotFoundError when it is none)."""
  if not is_remote(path):
    return os.listdir(path)
  if not isdir(path):
    raise FileNotFoundError(path)
  return [p.name for p in _gpath(path).iterdir()]


def copy_file(source: str, target: str) -> None:
  """Copies file `source` to `target`, either of them local or remote (small files: read whole)."""
  with open_file(source, 'rb') as f:
    data = f.read()
  with open_file(target, 'wb') as out:
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


def open_file(path: str, mode: str = 'r', **kwargs: Any):
  """`open(path, mode, ...)` of a local or remote file ('a' on a remote one: `_RemoteAppend`)."""
  if not is_remote(path):
    return open(path, mode, **kwargs)  # pylint: disable=unspecified-encoding  # the caller's encoding
  if mode == 'a':
    return _RemoteAppend(path)
  if mode == 'r':  # read whole (small files), decoded as asked: epath's open takes no errors=
    return io.StringIO(_gpath(path).read_bytes().decode(kwargs.get('encoding') or 'utf-8',
                                                        kwargs.get('errors') or 'strict'))
  kwargs.pop('newline', None)
  return _gpath(path).open(mode, **kwargs)


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through `path.tmp` and os.replace, creating the directory (a remote object is
  written once: the store publishes it whole)."""
  if is_remote(path):
    makedirs(os.path.dirname(path))
    _gpath(path).write_text(text, encoding='utf-8')
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8', newline='') as f:
    f.write(text)
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
    if _access(path).unconfirmed is None and (kind == 'file' and isdir(path) or kind == 'directory' and isfile(path)):
      raise ConfigError(f'{what} {path} is a {"directory" if kind == "file" else "file"}; give a {kind} path')
    if not writable(path, kind, what):
      raise ConfigError(f'{what} {path} cannot be written: {_not_writable(path, kind)}')
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
  with open_file(path, 'rb') as f:
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
    with open(f'/proc/{pid}/stat', encoding='ascii') as f:
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
      with open_file(self.path, encoding='utf-8') as f:
        held = json.load(f)
      if held.get('pid') == self.me['pid'] and held.get('host') == self.me['host']:
        remove(self.path)
    except (OSError, ValueError, AttributeError):
      pass


def _record(path: str) -> dict[str, Any]:
  """A lock file's holder record; {} when it cannot be read or is no record (FileNotFoundError: no lock)."""
  try:
    with open_file(path, encoding='utf-8') as f:
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
