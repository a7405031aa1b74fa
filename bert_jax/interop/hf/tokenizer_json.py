"""Our SentencePiece models as a Hugging Face fast tokenizer (tokenizer.json), checked against SentencePiece.

transformers cannot read a bert_jax SentencePiece model as a BertTokenizer (BERT means WordPiece
there), but its fast tokenizer runs any `tokenizers` pipeline. `sentencepiece_to_tokenizers`
builds one that encodes as SentencePiece does:

- model: Unigram over the same pieces and scores, [UNK] for characters no piece covers (runs of
  them fused into one, as SentencePiece does);
- normalizer: the model's own precompiled character map (its nmt_nfkc / nmt_nfkc_cf rules), then
  SentencePiece's whitespace handling (trim, collapse runs of spaces, spaces as '▁');
- pre-tokenizer: the dummy '▁' prefix, words at each '▁' (pieces never hold an inner one);
- [PAD] [UNK] [CLS] [SEP] [MASK] as special tokens that match in the raw text (bert_jax's
  `encode_inputs` splits on them alike), and BERT's `[CLS] A [SEP] B [SEP]` template with token types.

Two gaps cannot be closed with the `tokenizers` building blocks; both are rare in real text (the
counts on real corpora: docs/results.md):

- Its Precompiled normalizer rewrites a whole grapheme cluster by its shortest matching rule (often
  its first character's), where SentencePiece takes the longest one: a character that has a rule
  (NBSP, a full-width form; every capital in a lower-casing model) followed by a combining mark
  that does not compose with it loses the mark. NFC runs first, so decomposed (NFD) text composes
  before that and matches.
- Viterbi ties: segmentations with the same pieces in another order ('1 3 33' / '1 33 3') have
  the same score; SentencePiece sums float32 scores and the rounding picks one, `tokenizers`
  sums float64 and keeps the first found.

`check_exact` compares the two on every piece, every Basic Multilingual Plane character and a
list of odd texts before anything is written; a model that fails (settings we do not convert, a
model trained elsewhere) is refused in one line rather than exported with a tokenizer that
gives other ids.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from sentencepiece import sentencepiece_model_pb2
import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors

from bert_jax import files
from bert_jax.data import tokenization as tk
from bert_jax.errors import DataError

TOKENIZER_JSON, TOKENIZER_CONFIG = 'tokenizer.json', 'tokenizer_config.json'
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'
# The special pieces' score in the exported Unigram: so low that no Viterbi path takes them. SentencePiece
# never matches control pieces inside text; the Unigram would ('［CLS］' normalises to '[CLS]', score 0).
# Lowering the minimum score only moves the score of [UNK] nodes, which every path has in the same number
# (checked: every character of every piece is a piece itself), so no segmentation changes.
_SPECIAL_SCORE = -1e4
_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3  # ModelProto.SentencePiece.Type
_UNIGRAM = 1  # TrainerSpec.ModelType
# Texts every export is checked on besides the pieces and the single characters: accents (composed and
# decomposed), CJK, digits, long words, whitespace of every kind, special tokens in the text.
PROBE_TEXTS = (
    'The quick brown fox jumps over the lazy dog.', 'Crème brûlée, naïve café, Ångström, Øresund, Łódź, İstanbul',
    'Cre\u0300me bru\u0302le\u0301e, E\u0301cole, A\u030angstro\u0308m', 'ÉCOLE NORMALE SUPÉRIEURE', 'straße STRASSE ẞ',
    '東京都は日本の首都です。', '北京大学 and 서울 (한국어) and カタカナ', 'ΟΔΟΣ οδός Σίσυφος',
    'Москва — столица России.',
    '3.14159 1,234,567 2024-01-31 12:30 +49 (0)30 1234 ½ ² ①', 'pneumonoultramicroscopicsilicovolcanoconiosis ' * 2,
    'Supercalifragilisticexpialidocious!!!???', '  leading and trailing spaces  ', 'tabs\tand\nnewlines\r\n here',
    'non\u00a0breaking\u2002spaces\u3000ideographic', 'zero\u200bwidth\u200dparts\ufeff',
    'ﬁne ﬂour ＦＵＬＬ ｗｉｄｔｈ',
    'the [MASK] sat on the [MASK].', '[CLS] literal [SEP] specials [PAD] [UNK]', '［CLS］ full-width brackets',
    '\u2581leading block \u2581\u2581 marks', 'emoji 👍🏽 👨\u200d👩\u200d👧 🇫🇷', 'control\x00\x07chars\x1b', '', ' ',
    "It's a \"quoted\" (parenthesised) [bracketed] {braced} <angled> text; isn't it?",
    'e-mail: someone@example.com, url: https://example.com/a_b?c=d&e=f#g', 'C++ / C# / F# / .NET / Node.js',
    'Ünïcödé ÜBER alles; Œuvre, Æsir; ĳ Ǆ', 'x' * 300)


def sentencepiece_to_tokenizers(tokenizer: tk.SentencePieceTokenizer) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` that encodes like `tokenizer` (see the module docstring for the two gaps).

  Raises:
    DataError: the model uses settings this conversion does not reproduce (not unigram, byte fallback,
      user-defined pieces, other whitespace handling); nothing is built.
  """
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer.serialized_model())
  _check_settings(proto, tokenizer.path)
  vocab = [(p.piece, _SPECIAL_SCORE if i < tk.NUM_SPECIAL else p.score) for i, p in enumerate(proto.pieces)]
  fast = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=tk.UNK_ID, byte_fallback=False))
  spec = proto.normalizer_spec
  # Compose first: Precompiled rewrites a grapheme cluster by its shortest matching rule, so decomposed text
  # ('E' + U+0301 in a lower-casing model, where 'E' alone has a rule; 'u' + U+0308 + U+0300, where 'u' + U+0308
  # has one) would lose marks that SentencePiece's longest match composes.
  steps = [normalizers.NFC()]
  if spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
  steps += [
      # SentencePiece's remove_extra_whitespaces: only ' ' counts (the rules map the other spaces to it).
      normalizers.Replace(Regex(r'\A +| +\z'), ''), normalizers.Replace(Regex(' {2,}'), ' '),
      normalizers.Replace(' ', tk.WORD_START),
      # SentencePiece adds the dummy '▁' even before a '▁' in the text; Metaspace would not.
      normalizers.Replace(Regex(rf'\A{tk.WORD_START}'), tk.WORD_START * 2)]
  fast.normalizer = normalizers.Sequence(steps)
  # Words at each '▁': the same segmentation as SentencePiece's one lattice over the whole text, since pieces
  # hold a '▁' only at their start, and transformers gets word ids (the question-answering pipeline aligns
  # answers to them, the token-classification one groups sub-words by them).
  fast.pre_tokenizer = pre_tokenizers.Metaspace(replacement=tk.WORD_START, prepend_scheme='always', split=True)
  fast.decoder = decoders.Sequence([decoders.Replace(tk.WORD_START, ' '), decoders.Fuse(),
                                    decoders.Strip(content=' ', left=1, right=0)])
  fast.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in tk.SPECIAL_TOKENS])
  fast.post_processor = processors.TemplateProcessing(
      single=f'{tk.CLS_TOKEN}:0 $A:0 {tk.SEP_TOKEN}:0',
      pair=f'{tk.CLS_TOKEN}:0 $A:0 {tk.SEP_TOKEN}:0 $B:1 {tk.SEP_TOKEN}:1',
      special_tokens=[(tk.CLS_TOKEN, tk.CLS_ID), (tk.SEP_TOKEN, tk.SEP_ID)])
  return fast


