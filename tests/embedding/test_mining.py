"""Hard-negative mining (bert_jax/embedding/mining.py, experiments/mine.py): the rank window, positives never
returned, the margins, seeded random sampling, scores, the embedded blocks a rerun reads back, the output read by
the retrieval task's pair reader, bad input; and (slow) the same negatives as sentence-transformers'
`util.mine_hard_negatives` on all-MiniLM-L6-v2.

The library tests embed with a table of random unit vectors (no model): `_reference` restates
sentence-transformers' selection plainly over the full score matrix, so the streamed, blocked and sharded search and
the vectorised selection are checked against it."""

import gzip
import json
import random

import jax
import numpy as np
import pytest

from bert_jax.embedding import mining, pairs as pairs_lib
from bert_jax.errors import ConfigError, DataError

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import minilm_dir_or_skip, shared_data_or_skip
from harness.numerics import tolerance

DIM = 8


def _world(num_queries=12, num_passages=40, seed=0, extra_positives=((0, 5), (0, 9), (3, 5))):
  """(pairs, embed, vectors): query i's positive is passage i; `extra_positives` (query, passage) add rows."""
  rng = np.random.default_rng(seed)
  texts = [f'query {i}' for i in range(num_queries)] + [f'passage {j}' for j in range(num_passages)]
  vectors = rng.normal(size=(len(texts), DIM)).astype(np.float32)
  vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
  table = dict(zip(texts, vectors))
  rows = [(i, i) for i in range(num_queries)] + list(extra_positives)
  pairs = [pairs_lib.Pair(f'query {q}', f'passage {p}', (), line) for line, (q, p) in enumerate(rows, 1)]
  corpus = [f'passage {j}' for j in range(num_passages)]
  calls = []

  def embed(batch):
    calls.append(list(batch))
    return np.stack([table[t] for t in batch])

  embed.calls = calls
  return pairs, embed, corpus, table


def _reference(pairs, corpus, table, spec):
  """Per query (first-appearance order): sentence-transformers' negatives, as corpus indices, written plainly."""
  queries = list(dict.fromkeys(p.query for p in pairs))
  positives = {q: [] for q in queries}
  for p in pairs:
    if corpus.index(p.positive) not in positives[p.query]:
      positives[p.query].append(corpus.index(p.positive))
  most = max(map(len, positives.values()))
  passages = np.stack([table[t] for t in corpus]).astype(np.float64)
  draw, out = random.Random(spec.seed), []
  for q in queries:
    scores = passages @ table[q].astype(np.float64)
    low = min(scores[positives[q]])
    pool = [c for c in np.argsort(-scores, kind='stable')[:spec.range_max + most] if c not in positives[q]]
    if spec.absolute_margin is not None:
      pool = [c for c in pool if scores[c] + spec.absolute_margin <= low]
    if spec.relative_margin is not None:
      pool = [c for c in pool if scores[c] <= low - abs(low) * spec.relative_margin]
    window = pool[:spec.range_max][spec.range_min:]
    if spec.sampling == 'top':
      out.append(window[:spec.num_negatives])
    else:
      drawn = draw.sample(range(max(len(window), spec.num_negatives)), k=spec.num_negatives)
      out.append(sorted((window[i] for i in drawn if i < len(window)), key=lambda c: -scores[c]))
  return out


def _negatives(mined):
  return [[int(c) for c in n] for n in mined.negatives]


