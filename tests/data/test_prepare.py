"""Tests for bert_jax.data.prepare: the streamed, parallel, resumable build and its cache."""

import bz2
import dataclasses
import glob
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.config import DataConfig
from bert_jax.data import cache_identity, corpus_files, loader as ip, prepare, readers, tokenization, work_units
from bert_jax.data.tokenization import CLS_ID, SEP_ID, SentencePieceTokenizer
from bert_jax.errors import ConfigError, DataError

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import REPO, SMALL_VOCAB as VOCAB, WIKITEXT, minilm_dir_or_skip, small_data_config
from harness.processes import prints_nothing, start_two, succeed

BUNDLED = os.path.join(REPO, 'data', 'wikitext-2-raw')


def _cache_digest(directory: str) -> dict[str, str]:
  """sha256 of every file of a complete cache but build.json (timings, worker count)."""
  return {name: hashlib.sha256(open(os.path.join(directory, name), 'rb').read()).hexdigest()
          for name in sorted(os.listdir(directory)) if name != 'build.json'}


def _bundled_cfg(cache_dir, **overrides) -> DataConfig:
  # 2.4 MB in 1 MB units: 4 units, so workers and processes really split the work.
  fields = dict(train_files=BUNDLED, cache_dir=str(cache_dir), unit_mb=1, max_seq_length=64,
                max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.1)
  fields.update(overrides)
  return DataConfig(**fields)


def _prepare_data_args(cache_dir) -> list[str]:
  """experiments/prepare_data.py flags for `_bundled_cfg(cache_dir, num_workers=1)` with vocab 2000."""
  return ['--config=experiments/configs/pretrain.py:tiny', '--config.model.vocab_size=2000',
          f'--config.data.train_files={BUNDLED}', f'--config.data.cache_dir={cache_dir}', '--config.data.unit_mb=1',
          '--config.data.max_seq_length=64', '--config.data.max_predictions_per_seq=10',
          '--config.data.dupe_factor=1', '--config.data.eval_fraction=0.1', '--config.data.num_workers=1']


def _no_cache_left(cache_dir) -> bool:
  return not os.path.isdir(cache_dir) or os.listdir(cache_dir) == []


# ----------------------------------------------------------------------------- the cache


