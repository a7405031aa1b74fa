"""experiments/benchmark_gradcache.py: the plain contrastive step and GradCache's at one global batch, as a table."""

import json

import pytest

from harness.entry_points import run_main


@pytest.mark.slow
def test_gradcache_needs_less_memory_than_the_plain_step_at_the_same_batch():
  r = run_main('benchmark_gradcache.py', '--preset=tiny', '--batch_size=16', '--micro_batch_size=4', '--query_len=8',
               '--passage_len=32', '--steps=1')
  assert r.returncode == 0, r.stderr[-3000:]
  rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{')]
  assert [(x['step'], x['batch_size'], x['micro_batch_size']) for x in rows] == [('plain', 16, 16),
                                                                                ('GradCache', 16, 4)]
  assert 0 < rows[1]['temp_gib'] < rows[0]['temp_gib'] and all(x['step_time_s'] > 0 for x in rows)
  assert '| GradCache | 16 | 4 |' in r.stdout
  bad = run_main('benchmark_gradcache.py', '--batch_size=10', '--micro_batch_size=4')
  assert bad.returncode == 1 and bad.stderr.strip() == 'error: --micro_batch_size=4 must divide --batch_size=10'
