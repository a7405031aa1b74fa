"""Exports for transformers: SentencePiece models as a tokenizer.json with bert_jax's ids (fine-tuned task heads:
tests/interop/families/test_bert_tasks.py).

The end-to-end pipelines (fill-mask, text-, token-classification, question answering on trained tiny models) are in
test_export_pipelines.py.
"""

import json
import os

from flax import nnx
import jax
import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

from bert_jax import config
from bert_jax.data import tokenization as tk
from bert_jax.errors import DataError
from bert_jax.interop import families
from bert_jax.interop.hf import model_dir, tokenizer_json
from bert_jax.model import heads

from harness.inputs import WIKITEXT

TEST_RAW = os.path.join(os.path.dirname(WIKITEXT), 'wiki.test.raw')


def _lines(path):
  with open(path, encoding='utf-8') as f:
    return [line.rstrip('\n') for line in f]


@pytest.fixture(scope='module', params=[True, False], ids=['lower_case', 'cased'])
def sentencepiece(request, tmp_path_factory):
  """A 1000-piece model trained on the WikiText-2 validation file, lower-casing or not."""
  path = str(tmp_path_factory.mktemp('spm') / 'sp.model')
  return tk.train_sentencepiece(_lines(WIKITEXT), path, 1000, lower_case=request.param)


def _tiny(vocab_size=1000, max_position_embeddings=512):
  cfg = config.preset('tiny', vocab_size=vocab_size, max_position_embeddings=max_position_embeddings)
  params = nnx.to_pure_dict(nnx.state(heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param))
  return cfg, jax.tree.map(np.asarray, params)


ODD_TEXTS = ['Crème brûlée at the Café Ångström, naïve façade', 'E\u0301COLE normale supe\u0301rieure (decomposed)',
             '東京都 北京 서울 カタカナ', '3.14159, 1,234,567 and 2024-01-31 at 12:30',
             'pneumonoultramicroscopicsilicovolcanoconiosis',
             'the [MASK] sat on the [MASK] .', '[CLS] literal specials [SEP] [PAD] [UNK]', '  spaces\tand\nnewlines  ',
             'non\u00a0breaking\u3000space', 'ＦＵＬＬ ｗｉｄｔｈ ﬁne', 'emoji 👍🏽 and 🇫🇷', '']


@pytest.mark.slow
def test_tokenizer_json_gives_bert_jax_ids_on_wikitext(sentencepiece, tmp_path):
  """Every line of WikiText-2 valid + test, alone and paired (their first 300 characters, truncated longest-first),
  and odd texts: the exported tokenizer.json (read by the `tokenizers` library, as transformers' fast tokenizer
  does) gives encode_inputs' ids."""
  cfg, params = _tiny()
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, sentencepiece)
  assert {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'spiece.model'} <= set(os.listdir(out))
  fast = tokenizers.Tokenizer.from_file(os.path.join(out, 'tokenizer.json'))
  texts = _lines(WIKITEXT) + _lines(TEST_RAW) + ODD_TEXTS
  ours = [sentencepiece.encode_inputs(t, max_length=1 << 20)[:2] for t in texts]
  theirs = [(e.ids, e.type_ids) for e in fast.encode_batch(texts)]
  mismatched = [t for t, a, b in zip(texts, ours, theirs) if tuple(a) != b]
  assert not mismatched, (len(mismatched), mismatched[:3])
  fast.enable_truncation(48, strategy='longest_first')
  # Each text of a pair cut to 300 characters (still truncated: 2,353 of the 4,065 pairs): `tokenizers` computes
  # the overflow windows of whole paragraphs too, 4-5 s of the test's 5.5 s.
  pairs = [(a[:300], b[:300]) for a, b in zip(texts[::2], texts[1::2])]
  theirs = [(e.ids, e.type_ids) for e in fast.encode_batch(pairs)]
  for (a, b), got in zip(pairs, theirs):
    assert tuple(sentencepiece.encode_inputs(a, b, max_length=48)[:2]) == got, (a, b)
  # bert_jax reads its own model back (bit-exact), not the conversion.
  again = model_dir.load_hf_tokenizer(out)
  assert isinstance(again, tk.SentencePieceTokenizer) and again.serialized_model() == sentencepiece.serialized_model()
  assert isinstance(tk.load_tokenizer(out), tk.SentencePieceTokenizer)


