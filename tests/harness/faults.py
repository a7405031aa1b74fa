"""Faults injected into a run: kill -9 and signals at chosen points, failing reads, a process signalled mid-compile.

Production behaviour changed, and where:
  kill_after_save(step)         a `processes.script_code` patch, in the process it starts: wraps
                                bert_jax.runs.checkpoints.Checkpointer.save to SIGKILL the process once the
                                checkpoint of `step` is written
  sigterm_at_batch(n)           a `processes.script_code` patch: wraps bert_jax.data.loader.PretrainingBatches.__next__
                                to SIGTERM the process as it fetches the n-th training batch
  sigterm_at_pretraining_batch  the same in the test process, monkeypatched for the block
  signal_at_finetuning_batch    monkeypatches bert_jax.finetuning.batching.batch_indices, for the block, to signal
                                the test process as fine-tuning fetches a step's batch
  SpyDataset                    patches nothing: a wrapper a test passes where a PretrainingDataset goes; it records
                                the reads and fails chosen ones (OSError)
  compiling_entry, SignalledRun change nothing of the library: a script of their own, run without the persistent
                                compilation cache, that a test signals while it compiles
"""

import contextlib
import os
import subprocess
import sys

from harness.inputs import REPO


class SpyDataset:
  """Wraps a PretrainingDataset and records which indices were read; its `fail_on_call`-th
  read fails, and so does any read of record `fail_on_index`.

  Picklable (grain workers get a copy: their reads stay in the worker).
  """

  def __init__(self, dataset, fail_on_call=None, fail_on_index=None):
    self.dataset, self.read, self.calls, self.fail_on_call = dataset, [], 0, fail_on_call
    self.fail_on_index = fail_on_index

  def __len__(self):
    return len(self.dataset)

  @property
  def lengths(self):
    return self.dataset.lengths

  def gather(self, indices, width):
    self.calls += 1
    if self.calls == self.fail_on_call or self.fail_on_index in indices:
      raise OSError('disk on fire')
    self.read.extend(int(i) for i in indices)
    return self.dataset.gather(indices, width)


def kill_after_save(step: int) -> str:
  """A `script_code` patch: kill -9 of the process right after its checkpoint of `step` is written."""
  return f"""
import os, signal
from bert_jax.runs import checkpoints as checkpointing
save = checkpointing.Checkpointer.save
def killing_save(self, step, *a, **k):
  out = save(self, step, *a, **k)
  if step == {step}:
    self.wait()
    os.kill(os.getpid(), signal.SIGKILL)
  return out
checkpointing.Checkpointer.save = killing_save
"""


def sigterm_at_batch(n: int) -> str:
  """A `pretrain_subprocess` patch: SIGTERM to itself while the n-th training batch is fetched, mid-step and
  away from any log or checkpoint step, as a scheduler's would arrive."""
  return f"""
import os, signal
from bert_jax.data import loader
fetch = loader.PretrainingBatches.__next__
calls = [0]
def next_batch(self):
  calls[0] += 1
  if calls[0] == {n}:
    os.kill(os.getpid(), signal.SIGTERM)
  return fetch(self)
loader.PretrainingBatches.__next__ = next_batch
"""


@contextlib.contextmanager
def sigterm_at_pretraining_batch(monkeypatch, n: int):
  """`sigterm_at_batch` in this process: SIGTERM to itself while the n-th training batch is fetched, for the block's
  duration (a run_main in it exits 75). Where the process boundary is not what a test checks: a process of its own
  paid Python's start, jax's import and every trace again (8-12 s of a suite)."""
  import signal  # pylint: disable=g-import-not-at-top

  from bert_jax.data import loader  # pylint: disable=g-import-not-at-top
  fetch, calls = loader.PretrainingBatches.__next__, [0]

  def next_batch(self):
    calls[0] += 1
    if calls[0] == n:
      os.kill(os.getpid(), signal.SIGTERM)
    return fetch(self)

  with monkeypatch.context() as m:
    m.setattr(loader.PretrainingBatches, '__next__', next_batch)
    yield


