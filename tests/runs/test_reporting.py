"""reporting.Ticker: the progress lines of long evaluations and predictions (no stretch silent for longer than its
interval; nothing from a short loop)."""

from bert_jax.runs import reporting


def _lines(monkeypatch, times, total, every_s=10.0):
  clock, printed = iter(times), []
  monkeypatch.setattr(reporting.time, 'perf_counter', lambda: next(clock))
  monkeypatch.setattr(reporting, 'log', printed.append)
  ticker = reporting.Ticker('evaluating dev', total, every_s=every_s)
  for done in range(1, total + 1):
    ticker.tick(done)
  return printed


def test_a_line_each_interval_and_one_at_the_end(monkeypatch):
  # start at 0 s; batches finish at 4, 11, 15, 23 and 24 s
  lines = _lines(monkeypatch, [0, 4, 11, 15, 23, 24], total=5)
  assert lines == ['evaluating dev: 2/5 batches | elapsed 11s | ETA 16s',
                   'evaluating dev: 4/5 batches | elapsed 23s | ETA 5s',
                   'evaluating dev: 5/5 batches | elapsed 24s | ETA 0s']


def test_a_short_loop_prints_nothing(monkeypatch):
  assert _lines(monkeypatch, [0, 1, 2, 3], total=3) == []
