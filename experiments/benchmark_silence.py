"""Times what a command prints: when its first line comes and its longest silence (no line on stdout or stderr).

A run that says nothing for long looks hung; the targets are a first line within 10 s and no silence over 15 s
(docs/results.md keeps the figures of the main job and an SST-2 fine-tune). The command runs with its output
merged; each line is timed as it arrives and, with --log, written there with its time. Prints one Markdown table
row (and the header) and a JSON line; exits with the command's exit code.

  python3 experiments/benchmark_silence.py -- python3 experiments/pretrain.py --workdir=/tmp/bert_mini
  python3 experiments/benchmark_silence.py --log=/tmp/sst2_lines.txt -- python3 experiments/finetune.py \
      --config=experiments/configs/finetune.py:sst2 --workdir=/tmp/sst2
"""

import json
import os
import subprocess
import sys
import time

from absl import flags

from bert_jax.errors import ConfigError

import cli

_LOG = flags.DEFINE_string('log', None, 'Write every line of the command here, each with its time in seconds.')

HEADER = '| command | first line | longest silence | after the line | lines | wall | exit |\n|---|---|---|---|---|---|---|'


def time_lines(command: list[str], log=None) -> dict:
  """Runs `command`; returns when its first line came, its longest silence and the line before it, in seconds."""
  start = time.monotonic()
  first, longest, before, last, count = None, 0.0, '(the start)', 0.0, 0
  with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                        errors='replace') as proc:
    previous = '(the start)'
    for line in proc.stdout:
      now = time.monotonic() - start
      first = now if first is None else first
      if now - last > longest:
        longest, before = now - last, previous
      last, previous, count = now, line.rstrip('\n'), count + 1
      if log:
        log.write(f'{now:9.2f} {previous}\n')
    code = proc.wait()
  wall = time.monotonic() - start
  if wall - last > longest:  # the silence before it ended
    longest, before = wall - last, previous
  return {'command': ' '.join(command), 'first_line_s': first, 'longest_silence_s': longest,
          'silence_after': before[:80], 'lines': count, 'wall_s': wall, 'exit_code': code}


def main(argv):
  command = argv[1:]
  if not command:
    raise ConfigError('give the command to time after --, e.g. -- python3 experiments/pretrain.py --workdir=DIR')
  log = open(_LOG.value, 'w', encoding='utf-8') if _LOG.value else None  # pylint: disable=consider-using-with
  try:
    result = time_lines(command, log)
  finally:
    if log:
      log.close()
  first = 'none' if result['first_line_s'] is None else f'{result["first_line_s"]:.1f} s'
  print(HEADER)
  print(f'| `{os.path.basename(command[1]) if len(command) > 1 else command[0]}` | {first} | '
        f'{result["longest_silence_s"]:.1f} s | `{result["silence_after"]}` | {result["lines"]} | '
        f'{result["wall_s"]:.0f} s | {result["exit_code"]} |')
  print(json.dumps(result))
  sys.exit(result['exit_code'])


if __name__ == '__main__':
  cli.run(main, allow_args=True, multihost=False, kept='nothing was written')
