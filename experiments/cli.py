"""Shared start-up of the absl entry points in experiments/: one-line errors, the config flag, multi-host.

The library reads no flags; entry points parse them and call into it through here. Every entry
point gets the multi-host flags below: `run` starts `jax.distributed` from them (see
bert_jax/distributed.py) before `main` touches jax.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Any, Callable

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import files, hardware
from bert_jax.config import REMOVED, RENAMED
from bert_jax.config.finetune import config_type, field_readers, foreign_field, unread_fields
from bert_jax.errors import BertJaxError, CheckpointWriteError, ConfigError, Preempted
from bert_jax.runs import interrupts
from bert_jax.launch import stderr_filter
from tools import config_help

# bert_jax.distributed and bert_jax.train.preemption import jax (seconds): they are imported where used, so that a
# flag or config error comes first. _MODES is distributed.MODES (tests/experiments/test_cli.py checks).
_MODES = ('auto', 'on', 'off')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', _MODES,
    'Multi-process start-up: auto = when --coordinator_address is given or a SLURM/TPU multi-process '
    'launcher is detected; on = always (jax detects what is not given, e.g. on Cloud TPU pods); off = never.')
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0 (a free port there), the same for all processes.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes in a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, in [0, --num_processes).')
_LOCAL_DEVICE_IDS = flags.DEFINE_list(
    'local_device_ids', None, 'Accelerator ids this process drives (one process per GPU); default all.')
_FILESYSTEM_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG)
_MULTIHOST_FLAGS = (_DISTRIBUTED, _COORDINATOR_ADDRESS, _NUM_PROCESSES, _PROCESS_ID, _LOCAL_DEVICE_IDS)
_HELP_FLAGS = ('--help', '-h', '-?', '--helpshort', '--helpfull')
# The entry point's config flag (define_config): its default file and its config class (None: a plain ConfigDict).
_CONFIG = {}


# What a failed write (full disk, read-only filesystem) leaves: checkpoints are written atomically, so a failed
# save never replaces the last complete one.
CHECKPOINT_KEPT = ('the last complete checkpoint is kept: free space or fix permissions, then run the same command to '
                   'resume')


def run(main: Callable[[list[str]], None], allow_args: bool = False, text_flags: tuple[str, ...] = (),
        multihost: bool = True, kept: str = CHECKPOINT_KEPT, huge_pages: bool = True) -> None:
  """`absl.app.run(main)`, turning a BertJaxError into 'error: ...' on stderr and exit code 1
  (a preemption into 'preempted: ...' and preemption.EXIT_CODE).

  Args:
    main: gets absl's argv (program name, then any non-flag arguments).
    allow_args: pass non-flag arguments on to `main` instead of rejecting them as a usage error.
    text_flags: flags whose values are text for the model: bytes that are not UTF-8 are an error
      line (paths may hold any bytes, as the filesystem allows).
    multihost: start jax.distributed from the multi-host flags (False: a tool that never runs jax
      across processes; those flags are then not its own).
    kept: what a failed write leaves and how to go on, for its error line (a tool without checkpoints says its own).
    huge_pages: restart on transparent huge pages first (`bert_jax.hardware.prepare_process`); False: keep the
      allocator the process was started with (a benchmark whose peer trains in this process). The huge-pages settings
      are checked either way, before any work.
  """

  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)  # progress goes to stdout; absl INFO is noise here
    # Orbax logs each failed background write with a traceback; the checkpointer reports them in one line.
    logging.get_absl_logger().addFilter(_quiet_orbax)
    if len(argv) > 1 and not allow_args:
      raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    try:
      if _has_config() and flags.FLAGS.print_config:  # before any work: the workdir is never touched
        _print_config()
        return
      for name in text_flags:
        _check_utf8(name, flags.FLAGS[name].value)
      _check_remote_paths()
      if hardware.started_as_script():  # XLA's slow-compile banner becomes one line (not in another program's process)
        stderr_filter.start()
      with interrupts.watching():  # a signal while jax compiles is acknowledged at once, a second one stops at once
        if multihost:
          _initialize_distributed()
        main(argv)
    except Preempted as e:
      from bert_jax.train.preemption import EXIT_CODE  # pylint: disable=g-import-not-at-top
      print(f'preempted: {e}', file=sys.stderr, flush=True)
      sys.exit(EXIT_CODE)
    except CheckpointWriteError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      # Orbax's write threads still hold the failed save's futures; a normal shutdown prints a traceback
      # for each ("Event loop is closed"). Every file of ours is closed by now: leave at once.
      sys.stdout.flush()
      stderr_filter.stop()
      os._exit(1)  # pylint: disable=protected-access
    except BertJaxError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(1)
    except OSError as e:
      if 'config file' in str(e):  # ml_collections could not load --config; its last line says why
        print(f'error: --config: {str(e).strip().splitlines()[-1].strip()}', file=sys.stderr, flush=True)
        sys.exit(1)
      refused = files.refusal(e)  # a bucket that did not confirm access refused a read or write after all
      if refused:
        print(f'error: {refused}', file=sys.stderr, flush=True)
        sys.exit(1)
      if e.errno not in _FILESYSTEM_ERRNOS:
        raise
      print(f'error: {e.strerror} ({e.filename or "a file being written"}); {kept}', file=sys.stderr, flush=True)
      sys.exit(1)

  if not any(a.split('=')[0] in _HELP_FLAGS for a in sys.argv[1:]):  # --help is shown whatever the environment
    try:  # every entry point, huge_pages or not: a setting no reader takes fails before any work
      hardware.prepare_process(restart=huge_pages)
    except ConfigError as e:
      _fail(str(e))
  for holder in _MULTIHOST_FLAGS if multihost else ():  # --help of every entry point lists them beside its own
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
  if _has_config():
    for name in ('config', 'print_config'):  # defined here, in cli: listed as the entry point's own
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    if any(a.split('=')[0] in _HELP_FLAGS for a in sys.argv[1:]):
      _add_config_help()
  app.run(wrapped, flags_parser=_parse_flags)


def _has_config() -> bool:
  # define_config ran for this entry point (its flag is defined; _CONFIG alone may be an earlier one's in a test).
  return bool(_CONFIG) and 'print_config' in flags.FLAGS


def _config_spec() -> str:
  """The --config value given on the command line ('FILE[:VARIANT]'), else the entry point's default."""
  given = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--config=')]
  return given[-1] if given else _CONFIG['default']