def _check_settings(proto, path: str) -> None:
  trainer, spec = proto.trainer_spec, proto.normalizer_spec
  problems = []
  if trainer.model_type != _UNIGRAM:
    problems.append(f'model_type {sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type)} '
                    '(only UNIGRAM is converted)')
  if trainer.byte_fallback:
    problems.append('byte_fallback')
  if trainer.treat_whitespace_as_suffix:
    problems.append('treat_whitespace_as_suffix')
  for name in ('add_dummy_prefix', 'remove_extra_whitespaces', 'escape_whitespaces'):
    if not getattr(spec, name):
      problems.append(f'{name}=false')
  kinds = {p.type for p in proto.pieces[tk.NUM_SPECIAL:]} - {_NORMAL}
  if kinds:
    problems.append('pieces of type ' + ', '.join(sorted(sentencepiece_model_pb2.ModelProto.SentencePiece.Type.Name(k)
                                                          for k in kinds)))
  if [p.type for p in proto.pieces[:tk.NUM_SPECIAL]] != [_CONTROL, _UNKNOWN, _CONTROL, _CONTROL, _CONTROL]:
    problems.append('special pieces 0..4 are not [PAD] control, [UNK] unknown, [CLS]/[SEP]/[MASK] control')
  pieces = {p.piece for p in proto.pieces[tk.NUM_SPECIAL:]}
  orphans = sorted({c for p in pieces for c in p} - pieces)
  if orphans:  # an [UNK] node could then compete with a piece, and [UNK]'s score differs (see _SPECIAL_SCORE)
    problems.append(f'characters {"".join(orphans[:10])!r} occur in pieces but are no piece themselves')
  if problems:
    raise DataError(f'tokenizer {path} cannot be exported as a transformers tokenizer.json that gives the same ids: '
                    + '; '.join(problems))