@pytest.mark.parametrize('block_size,sharded', [(7, False), (40, False), (7, True)])
def test_top_negatives_come_from_the_window_and_are_never_a_positive(block_size, sharded):
  pairs, embed, corpus, table = _world()
  spec = mining.MiningSpec(num_negatives=3, range_min=2, range_max=10)
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,)) if sharded else None
  mined = mining.mine(pairs, embed, spec, corpus=corpus, block_size=block_size, mesh=mesh)
  assert _negatives(mined) == _reference(pairs, corpus, table, spec)
  g = mined.grouped
  assert g.positives[0] == [0, 5, 9] and g.positives[3] == [3, 5]  # several rows of a query: several positives
  for q, negatives in enumerate(mined.negatives):
    assert len(negatives) == 3 and not set(negatives.tolist()) & set(g.positives[q])
    scores = np.array([np.dot(table[g.queries[q]], table[corpus[c]]) for c in range(len(corpus))])
    others = [c for c in np.argsort(-scores, kind='stable') if c not in g.positives[q]]
    assert list(negatives) == others[2:5]  # ranks 3..5 among the non-positives: range_min=2 skipped
  assert 0 < mined.stats['removed']['positives'] <= sum(map(len, g.positives))  # those among the candidates


def test_the_pairs_own_positives_are_the_corpus_by_default():
  pairs, embed, _, table = _world(num_queries=30, extra_positives=((0, 5),))
  spec = mining.MiningSpec(num_negatives=2, range_min=0, range_max=20)
  mined = mining.mine(pairs, embed, spec, block_size=8)
  own = list(dict.fromkeys(p.positive for p in pairs))
  assert mined.grouped.corpus == own  # deduplicated, file order
  assert _negatives(mined) == _reference(pairs, own, table, spec)


@pytest.mark.parametrize('margins', [dict(absolute_margin=0.1), dict(relative_margin=0.3),
                                     dict(absolute_margin=0.0, relative_margin=0.05)])
def test_margins_keep_negatives_below_the_lowest_positive_score(margins):
  pairs, embed, corpus, table = _world()
  spec = mining.MiningSpec(num_negatives=3, range_min=1, range_max=12, **margins)
  mined = mining.mine(pairs, embed, spec, corpus=corpus, block_size=16)
  reference = _reference(pairs, corpus, table, spec)
  assert [n for n in _negatives(mined)] == [r for r in reference]
  g = mined.grouped
  for q, (negatives, scores) in enumerate(zip(mined.negatives, mined.negative_scores)):
    low = min(np.dot(table[g.queries[q]], table[corpus[c]]) for c in g.positives[q])
    if 'absolute_margin' in margins:
      assert np.all(scores + margins['absolute_margin'] <= low + 1e-6)
    if 'relative_margin' in margins:
      assert np.all(scores <= low - abs(low) * margins['relative_margin'] + 1e-6)
  assert set(mined.stats['removed']) == {'positives', *margins}
  assert sum(mined.stats['removed'][m] for m in margins) > 0


def test_rows_of_a_query_left_short_are_counted_and_left_out():
  pairs, embed, corpus, table = _world()
  spec = mining.MiningSpec(num_negatives=3, range_min=0, range_max=12, relative_margin=0.9)
  mined = mining.mine(pairs, embed, spec, corpus=corpus, block_size=16)
  short = [q for q, n in enumerate(mined.negatives) if len(n) < 3]
  assert short and mined.stats['short_queries'] == len(short)
  rows = mined.negative_rows(pairs)
  assert mined.stats['short_rows'] == len(pairs) - len(rows)
  assert all(len(r['negatives']) == 3 for r in rows)
  assert _negatives(mined) == _reference(pairs, corpus, table, spec)


def test_random_sampling_is_seeded_and_draws_from_the_window():
  pairs, embed, corpus, table = _world()
  spec = mining.MiningSpec(num_negatives=3, range_min=2, range_max=15, sampling='random', seed=7)
  first = mining.mine(pairs, embed, spec, corpus=corpus, block_size=16)
  assert _negatives(first) == _negatives(mining.mine(pairs, embed, spec, corpus=corpus, block_size=9))
  assert _negatives(first) == _reference(pairs, corpus, table, spec)  # Python's random, seeded once, per query
  other = mining.mine(pairs, embed, mining.MiningSpec(num_negatives=3, range_min=2, range_max=15, sampling='random',
                                                      seed=8), corpus=corpus, block_size=16)
  assert _negatives(other) != _negatives(first)
  top = mining.mine(pairs, embed, mining.MiningSpec(num_negatives=13, range_min=2, range_max=15), corpus=corpus)
  for drawn, window, scores in zip(first.negatives, top.negatives, first.negative_scores):
    assert set(drawn.tolist()) <= set(window.tolist()) and np.all(np.diff(scores) <= 0)  # sorted by score


