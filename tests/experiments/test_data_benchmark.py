"""The data benchmark's corpus shapes (experiments/tools/data_benchmark.py) and its per-shape table."""

import json
import os

import pytest

from bert_jax.data import corpus_formats, readers

from harness.entry_points import assert_one_line_error, run_experiment
from harness.inputs import FIXTURES
from tools import data_benchmark as bm


def _wikiextractor(path, num_docs):
  with open(path, 'w', encoding='utf-8') as f:
    for i in range(num_docs):
      f.write(f'<doc id="{i}" url="u" title="Title {i}">\nTitle {i}\n\n'
              + '\n'.join(f'Paragraph {j} of article {i}, about things. It has {j} parts.' for j in range(1 + i % 5))
              + '\n</doc>\n')
  return str(path)


def test_jsonl_shape_holds_several_articles_per_document(tmp_path):
  source = _wikiextractor(tmp_path / 'wiki_00', 100)
  files = bm.jsonl_corpus([source], str(tmp_path / 'jsonl'), log=lambda _: None)
  articles = readers.read_all([source])
  docs = readers.read_all(files)
  assert corpus_formats.detect_format(files[0], corpus_formats.ReaderOptions())[0] == 'jsonl'
  assert 100 / 40 <= len(docs) <= 100 / 10 + 1  # 10-40 articles per object
  # The same text, sentence for sentence, regrouped (jsonl drops no heading or title: they are not in it).
  assert [s for d in docs for s in d] == [s for d in articles for s in d]
  with open(files[0], encoding='utf-8') as f:
    assert all(set(json.loads(line)) == {'id', 'text'} for line in f)
  assert bm.jsonl_corpus([source], str(tmp_path / 'jsonl'), log=lambda _: None) == files  # reused


@pytest.mark.slow
def test_docs_shape_is_short_lines_and_tiny_documents(tmp_path):
  files = bm.docs_corpus(str(tmp_path / 'docs'), 1, log=lambda _: None)
  assert len(files) == 1 and 8e6 <= os.path.getsize(files[0]) < 9e6  # one 8 MB file covers 1 MB
  stats = {}
  docs = readers.read_all(files, stats=stats)
  sentences = [s for d in docs for s in d]
  assert stats['formats'] == {'plain': 1}
  assert sum(map(len, sentences)) / len(sentences) < 60  # short sentences and lines (prose runs ~130)
  assert len(sentences) / len(docs) < 8  # tiny documents
  assert any(s.startswith('def ') for s in sentences) and any('>>>' in s for s in sentences)  # code


@pytest.mark.parametrize('args,message', [
    (('--shapes=enwiki,books',), "unknown corpus shape 'books'"),
    (('--workers=two',), '--workers=two: give comma-separated integers >= 0'),
    (('--seq_len=128,-1',), '--seq_len=128,-1: give comma-separated integers >= 8'),
    (('--batches=0',), '--batches=0 must be positive'),
    (('--loader_only=/nonexistent',), 'is not a prepared cache directory'),
    (('--unknown_flag=1',), "Unknown command line flag 'unknown_flag'")])
def test_bad_flags_are_one_error_line(tmp_path, args, message):
  result = run_experiment('benchmark_data.py', *args, f'--scratch={tmp_path}', timeout=120)
  assert_one_line_error(result, message)
  assert not os.listdir(tmp_path)


@pytest.mark.slow
@pytest.mark.e2e
def test_shapes_table_has_a_row_per_shape_and_vocabulary(tmp_path):
  source = _wikiextractor(tmp_path / 'wiki_00', 400)
  result = run_experiment('benchmark_data.py', f'--corpus={source}', '--shapes=enwiki,jsonl', '--shape_mb=0.1',
                          f'--tokenizer={os.path.join(FIXTURES, "records_spm.model")}', '--vocab_size=1000',
                          '--workers=1', '--seq_len=64', '--loader_workers=0', '--batches=2', '--batch_size=8',
                          f'--scratch={tmp_path / "bench"}', timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  table = result.stdout.split('preparation by corpus shape')[1].split('loader:')[0]
  rows = [line.split('|') for line in table.splitlines() if '|' in line][2:]  # below the header and its rule
  assert [(r[0].strip(), r[1].strip()) for r in rows] == [('enwiki', '1,000'), ('jsonl', '1,000')]
  lines = [json.loads(l) for l in result.stdout.splitlines() if l.startswith('{"mb"')]
  assert all(l['read_mb_per_s'] and l['tokenize_mb_per_s'] and l['pairs_write_mb_per_s'] for l in lines)
