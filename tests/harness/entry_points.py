"""experiments/ entry points run by a test: in a subprocess (`run_experiment`), or in the test process (`run_main`,
which the rest here use: the README's commands, a short fine-tuning on own or SST-2 files, an export refused), and
their one-line errors (`assert_one_line_error`).

Production behaviour changed: `run_main` runs an entry point's `__main__` (runpy) in the test process. It deletes
the absl flags an earlier script defined and unparses the base ones (absl's and cli's, defined once per process),
replaces sys.argv, chdirs to `cwd`, redirects sys.stdout and sys.stderr into strings (with `children`: dup2s file
descriptors 1 and 2 onto temporary files, so the commands the script starts are captured too, in order), turns the
script's SystemExit into the returned exit code, and restores the directory, sys.argv and `reporting.log_to`'s
stream afterwards. `run_readme_commands_as_a_user` runs the README's commands through it in a process of its own,
with the machine's devices and XLA's default flags (`processes.user_environment`).
"""

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys

from harness.digests import tree_digest
from harness.inputs import REPO, head_of_task_file, shared_data_or_skip
from harness.processes import user_environment


def run_experiment(script, *args, timeout=600):
  """Runs experiments/<script> in a subprocess from the repository root."""
  import subprocess  # pylint: disable=g-import-not-at-top,multiple-imports
  import sys
  return subprocess.run([sys.executable, os.path.join('experiments', script), *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


_BASE_FLAGS: set[str] = set()


class _FdCapture:
  """File descriptor `fd` (1 or 2) appended to a temporary file until `close`, and `stream`, a line-buffered text stream
  onto it: what this process writes there and what the processes it starts write, in the order they write it."""

  def __init__(self, fd: int):
    import fcntl  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top
    self.fd, self.file, self.saved = fd, tempfile.TemporaryFile(), os.dup(fd)
    fcntl.fcntl(self.file.fileno(), fcntl.F_SETFL, fcntl.fcntl(self.file.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    os.dup2(self.file.fileno(), fd)
    self.stream = open(fd, 'w', buffering=1, encoding='utf-8', closefd=False)  # pylint: disable=consider-using-with

  def close(self) -> str:
    self.stream.flush()
    os.dup2(self.saved, self.fd)
    os.close(self.saved)
    self.file.seek(0)
    text = self.file.read().decode('utf-8', 'replace')
    self.file.close()
    return text


def run_main(script, *args, cwd=REPO, children: bool = False) -> subprocess.CompletedProcess:
  """Runs experiments/<script> as its `__main__` in this process, from `cwd` (the repository root, as
  run_experiment) (its main through cli.run: flags, error lines, exit code) and returns what `run_experiment` would:
  returncode, stdout, stderr.

  Each run defines the script's flags afresh: the flags an earlier script defined are removed first (entry points
  share names such as --workdir and --config). Where the library's lines go (`reporting.log_to`, which some
  scripts point at their stderr) is restored afterwards. `children`: the output of the commands the script starts
  (a sweep's or a ladder's cells: they write to file descriptors 1 and 2, not to sys.stdout) is captured too, in
  order.
  """
  import io  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  import cli  # pylint: disable=g-import-not-at-top,unused-import  (its flags are defined once, with the base)
  from bert_jax.runs import reporting  # pylint: disable=g-import-not-at-top
  if not _BASE_FLAGS:
    app.define_help_flags()  # --help, --helpfull: absl defines them once per process; they stay with the base
    _BASE_FLAGS.update(flags.FLAGS)
  for name in set(flags.FLAGS) - _BASE_FLAGS:
    delattr(flags.FLAGS, name)
  for name in _BASE_FLAGS:  # as in a new process: an earlier run's --num_processes=2 must not carry over
    flags.FLAGS[name].unparse()
  path = os.path.join(REPO, 'experiments', script)
  captures = [_FdCapture(1), _FdCapture(2)] if children else []
  out, err = (c.stream for c in captures) if children else (io.StringIO(), io.StringIO())
  code, argv, here, stream = 0, sys.argv, os.getcwd(), reporting._stream  # pylint: disable=protected-access
  sys.argv = [path, *args]
  os.chdir(cwd)  # relative paths (--config=experiments/configs/...) as run_experiment reads them
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      runpy.run_path(path, run_name='__main__')
  except SystemExit as e:  # absl's app.run always exits
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    sys.argv = argv
    os.chdir(here)
    reporting.log_to(stream)
    texts = [c.close() for c in captures] or [out.getvalue(), err.getvalue()]
  return subprocess.CompletedProcess([script, *args], code, *texts)


def assert_one_line_error(result, pattern):
  """Exit code 1, exactly one 'error:' line containing `pattern`, no traceback."""
  assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and pattern in errors[0], result.stderr[-3000:]
  assert 'Traceback' not in result.stderr


# What the README's commands get added, to run in seconds: tiny budgets, the same code paths. A fine-tuning run
# evaluates its whole dev set (SST-2's 872 sentences, RTE's 277 pairs twice in the sweep): 16 tokens a row, not the
# variant's 64 or 128, cut that evaluation about fourfold (SST-2 on all-MiniLM: 32 s to 9 s on 2 loaded cores).
_README_BUDGETS = {
    'pretrain.py': ['--config.num_train_steps=2', '--config.eval_every=2', '--config.checkpoint_every=2',
                    '--config.log_every=1', '--config.max_eval_batches=1'],
    'finetune.py': ['--config.num_train_steps=2', '--config.max_train_samples=32', '--config.num_seeds=1',
                    '--config.max_seq_length=16', '--config.log_every=1'],
}


def readme_commands(tmp) -> list[list[str]]:
  """The README's commands (the main job, then the tour), /tmp/ moved to `tmp`, with tiny budgets."""
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    blocks = re.findall(r'```bash\n(.*?)```', f.read(), re.S)
  lines = [l.split('&& ')[-1] for b in blocks[:2] for l in b.splitlines()
           if 'experiments/' in l and not l.lstrip().startswith('#')]
  out = []
  for line in lines:
    argv = shlex.split(line.replace('/tmp/', f'{tmp}/'))
    inner = argv.index('--') if '--' in argv else len(argv)
    script = os.path.basename(next(a for a in argv[inner:] + argv if a.startswith('experiments/')))
    budget = _README_BUDGETS.get(script, [])
    if any(a.endswith('pretrain.py:recipe') for a in argv):  # a run in phases: its length is theirs
      budget = [f'--config.phases.{p}.steps=1' for p in ('stable', 'extend', 'decay')] + budget[1:]
    out.append(argv + budget)
  return out


def readme_script(argv: list[str]) -> str:
  """The entry point a README command (`readme_commands`) runs: sweep.py for `sweep.py ... -- finetune.py ...`."""
  return os.path.basename(next(a for a in argv if a.startswith('experiments/')))


def run_readme_command(argv: list[str]) -> subprocess.CompletedProcess:
  """A README command (`readme_commands`): its entry point's main() in this process (run_main: its flags, output and
  exit code as a shell gives them): a subprocess each would pay Python's and jax's start-up fourteen times. The
  commands a sweep or a ladder starts (after --) are still processes of their own, run by `python3` as in a shell."""
  argv = [sys.executable if a == 'python3' else a for a in argv]
  at = next(i for i, a in enumerate(argv) if a.startswith('experiments/'))
  script = os.path.basename(argv[at])
  return run_main(script, *argv[at + 1:], children=script in ('sweep.py', 'ladder.py'))


_AS_A_USER = """
import faulthandler, json, sys
faulthandler.enable()  # a crash names where it happened in the runner's stderr (a kill -9 shows as exit code -9)
sys.path[:0] = [{tests!r}, {experiments!r}]
from absl import flags
flags.FLAGS.mark_as_parsed()  # as conftest: the library's grain reads absl flags
from harness.entry_points import run_readme_command
with open({commands!r}, encoding='utf-8') as f:
  commands = json.load(f)
for argv in commands:
  r = run_readme_command(argv)
  with open({results!r}, 'a', encoding='utf-8') as f:
    f.write(json.dumps([argv, r.returncode, r.stdout[-20000:], r.stderr[-20000:]]) + '\\n')
  if r.returncode:
    break
"""


def run_readme_commands_as_a_user(commands: list[list[str]], tmp) -> list[subprocess.CompletedProcess]:
  """README commands (`readme_commands`) in order, as a user runs them: in one process of their own with the
  machine's own devices and XLA's default flags (`user_environment`), each command's main() in turn
  (`run_readme_command`: one Python start and jax import for all), up to the first that fails. Their exit codes
  and output, one per command run. Real-size models (MiniLM) use 8 copies of their state on 8 fake devices:
  7.9 GiB against 3.5 GiB here, beside a second test worker on a 24 GiB machine."""
  commands_file, results_file = os.path.join(tmp, 'readme_commands.json'), os.path.join(tmp, 'readme_results.jsonl')
  with open(commands_file, 'w', encoding='utf-8') as f:
    json.dump(commands, f)
  code = _AS_A_USER.format(tests=os.path.join(REPO, 'tests'), experiments=os.path.join(REPO, 'experiments'),
                           commands=commands_file, results=results_file)
  runner = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=user_environment(), capture_output=True,
                          text=True, timeout=1800)
  results = []
  if os.path.exists(results_file):
    with open(results_file, encoding='utf-8') as f:
      results = [subprocess.CompletedProcess(*json.loads(line)) for line in f]
  if runner.returncode and (not results or not results[-1].returncode):  # the runner itself failed
    results.append(subprocess.CompletedProcess(commands[len(results)], runner.returncode, runner.stdout,
                                               f'the runner exited with {runner.returncode}:\n{runner.stderr}'))
  return results


def finetune_own_file(variant: str, workdir, checkpoint: str, train_file: str, *extra: str) -> dict:
  """finetune.py:<variant> (a task of your own files) on `train_file` from `checkpoint`, in process, with a 3-step
  budget at batch 8 and length 32 and 20% of the rows held out; returns its final JSON line."""
  result = run_main('finetune.py', f'--config=experiments/configs/finetune.py:{variant}', f'--workdir={workdir}',
                    f'--config.init_checkpoint={checkpoint}', f'--config.train_file={train_file}',
                    '--config.num_train_steps=3', '--config.batch_size=8', '--config.max_seq_length=32',
                    '--config.eval_fraction=0.2', *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def finetune_small_sst2(checkpoint: str, workdir: str, tmp_path, steps: int = 2) -> dict:
  """finetune.py:sst2 from `checkpoint` on the first 48 training and 16 dev rows of ../shared/data's SST-2 (copied
  into `tmp_path`; skipped without it), `steps` steps at batch 8 and length 32, in process; returns its final
  JSON line."""
  data = shared_data_or_skip('sst2')
  head_of_task_file(os.path.join(data, 'train.tsv'), 48, tmp_path)
  head_of_task_file(os.path.join(data, 'dev.tsv'), 16, tmp_path)
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:sst2', f'--workdir={workdir}',
                    f'--config.init_checkpoint={checkpoint}', f'--config.data_dir={tmp_path}',
                    f'--config.num_train_steps={steps}', '--config.batch_size=8', '--config.max_seq_length=32')
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def assert_export_refused(directory: str, out: str, pattern: str) -> None:
  """export_hf.py of `directory` fails with one error line matching `pattern`, writes no `out` and leaves
  `directory` as it was."""
  before = tree_digest(directory)
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={directory}', f'--output={out}'), pattern)
  assert not os.path.exists(out) and tree_digest(directory) == before