def _add_config_help() -> None:
  # absl's --help prints the main module's docstring above the flags: the config's variants and main fields go there.
  main = sys.modules['__main__']
  extra = config_help.help_text(_config_spec(), _CONFIG['schema'])
  # absl %-formats the docstring (its '%s' become the program name): a literal '%' is written '%%'.
  main.__doc__ = (main.__doc__ or '').rstrip() + '\n\n' + extra.replace('%', '%%') + '\n'


def _print_config() -> None:
  config_help.print_config(flags.FLAGS['config'].config_filename, flags.FLAGS.config.to_dict(), _CONFIG['schema'],
                           config_overrides('model.'))


def _quiet_orbax(record) -> bool:
  """False for Orbax/asyncio log records the checkpointer reports in one line: each failed background
  write (a full disk logs one per array), and the warnings of reading a checkpoint read-only."""
  if 'orbax' not in record.pathname and 'asyncio' not in record.pathname:
    return True
  text = record.getMessage()
  if record.exc_info and record.exc_info[1] is not None:
    text += str(record.exc_info[1])
  return not any(m in text for m in files.WRITE_FAILURES + ('read_only=True', 'read only='))


# The flags and config fields (their last dotted part) that name a file the run reads: a bucket that does not confirm
# the credentials may read it refuses such a path only when the file itself cannot be read (files.check_reachable).
_FILES_READ = ('input', 'train_file', 'eval_file', 'sts_file')


def _check_remote_paths() -> None:
  """One error line before any work when a flag or config field names a gs:// or s3:// path whose filesystem
  package is not installed (Orbax would fail deep in its first save with a long traceback), then when its store
  cannot be reached or its bucket does not exist, or it names a file to read that the credentials may not read
  (gcsfs would retry for a minute first)."""
  given = [(key, text) for name in flags.FLAGS for key, text in _strings(flags.FLAGS[name].value, f'--{name}')]
  for key, text in given:
    files.check_remote(text, key)
  for key, text in given:
    files.check_reachable(text, key, reads_files=key.rsplit('.', 1)[-1].lstrip('-') in _FILES_READ)


def _strings(value, key: str):
  """(dotted key, text) of every string in a flag's value: a config's fields, lists, dicts."""
  if isinstance(value, str):
    yield key, value
  elif hasattr(value, 'items'):  # a ConfigDict or a dict
    for k, v in value.items():
      yield from _strings(v, f'{key}.{k}')
  elif isinstance(value, (list, tuple)):
    for v in value:
      yield from _strings(v, key)


