"""Corpus files: which files a corpus spec names, and reading their bytes.

`resolve_files` expands a comma-separated spec of files, globs and directories: local paths and
anything etils.epath opens (gs://…). Files may be gzip, bzip2 or xz compressed, recognised by
their magic bytes rather than their names (`detect_compression`; bert_jax.files decompresses them); a failed
read or damaged data is a DataError naming the file (`read`). This module imports no jax: it runs in
spawned worker processes.
"""

from __future__ import annotations

import glob
import io
import lzma
import re
from typing import BinaryIO
import zlib

from etils import epath

from bert_jax import files
from bert_jax.errors import DataError
from bert_jax.files import check_regular, check_remote

READ_BYTES = 1 << 20       # one read, by every module that reads corpus bytes
# Files a directory spec skips: the bundled corpus folder carries its README.
_NOT_CORPUS = re.compile(r'^\.|^(README|LICENSE|LICENCE|SHA256SUMS)|\.md$', re.IGNORECASE)


def resolve_files(spec: str) -> list[str]:
  """Expands a comma-separated list of files, globs and directories.

  Local paths and anything etils.epath opens (gs://…) are accepted.

  Args:
    spec: e.g. 'data/wikitext-2-raw' or 'a.txt,corpus/*.txt'. Directories expand to every
      regular file below them (recursively, sorted), except hidden files and notes
      that ship beside data (README*, LICENSE*, *.md, SHA256SUMS).

  Returns:
    The files in spec order, each listed once.
  """
  files: list[str] = []
  for part in (p.strip() for p in spec.split(',')):
    if not part:
      continue
    where = '' if part == spec.strip() else f' (from {spec!r})'
    check_remote(part, 'corpus path')
    try:
      path = epath.Path(part)
      if path.is_dir():
        found = _walk(path)
      elif any(c in part for c in '*?['):
        found = _glob(part)
      elif path.is_file():
        found = [part]
      else:
        raise DataError(f'corpus file {part!r}{where} does not exist; check the path or the '
                        'current directory')
    except ImportError as e:  # epath's backend for gs:// etc. is an optional install
      raise DataError(f'cannot list {part!r}{where}: {_one_line(e)}') from None
    if not found:
      raise DataError(f'{part!r}{where} matches no files')
    for f in found:  # a FIFO or device would block the first read forever
      check_regular(f, 'corpus file' if f == part else f'corpus file (from {part!r})')
    files.extend(found)
  if not files:
    raise DataError(f'corpus spec {spec!r} names no files')
  return list(dict.fromkeys(files))


def _walk(root: epath.Path) -> list[str]:
  out = []
  for dirpath, dirnames, filenames in root.walk():
    dirnames[:] = [d for d in dirnames if not d.startswith('.')]
    out.extend(dirpath / f for f in filenames if not _NOT_CORPUS.search(f))
  return sorted(str(p) for p in out if p.exists() and not p.is_dir())  # FIFOs too: refused by the caller


def _glob(pattern: str) -> list[str]:
  if '://' not in pattern:
    # epath refuses '**' (a recursive listing costs thousands of requests on GCS); local
    # files keep it.
    found = glob.glob(pattern, recursive=True)
  else:
    # epath globs below a literal directory: split at the first component with a wildcard.
    parts = pattern.split('/')
    first = next(i for i, p in enumerate(parts) if any(c in p for c in '*?['))
    root = epath.Path('/'.join(parts[:first]))
    found = [str(p) for p in root.glob('/'.join(parts[first:]))]
  return sorted(p for p in found if epath.Path(p).exists() and not epath.Path(p).is_dir())


def open_raw(path: str) -> BinaryIO:
  try:
    return epath.Path(path).open('rb')
  except OSError as e:
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None
  except ImportError as e:  # no epath backend installed for this kind of path
    raise DataError(f'cannot read corpus file {path}: {_one_line(e)}') from None


def detect_compression(path: str, raw: BinaryIO) -> str:
  magic = read(raw, 6, path, '')
  raw.seek(0)
  return next((name for prefix, name in files.COMPRESSION_MAGIC if magic.startswith(prefix)), '')


def read(f: BinaryIO, n: int, path: str, compression: str) -> bytes:
  """f.read(n), with damaged data and I/O failures as DataErrors naming the file."""
  try:
    return f.read(n)
  except (EOFError, zlib.error, lzma.LZMAError) as e:
    raise DataError(f'{path}: corrupt {compression or "compressed"} data ({_one_line(e)})'
                    ) from None
  except OSError as e:
    if compression:  # gzip and bz2 report bad data as OSError
      raise DataError(f'{path}: corrupt {compression} data ({_one_line(e)})') from None
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None


def size(f: BinaryIO, path: str) -> int:
  try:
    return f.seek(0, io.SEEK_END)
  except OSError as e:
    raise DataError(f'cannot read corpus file {path}: {e.strerror or _one_line(e)}') from None


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split()) or type(e).__name__
