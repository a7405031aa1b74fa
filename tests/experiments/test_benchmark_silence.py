"""experiments/benchmark_silence.py: the time to a command's first line and its longest silence, measured on a
command whose timing is known."""

import json
import sys

from harness.entry_points import run_main

_SCRIPT = ('import sys, time\n'
           'time.sleep(0.4); print("first", flush=True)\n'
           'time.sleep(1.2); print("second", file=sys.stderr, flush=True)\n'
           'print("third", flush=True); sys.exit(3)')


def test_first_line_and_longest_silence(tmp_path):
  result = run_main('benchmark_silence.py', f'--log={tmp_path / "lines.txt"}', '--', sys.executable, '-c', _SCRIPT)
  assert result.returncode == 3  # the command's own
  timed = json.loads(result.stdout.strip().splitlines()[-1])
  assert result.stdout.splitlines()[0].startswith('| command | first line | longest silence |')
  logged = [line.split() for line in (tmp_path / 'lines.txt').read_text(encoding='utf-8').splitlines()]
  assert [text for _, text in logged] == ['first', 'second', 'third'] and timed['lines'] == 3  # stderr counts too
  # What the sleeps guarantee on any machine, however busy: the first line comes after 0.4 s, the second 1.2 s
  # after it, so the longest silence is at least half of 1.6 s. Upper bounds, and which gap is the longest, depend
  # on how late a busy machine starts the command and reads its lines: they are checked against the log instead.
  assert timed['first_line_s'] >= 0.4 and timed['wall_s'] >= 1.6 and timed['longest_silence_s'] >= 0.8
  # The JSON line is the log's own timing (each time written to 0.01 s: a gap of two is off by up to 0.01 s): the
  # first arrival, and the longest of the gaps before, between and after the lines, named by the line it follows.
  arrived = [float(t) for t, _ in logged]
  assert abs(timed['first_line_s'] - arrived[0]) <= 0.0051
  gaps = dict(zip(['(the start)', 'first', 'second', 'third'],
                  [b - a for a, b in zip([0.0] + arrived, arrived + [timed['wall_s']])]))
  assert abs(timed['longest_silence_s'] - max(gaps.values())) <= 0.0101, (timed, gaps)
  assert abs(gaps[timed['silence_after']] - timed['longest_silence_s']) <= 0.0101, (timed, gaps)


def test_no_command_is_one_error_line():
  result = run_main('benchmark_silence.py')
  assert result.returncode == 1 and result.stderr.startswith('error: give the command to time after --')