def _check_utf8(name: str, value: str | None) -> None:
  """ConfigError for a flag value with bytes that are not UTF-8 (Python keeps them as lone surrogates)."""
  bad = next((i for i, ch in enumerate(value or '') if '\udc80' <= ch <= '\udcff'), None)
  if bad is not None:
    raise ConfigError(f'--{name} is not UTF-8 text (byte 0x{ord(value[bad]) - 0xdc00:02x} at character {bad}); '
                      'give UTF-8, e.g. convert it with iconv -f latin1 -t utf-8')


def _fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(1)


def _parse_flags(argv: list[str]) -> list[str]:
  # absl prints a multi-line 'FATAL Flags parsing error' (with the config file's traceback): one line instead.
  if _has_config() and any(a in _PRINT_CONFIG_ON for a in argv[1:]):
    _not_required('workdir')  # --print_config touches no workdir: it needs none
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _bad_config_value(str(e))
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    flag = lines[0].split(': ')[0] if lines else ''
    last = lines[-1] if lines else str(e)
    _fail(last if len(lines) == 1 else f'{flag}: {last.split(": ", 1)[-1]}')
  except (AttributeError, KeyError) as e:  # an unknown --config.KEY after an explicit --config=FILE
    _unknown_key(e)
  return []  # unreachable


_PRINT_CONFIG_ON = ('--print_config', '--print_config=true', '--print_config=True', '--print_config=1')


def _not_required(name: str) -> None:
  """Drops the required-value check absl attached to flag `name` (`required=True`), if it has one."""
  if name in flags.FLAGS:
    flag = flags.FLAGS[name]
    flag.validators = [v for v in flag.validators if 'must have a value other than None' not in v.message]


def _bad_config_value(message: str) -> None:
  """'--config.FIELD: expected int, got 'abc'' for a --config.* value of the wrong type (absl says 'flag
  --config.FIELD=abc: invalid literal for int() with base 10: 'abc''); nothing for any other flag error."""
  match = re.match(r"flag --(config\.[\w.]+)=(.*?): ", message)
  if not match or match.group(1) not in flags.FLAGS:
    return
  expected = flags.FLAGS[match.group(1)].parser.flag_type()
  _fail(f'--{match.group(1)}: expected {expected}, got {match.group(2)!r}')


def _unknown_key(e: Exception) -> None:
  # ml_collections' message: "'learnin_rate'\nDid you mean "learning_rate" instead of "learnin_rate"?" (a KeyError
  # or AttributeError whose first argument may itself be such a repr).
  text = str(e.args[0] if e.args else e)
  while len(text) > 1 and text[0] == text[-1] and text[0] in '\'"':
    text = text[1:-1].encode().decode('unicode_escape')
  key = text.splitlines()[0].strip('\'"') if text else ''
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  given = [a.split('=')[0] for a in sys.argv[1:]
           if a.startswith('--config.') and key and key in a.split('=')[0].split('.')]
  flag = given[0] if given else 'a --config.* flag'
  name = flag[len('--config.'):] if given else key
  if name in RENAMED:
    _fail(f'{flag} is now --config.{RENAMED[name]}')
  if name in REMOVED:
    _fail(f'{flag} is gone: {REMOVED[name]}')
  foreign = _foreign_flags() if field_readers(name) else None  # a field of another task kind's config type
  if foreign:
    _fail(foreign)
  if suggestion and given:
    parts = name.split('.')
    parts[parts.index(key)] = suggestion.group(1)
    _fail(f'unknown field {name} in {flag}; did you mean {".".join(parts)}?')
  hint = f'; did you mean {suggestion.group(1)}?' if suggestion else ''
  _fail(f'unknown field {name} in {flag}{hint} (the config file\'s fields are the valid keys: --helpfull)')


def _foreign_flags() -> str | None:
  """'--config.a and --config.b are fields of the retrieval task; this run's task is sst2 (classification), which
  does not read them': every --config flag given that the config file's task does not read; None for a config file
  without a task (evaluate.py's: its fields are the evaluation settings)."""
  try:
    module, variant = config_help.load_config_module(_config_spec())
    task = (module.get_config(variant) if variant else module.get_config()).get('task')
  except Exception:  # pylint: disable=broad-except  # the config file's own error comes when absl loads it
    task = None
  if not isinstance(task, str):
    return None
  given_task = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--config.task=')]
  if given_task and config_type(given_task[-1]) is not config_type(task):
    return (f'--config.task={given_task[-1]}: task {given_task[-1]!r} is configured by '
            f'{config_type(given_task[-1]).__name__}, this config file\'s task {task!r} by '
            f'{config_type(task).__name__}: start from a config variant made for {given_task[-1]!r} '
            f'(--config=FILE:VARIANT; --help lists them)')
  unread: dict[str, list[str]] = {}
  for given in dict.fromkeys(a.split('=')[0][len('--config.'):] for a in sys.argv[1:] if a.startswith('--config.')):
    readers = foreign_field(given, task)
    if readers:
      unread.setdefault(readers, []).append(f'--config.{given}')
  return unread_fields(unread, task) if unread else None