def test_prepare_writes_shards_and_meta(prepared):
  cfg, data = prepared
  files = sorted(os.listdir(data.dir))
  assert files == ['build.json', 'eval-00000.tokens', 'eval.index.npy', 'meta.json', 'tokenizer.model',
                   'train-00000.tokens', 'train.index.npy']
  assert os.path.dirname(data.dir) == cfg.cache_dir and len(os.path.basename(data.dir)) == 16
  assert [p for p in os.listdir(cfg.cache_dir) if p.endswith('.partial')] == []
  stats = data.stats
  assert stats['eval_documents'] >= 2 and stats['train_documents'] + stats['eval_documents'] == stats['documents']
  assert stats['train_pairs'] == data.num_train and stats['eval_pairs'] == data.num_eval
  assert 0.4 < stats['random_next_fraction'] < 0.6
  tokenizer = SentencePieceTokenizer(data.tokenizer_path)
  assert tokenizer.vocab_size == VOCAB
  train = ip.PretrainingDataset(data.dir, 'train')
  counts = np.bincount(np.concatenate([train[i][0] for i in range(len(train))]), minlength=VOCAB)
  assert data.most_frequent_token == np.argmax(counts[5:]) + 5
  assert stats['train_tokens'] == counts[5:].sum() + counts[1]
  build = prepare.read_build_info(data.dir)
  assert set(build['seconds']) >= {'plan', 'tokenizer_train', 'units', 'manifest'}
  for split, num in (('train', data.num_train), ('eval', data.num_eval)):
    dataset = ip.PretrainingDataset(data.dir, split)
    assert len(dataset) == num > 0
    assert dataset.lengths.tolist() == [len(dataset[i][0]) for i in range(num)]
    for i in range(0, num, max(1, num // 50)):
      tokens, len_a, is_random_next = dataset[i]
      assert tokens.dtype == np.int32 and len(tokens) <= cfg.max_seq_length
      assert tokens[0] == CLS_ID and tokens[len_a + 1] == SEP_ID and tokens[-1] == SEP_ID
      assert len_a >= 1 and len(tokens) - len_a - 3 >= 1 and isinstance(is_random_next, bool)
      body = np.delete(tokens, [0, len_a + 1, len(tokens) - 1])
      assert np.all((body >= 5) | (body == 1)) and tokens.max() < VOCAB  # text and [UNK] only


def test_prepare_reuses_cache(prepared, monkeypatch):
  cfg, data = prepared
  meta_mtime = os.path.getmtime(os.path.join(data.dir, 'meta.json'))

  def no_rebuild(*args, **kwargs):
    raise AssertionError('rebuilt a complete cache')

  monkeypatch.setattr(prepare, '_Builder', no_rebuild)
  assert prepare.prepare_pretraining_data(cfg, vocab_size=VOCAB, seed=0) == data
  assert os.path.getmtime(os.path.join(data.dir, 'meta.json')) == meta_mtime
  # A field that shapes the records, or the seed, keys another cache.
  for other_cfg, seed in ((dataclasses.replace(cfg, dupe_factor=3), 0), (cfg, 1),
                          (dataclasses.replace(cfg, hard_wrapped=True), 0)):
    with pytest.raises(AssertionError, match='rebuilt'):
      prepare.prepare_pretraining_data(other_cfg, vocab_size=VOCAB, seed=seed)
  # Masking settings and the worker count do not change the records and share the cache.
  same_cfg = dataclasses.replace(cfg, masked_lm_prob=0.2, masking='whole_word', num_workers=3)
  assert prepare.prepare_pretraining_data(same_cfg, vocab_size=VOCAB, seed=0).dir == data.dir


def test_prepare_with_given_tokenizer(prepared, tmp_path):
  cfg, data = prepared
  given = dataclasses.replace(cfg, tokenizer=data.tokenizer_path, cache_dir=str(tmp_path))
  with pytest.raises(ConfigError, match=f'set --config.model.vocab_size={VOCAB}'):
    prepare.prepare_pretraining_data(given, vocab_size=VOCAB + 1, seed=0)
  other = prepare.prepare_pretraining_data(given, vocab_size=VOCAB, seed=0)
  assert (other.num_train, other.num_eval) == (data.num_train, data.num_eval)
  assert [f for f in _cache_digest(other.dir).items() if f[0] != 'meta.json'] == \
      [f for f in _cache_digest(data.dir).items() if f[0] != 'meta.json']  # the same records


def test_mlm_only_cache_holds_full_sentences(prepared, tmp_path):
  cfg, data = prepared
  mlm = dataclasses.replace(cfg, tokenizer=data.tokenizer_path, cache_dir=str(tmp_path), objective='none', masked_lm_prob=0.3,
                            max_predictions_per_seq=0)
  assert mlm.max_predictions_per_seq == 20  # derived: ceil(0.3 * 64)
  out = prepare.prepare_pretraining_data(mlm, vocab_size=VOCAB, seed=0)
  assert os.path.basename(out.dir) != os.path.basename(data.dir)  # its own fingerprint
  # Each document once, untruncated (pairs: dupe_factor passes, each cut to fit).
  assert out.stats['train_tokens'] > data.stats['train_tokens'] / cfg.dupe_factor
  train = ip.PretrainingDataset(out.dir, 'train')
  lengths = train.lengths
  assert lengths.max() <= cfg.max_seq_length and np.mean(lengths) > 0.6 * cfg.max_seq_length
  for i in range(len(train)):
    tokens, len_a, is_random_next = train[i]
    assert tokens[0] == CLS_ID and tokens[-1] == SEP_ID and len_a == len(tokens) - 2 and not is_random_next
  batches = ip.PretrainingBatches(train, global_batch_size=64, seed=0, cfg=mlm,
                                  vocab=ip.Vocab.from_tokenizer(SentencePieceTokenizer(out.tokenizer_path),
                                                                out.special_ids))
  batch = next(batches)
  batches.close()
  assert not batch['token_type_ids'].any() and not batch['nsp_weights'].any()  # one segment, no NSP
  # Dynamic masking at 30%: round(0.3 * length) predictions per row, capped by the derived 20.
  real = batch['attention_mask'].sum(1)
  np.testing.assert_array_equal(batch['masked_lm_weights'].sum(1), np.minimum(np.rint(0.3 * real), 20))


def test_sop_cache_holds_consecutive_segments_in_either_order(prepared, tmp_path):
  cfg, data = prepared
  sop = dataclasses.replace(cfg, tokenizer=data.tokenizer_path, cache_dir=str(tmp_path), objective='sop')
  out = prepare.prepare_pretraining_data(sop, vocab_size=VOCAB, seed=0)
  assert os.path.basename(out.dir) != os.path.basename(data.dir)  # its own fingerprint
  with open(os.path.join(out.dir, 'meta.json'), encoding='utf-8') as f:
    assert json.load(f)['data_config']['objective'] == 'sop'
  assert 0.4 < out.stats['random_next_fraction'] < 0.6 and 0.3 < out.stats['eval_random_next_fraction'] < 0.7
  # The masked-LM-only cache's records, back to back, are the training documents' token stream:
  # an untruncated SOP pair, put back in order, is a slice of it within one document.
  full = prepare.prepare_pretraining_data(dataclasses.replace(sop, objective='none'), vocab_size=VOCAB, seed=0)
  full_ds = ip.PretrainingDataset(full.dir, 'train')
  stream = np.concatenate([full_ds[i][0][1:-1] for i in range(len(full_ds))]).astype('<i4').tobytes()
  def find(tokens):
    at = stream.find(tokens.astype('<i4').tobytes())
    while at % 4:  # a match must start at a token
      at = stream.find(tokens.astype('<i4').tobytes(), at + 1)
    return at

  train = ip.PretrainingDataset(out.dir, 'train')
  untruncated = {0: 0, 1: 0}
  for i in range(len(train)):
    tokens, len_a, swapped = train[i]
    a, b = tokens[1:1 + len_a], tokens[2 + len_a:-1]
    assert len(a) and len(b) and tokens[len_a + 1] == SEP_ID and SEP_ID not in a and SEP_ID not in b
    assert find(a) >= 0 and find(b) >= 0
    if len(tokens) < cfg.max_seq_length:  # not truncated: the segments are adjacent
      assert find(np.concatenate([b, a] if swapped else [a, b])) >= 0
      untruncated[int(swapped)] += 1
  assert min(untruncated.values()) >= 5


def test_bad_data_config(tmp_path):
  with pytest.raises(ConfigError, match='eval_fraction=0'):
    prepare.prepare_pretraining_data(small_data_config(str(tmp_path), eval_fraction=0.0), vocab_size=VOCAB, seed=0)
  with pytest.raises(DataError, match='does not exist'):
    prepare.prepare_pretraining_data(small_data_config(str(tmp_path), train_files=str(tmp_path / 'nope')),
                                     vocab_size=VOCAB, seed=0)
  with pytest.raises(ConfigError, match='format'):
    prepare.prepare_pretraining_data(small_data_config(str(tmp_path), format='parquet'), vocab_size=VOCAB, seed=0)


# ----------------------------------------------------------------------------- parallel and resumable


@pytest.mark.slow
def test_one_and_two_workers_give_identical_caches(tmp_path):
  digests, stats = [], []
  for workers in (1, 2):
    cfg = _bundled_cfg(tmp_path / f'w{workers}', num_workers=workers)
    data = prepare.prepare_pretraining_data(cfg, vocab_size=2000, seed=0, log=lambda _: None)
    digests.append(_cache_digest(data.dir))
    stats.append(prepare.read_build_info(data.dir))
    assert data.stats['formats'] == {'wikitext': 4}  # four 1 MB units of two files
  assert digests[0] == digests[1]
  assert [s['workers'] for s in stats] == [1, 2]
  assert len([n for n in digests[0] if n.startswith('train-')]) == 4


@pytest.mark.slow
@pytest.mark.e2e
def test_killed_build_resumes_to_the_same_bytes(tmp_path):
  reference = prepare.prepare_pretraining_data(_bundled_cfg(tmp_path / 'ref', num_workers=1), vocab_size=2000,
                                               seed=0, log=lambda _: None)
  cache = tmp_path / 'killed'
  args = _prepare_data_args(cache)
  proc = subprocess.Popen([sys.executable, 'experiments/prepare_data.py', *args], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  while not glob.glob(str(cache / '*.partial' / 'units' / '*.json')):  # one unit finished
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  partial = glob.glob(str(cache / '*.partial'))
  assert len(partial) == 1 and not os.path.exists(os.path.join(partial[0], 'meta.json'))
  with pytest.raises(DataError, match='not a complete prepared cache'):
    ip.PretrainingDataset(partial[0], 'train')  # a half-built cache is never read
  done = len(glob.glob(os.path.join(partial[0], 'units', '*.json')))
  result = subprocess.run([sys.executable, 'experiments/prepare_data.py', *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'{done} unit(s) already built by an earlier run' in result.stdout
  final = json.loads(result.stdout.strip().splitlines()[-1])['dir']
  assert _cache_digest(final) == _cache_digest(reference.dir)


@pytest.mark.slow
@pytest.mark.e2e
def test_two_processes_build_the_same_cache(tmp_path):
  reference = prepare.prepare_pretraining_data(_bundled_cfg(tmp_path / 'ref', num_workers=1), vocab_size=2000,
                                               seed=0, log=lambda _: None)
  cache = tmp_path / 'two'
  args = _prepare_data_args(cache)
  outs = succeed(start_two(os.path.join(REPO, 'experiments', 'prepare_data.py'), args))
  assert prints_nothing(outs[1])
  final = json.loads(outs[0].strip().splitlines()[-1])['dir']
  assert _cache_digest(final) == _cache_digest(reference.dir)
  assert prepare.read_build_info(final)['processes'] == 2


# ----------------------------------------------------------------------------- corpora and tokenizers


def test_compressed_and_jsonl_corpora_give_the_same_records(tmp_path):
  with open(WIKITEXT, encoding='utf-8') as f:
    text = ''.join(f.readlines()[:700])
  plain_dir, packed_dir = tmp_path / 'plain', tmp_path / 'packed'
  plain_dir.mkdir()
  packed_dir.mkdir()
  docs = readers.read_all([WIKITEXT])[:12]
  # The same documents as plain text (blank line between documents) and as gzip/bz2 jsonl.
  (plain_dir / 'a.txt').write_text('\n\n'.join('\n'.join(d) for d in docs[:6]) + '\n')
  (plain_dir / 'b.txt').write_text('\n\n'.join('\n'.join(d) for d in docs[6:]) + '\n')
  lines = [json.dumps({'body': '\n'.join(d), 'id': i}) for i, d in enumerate(docs)]
  with gzip.open(packed_dir / 'a.jsonl.gz', 'wt') as f:
    f.write('\n'.join(lines[:6]) + '\n')
  with bz2.open(packed_dir / 'b.jsonl.bz2', 'wt') as f:
    f.write('\n'.join(lines[6:]) + '\n')
  del text
  tokenizer = tmp_path / 'tok.model'
  tokenization.train_sentencepiece((s for d in docs for s in d), str(tokenizer), VOCAB, True)
  common = dict(tokenizer=str(tokenizer), max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2,
                eval_fraction=0.3, unit_mb=1)
  plain = prepare.prepare_pretraining_data(
      DataConfig(train_files=str(plain_dir), cache_dir=str(tmp_path / 'c1'), **common), vocab_size=VOCAB, seed=0)
  packed = prepare.prepare_pretraining_data(
      DataConfig(train_files=str(packed_dir), cache_dir=str(tmp_path / 'c2'), text_field='body', **common),
      vocab_size=VOCAB, seed=0)
  assert packed.stats['formats'] == {'jsonl': 2} and plain.stats['formats'] == {'plain': 2}
  for split in ('train', 'eval'):
    a, b = ip.PretrainingDataset(plain, split), ip.PretrainingDataset(packed, split)
    assert len(a) == len(b) > 0
    assert all(np.array_equal(a[i][0], b[i][0]) for i in range(len(a)))


def test_nsp_records_take_a_roberta_style_pair_template(tmp_path, roberta_tokenizer):
  """A tokenizer whose pairs are <s> A </s></s> B </s> (RoBERTa's) gets NSP records in that template, each at most
  max_seq_length long (room for its four specials); BERT's ([CLS] A [SEP] B [SEP]) is the test above."""
  tokenizer = tokenization.load_tokenizer(roberta_tokenizer)
  cfg = small_data_config(str(tmp_path), tokenizer=tokenizer.path, dupe_factor=1)
  data = prepare.prepare_pretraining_data(cfg, vocab_size=tokenizer.vocab_size, seed=0)
  dataset = ip.PretrainingDataset(data, 'train')
  cls_id, sep_id, lengths = tokenizer.cls_id, tokenizer.sep_id, []
  for i in range(len(dataset)):
    tokens, len_a, _ = dataset[i]
    a, b = tokens[1:len_a + 1], tokens[len_a + 3:-1]
    assert (tokens[0], *tokens[len_a + 1:len_a + 3], tokens[-1]) == (cls_id, sep_id, sep_id, sep_id)
    assert len(a) and len(b) and sep_id not in a and sep_id not in b and cls_id not in b
    lengths.append(len(tokens))
  assert max(lengths) == cfg.max_seq_length  # the budget is T - 4: full records, none longer


def test_wordpiece_corpus_has_the_checkpoint_tokenizers_ids(tmp_path, wordpiece):
  model_dir = minilm_dir_or_skip()
  cfg = small_data_config(str(tmp_path), tokenizer=model_dir)
  data = prepare.prepare_pretraining_data(cfg, vocab_size=wordpiece.vocab_size, seed=0)
  assert os.path.exists(os.path.join(data.dir, 'tokenizer.json'))
  assert (data.special_ids.cls, data.special_ids.sep, data.special_ids.mask) == (101, 102, 103)
  # Every segment is a contiguous run of some document's ids, as the HF tokenizer encodes its sentences.
  docs = readers.read_all(corpus_files.resolve_files(cfg.train_files))
  streams = [' ' + ' '.join(str(i) for s in d for i in wordpiece.encode(s)) + ' ' for d in docs]
  dataset = ip.PretrainingDataset(data, 'train')
  for i in range(0, len(dataset), max(1, len(dataset) // 40)):
    tokens, len_a, _ = dataset[i]
    assert tokens[0] == 101 and tokens[len_a + 1] == 102 and tokens[-1] == 102
    for segment in (tokens[1:len_a + 1], tokens[len_a + 2:-1]):
      needle = ' ' + ' '.join(str(t) for t in segment.tolist()) + ' '
      assert any(needle in s for s in streams)
  vocab = ip.Vocab.from_tokenizer(tokenization.load_tokenizer(data.tokenizer_path), data.special_ids)
  assert vocab.special_v[[0, 1, 101, 102, 103]].tolist() == [True, True, True, True, True]  # [unused0] is 1
  assert not vocab.special_v[100] and 100 not in vocab.replace_ids  # [UNK] is text, never drawn


def _corpus_spelling_specials(directory) -> str:
  """The small corpus with 2 special-token spellings (of 5 kinds, "[SEP]" ... "[UNK]") put into every line of
  over five words, and a line of them alone."""
  rng = np.random.default_rng(0)
  spellings = list(tokenization.SPECIAL_TOKENS)
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = [next(f) for _ in range(700)]
  out = []
  for line in lines:
    words = line.split(' ')
    if len(words) > 5:
      for _ in range(2):
        words.insert(int(rng.integers(len(words))), spellings[int(rng.integers(len(spellings)))])
    out.append(' '.join(words))
  out[3] = ' '.join(spellings) + ' [SEP][SEP] [MASK].\n'
  path = os.path.join(str(directory), 'specials.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(out)
  return path


@pytest.mark.parametrize('kind,objective', [('wordpiece', 'nsp'), ('wordpiece', 'none'), ('sentencepiece', 'sop')])
def test_special_tokens_spelled_in_the_corpus_are_text(tmp_path, capsys, kind, objective):
  corpus = _corpus_spelling_specials(tmp_path)
  # The sentences the reader keeps (headings go): the spellings never overlap, so str.count counts them.
  text = '\n'.join(s for d in readers.read_all([corpus]) for s in d)
  spelled = {t: text.count(t) for t in tokenization.SPECIAL_TOKENS}
  given = minilm_dir_or_skip() if kind == 'wordpiece' else ''
  cfg = small_data_config(str(tmp_path), train_files=corpus, tokenizer=given, objective=objective)
  data = prepare.prepare_pretraining_data(cfg, vocab_size=30522 if given else VOCAB, seed=0)
  sp = data.special_ids
  checked = 0
  for split in ('train', 'eval'):
    reader, between_documents = data.reader(split), 0
    for i in range(len(reader)):
      tokens, len_a, _ = reader[i]
      # Exactly the format's specials: [CLS] first, [SEP] after each segment (full sentences: also between
      # documents); no [PAD], [MASK] or other [CLS].
      seps = np.flatnonzero(tokens == sp.sep).tolist()
      if objective == 'none':
        assert seps[-1] == len(tokens) - 1, (split, i)
        between_documents += len(seps) - 1
      else:
        assert seps == [len_a + 1, len(tokens) - 1], (split, i)
      assert np.flatnonzero(tokens == sp.cls).tolist() == [0], (split, i)
      assert not np.isin(tokens, [sp.pad, sp.mask]).any(), (split, i)
      checked += 1
    assert between_documents < data.stats[f'{split}_documents']  # the corpus spells [SEP] more often than that
  assert checked == data.num_train + data.num_eval > 100
  assert spelled['[SEP]'] > data.stats['documents']
  with open(os.path.join(data.dir, 'build.json'), encoding='utf-8') as f:
    assert json.load(f)['special_tokens_as_text'] == spelled  # every spelling counted, none missed
  lines = [l for l in capsys.readouterr().out.splitlines() if 'spells special tokens' in l]
  assert len(lines) == 1 and f'{sum(spelled.values()):,} times' in lines[0], lines
  if given:  # the spellings were text: the tokenizer's own ids of '[', 'sep', ']' are in the records
    bracket = tokenization.WordPieceTokenizer.from_directory(given).encode('[')[0]
    assert any(bracket in data.reader('train')[i][0] for i in range(len(data.reader('train'))))


def test_invalid_utf8_in_the_corpus_is_one_warning_line(tmp_path, capsys):
  corpus = tmp_path / 'bad.txt'
  with open(WIKITEXT, 'rb') as f:
    corpus.write_bytes(b'Bad \xff\xfe bytes here. And more.\n' + b''.join(f.readlines()[:700]))
  prepare.prepare_pretraining_data(small_data_config(str(tmp_path), train_files=str(corpus)), vocab_size=VOCAB, seed=0)
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith('warning:')]
  assert warnings == [f'warning: 2 invalid UTF-8 byte sequence(s) in the corpus were replaced with U+FFFD (the first '
                      f'in {corpus})']


@pytest.mark.slow  # prepares the whole bundled corpus (about 5 s on 2 cores)
def test_streaming_hold_out_is_deterministic_and_disjoint(tmp_path):
  cfg = _bundled_cfg(tmp_path)
  data = prepare.prepare_pretraining_data(cfg, vocab_size=2000, seed=0, log=lambda _: None)
  docs = readers.read_all(corpus_files.resolve_files(BUNDLED))
  held = [work_units._is_held_out(d, 0, cfg.eval_fraction) for d in docs]
  assert held == [work_units._is_held_out(d, 0, cfg.eval_fraction) for d in docs]
  assert held != [work_units._is_held_out(d, 1, cfg.eval_fraction) for d in docs]  # the seed picks others
  assert sum(held) == data.stats['eval_documents'] >= 2
  tok = tokenization.load_tokenizer(data.tokenizer_path)
  streams = {True: [], False: []}
  for d, h in zip(docs, held):
    streams[h].append(' ' + ' '.join(str(i) for i in np.concatenate([tok.encode(s) for s in d]).tolist()) + ' ')
  for split, is_eval in (('train', False), ('eval', True)):
    dataset = ip.PretrainingDataset(data, split)
    for i in range(0, len(dataset), max(1, len(dataset) // 30)):
      tokens, len_a, _ = dataset[i]
      needle = ' ' + ' '.join(str(t) for t in tokens[1:len_a + 1].tolist()) + ' '
      assert any(needle in s for s in streams[is_eval]) and not any(needle in s for s in streams[not is_eval])


# ----------------------------------------------------------------------------- bad input


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize('case', ['unknown_format', 'jsonl_without_field', 'corrupt_gzip', 'no_mask_token'])
def test_bad_input_is_one_error_line_and_leaves_no_cache(tmp_path, case):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  cache = tmp_path / 'cache'
  extra = []
  if case == 'unknown_format':
    (corpus / 'a.txt').write_text('One sentence. Two sentences.\n\nThree. Four.\n')
    extra, pattern = ['--config.data.format=parquet'], 'format'
  elif case == 'jsonl_without_field':
    (corpus / 'a.jsonl').write_text('{"text": "One. Two."}\n{"body": "Three. Four."}\n')
    pattern = "'text'"
  elif case == 'corrupt_gzip':
    data = bytearray(gzip.compress(open(WIKITEXT, 'rb').read()))
    data[len(data) // 2:len(data) // 2 + 64] = b'\0' * 64
    (corpus / 'a.txt.gz').write_bytes(bytes(data))
    pattern = 'a.txt.gz'
  else:
    (corpus / 'a.txt').write_text('One sentence. Two sentences.\n\nThree. Four.\n')
    vocab = tmp_path / 'hf'
    vocab.mkdir()
    (vocab / 'vocab.txt').write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'one', 'two']) + '\n')
    extra, pattern = [f'--config.data.tokenizer={vocab}'], '[MASK]'
  # In this process (run_main: the same flags, error line and exit code; one corpus file is prepared without workers).
  result = run_main('prepare_data.py', '--config=experiments/configs/pretrain.py:tiny',
                    f'--config.data.train_files={corpus}', f'--config.data.cache_dir={cache}', *extra)
  assert_one_line_error(result, pattern)
  assert _no_cache_left(cache), os.listdir(cache)


# ----------------------------------------------------------------------------- faults


@pytest.mark.parametrize('damage', ['truncated_shard', 'missing_shard', 'bad_meta', 'meta_without_field',
                                    'short_index'])
def test_damaged_cache_is_one_line_that_says_how_to_rebuild(prepared, tmp_path, damage):
  import shutil  # pylint: disable=g-import-not-at-top
  cfg, data = prepared
  cache = str(tmp_path / os.path.basename(data.dir))
  shutil.copytree(data.dir, cache)
  shard = os.path.join(cache, json.load(open(os.path.join(cache, 'meta.json')))['train_shards'][0])
  if damage == 'truncated_shard':
    os.truncate(shard, os.path.getsize(shard) - 2)
  elif damage == 'missing_shard':
    os.remove(shard)
  elif damage == 'bad_meta':
    with open(os.path.join(cache, 'meta.json'), 'r+b') as f:
      f.truncate(100)
  elif damage == 'meta_without_field':
    meta = json.load(open(os.path.join(cache, 'meta.json')))
    del meta['most_frequent_token']
    json.dump(meta, open(os.path.join(cache, 'meta.json'), 'w'))
  else:
    index = np.load(os.path.join(cache, 'eval.index.npy'))
    np.save(os.path.join(cache, 'eval.index.npy'), index[:-1])
  before = _cache_digest(cache)
  with pytest.raises(DataError, match=f'prepared data cache {cache} is damaged: .*; delete that directory and run'):
    ip.PretrainingDataset(cache, 'train')
  # The same when a run finds it under its fingerprint: never a traceback at step 1.
  with pytest.raises(DataError, match='is damaged'):
    prepare.prepare_pretraining_data(dataclasses.replace(cfg, cache_dir=str(tmp_path)), vocab_size=VOCAB, seed=0,
                                     log=lambda _: None)
  assert _cache_digest(cache) == before


@pytest.mark.slow
@pytest.mark.e2e
def test_a_second_preparation_of_the_same_cache_waits_and_reuses_it(tmp_path):
  cfg = _bundled_cfg(tmp_path / 'cache', num_workers=1)
  fingerprint, _ = cache_identity.fingerprints(cfg, corpus_files.resolve_files(cfg.train_files), [], None, 2000, 0)
  final = os.path.join(cfg.cache_dir, fingerprint)
  os.makedirs(cfg.cache_dir)
  holder = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
  try:
    from bert_jax import files  # pylint: disable=g-import-not-at-top
    with open(final + '.lock', 'w', encoding='utf-8') as f:  # a live process on this host is building it
      json.dump({'host': os.uname().nodename, 'pid': holder.pid, 'start': files._start_time(holder.pid)}, f)
    logs = []

    def finish_first():  # the first build completes: its cache appears, then its lock goes
      while not any('waiting for pid' in l for l in logs):
        time.sleep(0.05)
      prepare.prepare_pretraining_data(dataclasses.replace(cfg, cache_dir=str(tmp_path / 'elsewhere')),
                                       vocab_size=2000, seed=0, log=lambda _: None)
      os.rename(str(tmp_path / 'elsewhere' / fingerprint), final)
      holder.kill()
      holder.wait()
      os.remove(final + '.lock')

    import threading  # pylint: disable=g-import-not-at-top
    first = threading.Thread(target=finish_first)
    first.start()
    data = prepare.prepare_pretraining_data(cfg, vocab_size=2000, seed=0, log=logs.append)
    first.join()
  finally:
    holder.kill()
  assert data.dir == final and any('reusing' in l for l in logs)
  assert sorted(os.listdir(cfg.cache_dir)) == [fingerprint]  # no .partial, no lock left


@pytest.mark.slow
@pytest.mark.e2e
def test_killing_prepare_data_kills_its_workers(tmp_path):
  cache = tmp_path / 'cache'
  args = [a for a in _prepare_data_args(cache) if 'num_workers' not in a] + ['--config.data.num_workers=2']
  proc = subprocess.Popen([sys.executable, 'experiments/prepare_data.py', *args], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  workers = []
  while len(workers) < 2:  # spawned workers: children of the parent running units
    assert proc.poll() is None and time.time() < deadline
    workers = _children(proc.pid)
    time.sleep(0.05)
  proc.kill()
  proc.wait()
  _assert_exit_soon(workers)


@pytest.mark.slow
@pytest.mark.e2e
def test_sigterm_while_preparing_stops_workers_keeps_units_and_exits_75(tmp_path):
  cache = tmp_path / 'cache'
  workdir = str(tmp_path / 'run')
  args = [a.replace('--config.data.num_workers=1', '--config.data.num_workers=2') for a in _prepare_data_args(cache)]
  proc = subprocess.Popen([sys.executable, 'experiments/pretrain.py', f'--workdir={workdir}', *args,
                           '--config.num_train_steps=2'], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 180
  while not glob.glob(str(cache / '*.partial' / 'units' / '*.json')):  # one unit finished, others running
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.02)
  workers = _children(proc.pid)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 75, err[-3000:]
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('preempted: SIGTERM received while preparing the data'), err
  _assert_exit_soon(workers)
  assert not os.path.exists(os.path.join(workdir, '.lock'))
  done = len(glob.glob(str(cache / '*.partial' / 'units' / '*.json')))
  assert done  # finished units stay for the rerun, which builds only the rest
  result = subprocess.run([sys.executable, 'experiments/prepare_data.py', *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0 and f'{done} unit(s) already built by an earlier run' in result.stdout, result.stderr


def _assert_exit_soon(pids: list[int]) -> None:
  deadline = time.time() + 10
  while any(_running(pid) for pid in pids) and time.time() < deadline:
    time.sleep(0.1)
  left = [(pid, open(f'/proc/{pid}/cmdline').read()) for pid in pids if _running(pid)]
  assert not left


def _children(pid: int) -> list[int]:
  out = subprocess.run(['ps', '-o', 'pid=', '--ppid', str(pid)], capture_output=True, text=True).stdout
  return [int(p) for p in out.split()]


def _running(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', encoding='ascii') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'  # a zombie has exited
  except OSError:
    return False