def test_scores_are_the_dot_products_positive_first():
  pairs, embed, corpus, table = _world()
  mined = mining.mine(pairs, embed, mining.MiningSpec(num_negatives=2, range_min=0, range_max=5), corpus=corpus,
                      block_size=16)
  rows = mined.negative_rows(pairs, scores=True)
  assert len(rows) == len(pairs)
  for row in rows:
    expected = [np.dot(table[row['query']], table[t]) for t in [row['positive']] + row['negatives']]
    np.testing.assert_allclose(row['scores'], expected, atol=tolerance(np.float32, DIM))
  labelled = mined.pair_rows(scores=True)
  assert [r['label'] for r in labelled[:5]] == [1, 1, 1, 0, 0]  # query 0: its three positives, then 2 negatives
  assert labelled[0]['score'] == rows[0]['scores'][0]
  assert len(labelled) == len(pairs) + 2 * len(mined.grouped.queries)


def test_cached_blocks_are_read_back_after_an_interrupted_run(tmp_path):
  pairs, embed, corpus, _ = _world()
  spec = mining.MiningSpec(num_negatives=3, range_min=2, range_max=10)
  straight = mining.mine(pairs, embed, spec, corpus=corpus, block_size=8)

  class Killed(Exception):
    pass

  def dies_after_three_blocks(texts):
    if len(embed.calls) >= 3:
      raise Killed
    return embed(texts)

  embed.calls.clear()
  cache = mining.BlockCache(str(tmp_path / 'cache'), 'model-a')
  with pytest.raises(Killed):
    mining.mine(pairs, dies_after_three_blocks, spec, corpus=corpus, block_size=8, cache=cache)
  assert len(list((tmp_path / 'cache').iterdir())) == 3  # the queries' two blocks and the first of the corpus's five
  (tmp_path / 'cache' / 'corpus_000001_0123456789abcdef.npy.tmp').write_bytes(b'half a block')  # a write cut short
  embed.calls.clear()
  resumed = mining.mine(pairs, embed, spec, corpus=corpus, block_size=8, cache=cache)
  assert len(embed.calls) == 4 and cache.hits == 3  # only the blocks not finished
  assert _negatives(resumed) == _negatives(straight)
  np.testing.assert_array_equal(resumed.positive_scores, straight.positive_scores)
  embed.calls.clear()
  mining.mine(pairs, embed, spec, corpus=corpus, block_size=8, cache=mining.BlockCache(cache.directory, 'model-b'))
  assert len(embed.calls) == 7  # another model's identity: nothing read
  cache.remove()
  assert not (tmp_path / 'cache').exists()


@pytest.mark.parametrize('change,error,pattern', [
    (dict(corpus=['passage 0', 'passage 1']), DataError, 'the positive is not in the corpus'),
    (dict(spec=dict(range_max=39)), ConfigError, 'lower range_max to 37'),
    (dict(spec=dict(range_min=8, range_max=10)), ConfigError, 'fewer than num_negatives=3'),
    (dict(spec=dict(sampling='best')), ConfigError, 'sampling must be one of'),
    (dict(pairs=[]), DataError, 'no pairs'),
])
def test_bad_input_is_refused_before_any_embedding(change, error, pattern):
  pairs, embed, corpus, _ = _world()
  spec = mining.MiningSpec(**{'num_negatives': 3, 'range_max': 10, **change.get('spec', {})})
  with pytest.raises(error, match=pattern):
    mining.mine(change.get('pairs', pairs), embed, spec, corpus=change.get('corpus', corpus))
  assert not embed.calls