def define_config(default: str, help_text: str, schema: type | None = None):
  """`config_flags.DEFINE_config_file('config', default)`, one line for an unknown --config.KEY override, and
  --print_config.

  ml_collections applies the overrides while the flag is defined (at import), where an unknown key
  would escape as a traceback. `schema` (PretrainConfig, FinetuneConfig) is the class the config becomes: --help
  lists its main fields, --print_config resolves the config with it (parameters, tokens per step).
  """
  _CONFIG.update(default=default, schema=schema)
  flags.DEFINE_bool('print_config', False, 'Print the resolved config, what the --config.* flags changed, the '
                    'parameter count and the tokens per step, then exit (nothing is written).')
  try:
    return config_flags.DEFINE_config_file('config', default, help_text)
  except (AttributeError, KeyError) as e:
    _unknown_key(e)
  except Exception as e:  # pylint: disable=broad-except  # a bad value or variant inside the config file
    _fail(f'--config: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}')


def config_overrides(section: str = '') -> set[str]:
  """The config fields given as --config.FIELD flags on the command line (dotted, without 'config.'),
  those under `section` (e.g. 'model.') only, with that prefix removed."""
  out = set()
  for arg in sys.argv[1:]:
    name = arg.lstrip('-').split('=')[0]
    name = name[2:] if name.startswith('noconfig.') else name  # --noconfig.x: a boolean set to False
    if arg.startswith('--') and name.startswith('config.' + section):
      out.add(name[len('config.' + section):])
  return out


def _initialize_distributed() -> None:
  from bert_jax import distributed  # pylint: disable=g-import-not-at-top  # imports jax
  # Before main: jax.distributed must start before anything initializes a jax backend.
  ids = _LOCAL_DEVICE_IDS.value
  try:
    ids = None if ids is None else [int(i) for i in ids]
  except ValueError:
    raise ConfigError(f'--local_device_ids takes comma-separated integers, got {",".join(ids)!r}') from None
  distributed.initialize(_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value, ids,
                         mode=_DISTRIBUTED.value)


# The SLURM array script that --slurm_template replaces (`launcher`).
ARRAY_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'launch', 'array.sbatch')


def define_launcher_flags(noun: str = 'cell'):
  """--launcher, --gather, --dry_run and the SLURM flags of the scripts that run many cells (sweep.py, ladder.py;
  `noun`: what their help calls a cell); --help lists them as the script's own."""
  defined = dict(
      dry_run=flags.DEFINE_bool('dry_run', False, f'Print one shell-quoted command per pending {noun}; run nothing.'),
      launcher=flags.DEFINE_enum('launcher', 'local', ('local', 'slurm'), 'local: run the cells here, one after '
                                 'another; slurm: write job arrays (one cell per array task) and submit them.'),
      gather=flags.DEFINE_bool('gather', False, 'Run nothing: build the results from what the cells left (after '
                               '--launcher=slurm, or while they run).'),
      template=flags.DEFINE_string('slurm_template', None, 'The array script template (default '
                                   'experiments/launch/array.sbatch): your cluster\'s partition, account, GPUs.'),
      sbatch=flags.DEFINE_string('slurm_sbatch', '', 'Extra sbatch options for every array task, e.g. '
                                 '"--partition=gpu --gpus=1 --time=4:00:00".'),
      submit=flags.DEFINE_bool('slurm_submit', True, 'Submit the arrays with sbatch (--noslurm_submit: only '
                               'write them and print how to submit).'),
  )
  for holder in defined.values():
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
  return defined


def launcher(defined) -> dict[str, Any]:
  """The values of `define_launcher_flags`' flags, as `bert_jax.launch.cells.run` takes them: the array template
  defaults to experiments/launch/array.sbatch."""
  values = {name: holder.value for name, holder in defined.items()}
  return {**values, 'template': values['template'] or ARRAY_TEMPLATE}
