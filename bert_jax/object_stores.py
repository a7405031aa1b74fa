"""Object stores (gs://, s3://): which fsspec package each needs, whether a path is on one, the filesystem that reads
it, and what its bucket allows, asked before any work.

fsspec (etils.epath, Orbax) reaches gs:// and s3:// through a backend that is an optional install: `check_remote`
names it in one line before any work, instead of a traceback from deep inside a save. `check_reachable` then asks
the bucket once, with one try of at most PROBE_TIMEOUT_S (gcsfs alone tries six times over about a minute): a store
that cannot be reached or a bucket that does not exist is one line naming the path and what to check. A bucket that
refuses the credentials (401, 403) or grants them no read does not refuse a path by itself (grants on objects,
managed folders and prefixes, and anonymous reads of a public bucket, do not show at bucket level): a file the run
reads is then asked for itself and refused only when it cannot be read either; any other path gets a warning line.
`writable` says whether the credentials in use may create and replace objects where a path is: a GCS bucket's
policy may say so without a write; otherwise a probe object is written there and removed. The I/O layer
(bert_jax.files) uses these for every remote path.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import socket
from typing import Any

from bert_jax.errors import ConfigError

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


def gpath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def filesystem(path: str):
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


def read_confirmed(url: str) -> bool:
  """Whether the bucket of remote path `url` confirmed that the credentials in use may read it (its objects can be
  listed and looked at: `check_reachable` lets an unconfirmed one through with a warning)."""
  return _access(url).unconfirmed is None


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
    fs = filesystem(f'gs://{bucket}')
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
        _gcs_request(filesystem(url), 'GET', 'b/{}/o/{}', bucket, name)
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


def _write_refusal(directory: str, what: str) -> str | None:
  """None when a probe object can be written in remote `directory` and removed again (one try each, at most
  PROBE_TIMEOUT_S), else the store's refusal in words; asked once a process. ConfigError in one line when the
  store fails otherwise (unreachable, a timeout, an Object Lock or encryption key it cannot apply)."""
  scheme, bucket = _bucket(directory)
  key = (directory.rstrip('/'), _endpoint(scheme))
  if key not in _WRITABLE:
    probe = f'{key[0]}/.write-probe-{socket.gethostname()}-{os.getpid()}'
    name = _object_name(probe)
    fs = filesystem(probe) if scheme == 'gs' else _s3()

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
  """Whether the credentials in use may create and replace objects where remote `path` (a `kind`: 'directory' or
  'file') is: in it, or beside the file. GCS's bucket policy grants it (asked once per bucket), else a probe object
  is written there and removed (once per directory). ConfigError naming `what` when the store cannot be used at all
  (unreachable, no such bucket: `check_reachable`) or fails a write otherwise than by refusing it."""
  access = _access(path)
  if access.problem:
    raise ConfigError(f'{what} {path}: {access.problem}')
  return bool(access.writable) or _write_refusal(_directory(path, kind), what) is None


def not_writable(path: str, kind: str) -> str:
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
