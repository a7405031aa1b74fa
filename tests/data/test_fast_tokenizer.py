"""bert_jax.data.fast_tokenizer: any Hugging Face tokenizer.json, with ids equal to transformers' AutoTokenizer.

The tokenizers are trained here in the style of the published models (nothing is downloaded): ModernBERT's
byte-level BPE ([CLS]/[SEP]/[MASK] appended after the merges, no token type ids), RoBERTa's byte-level BPE
(<s>/</s>/<mask>, `<s> A </s></s> B </s>`) and XLM-R's Unigram (SentencePiece pieces in tokenizer.json form)."""

import json
import os

import numpy as np
import pytest

from bert_jax.data import fast_tokenizer, masking, tokenization as tk
from bert_jax.errors import DataError
from bert_jax.interop.hf import tokenizer_json

from harness.inputs import modernbert_style_tokenizer

transformers = pytest.importorskip('transformers')

# Hidden-style texts on top of the SentencePiece export's probes (accents, CJK, emoji, whitespace, specials).
HARD_TEXTS = list(tokenizer_json.PROBE_TEXTS) + [
    'def f(x):\n    return x ** 2  # squares', 'for (int i = 0; i < n; ++i) { a[i] = "s\\n"; }',
    'https://en.wikipedia.org/wiki/Caf%C3%A9?x=1&y=%20#top', 'the <mask> and [MASK][MASK] and [mask] and [SEP]x[CLS]',
    ' [MASK] leading, trailing [MASK] ', '[unused1] [PAD] [UNK] |||IP_ADDRESS||| <|padding|>', 'Ǆ ǅ ǆ ﬀ ℌ ℍ ①②③ ⅫⅣ',
    'مرحبا بالعالم', 'नमस्ते दुनिया', '🤗🤗🤗 🏳️\u200d🌈 a🎉b', "can't won't it's I'm y'all", '\u00e9\u0301\u0327 e\u0301']
SECOND = 'a second text, with [MASK] and émoji 👍 and 東京'


@pytest.fixture(scope='module')
def modernbert_dir(tmp_path_factory):
  return modernbert_style_tokenizer(str(tmp_path_factory.mktemp('modernbert_tokenizer')))


def _assert_same_as_transformers(ours, directory, texts=HARD_TEXTS):
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  assert ours.encode_batch(texts) == [theirs(t, add_special_tokens=False)['input_ids'] for t in texts]
  for a in texts:
    for b in (None, SECOND):
      for max_length in (None, 12):
        kw = {'truncation': 'longest_first', 'max_length': max_length} if max_length else {}
        want = theirs(a, **kw) if b is None else theirs(a, b, **kw)
        ids, types, truncated = ours.encode_inputs(a, b, max_length=max_length or 10_000)
        assert ids == want['input_ids'], (a, b, max_length)
        assert types == want.get('token_type_ids', [0] * len(ids)), (a, b, max_length)
        assert truncated == (max_length is not None and len(ours.encode_inputs(a, b, max_length=10_000)[0]) > 12)


def test_modernbert_style_bpe_gives_transformers_ids(modernbert_dir):
  tokenizer = tk.load_tokenizer(modernbert_dir)
  assert isinstance(tokenizer, fast_tokenizer.FastTokenizer) and tk.WordPieceTokenizer is fast_tokenizer.FastTokenizer
  theirs = transformers.AutoTokenizer.from_pretrained(modernbert_dir)
  assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.pad_id, tokenizer.unk_id) == (
      theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id, theirs.pad_token_id, theirs.unk_token_id)
  assert tokenizer.cls_id > 100 and not tokenizer.token_types and tokenizer.vocab_size == len(theirs)
  _assert_same_as_transformers(tokenizer, modernbert_dir)
  # [MASK] strips the space before it (lstrip), as ModernBERT's does: fill-mask's input.
  ids = tokenizer.encode_inputs('Paris is the [MASK] of France.', max_length=64)[0]
  assert ids.count(tokenizer.mask_id) == 1 and tokenizer.decode(ids) == 'Paris is the of France.'
  # Corpus preparation reads a spelled "[SEP]" as text, never as a boundary.
  assert tokenizer.sep_id not in tokenizer.encode_batch(['a [SEP] b'], specials_as_text=True)[0]


