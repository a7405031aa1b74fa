"""The one owner of a workdir's layout, what kind of directory a path is, and one run at a time.

A workdir (pretraining or fine-tuning) holds
  config.json          the run's config (pretraining: PretrainConfig; fine-tuning: {'finetune':
                       FinetuneConfig, 'task': {name, kind, num_labels, label_names}}), earlier
                       versions of it in config_history.jsonl
  tokenizer.model | tokenizer.json (+ vocab.txt, tokenizer_config.json)   its tokenizer
  checkpoints/         the Orbax checkpoints of a pretraining run
  seed_<n>/            a fine-tuning seed's checkpoints/, metrics and predictions
  final_metrics.json   the results, written last (atomically)
  metrics_{train,eval}.jsonl, tb/, curves.png   (per seed in seed_<n>/ for fine-tuning)
`Workdir` is the only code that knows these names, and `inspect(path)` the only code that reads a directory to say
what it is (a `Found`: its kind, and the config.json it holds); every loader and entry point starts from it.

Every entry point that writes a workdir calls `claim(path, kind)` before writing anything:
it refuses a path that is a file, unwritable, or a workdir of another kind (pretraining,
fine-tuning, Hugging Face export), then takes `<workdir>/.lock` (host, pid and the pid's start
time). A second run on the same workdir stops with one line; a lock left by a process that no
longer exists on this host (kill -9, a crashed node) is taken over with a warning. On a pod
only process 0 holds the lock (the workdir is on a shared filesystem).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
from typing import Any, Iterator

from bert_jax import files
from bert_jax.config import upgrade_saved
from bert_jax.config.migration import upgrade_metrics
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.files import check_regular, write_json_atomic

LOCK_FILE = '.lock'
CONFIG_FILE = 'config.json'
HISTORY_FILE = 'config_history.jsonl'
FINAL_METRICS_FILE = 'final_metrics.json'
CHECKPOINTS_DIR = 'checkpoints'
MERGE_FILE = 'merge.json'  # a merge of checkpoints (pretraining.merge): parameters only, never trained in
# A workdir's tokenizer: SentencePiece, or WordPiece (tokenizer.json with vocab.txt beside it).
TOKENIZER_FILES = ('tokenizer.model', 'tokenizer.json')
KINDS = ('pretraining', 'finetuning', 'export')  # what a run writes (`claim`)
# What a directory can be, as `inspect` answers it, and how messages name each.
KIND_NAMES = {'pretraining': 'a pretraining workdir', 'merge': 'a merge of checkpoints',
              'finetuning': 'a fine-tuning workdir', 'export': 'a Hugging Face directory'}
_SEED_DIR = re.compile(r'seed_(\d+)')


@dataclasses.dataclass(frozen=True)
class Found:
  """What a path is, read once by `inspect`.

  Attributes:
    path: the path as given.
    kind: 'pretraining', 'merge' (a pretraining workdir holding a merge of checkpoints: parameters only),
      'finetuning', 'export' (a Hugging Face directory: bert_jax's export or anyone's checkpoint) or None (absent,
      a file, empty or unknown).
    exists, is_dir: what the filesystem says.
    saved: its config.json as a JSON object (as written: `Workdir.config` upgrades a workdir's), else None.
  """

  path: str
  kind: str | None
  exists: bool = False
  is_dir: bool = False
  saved: dict[str, Any] | None = None

  @property
  def task(self) -> dict[str, Any] | None:
    """A fine-tuning workdir's task, as its run recorded it (config.json's 'task': name, kind, labels, and an
    embedding model's pooling); None for any other kind."""
    return (self.saved or {}).get('task') if self.kind == 'finetuning' else None

  @property
  def trained(self) -> bool:
    """A bert_jax pretraining workdir, a merge among them."""
    return self.kind in ('pretraining', 'merge')

  def describe(self) -> str:
    """'a fine-tuning workdir', 'a file', 'absent', ...: how a message names it."""
    if not self.exists:
      return 'absent'
    if not self.is_dir:
      return 'a file'
    return KIND_NAMES.get(self.kind, 'a directory of no known kind')

  def require(self, *kinds: str | None, what: str = 'checkpoint', hint: str = '') -> Found:
    """Itself when its kind is one of `kinds` (None: a new or empty directory, or none yet); else a ConfigError
    in one wording: '{what} {path} is {its kind}, not {the kinds asked}[; hint]'."""
    if self.kind in kinds and (self.is_dir or not self.exists):
      return self
    wanted = ' or '.join(KIND_NAMES.get(k, 'a new or empty directory') for k in kinds)
    raise ConfigError(f'{what} {self.path} is {self.describe()}, not {wanted}' + (f'; {hint}' if hint else ''))


def embeds(task: dict[str, Any] | None) -> bool:
  """Whether a fine-tuning workdir's recorded task (`Found.task`) is an embedding model's, which records how its
  embeddings are made (pooling, normalisation), rather than a head model's, which records its head's kind."""
  return bool(task) and 'pooling' in task


def sparse(task: dict[str, Any] | None) -> bool:
  """Whether a fine-tuning workdir's recorded task is a sparse (SPLADE) encoder's: term weights from its encoder and
  masked-LM head, no task head and no pooled embedding."""
  return bool(task) and task.get('kind') == 'sparse'


def inspect(path: str) -> Found:
  """Reads `path` once and says what it is (`Found`). Decided by its config.json when it has a readable one (a
  fine-tuning config, a Hugging Face config, a pretraining config), else by what it holds (seed_<n>/,
  checkpoints/, *.safetensors); a merge is a pretraining workdir with merge.json."""
  if not files.exists(path):
    return Found(path, None)
  if not files.isdir(path):
    return Found(path, None, exists=True)
  names = set(files.listdir(path))
  saved = _read_config(os.path.join(path, CONFIG_FILE)) if CONFIG_FILE in names else None
  kind = None
  if saved is not None:
    if 'finetune' in saved:
      kind = 'finetuning'
    elif 'model_type' in saved or 'architectures' in saved:
      kind = 'export'
    elif {'model', 'data', 'optim'} <= set(saved):
      kind = 'pretraining'
  if kind is None:
    if any(_SEED_DIR.fullmatch(n) for n in names):
      kind = 'finetuning'
    elif CHECKPOINTS_DIR in names:
      kind = 'pretraining'
    elif any(n.endswith('.safetensors') for n in names):
      kind = 'export'
  if kind == 'pretraining' and MERGE_FILE in names:
    kind = 'merge'
  return Found(path, kind, exists=True, is_dir=True, saved=saved)


def _read_config(path: str, strict: bool = False) -> dict[str, Any] | None:
  """config.json as a JSON object; None when absent or (unless `strict`: CheckpointError; DataError for a
  directory, FIFO or device) unreadable."""
  if not (files.exists(path) if strict else files.isfile(path)):
    return None
  check_regular(path, 'workdir config')
  try:
    with files.open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    if not strict:
      return None
    first = (str(e).strip().splitlines() or [''])[0][:200]
    raise CheckpointError(f'{path} is unreadable ({type(e).__name__}: {first}); restore it from '
                          'config_history.jsonl or the checkpoints\' meta, or use a new workdir') from None
  if not isinstance(saved, dict):
    if strict:
      raise CheckpointError(f'{path} is not a JSON object')
    return None
  return saved


class Workdir:
  """A pretraining or fine-tuning workdir: the paths of what it holds, and reading/writing its files.

  Writes happen on process 0 only (the workdir is shared by a pod's processes).
  """

  def __init__(self, path: str):
    self.path = path

  def __repr__(self) -> str:
    return f'Workdir({self.path!r})'

  @property
  def kind(self) -> str | None:
    """`inspect(path).kind`: 'pretraining', 'merge', 'finetuning', 'export' or None (new, empty or unknown)."""
    return inspect(self.path).kind

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def checkpoints(self) -> str:
    """Its checkpoints/ directory (a seed's: `Workdir(seed_dir(n)).checkpoints`)."""
    return checkpoint_dir(self.path)

  def seed_dir(self, seed: int) -> str:
    """A fine-tuning seed's directory."""
    return os.path.join(self.path, f'seed_{int(seed)}')

  def seeds(self) -> list[int]:
    """The seeds that have a directory here, in order."""
    names = files.listdir(self.path) if files.isdir(self.path) else []
    return sorted(int(m.group(1)) for m in map(_SEED_DIR.fullmatch, names) if m)

  def config(self) -> dict[str, Any] | None:
    """config.json in today's field names (`config.upgrade_saved`), None when absent."""
    saved = _read_config(self.file(CONFIG_FILE), strict=True)
    return None if saved is None else upgrade_saved(saved)

  def write_config(self, config: dict[str, Any]) -> None:
    """Writes config.json atomically, keeping a different earlier one in config_history.jsonl."""
    if _process_index() == 0:
      write_config(self.path, config)

  def tokenizer_file(self) -> str | None:
    """The tokenizer file it holds (what `tokenization.load_tokenizer` reads), or None."""
    return next((self.file(f) for f in TOKENIZER_FILES if files.isfile(self.file(f))), None)

  def save_tokenizer(self, tokenizer) -> None:
    """Writes the tokenizer's files (process 0), unless it holds a tokenizer already."""
    from bert_jax.data import tokenization  # pylint: disable=g-import-not-at-top  # sentencepiece: only when saving
    if _process_index() == 0 and self.tokenizer_file() is None:
      tokenization.save_tokenizer(tokenizer, self.path)

  def finished(self) -> float | None:
    """When final_metrics.json (a run's last write) was written, in seconds since the epoch; None before."""
    path = self.file(FINAL_METRICS_FILE)
    return files.getmtime(path) if files.isfile(path) else None

  def results(self) -> dict[str, Any] | None:
    """final_metrics.json (in today's metric scale), None when absent (the run has not finished); CheckpointError
    when it is not a readable JSON object."""
    path = self.file(FINAL_METRICS_FILE)
    if not files.isfile(path):
      return None
    try:
      with files.open(path, encoding='utf-8') as f:
        results = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
      raise CheckpointError(f'{path} is unreadable ({type(e).__name__})') from None
    if not isinstance(results, dict):
      raise CheckpointError(f'{path} is not a JSON object')
    return upgrade_metrics(results, results.get('task'))  # an earlier version's SQuAD percents as fractions

  def write_results(self, results: dict[str, Any], directory: str | None = None) -> None:
    """final_metrics.json in the workdir, or in `directory` (a seed's, an evaluation's)."""
    self.write_json(os.path.join(directory or self.path, FINAL_METRICS_FILE), results)

  def write_json(self, path: str, obj: Any) -> None:
    """Writes a JSON file of the workdir (a path in it) atomically, on process 0."""
    if _process_index() == 0:
      write_json_atomic(path, obj)

  def claim(self, kind: str, *, owner: bool = True, log=print):
    """`claim(self.path, kind, ...)`: the lock, held while the block runs."""
    return claim(self.path, kind, owner=owner, log=log)


def _process_index() -> int:
  # jax is imported here, not with the module: what only reads a workdir (a sweep, a SLURM array task deciding
  # whether its cell is done) starts in a second instead of several.
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index()


def checkpoint_dir(run_dir: str) -> str:
  """The checkpoints/ directory of a run directory; a remote one (gs://...) keeps its path as given."""
  return os.path.join(run_dir if '://' in run_dir else os.path.abspath(run_dir), CHECKPOINTS_DIR)


def check_kind(path: str, kind: str, what: str = 'workdir') -> None:
  """ConfigError unless `path` can hold a `kind` workdir: absent, a directory of that kind or of none. A merge is
  never trained in: it is refused for every kind of run, with the way to continue from it."""
  found = inspect(path)
  if found.exists and not found.is_dir:
    raise ConfigError(f'{what} {path} is a file, not a directory')
  if found.kind == 'merge' and kind == 'pretraining':
    raise ConfigError(f'{path} is a merge of checkpoints ({MERGE_FILE}: parameters only, no optimizer '
                      f'state); continue from it with --config.init_checkpoint={path} and a new --workdir')
  if found.kind is not None and found.kind != kind:
    raise ConfigError(f'{what} {path} is a {found.kind} directory, not a {kind} one; nothing was written there. '
                      f'Use a new or empty directory')


def check_outside(workdir: str, source: str, what: str) -> None:
  """ConfigError when `workdir` is `source` or inside it (a checkpoint that is only ever read).

  Paths compare resolved (symbolic links, '..', relative paths; remote ones as written).
  """
  resolve = lambda p: p.rstrip('/') if files.is_remote(p) else os.path.realpath(p)  # pylint: disable=unnecessary-lambda-assignment
  work, src = resolve(workdir), resolve(source)
  if work == src or work.startswith(src + os.sep):
    raise ConfigError(f'workdir {workdir} is inside {what} {source}, which is only ever read: choose another '
                      '--workdir (re-running in the same workdir resumes a run)')


def _lock_error(path: str, owner: dict[str, Any], detail: str) -> ConfigError:
  return ConfigError(f'workdir {os.path.dirname(path)} is in use by {files.describe_holder(owner)}: {detail}')


@contextlib.contextmanager
def claim(path: str, kind: str, *, owner: bool = True, log=print) -> Iterator[None]:
  """Checks `path` for a `kind` run, creates it and holds its lock while the block runs.

  Args:
    path: the workdir.
    kind: one of KINDS.
    owner: whether this process takes the lock (process 0 of a pod; the others only check).
    log: where the stale-lock warning goes.
  """
  if files.is_remote(path):  # reachable, and the credentials may write there: one line before any request retries
    files.check_output(path, 'directory', 'workdir')
  check_kind(path, kind)
  if not owner:
    yield
    return
  created = not files.exists(path)
  try:
    files.makedirs(path)
  except OSError as e:
    raise ConfigError(f'cannot create workdir {path}: {e.strerror}') from None
  lock = files.Lock(os.path.join(path, LOCK_FILE), log)
  try:
    held = lock.acquire()
  except OSError as e:
    raise ConfigError(f'cannot write in workdir {path}: {e.strerror}') from None
  if held is not None:
    if created:
      with contextlib.suppress(OSError):
        files.rmdir(path)
    if held.get('remote'):
      raise _lock_error(lock.path, held, f'a run on another host may be using it; if none is, delete {lock.path}')
    raise _lock_error(lock.path, held, 'two runs on one workdir would mix their checkpoints and metrics; wait '
                      'for it to finish or use another --workdir')
  try:
    yield
  finally:
    lock.release()
    if created:  # a run that stopped before writing anything leaves no empty workdir behind
      with contextlib.suppress(OSError):
        files.rmdir(path)


def write_config(path: str, config: dict[str, Any]) -> None:
  """Writes `path/config.json`; an earlier, different config is appended to config_history.jsonl first."""
  target = os.path.join(path, CONFIG_FILE)
  if files.isfile(target):
    old = _read_config(target)
    if old == json.loads(json.dumps(config)):
      return
    if old is not None:
      entry = {'replaced': datetime.datetime.now().isoformat(timespec='seconds'), 'config': old}
      with files.open(os.path.join(path, HISTORY_FILE), 'a', encoding='utf-8') as f:
        f.write(json.dumps(entry, sort_keys=True) + '\n')
  write_json_atomic(target, config, sort_keys=True)