# The entry point on the tiny checkpoint (hidden 32, MiniLM's vocabulary), in this process.

_TOPICS = ['volcano', 'glacier', 'desert', 'rainforest', 'tundra', 'savanna', 'coral reef', 'wetland', 'prairie',
           'canyon', 'delta', 'fjord']


def _pairs_file(path, rows=None):
  rows = rows or [{'question': f'what is a {t}?', 'answer': f'a {t} is a landform described here'}
                  for t in _TOPICS]
  data = ''.join(json.dumps(r) + '\n' for r in rows).encode()
  path.write_bytes(gzip.compress(data) if path.suffix == '.gz' else data)
  return path


def _mine(tmp_path, model, *args, train=None, output=None):
  train = train or _pairs_file(tmp_path / 'pairs.jsonl.gz')
  return run_main('mine.py', f'--model={model}', f'--train_file={train}',
                  f'--output={output or tmp_path / "out" / "mined.jsonl"}', '--query_column=question',
                  '--positive_column=answer', '--block_size=5', '--batch_size=4', *args)


def test_mine_writes_rows_the_retrieval_task_reads(tiny_checkpoint, tmp_path):
  result = _mine(tmp_path, tiny_checkpoint, '--num_negatives=2', '--range_min=1', '--range_max=6', '--scores',
                 output=tmp_path / 'out' / 'mined.jsonl.gz')
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary['written'] == summary['rows'] == 12 and summary['corpus'] == 12 and summary['cached_blocks_read'] == 0
  out = tmp_path / 'out' / 'mined.jsonl.gz'
  read = pairs_lib.read_pairs(str(out), pairs_lib.PairColumns(negatives=('negatives',)))  # as --config.negative_columns
  assert len(read) == 12 and all(len(p.negatives) == 2 and p.positive not in p.negatives for p in read)
  rows = [json.loads(l) for l in gzip.decompress(out.read_bytes()).decode().splitlines()]
  assert all(len(r['scores']) == 3 and r['scores'][1] >= r['scores'][2] for r in rows)
  assert not (tmp_path / 'out' / 'mined.jsonl.gz.cache').exists()  # removed once the output is written


def test_mine_writes_labelled_pairs_for_a_cross_encoder(tiny_checkpoint, tmp_path):
  labelled = _mine(tmp_path, tiny_checkpoint, '--num_negatives=2', '--range_max=6', '--layout=pairs',
                   output=tmp_path / 'pairs_out.jsonl')
  assert labelled.returncode == 0, labelled.stderr[-3000:]
  rows = [json.loads(l) for l in (tmp_path / 'pairs_out.jsonl').read_text().splitlines()]
  assert [r['label'] for r in rows[:3]] == [1, 0, 0] and set(rows[0]) == {'query', 'passage', 'label'}


@pytest.mark.parametrize('case,pattern', [
    ('corpus', 'is not in the corpus'),
    ('window', 'lower range_max to 11'),
    ('column', "no column 'question'"),
    ('empty', 'is empty'),
    ('margins', 'no query has 3 negatives left'),
])
def test_mine_bad_input_is_one_error_line_and_keeps_what_was_written(tiny_checkpoint, tmp_path, case, pattern):
  output = tmp_path / 'mined.jsonl'
  output.write_text('an earlier output\n', encoding='utf-8')
  args, train = ['--overwrite'], None
  if case == 'corpus':
    corpus = tmp_path / 'corpus.jsonl'
    corpus.write_text(''.join(json.dumps({'text': f'a {t} is a landform described here'}) + '\n'
                              for t in _TOPICS[1:]), encoding='utf-8')
    args.append(f'--corpus_file={corpus}')
  elif case == 'window':
    args.append('--range_max=20')
  elif case == 'column':
    train = _pairs_file(tmp_path / 'p.jsonl', [{'query': 'q', 'positive': 'p'}])
  elif case == 'empty':
    train = tmp_path / 'empty.jsonl'
    train.write_text('', encoding='utf-8')
  else:
    args += ['--range_max=8', '--absolute_margin=5']  # every score is within 5 of the positive's
  assert_one_line_error(_mine(tmp_path, tiny_checkpoint, *args, train=train, output=output), pattern)
  assert output.read_text(encoding='utf-8') == 'an earlier output\n'
  assert_one_line_error(_mine(tmp_path, tiny_checkpoint, train=train, output=output), 'exists')


