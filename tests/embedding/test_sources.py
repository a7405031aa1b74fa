"""bert_jax.embedding.sources and experiments/make_pairs.py: SQuAD pairs split by article with a BEIR set no
training paragraph is in, weak enwiki pairs, and the entry point's files, refusals and error lines."""

from __future__ import annotations

import json
import os

import pytest

from bert_jax.embedding import beir, pairs, sources
from bert_jax.errors import DataError

from harness.digests import tree_digest
from harness.entry_points import run_main

LONG = ' '.join(f'word{i}' for i in range(sources.MIN_WORDS))


def _squad(path, n_articles=3):
  articles = [{'title': f'Topic_{a}', 'paragraphs': [
      {'context': f'Context {a}.{p} {LONG}', 'qas': [{'id': f'q{a}{p}{k}', 'question': f' Question {a}.{p}.{k}?',
                                                      'answers': [{'text': 'x', 'answer_start': 0}]}
                                                     for k in range(2)]} for p in range(2)]}
              for a in range(n_articles)]
  path.write_text(json.dumps({'version': '1.1', 'data': articles}), encoding='utf-8')
  return str(path)


def test_squad_pairs_split_by_article_and_the_held_out_set_reads_as_beir(tmp_path):
  train, held_out = sources.squad_pairs(_squad(tmp_path / 'dev.json'), eval_articles=1)
  assert len(train) == 8 and train[0] == {'query': 'Question 0.0.0?', 'positive': f'Topic 0 Context 0.0 {LONG}'}
  sources.write_beir(str(tmp_path / 'beir'), held_out)
  data = beir.read_beir(str(tmp_path / 'beir'))
  assert data.queries == ['Question 2.0.0?', 'Question 2.0.1?', 'Question 2.1.0?', 'Question 2.1.1?']
  assert [sorted(q) for q in data.qrels] == [[0], [0], [1], [1]]
  assert not {p['positive'] for p in train} & set(data.passages())  # no paragraph on both sides
  assert {p['positive'] for p in train if p['query'].startswith('Question 1')} <= {
      f'Topic 1 Context 1.{p} {LONG}' for p in range(2)}
  with pytest.raises(DataError, match='eval_articles=3 must leave some on each side'):
    sources.squad_pairs(str(tmp_path / 'dev.json'), eval_articles=3)


def test_enwiki_pairs_are_title_to_first_paragraph_and_neighbours(tmp_path):
  wiki = tmp_path / 'wiki_00'
  wiki.write_text(f'<doc id="1" url="u" title="Anarchism">\nAnarchism\n\nFirst {LONG}\nHistory.\nSecond {LONG}\n'
                  f'Third {LONG}\nshort line\n</doc>\n<doc id="2" url="u" title="Stub">\nStub\n\ntoo short\n</doc>\n',
                  encoding='utf-8')
  got = sources.enwiki_pairs([str(wiki)])
  assert sorted((p['query'].split()[0], p['positive'].split()[0]) for p in got) == [
      ('Anarchism', 'First'), ('First', 'Second'), ('Second', 'Third')]
  assert len(sources.enwiki_pairs([str(wiki)], max_pairs=2, seed=1)) == 2
  (tmp_path / 'plain.txt').write_text('no articles here\n', encoding='utf-8')
  with pytest.raises(DataError, match='holds no <doc title'):
    sources.enwiki_pairs([str(tmp_path / 'plain.txt')])


def test_make_pairs_writes_what_retrieval_reads_and_never_overwrites(tmp_path):
  squad, out = _squad(tmp_path / 'dev.json'), tmp_path / 'out'
  r = run_main('make_pairs.py', '--source=squad', f'--input={squad}', f'--out={out}', '--eval_articles=1')
  assert r.returncode == 0, r.stderr
  line = json.loads(r.stdout.strip().splitlines()[-1])
  assert (line['train_pairs'], line['beir_queries'], line['beir_corpus']) == (8, 4, 2)
  assert len(pairs.read_pairs(line['train_file'])) == 8 and len(beir.read_beir(line['beir_dir']).queries) == 4
  before = tree_digest(out)
  again = run_main('make_pairs.py', '--source=squad', f'--input={squad}', f'--out={out}')
  assert again.returncode == 1 and again.stderr.strip().splitlines() == [
      f'error: {out}/train.jsonl exists; give another --out (nothing was written)']
  assert tree_digest(out) == before
  missing = run_main('make_pairs.py', '--source=enwiki', f'--input={tmp_path}/nope', f'--out={tmp_path}/o2')
  assert missing.returncode == 1 and 'error: --input' in missing.stderr and not os.path.exists(tmp_path / 'o2')
