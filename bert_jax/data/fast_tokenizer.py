"""Any Hugging Face tokenizer (WordPiece, byte-level BPE, Unigram) run through the `tokenizers` package.

`FastTokenizer` reads a checkpoint's tokenizer.json (or a BERT vocab.txt) and runs it with the
library transformers' fast tokenizers run on, so ids are transformers' exactly. What a BERT
tokenizer has at fixed names the model's own files say here:

- special tokens ([CLS]/[SEP]/[MASK]/[PAD]/[UNK] or <s>/</s>/<mask>/<pad>/<unk>): tokenizer_config.json,
  else special_tokens_map.json, else the post-processor's template (cls, sep), else the usual names;
- the template of a text or a pair (BERT's `[CLS] A [SEP] B [SEP]`, RoBERTa's `<s> A </s></s> B </s>`): its
  post-processor (BERT's, built from [CLS]/[SEP], when it has none, as transformers' BertTokenizer does);
- token type ids: only where the tokenizer returns them (`model_input_names`; RoBERTa's and
  ModernBERT's do not: all zeros then, as for a model with one token type);
- word boundaries for whole-word masking: the '##' continuations of WordPiece, the space mark ('Ġ' of
  byte-level BPE, '▁' of Metaspace) that starts a word elsewhere.

`tokenization.WordPieceTokenizer` is this class (the name bert_jax had when it read WordPiece only).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unicodedata
from typing import Any, Sequence

import numpy as np
import tokenizers

from bert_jax import files
from bert_jax.data import tokenization as tk
from bert_jax.errors import DataError
from bert_jax.files import check_regular

TOKENIZER_JSON, VOCAB_TXT, TOKENIZER_CONFIG = 'tokenizer.json', 'vocab.txt', 'tokenizer_config.json'
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'
ROLES = ('pad', 'unk', 'cls', 'sep', 'mask')  # the special tokens bert_jax needs, in SPECIAL_TOKENS' order
# Names tried, in order, when neither the files nor the post-processor name a role.
_USUAL = {'pad': ('[PAD]', '<pad>'), 'unk': ('[UNK]', '<unk>'), 'cls': ('[CLS]', '<s>'), 'sep': ('[SEP]', '</s>'),
          'mask': ('[MASK]', '<mask>')}
# transformers tokenizer classes whose model_input_names (a class default, absent from their config) lack
# token_type_ids; 'Fast' is stripped before the lookup.
_NO_TOKEN_TYPES = frozenset({'RobertaTokenizer', 'XLMRobertaTokenizer', 'CamembertTokenizer', 'BartTokenizer',
                             'DistilBertTokenizer', 'LongformerTokenizer', 'MPNetTokenizer'})


class FastTokenizer:
  """A Hugging Face tokenizer.json with its model's special tokens, template and token types (module docstring)."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, path: str, config: dict[str, Any] | None = None,
               special_map: dict[str, Any] | None = None):
    """Wraps `tokenizer`, read from `path`; use `from_directory` to read one from files.

    Args:
      tokenizer: the `tokenizers` pipeline.
      path: where it was read (messages, `tokenizer_files`).
      config: the directory's tokenizer_config.json ({} when absent).
      special_map: its special_tokens_map.json ({} when absent).

    Raises:
      DataError: a special token bert_jax needs is neither named in the files nor in the vocabulary.
    """
    self._config = dict(config or {})
    names = _special_names(tokenizer, self._config, special_map or {})
    missing = [f'{names[role] or " or ".join(_USUAL[role])} ({role})' for role in ROLES
               if names[role] is None or tokenizer.token_to_id(names[role]) is None]
    if missing:
      raise DataError(f'tokenizer {path} lacks the special token(s) {", ".join(missing)}; bert_jax needs '
                      f'{"/".join(ROLES)} tokens in the vocabulary, named in {TOKENIZER_CONFIG} or '
                      f'{SPECIAL_TOKENS_MAP}')
    self.special_names = names  # role -> the token's text
    # Padding and truncation saved in tokenizer.json (MiniLM's pads to 128) would leak into
    # `encode`; `encode_inputs` asks for truncation explicitly instead.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if tokenizer.post_processor is None:
      cls, sep = names['cls'], names['sep']
      tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
          single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
          special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
    self._tok = tokenizer
    self._truncating: dict[int, tokenizers.Tokenizer] = {}
    self._as_text: tokenizers.Tokenizer | None = None  # a copy that splits special tokens as text
    self._template: tk.Template | None = None
    self._space_before_words: bool | None = None  # `encode_word`'s, read from the pre-tokeniser once
    self.path = path
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        tokenizer.token_to_id(names[role]) for role in ROLES)
    inputs = self._config.get('model_input_names')
    tokenizer_class = str(self._config.get('tokenizer_class') or '').removesuffix('Fast')
    self.token_types = ('token_type_ids' in inputs if isinstance(inputs, list)
                        else tokenizer_class not in _NO_TOKEN_TYPES)

  @classmethod
  def from_directory(cls, directory: str) -> 'FastTokenizer':
    """Reads tokenizer.json, or else vocab.txt (+ tokenizer_config.json), as Hugging Face does.

    Args:
      directory: a Hugging Face checkpoint or tokenizer directory.

    Returns:
      The tokenizer. DataError if the directory has neither file.
    """
    json_path = os.path.join(directory, TOKENIZER_JSON)
    vocab_path = os.path.join(directory, VOCAB_TXT)
    for name in (TOKENIZER_JSON, VOCAB_TXT, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
      check_regular(os.path.join(directory, name), 'tokenizer file')
    config = _read_json(os.path.join(directory, TOKENIZER_CONFIG))
    special_map = _read_json(os.path.join(directory, SPECIAL_TOKENS_MAP))
    if files.isfile(json_path):
      try:
        tok = tokenizers.Tokenizer.from_file(json_path)
      except Exception as e:  # pylint: disable=broad-except  (tokenizers raises bare Exception)
        raise DataError(f'{json_path} is not a tokenizers JSON file ({e})') from None
      return cls(tok, json_path, config, special_map)
    if files.isfile(vocab_path):
      return cls(_tokenizer_from_vocab(vocab_path, config), vocab_path, config, special_map)
    raise DataError(f'{directory} has no vocabulary: neither {TOKENIZER_JSON} nor {VOCAB_TXT}; '
                    'copy the tokenizer files of the checkpoint into it')

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def is_wordpiece(self) -> bool:
    return isinstance(self._tok.model, tokenizers.models.WordPiece)

  @property
  def do_lower_case(self) -> bool | None:
    """The normaliser's lower-casing, or None when it is not a BertNormalizer."""
    normalizer = json.loads(self._tok.to_str()).get('normalizer') or {}
    return normalizer.get('lowercase') if normalizer.get('type') == 'BertNormalizer' else None

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without the template's specials."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_word(self, word: str) -> list[int]:
    """Token ids of one word of a text given as words (CoNLL), as transformers' `is_split_into_words=True` gives
    them with `add_prefix_space=True` (what RoBERTa-style tokenizers need for it): a byte-level BPE that adds no
    space of its own encodes ' ' + word, the pieces a word has inside a sentence ('Ġparis', not 'paris');
    WordPiece and SentencePiece-style (Metaspace) tokenizers encode the word as it is."""
    if self._space_before_words is None:
      pre = json.loads(self._tok.to_str()).get('pre_tokenizer') or {}
      steps = pre.get('pretokenizers', [pre]) if pre.get('type') == 'Sequence' else [pre]
      self._space_before_words = any(step.get('type') == 'ByteLevel' and not step.get('add_prefix_space', True)
                                     for step in steps)
    return self.encode(' ' + word if self._space_before_words else word)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of `text` (no specials) and each token's (start, end) character span in it."""
    enc = self._tok.encode(text, add_special_tokens=False)
    return enc.ids, [tuple(o) for o in enc.offsets]

  @property
  def special_strings(self) -> tuple[str, ...]:
    """The texts that `encode` turns into special ids (the five roles', and any other special added token)."""
    added = [a.content for a in self._tok.get_added_tokens_decoder().values() if a.special]
    return tuple(dict.fromkeys([self.special_names[r] for r in ROLES] + added))

  def encode_batch(self, texts: Sequence[str], num_threads: int = 0,
                   specials_as_text: bool = False) -> list[list[int]]:
    """Token ids of each text: on one thread if num_threads == 1, else on the library's thread pool.

    By default a special token spelled in a text ("[MASK]") becomes its id, as in Hugging Face's
    tokenizer. With `specials_as_text` it is split as ordinary text ('[', 'mask', ']'; the library's
    `encode_special_tokens`, transformers' `split_special_tokens`), as corpus preparation needs: a
    "[SEP]" in a document must not become a segment boundary.
    """
    tok = self._tok
    if specials_as_text:
      if self._as_text is None:
        self._as_text = tokenizers.Tokenizer.from_str(self._tok.to_str())
        self._as_text.encode_special_tokens = True
      tok = self._as_text
    if num_threads != 1:
      return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    # The library has no per-call thread count; it reads this variable on every batch call.
    before = os.environ.get('TOKENIZERS_PARALLELISM')
    os.environ['TOKENIZERS_PARALLELISM'] = 'false'
    try:
      return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    finally:
      if before is None:
        del os.environ['TOKENIZERS_PARALLELISM']
      else:
        os.environ['TOKENIZERS_PARALLELISM'] = before

  def encode_inputs(self, text_a: str, text_b: str | None = None, *,
                    max_length: int) -> tuple[list[int], list[int], bool]:
    """Model inputs for one text or a pair, exactly as Hugging Face's tokenizer builds them.

    Args:
      text_a: the first (or only) text.
      text_b: the second text of a pair, or None.
      max_length: length limit including the template's specials; longest-first truncation.

    Returns:
      (input_ids, token_type_ids, truncated); token types all 0 where the tokenizer has none.
    """
    is_pair = text_b is not None
    tk.check_max_length(max_length, is_pair=is_pair,
                        num_specials=self._tok.post_processor.num_special_tokens_to_add(is_pair))
    tok = self._truncating.get(max_length)
    if tok is None:
      # A copy per length: the library's truncation is tokenizer state, and `encode` must
      # stay untruncated.
      tok = tokenizers.Tokenizer.from_str(self._tok.to_str())
      tok.enable_truncation(max_length, strategy='longest_first')
      self._truncating[max_length] = tok
    enc = tok.encode(text_a) if text_b is None else tok.encode(text_a, text_b)
    types = enc.type_ids if self.token_types else [0] * len(enc.ids)
    return enc.ids, types, bool(enc.overflowing)

  def template(self) -> tk.Template:
    """The post-processor's specials around one text and a pair (`tokenization.Template`), read by running the
    tokenizer on two short texts; B's token type is 0 where the tokenizer has no token types."""
    if self._template is None:
      single, pair = self._tok.encode('a'), self._tok.encode('a', 'b')
      seq = pair.sequence_ids
      a_at = [i for i, s in enumerate(seq) if s == 0]
      b_at = [i for i, s in enumerate(seq) if s == 1]
      single_at = [i for i, s in enumerate(single.sequence_ids) if s == 0]
      b_type = pair.type_ids[b_at[0]] if self.token_types else 0
      self._template = tk.Template(
          head=tuple(pair.ids[:a_at[0]]), single_tail=tuple(single.ids[single_at[-1] + 1:]),
          mid=tuple(pair.ids[a_at[-1] + 1:b_at[0]]), tail=tuple(pair.ids[b_at[-1] + 1:]), b_type=b_type)
    return self._template

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` with special tokens dropped and sub-word pieces joined."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def id_to_token(self, i: int) -> str:
    return self._tok.id_to_token(int(i))

  def token_to_id(self, token: str) -> int:
    """Id of a token; the unknown token's id for unknown tokens."""
    i = self._tok.token_to_id(token)
    return self.unk_id if i is None else i

  def special_table(self) -> np.ndarray:
    """bool[vocab_size]: True for ids masking never picks or draws: pad/cls/sep/mask, the
    '[unusedN]' slots and other added special tokens. The unknown token stands for text and is not special."""
    table_v = np.zeros(self.vocab_size, bool)
    for i in range(self.vocab_size):
      token = self._tok.id_to_token(i) or ''
      table_v[i] = bool(tk.UNUSED.match(token))
    for i, added in self._tok.get_added_tokens_decoder().items():
      if added.special and i < self.vocab_size:
        table_v[i] = True
    table_v[[self.pad_id, self.cls_id, self.sep_id, self.mask_id]] = True
    table_v[self.unk_id] = False
    return table_v

  def word_start_table(self) -> np.ndarray:
    """bool[vocab_size]: True where a token starts a word; specials are starts.

    WordPiece: every token but its '##' continuations. Byte-level BPE and Metaspace (Unigram, BPE):
    tokens that begin with the space mark ('Ġ', '▁'), or with no letter or digit (punctuation,
    which their pre-tokenisers split from words); a word's first token at the start of a text or after
    punctuation has no mark and joins the word before it (masking never groups across a special).
    """
    tokens = [self._tok.id_to_token(i) or '' for i in range(self.vocab_size)]
    spec = json.loads(self._tok.to_str())
    if self.is_wordpiece:
      prefix = spec['model'].get('continuing_subword_prefix') or '##'
      table_v = np.array([not t.startswith(prefix) for t in tokens], dtype=bool)
    elif 'ByteLevel' in json.dumps(spec.get('pre_tokenizer')):
      table_v = np.array([_byte_level_start(t) for t in tokens], dtype=bool)
    else:
      table_v = np.array([not t or t[0] == tk.WORD_START or unicodedata.category(t[0])[0] not in 'LN'
                          for t in tokens], dtype=bool)
    for i, added in self._tok.get_added_tokens_decoder().items():
      if i < self.vocab_size:
        table_v[i] = True
    return table_v

  def save(self, directory: str, *, model_max_length: int | None = None) -> None:
    """Writes the files transformers' AutoTokenizer loads with the same ids: tokenizer.json,
    tokenizer_config.json, and vocab.txt (WordPiece) or special_tokens_map.json (other models).

    Args:
      directory: where to write (created if needed).
      model_max_length: recorded in tokenizer_config.json for transformers' truncation.
    """
    os.makedirs(directory, exist_ok=True)
    # Each file is written beside its final name and renamed, tokenizer.json (what readers look for) last:
    # a write killed half-way never leaves a file that reads as a broken tokenizer.
    staging = tempfile.mkdtemp(prefix='.tokenizer-', dir=directory)
    try:
      specials = {f'{role}_token': self._config.get(f'{role}_token') or self.special_names[role] for role in ROLES}
      if self.is_wordpiece:
        self._tok.model.save(staging)  # vocab.txt, for tools that read only that
        config = {'tokenizer_class': 'BertTokenizer', **specials}
        if self.do_lower_case is not None:
          config['do_lower_case'] = self.do_lower_case
        names = [VOCAB_TXT, TOKENIZER_CONFIG]
      else:
        # PreTrainedTokenizerFast runs tokenizer.json as it is (a model's own class may rebuild it).
        config = {'tokenizer_class': 'PreTrainedTokenizerFast', **specials,
                  'clean_up_tokenization_spaces': self._config.get('clean_up_tokenization_spaces', False),
                  'model_input_names': ['input_ids', *(['token_type_ids'] if self.token_types else []),
                                        'attention_mask']}
        with files.open(os.path.join(staging, SPECIAL_TOKENS_MAP), 'w', encoding='utf-8') as f:
          json.dump(specials, f, indent=2)
        names = [SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG]
      if model_max_length is not None:
        config['model_max_length'] = model_max_length
      with files.open(os.path.join(staging, TOKENIZER_CONFIG), 'w', encoding='utf-8') as f:
        json.dump(config, f, indent=2)
      self._tok.save(os.path.join(staging, TOKENIZER_JSON))
      for name in (*names, TOKENIZER_JSON):
        os.replace(os.path.join(staging, name), os.path.join(directory, name))
    finally:
      shutil.rmtree(staging, ignore_errors=True)

  def identity(self) -> str:
    """What defines its ids (vocabulary, normaliser, pre-tokeniser, specials): equal for the same tokenizer."""
    return self._tok.to_str()


def _byte_level_alphabet() -> dict[str, int]:
  """Byte-level BPE's character for each byte (GPT-2's table: printable bytes stand for themselves, the
  others for U+0100 on), inverted: character -> byte."""
  kept = [*range(ord('!'), ord('~') + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  shifted = [b for b in range(256) if b not in kept]
  return {**{chr(b): b for b in kept}, **{chr(0x100 + i): b for i, b in enumerate(shifted)}}


_BYTE_OF = _byte_level_alphabet()


def _byte_level_start(token: str) -> bool:
  """A byte-level token starts a word when its first byte is a space or an ASCII character that is no
  letter or digit; UTF-8 bytes of other characters (accents, CJK, emoji) continue or start words alike."""
  b = _BYTE_OF.get(token[:1])
  return b is None or b == 0x20 or (b < 0x80 and not chr(b).isalnum())


def _read_json(path: str) -> dict:
  """A tokenizer's JSON file, {} when it has none."""
  return files.read_json(path, 'tokenizer file') if files.isfile(path) else {}


def _token_text(value) -> str | None:
  """A special token as the files write it: a string, or an AddedToken's dict."""
  if isinstance(value, dict):
    value = value.get('content')
  return value if isinstance(value, str) and value else None


def _template_specials(processor: dict) -> dict[str, str]:
  """cls/sep as the post-processor places them: a template's first and last special token."""
  kind = processor.get('type')
  if kind in ('BertProcessing', 'RobertaProcessing'):
    return {'cls': processor['cls'][0], 'sep': processor['sep'][0]}
  if kind == 'TemplateProcessing':
    specials = [p['SpecialToken']['id'] for p in processor.get('single', []) if 'SpecialToken' in p]
    return {'cls': specials[0], 'sep': specials[-1]} if len(specials) >= 2 else {}
  if kind == 'Sequence':
    found = {}
    for p in processor.get('processors', []):
      found.update(_template_specials(p))
    return found
  return {}


def _special_names(tok: tokenizers.Tokenizer, config: dict, special_map: dict) -> dict[str, str | None]:
  spec = json.loads(tok.to_str())
  from_template = _template_specials(spec.get('post_processor') or {})
  model_unk = _token_text(spec['model'].get('unk_token'))
  if spec['model'].get('type') == 'Unigram' and spec['model'].get('unk_id') is not None:
    model_unk = tok.id_to_token(spec['model']['unk_id'])
  names = {}
  for role in ROLES:
    name = (_token_text(config.get(f'{role}_token')) or _token_text(special_map.get(f'{role}_token'))
            or from_template.get(role) or (model_unk if role == 'unk' else None))
    if name is None:
      name = next((n for n in _USUAL[role] if tok.token_to_id(n) is not None), None)
    names[role] = name
  return names


def _tokenizer_from_vocab(vocab_path: str, config: dict) -> tokenizers.Tokenizer:
  # The pipeline transformers' BertTokenizer builds from a vocab.txt (same defaults).
  unk = _token_text(config.get('unk_token')) or tk.UNK_TOKEN
  try:
    model = tokenizers.models.WordPiece.from_file(vocab_path, unk_token=unk, max_input_chars_per_word=100)
  except Exception as e:  # pylint: disable=broad-except  (tokenizers raises bare Exception)
    raise DataError(f'{vocab_path} is not a WordPiece vocabulary ({e})') from None
  tok = tokenizers.Tokenizer(model)
  tok.normalizer = tokenizers.normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=config.get('tokenize_chinese_chars', True),
      strip_accents=config.get('strip_accents'), lowercase=config.get('do_lower_case', True))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = tokenizers.decoders.WordPiece(prefix='##')
  # Specials match the raw text ("[MASK]" is one token even when lower-casing).
  named = [_token_text(config.get(f'{role}_token')) or default for role, default in zip(ROLES, tk.SPECIAL_TOKENS)]
  tok.add_special_tokens([t for t in named if tok.token_to_id(t) is not None])
  return tok  # FastTokenizer checks the specials and adds the [CLS]/[SEP] template