# Against the peer: sentence-transformers' miner on the same model and pairs.

def _squad_pairs(every):
  """Every `every`-th pair of make_pairs.py's SQuAD training pairs (about one question a paragraph)."""
  from bert_jax.embedding import sources  # pylint: disable=g-import-not-at-top
  squad = shared_data_or_skip('squad-v1.1')
  rows, _ = sources.squad_pairs(f'{squad}/dev-v1.1.json')
  return [pairs_lib.Pair(r['query'], r['positive'], (), i) for i, r in enumerate(rows[::every], 1)]


@pytest.mark.slow
def test_same_negatives_as_sentence_transformers_on_minilm(tmp_path):
  """Row for row the peer's negatives ('n-tuple' rows, matched by (query, positive)) on 225 SQuAD pairs (about 200
  passages, a query with two positives among them), for the top of the window, a relative margin and seeded random
  sampling. Every row is the same: on these pairs no two candidates of a query are closer than the two
  implementations' score difference (float32 XLA against float32 torch: about 5e-7, max over the positives)."""
  datasets = pytest.importorskip('datasets', reason='the peer needs datasets and pandas (tests/requirements.txt)')
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.util import mine_hard_negatives  # pylint: disable=g-import-not-at-top
  from bert_jax import inference  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top
  path = minilm_dir_or_skip()
  pairs = _squad_pairs(80)
  pairs += [pairs_lib.Pair(pairs[0].query, pairs[5].positive, (), len(pairs) + 1)]  # a second positive for a query
  model = pretrained.load_encoder(path)
  settings = inference.embedding_settings(path, model, log=lambda _: None)
  vectors = {}

  def embed(texts):  # each text embedded once over the three settings
    todo = [t for t in texts if t not in vectors]
    if todo:
      out = inference.embed(model, [(t, None) for t in todo], max_length=settings.max_seq_length, batch_size=32,
                            pooling=settings.pooling, normalize=settings.normalize, sentence_only=True)
      vectors.update(zip(todo, out['sentence_embedding']))
    return np.stack([vectors[t] for t in texts])

  peer = SentenceTransformer(path, device='cpu')
  data = datasets.Dataset.from_dict({'query': [p.query for p in pairs], 'positive': [p.positive for p in pairs]})
  for settings_ in (dict(sampling='top'), dict(sampling='top', relative_margin=0.05),
                    dict(sampling='random', seed=3)):
    spec = mining.MiningSpec(num_negatives=3, range_min=2, range_max=30, **settings_)
    ours = mining.mine(pairs, embed, spec)
    random.seed(spec.seed)  # the peer draws from Python's global random
    theirs = mine_hard_negatives(
        data, peer, num_negatives=3, range_min=2, range_max=30, sampling_strategy=spec.sampling,
        relative_margin=spec.relative_margin, use_faiss=False, output_format='n-tuple', verbose=False,
        cache_folder=str(tmp_path / 'peer_cache'))
    expected = {(r['query'], r['positive']): [r[f'negative_{i}'] for i in (1, 2, 3)] for r in theirs}
    got = {(r['query'], r['positive']): r['negatives'] for r in ours.negative_rows(pairs)}
    assert got == expected, settings_
    assert len(got) >= 100 and len(ours.grouped.corpus) >= 100