@contextlib.contextmanager
def signal_at_finetuning_batch(monkeypatch, step: int, signum=None):
  """Sends `signum` (SIGTERM) to this process when fine-tuning fetches the batch of step `step` (the step before
  trains meanwhile), for the block's duration."""
  import signal  # pylint: disable=g-import-not-at-top

  from bert_jax.finetuning import batching  # pylint: disable=g-import-not-at-top
  indices = batching.batch_indices

  def signalling(num_train, batch_size, seed, k, shuffle=True):
    if k == step:
      os.kill(os.getpid(), signum or signal.SIGTERM)
    return indices(num_train, batch_size, seed, k, shuffle)

  monkeypatch.setattr(batching, 'batch_indices', signalling)
  try:
    yield
  finally:
    monkeypatch.setattr(batching, 'batch_indices', indices)


def compiling_entry(directory, links: int, inside: str = '') -> str:
  """An entry point (through experiments/cli.run) whose main compiles a chain of `links` distinct small matrix
  products: outside any Preemption, or inside one, inside='training' (the compile of step 1, as a train step's) or
  'immediately' (as data preparation). It prints 'compiling' on stdout as the compile starts and 'compiled' on
  stderr when it returns. Under the tests' XLA flags on 2 loaded cores 1,500 links compile in 5-10 s and 3,000 in
  about 40 s, in under 1 GB."""
  path = os.path.join(str(directory), 'compiling.py')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(f'''import sys
sys.path[:0] = [{REPO!r}, {os.path.join(REPO, 'experiments')!r}]
import cli

def main(argv):
  import contextlib
  import jax, jax.numpy as jnp
  from bert_jax.errors import Preempted
  from bert_jax.train.preemption import Preemption
  def chain(x, w):
    for i in range({links}):
      x = jnp.tanh(x @ w[i % 7]) + i
    return x
  lowered = jax.jit(chain).lower(jnp.ones((4, 16)), jnp.ones((7, 16, 16)))
  with Preemption() if {inside!r} else contextlib.nullcontext() as preempt:
    with preempt.immediately('preparing the data') if {inside!r} == 'immediately' else contextlib.nullcontext():
      if {inside!r} == 'training':
        preempt.stop_now(0, synced=False)  # step 1 is the one in flight
      print('compiling', flush=True)
      lowered.compile()
      print('compiled', file=sys.stderr, flush=True)
    if {inside!r} == 'training' and preempt.stop_now(1, synced=False):
      raise Preempted(preempt.message(1, saved=False))

cli.run(main, multihost=False)
''')
  return path


class SignalledRun:
  """`script` in a process of its own that compiles (no persistent compilation cache), its stderr lines timed as they
  come; `send` signals it."""

  def __init__(self, script: str):
    import threading  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top
    self._time = time.monotonic
    env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
    self.proc = subprocess.Popen([sys.executable, script], env={**env, 'JAX_ENABLE_COMPILATION_CACHE': 'false'},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.lines: list[tuple[float, str]] = []  # (when, line) of stderr
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append((self._time(), line.rstrip('\n')))

  def started(self) -> None:
    """Waits for 'compiling' on stdout."""
    assert self.proc.stdout.readline() == 'compiling\n', self.stderr

  def send(self, signum) -> float:
    self.proc.send_signal(signum)
    return self._time()

  def line(self, start: str, timeout: float = 60.0) -> float:
    """When the first stderr line starting with `start` came (waits for it up to `timeout` seconds)."""
    import time  # pylint: disable=g-import-not-at-top
    deadline = self._time() + timeout
    while self._time() < deadline:
      found = [t for t, l in list(self.lines) if l.startswith(start)]
      if found:
        return found[0]
      if self.proc.poll() is not None and not self._reader.is_alive():
        break
      time.sleep(0.02)
    raise AssertionError(f'no line starting {start!r} on stderr:\n{self.stderr}')

  def wait(self, timeout: float) -> int:
    try:
      self.proc.wait(timeout=timeout)
    finally:
      self.proc.kill()
      self._reader.join(timeout=10)
    return self.proc.returncode

  @property
  def stderr(self) -> str:
    return '\n'.join(l for _, l in list(self.lines))