def _probes(tokenizer: tk.SentencePieceTokenizer) -> list[str]:
  pieces = [tokenizer.id_to_token(i).replace(tk.WORD_START, ' ') for i in range(tk.NUM_SPECIAL, tokenizer.vocab_size)]
  chars = [chr(c) for c in range(1, 0x10000) if not 0xD800 <= c < 0xE000]
  return list(PROBE_TEXTS) + pieces + chars + [f'a{c}b' for c in chars[::7]]


def check_exact(tokenizer: tk.SentencePieceTokenizer, fast: tokenizers.Tokenizer,
                texts: Sequence[str] | None = None) -> None:
  """Raises DataError unless `fast` gives `tokenizer`'s ids: `encode` on every probe text, and
  `encode_inputs` (specials, pairs, truncation) on the odd texts of PROBE_TEXTS.

  Args:
    tokenizer: the SentencePiece model.
    fast: its conversion.
    texts: what to compare on (default: PROBE_TEXTS, every piece, every BMP character alone and some in context).
  """
  texts = _probes(tokenizer) if texts is None else list(texts)
  ours = tokenizer.encode_batch(texts)
  theirs = [e.ids for e in _without_specials(fast).encode_batch(texts, add_special_tokens=False)]
  bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  pairs = list(zip(PROBE_TEXTS, PROBE_TEXTS[1:] + PROBE_TEXTS[:1]))
  truncating = tokenizers.Tokenizer.from_str(fast.to_str())
  truncating.enable_truncation(24, strategy='longest_first')
  for a, b in pairs:
    for text_b in (None, b):
      expected = tokenizer.encode_inputs(a, text_b, max_length=24)[:2]
      enc = truncating.encode(a) if text_b is None else truncating.encode(a, text_b)
      if (enc.ids, enc.type_ids) != tuple(expected):
        bad.append(len(texts))
        texts.append(a if text_b is None else f'{a} | {b}')
        ours.append(expected[0])
        theirs.append(enc.ids)
  if bad:
    i = bad[0]
    raise DataError(f'tokenizer {tokenizer.path}: the transformers tokenizer.json built from it gives other ids on '
                    f'{len(bad)} of {len(texts)} probe texts (e.g. {texts[i][:40]!r}: {ours[i][:8]} vs '
                    f'{theirs[i][:8]}); not exported, since transformers would tokenize differently from bert_jax')


def _without_specials(fast: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """`fast` without its added special tokens, to compare with `encode` (which never splits them out)."""
  spec = json.loads(fast.to_str())
  spec['added_tokens'] = []
  return tokenizers.Tokenizer.from_str(json.dumps(spec))


def save_for_transformers(tokenizer: tk.SentencePieceTokenizer, directory: str, *,
                          model_max_length: int | None = None, fast: tokenizers.Tokenizer | None = None,
                          token_types: bool = True) -> None:
  """Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json for transformers' AutoTokenizer.

  Args:
    tokenizer: the SentencePiece model.
    directory: where to write (it exists).
    model_max_length: recorded for transformers' truncation.
    fast: its conversion, when already built (and checked).
    token_types: the model takes token_type_ids (BERT; ModernBERT does not).
  """
  fast = fast or sentencepiece_to_tokenizers(tokenizer)
  fast.save(os.path.join(directory, TOKENIZER_JSON))
  specials = {'unk_token': tk.UNK_TOKEN, 'sep_token': tk.SEP_TOKEN, 'pad_token': tk.PAD_TOKEN,
              'cls_token': tk.CLS_TOKEN, 'mask_token': tk.MASK_TOKEN}
  # PreTrainedTokenizerFast: the class that runs tokenizer.json as it is (BertTokenizer would build WordPiece).
  config = {'tokenizer_class': 'PreTrainedTokenizerFast', **specials, 'clean_up_tokenization_spaces': False,
            'model_input_names': ['input_ids', *(['token_type_ids'] if token_types else []), 'attention_mask']}
  if model_max_length is not None:
    config['model_max_length'] = model_max_length
  for name, content in ((TOKENIZER_CONFIG, config), (SPECIAL_TOKENS_MAP, specials)):
    with files.open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
      json.dump(content, f, indent=2)
