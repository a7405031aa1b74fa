"""experiments/benchmark_silence.py: the time to a command's first line and its longest silence, measured on a
command whose timing is known."""

import json
import sys

from helpers import run_main

_SCRIPT = ('import sys, time\n'
           'time.sleep(0.4); print("first", flush=True)\n'
           'time.sleep(1.2); print("second", file=sys.stderr, flush=True)\n'
           'print("third", flush=True); sys.exit(3)')


def test_first_line_and_longest_silence(tmp_path):
  result = run_main('benchmark_silence.py', f'--log={tmp_path / "lines.txt"}', '--', sys.executable, '-c', _SCRIPT)
  assert result.returncode == 3  # the command's own
  timed = json.loads(result.stdout.strip().splitlines()[-1])
  assert timed['lines'] == 3 and timed['silence_after'] == 'first'  # stderr counts as output too
  assert 0.3 <= timed['first_line_s'] < 3 and 1.0 <= timed['longest_silence_s'] < 3  # sleeps of 0.4 and 1.2 s
  assert result.stdout.splitlines()[0].startswith('| command | first line | longest silence |')
  logged = (tmp_path / 'lines.txt').read_text(encoding='utf-8').splitlines()
  assert [line.split()[1] for line in logged] == ['first', 'second', 'third']


def test_no_command_is_one_error_line():
  result = run_main('benchmark_silence.py')
  assert result.returncode == 1 and result.stderr.startswith('error: give the command to time after --')