@pytest.mark.slow
def test_transformers_autotokenizer_reads_the_export(sentencepiece, tmp_path):
  transformers = pytest.importorskip('transformers')
  cfg, params = _tiny()
  out = str(tmp_path / 'export')
  families.save_hf_checkpoint(out, cfg, params, sentencepiece)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  assert tokenizer.is_fast and len(tokenizer) == sentencepiece.vocab_size == 1000
  assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
          tokenizer.mask_token_id) == (0, 1, 2, 3, 4)
  texts = _lines(WIKITEXT)[:400] + ODD_TEXTS
  batch = tokenizer(texts)
  for text, ids, types in zip(texts, batch['input_ids'], batch['token_type_ids']):
    assert (ids, types) == tuple(sentencepiece.encode_inputs(text, max_length=1 << 20)[:2]), text
  pair = tokenizer(texts[1], texts[3], truncation=True, max_length=40)
  assert (pair['input_ids'], pair['token_type_ids']) == tuple(
      sentencepiece.encode_inputs(texts[1], texts[3], max_length=40)[:2])
  words = 'the quick brown fox'
  assert tokenizer.decode(tokenizer(words)['input_ids'], skip_special_tokens=True) == sentencepiece.decode(
      sentencepiece.encode(words))


def _train_other_sentencepiece(path, **settings):
  """A SentencePiece model with bert_jax's special ids but `settings` (model_type, byte_fallback...) of its own."""
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_lines(WIKITEXT)[:800]), model_prefix=path, vocab_size=400, pad_id=0, pad_piece='[PAD]',
      unk_id=1, unk_piece='[UNK]', bos_id=-1, eos_id=-1, control_symbols=['[CLS]', '[SEP]', '[MASK]'], minloglevel=2,
      **settings)
  return tk.SentencePieceTokenizer(path + '.model')


@pytest.mark.parametrize('settings,reason', [(dict(model_type='bpe'), 'model_type BPE'),
                                             (dict(byte_fallback=True), 'byte_fallback'),
                                             (dict(user_defined_symbols=['<x>']), 'pieces of type USER_DEFINED'),
                                             (dict(remove_extra_whitespaces=False), 'remove_extra_whitespaces=false')])
def test_unconvertible_sentencepiece_models_are_refused(settings, reason, tmp_path):
  sp = _train_other_sentencepiece(str(tmp_path / 'other'), **settings)
  cfg, params = _tiny()
  with pytest.raises(DataError, match=f'cannot be exported as a transformers tokenizer.json .*{reason}') as e:
    families.save_hf_checkpoint(str(tmp_path / 'out'), cfg, params, sp)
  assert '\n' not in str(e.value)
  assert not os.path.exists(tmp_path / 'out')  # nothing written


def test_a_conversion_that_differs_is_refused(sentencepiece, tmp_path):
  """check_exact catches a tokenizer.json that would give other ids (here: without the model's normalisation)."""
  fast = tokenizer_json.sentencepiece_to_tokenizers(sentencepiece)
  spec = json.loads(fast.to_str())
  spec['normalizer']['normalizers'] = [n for n in spec['normalizer']['normalizers'] if n['type'] == 'Replace']
  with pytest.raises(DataError, match=r'gives other ids on \d+ of \d+ probe texts .*not exported') as e:
    tokenizer_json.check_exact(sentencepiece, tokenizers.Tokenizer.from_str(json.dumps(spec)))
  assert '\n' not in str(e.value)
  tokenizer_json.check_exact(sentencepiece, fast)
