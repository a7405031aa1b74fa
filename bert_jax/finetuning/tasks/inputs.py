"""The files a fine-tuning run will read, checked before it loads a checkpoint or compiles anything.

`check_inputs(cfg)` looks at each file a head task's run of `cfg` reads (its task's files in data_dir, or train_file,
eval_file; the head-task kind's input check, `finetuning.kinds`): that it exists, is a regular file that can be read, and
that the columns the config names are in its header (CSV, TSV), its first record (JSONL) or its schema (Parquet). It
reads only the first lines: a bad row further down is still the task's own reader's error, when the run reads the
whole file. The error messages are the readers' own (`own_data.check_columns`, `tagging.sentence_columns`, ...). Remote
paths (gs://, s3://) are left to the readers.
"""

from __future__ import annotations

import os

from bert_jax import files
from bert_jax.data import tables
from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import answering, conll, glue, own_data, squad, tagging


def check_inputs(cfg) -> None:
  """DataError (or ConfigError for a file that must be named) for the first input of `cfg`'s run that is missing,
  unreadable or lacks a column the config names."""
  task = cfg.task
  if task in glue.TASKS:
    _check_glue(glue.TASKS[task], cfg)
  elif task == 'conll2003':
    _check_conll(cfg)
  elif task in ('squad', 'squad_v2'):
    _check_squad(cfg, task == 'squad_v2')
  elif task in own_data.TASKS:
    for path in _own_files(cfg, 'the training file'):
      names = column_names(path)
      if names is not None:  # as own_data.read_rows finds them
        own_data.check_columns(path, names, own_data.columns(cfg))
  elif task == 'tag':
    for path in _own_files(cfg, 'the training file'):
      if not tagging.is_row_file(path):
        first_lines(path, 'tagged file', 1)
      elif (names := column_names(path)) is not None:
        tagging.sentence_columns(path, names, cfg.text_column, cfg.label_column)
  elif task == 'qa':
    for path in _own_files(cfg, 'the training file\'s contexts'):
      if answering.is_squad_file(path):
        first_lines(path, 'SQuAD file', 1)
      elif (names := column_names(path)) is not None:
        answering.row_columns(path, names, cfg)


def _own_files(cfg, held_out: str) -> list[str]:
  """train_file (required) and eval_file (if given) of a task that reads your files."""
  if not cfg.train_file:
    raise DataError(f'task {cfg.task} reads your files: set --config.train_file (and --config.eval_file, or hold '
                    f'out --config.eval_fraction of {held_out})')
  return [p for p in (cfg.train_file, cfg.eval_file) if p]


def _check_glue(task: glue.GlueTask, cfg) -> None:
  paths = [cfg.train_file or os.path.join(cfg.data_dir, 'train.tsv')]
  paths += [cfg.eval_file] if cfg.eval_file else [os.path.join(cfg.data_dir, f) for _, f in task.eval_files]
  for path in paths:
    lines = first_lines(path, 'GLUE file', 1, 'set data_dir (or train_file/eval_file) to the GLUE task folder')
    if not lines:  # remote
      continue
    fields = lines[0].split('\t')
    if task.has_header:
      task._column_indices(path, [c.strip() for c in fields])  # pylint: disable=protected-access
    else:  # CoLA: the columns by position
      needed = max(c for c in (task.text_a, task.text_b, task.label) if c is not None) + 1
      if len(fields) < needed:
        raise DataError(f'{path}:1: {len(fields)} tab-separated column(s), {task.name} needs at least {needed}')


def _check_conll(cfg) -> None:
  paths = [cfg.train_file or os.path.join(cfg.data_dir, conll.TRAIN_FILE),
           cfg.eval_file or os.path.join(cfg.data_dir, conll.DEV_FILE)]
  if cfg.data_dir or not cfg.eval_file:  # as Conll2003.eval_sets
    paths.append(os.path.join(cfg.data_dir, conll.TEST_FILE))
  for path in paths:
    first_lines(path, 'CoNLL file', 1, f'set data_dir to the CoNLL-2003 folder ({conll.TRAIN_FILE}, '
                f'{conll.DEV_FILE}, {conll.TEST_FILE}) or train_file/eval_file')


def _check_squad(cfg, version_2: bool) -> None:
  train_name, dev_name = squad.file_names(version_2)
  paths = [cfg.eval_file or os.path.join(cfg.data_dir, dev_name)]
  if cfg.train_file:  # else train-*.json in data_dir if there, or the dev file split by article
    paths.append(cfg.train_file)
  for path in paths:
    first_lines(path, 'SQuAD file', 1, 'set --config.data_dir (or train_file/eval_file) to where the official JSON '
                'files are')


# ------------------------------------------------------------------------------------------ reading the start


def _readable(path: str, what: str, hint: str = '') -> bool:
  """False for a remote path (its reader checks it); DataError for a missing or unreadable local one."""
  if files.is_remote(path):
    return False
  files.check_regular(path, what)
  if not files.isfile(path):
    raise DataError(f'{what} {path} does not exist' + (f'; {hint}' if hint else ''))
  if not os.access(path, os.R_OK):
    raise DataError(f'{what} {path} cannot be read (permission denied)')
  return True


def first_lines(path: str, what: str, n: int, hint: str = '') -> list[str]:
  """The first `n` non-blank lines of a text file (fewer when it has fewer); DataError when it is missing,
  unreadable, empty or does not start as UTF-8 text. A remote path: []."""
  if not _readable(path, what, hint):
    return []
  lines = []
  try:
    with files.open(path, encoding='utf-8-sig') as f:
      for line in f:
        if line.strip():
          lines.append(line.rstrip('\r\n'))
          if len(lines) == n:
            break
  except UnicodeDecodeError:
    raise files.not_utf8(path) from None
  except OSError as e:
    raise DataError(f'{what} {path} cannot be read ({e.strerror})') from None
  if not lines:
    raise DataError(f'{path} is empty')
  return lines


def column_names(path: str) -> list[str] | None:
  """The columns `tables.records` reads in a CSV/TSV, JSONL or Parquet file (`tables.column_names`); None for a
  remote path; DataError for a missing, unreadable or empty file, an unknown file type or a malformed first row."""
  if not _readable(path, 'data file'):
    return None
  names = tables.column_names(path)
  if not names and tables.file_format(path) != 'parquet':
    raise DataError(f'{path} is empty')
  return names