def test_roberta_and_xlmr_style_give_transformers_ids(styled_tokenizer):
  style, directory = styled_tokenizer
  tokenizer = tk.load_tokenizer(directory)
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.pad_id, tokenizer.unk_id) == (
      theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id, theirs.pad_token_id, theirs.unk_token_id)
  assert [tokenizer.id_to_token(i) for i in (tokenizer.cls_id, tokenizer.pad_id, tokenizer.sep_id)] == [
      '<s>', '<pad>', '</s>']
  assert not tokenizer.token_types and tokenizer.vocab_size == len(theirs)
  _assert_same_as_transformers(tokenizer, directory)
  a, b = tokenizer.encode('a b'), tokenizer.encode('c d')
  seps = 2 if style == 'roberta' else 1  # transformers 5's XLMRobertaTokenizer writes one </s> between the texts
  assert tokenizer.encode_inputs('a b', 'c d', max_length=32)[0] == [
      tokenizer.cls_id, *a, *[tokenizer.sep_id] * seps, *b, tokenizer.sep_id]
  starts = tokenizer.word_start_table()
  ids = tokenizer.encode('The tokenization of words')
  mark = 'Ġ' if style == 'roberta' else '▁'
  # After the first (which joins what precedes it in a row: module docstring), the marked pieces start words.
  assert [bool(starts[i]) for i in ids[1:]] == [tokenizer.id_to_token(i).startswith(mark) for i in ids[1:]]
  assert len(ids) > 4 and starts[[tokenizer.cls_id, tokenizer.sep_id]].all()


def test_tables_for_masking(modernbert_dir):
  tokenizer = tk.load_tokenizer(modernbert_dir)
  special = tokenizer.special_table()
  for token in ('[CLS]', '[SEP]', '[PAD]', '[MASK]', '[unused2]', '|||IP_ADDRESS|||', '<|padding|>'):
    assert special[tokenizer.token_to_id(token)], token
  assert not special[tokenizer.unk_id] and special.sum() == 9  # 2 + cls, sep, pad, mask + 3 unused
  starts = tokenizer.word_start_table()
  ids = tokenizer.encode('The tokenization, of pneumonoultramicroscopic words')
  pieces = [tokenizer.id_to_token(i) for i in ids]
  # A word is its 'Ġ' piece and what follows up to the next 'Ġ' or punctuation piece.
  assert [p for p, s in zip(pieces, starts[ids]) if s] == [p for p in pieces if p[0] in 'Ġ,']
  assert starts[[tokenizer.cls_id, tokenizer.sep_id]].all()
  # Whole-word masking with the model's own mask id: only whole words, never a special.
  row = tokenizer.encode_inputs('The tokenization, of pneumonoultramicroscopic words ' * 3, max_length=64)[0]
  tokens = np.array([row], np.int32)
  replace = np.flatnonzero(~special).astype(np.int32)
  out, positions, labels, weights = masking.mask_batch(
      tokens, np.array([len(row)]), np.array([7], np.uint64), special_v=special, replace_ids=replace,
      mask_id=tokenizer.mask_id, max_predictions=20, masked_lm_prob=0.3, word_starts_v=starts)
  chosen = set(positions[0][weights[0] > 0].tolist())
  assert chosen and not special[tokens[0, sorted(chosen)]].any()
  assert (out[0] == tokenizer.mask_id).any()
  for p in chosen:  # a chosen non-start continues a chosen word (or follows [CLS], which ends words)
    if not starts[tokens[0, p]]:
      assert p - 1 in chosen or special[tokens[0, p - 1]]


def test_saved_into_a_workdir_loads_back_and_in_transformers(modernbert_dir, tmp_path):
  tokenizer = tk.load_tokenizer(modernbert_dir)
  workdir = str(tmp_path / 'workdir')
  path = tk.save_tokenizer(tokenizer, workdir)
  assert path == os.path.join(workdir, 'tokenizer.json') == os.path.join(workdir, tk.tokenizer_file_name(tokenizer))
  back = tk.load_tokenizer(workdir)
  assert back.identity() == tokenizer.identity() and back.special_names == tokenizer.special_names
  assert not back.token_types
  assert {os.path.basename(p) for p in tk.tokenizer_files(back)} == {'tokenizer.json', 'tokenizer_config.json'}
  _assert_same_as_transformers(back, workdir, HARD_TEXTS[-12:])


def _write_json(path, content):
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(content, f)


def test_missing_special_tokens_are_named(modernbert_dir, tmp_path):
  with open(os.path.join(modernbert_dir, 'tokenizer.json'), encoding='utf-8') as f:
    spec = json.load(f)
  no_mask = tmp_path / 'no_mask'
  no_mask.mkdir()
  spec['added_tokens'] = [a for a in spec['added_tokens'] if a['content'] != '[MASK]']
  _write_json(no_mask / 'tokenizer.json', spec)
  with pytest.raises(DataError, match=r'lacks the special token\(s\) \[MASK\] or <mask> \(mask\); ') as e:
    tk.load_tokenizer(str(no_mask))
  assert '\n' not in str(e.value)
  _write_json(no_mask / 'tokenizer_config.json', {'mask_token': '<mask>', 'cls_token': '<s>'})
  with pytest.raises(DataError, match=r'lacks the special token\(s\) <s> \(cls\), <mask> \(mask\); '):
    tk.load_tokenizer(str(no_mask))
