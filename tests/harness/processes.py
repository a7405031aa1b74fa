"""Processes of their own, where the process boundary is what a test checks: the processes of one jax.distributed
run on localhost (`start_two`, `launch_process`, `wait_all`, `succeed`, `free_port`, `prints_nothing`), an entry
point run after a patch (`script_code`, `pretrain_subprocess`, `pretrain_flags`; the patches are in faults.py), and
the environments they get (`xla_flags`, `user_environment`).

Production behaviour changed: none in the test process. `launch_process` gives a process the tests' XLA flags
(conftest's profile) with its own device count and JAX_PLATFORMS=cpu; `user_environment` is a user's environment,
without what conftest adds.
"""

import os
import re
import socket
import subprocess
import sys

from harness.inputs import REPO


MULTIPROCESS_TIMEOUT_S = 240  # a process waiting on a dead peer fails the test instead of hanging CI


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def xla_flags(devices: int | None = None) -> str:
  """This process's XLA_FLAGS (the developer's own, e.g. --xla_cpu_max_isa=AVX2, and the tests') for a process with
  `devices` fake CPU devices (None: XLA's one): a process a test compares with keeps the kernels this one runs."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  return ' '.join(flags + ([f'--xla_force_host_platform_device_count={devices}'] if devices else []))


def user_environment() -> dict[str, str]:
  """This process's environment less what conftest adds for the tests (8 fake devices, XLA's optimisation off)."""
  added = {'--xla_force_host_platform_device_count=8', *os.environ.get('BERT_JAX_TEST_XLA_FLAGS', '').split()}
  env = dict(os.environ, XLA_FLAGS=' '.join(f for f in os.environ.get('XLA_FLAGS', '').split() if f not in added))
  if not env['XLA_FLAGS']:
    del env['XLA_FLAGS']
  return env


def launch_process(script, args, devices, **env):
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(devices), **env)
  return subprocess.Popen([sys.executable, script, *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_two(script, args):
  """`script` as processes 0 and 1 of a 2-process run, 4 devices each."""
  address = f'localhost:{free_port()}'
  return [launch_process(script, [*args, f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}'], 4)
          for i in range(2)]


def wait_all(procs) -> list[subprocess.CompletedProcess]:
  """Waits for all; kills whatever still runs when one times out."""
  results = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=MULTIPROCESS_TIMEOUT_S)
      results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return results


def succeed(procs) -> list[str]:
  results = wait_all(procs)
  for r in results:
    assert r.returncode == 0, r.stderr[-3000:]
  return [r.stdout for r in results]


# gloo's connection message, "[Gloo] Rank R is connected to N peer ranks. Expected number of connected peer ranks
# is : N", is written in pieces; its threads interleave them anywhere between pieces (even across lines).
_GLOO_PIECES = re.compile(r'\[Gloo\] Rank | is connected to | peer ranks\. |Expected number of connected peer ranks is : ')


def prints_nothing(stdout) -> bool:
  """True when a process printed nothing but gloo's connection messages."""
  return re.fullmatch(r'[\d\s]*', _GLOO_PIECES.sub('', stdout)) is not None


def pretrain_flags(corpus: str, cache: str, workdir: str, steps: int, extra=()) -> list[str]:
  """The flags of `pretrain_subprocess`'s run, for the same run in this process:
  `run_main('pretrain.py', *pretrain_flags(...))` (an uninterrupted run, or the resume after a killed one)."""
  return [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
          f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}',
          f'--config.num_train_steps={steps}', '--config.checkpoint_every=10', '--config.log_every=10',
          '--config.eval_every=1000', '--config.data.eval_fraction=0.4', *extra]


def pretrain_subprocess(corpus: str, cache: str, workdir: str, steps: int, patch: str = '', extra=()) -> list[str]:
  """A command running experiments/pretrain.py (tiny variant; checkpoints and logs every 10 steps; `extra`
  flags) in a fresh Python that first runs `patch`: code that wraps a library function to inject a fault."""
  import sys  # pylint: disable=g-import-not-at-top
  return [sys.executable, '-c', script_code(['pretrain.py', *pretrain_flags(corpus, cache, workdir, steps, extra)], patch)]


def script_code(argv: list[str], patch: str = '') -> str:
  """Python code that runs experiments/<argv[0]> as its main with `argv`, after running `patch` (from the
  repository root, with experiments/ on the path as when the script runs itself)."""
  return (f'import runpy, sys\nsys.path.insert(0, "experiments")\nsys.argv = {list(argv)!r}\n{patch}\n'
          f'runpy.run_path("experiments/{argv[0]}", run_name="__main__")\n')
