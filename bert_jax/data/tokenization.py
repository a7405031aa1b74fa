"""Tokenizers: SentencePiece with BERT's special tokens at fixed ids; Hugging Face tokenizers for imports.

Our own SentencePiece models always have ids 0..4 = [PAD], [UNK], [CLS], [SEP], [MASK], so
model code, masking and checkpoints can rely on constants instead of asking the tokenizer.
Imported Hugging Face checkpoints bring their own tokenizer (WordPiece, byte-level BPE, Unigram)
whose special ids and template differ; `fast_tokenizer.FastTokenizer` (also named
`WordPieceTokenizer` here) runs it with the `tokenizers` package, the same code Hugging Face runs,
so ids match exactly. Both share `encode_inputs`, which adds the template's specials and truncates
pairs longest-first, and the tables masking reads (`special_table`, `word_start_table`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import random
import re
import shutil
import tempfile
import weakref
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import sentencepiece as spm

from bert_jax import files
from bert_jax.errors import ConfigError, DataError
from bert_jax.files import check_regular

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = SPECIAL_TOKENS
NUM_SPECIAL = len(SPECIAL_TOKENS)
WORD_START = '\u2581'  # '▁', SentencePiece's word-boundary mark
# Splits a text at the special tokens spelled in it, keeping them (odd items of the split).
_SPECIAL_SPLIT = re.compile('(' + '|'.join(re.escape(t) for t in SPECIAL_TOKENS) + ')')

# SentencePiece splits the EM statistics by thread index, so the model bytes depend on
# the thread count (not on timing): fix it so every host trains the identical model.
_TRAIN_THREADS = 4
_ASCII_PRINTABLE = ''.join(chr(c) for c in range(33, 127))
# Names how train_sentencepiece trains, in cache fingerprints: a change must not reuse old caches.
SENTENCEPIECE_TRAINING = 'unigram, word counts, 1 sub-iteration, shrinking 0.6'
_MAX_LINE_BYTES = 4000  # under the trainer's max_sentence_length (4192 bytes)


def train_sentencepiece(sentences: Iterable[str], output_path: str, vocab_size: int,
                        lower_case: bool, seed: int = 0,
                        max_sentences: int = 2_000_000) -> 'SentencePieceTokenizer':
  """Trains a unigram SentencePiece model in-process; same input, same bytes.

  The trainer is fed word counts (its TSV input), not the sentences: SentencePiece splits
  at whitespace before EM anyway, and its seed pieces then come from a suffix array over
  the distinct words instead of over all the text, which was most of the time on a large
  sample (see `_word_count_lines`). One EM sub-iteration per round and a 0.6 shrinking
  factor (defaults 2 and 0.75) halve the rest, at the same pieces per word (docs/results.md).

  Args:
    sentences: training text, one sentence per item.
    output_path: where the .model file is written (atomically).
    vocab_size: pieces including the 5 special tokens.
    lower_case: case-fold during normalisation (nmt_nfkc_cf) or keep case (nmt_nfkc).
    seed: picks the `max_sentences` sample when there are more sentences.
    max_sentences: cap on training sentences (memory and time grow with it).

  Returns:
    The trained tokenizer, loaded from `output_path`.
  """
  sentences = [s for s in sentences if s.strip()]
  if not sentences:
    raise DataError(f'no text to train the tokenizer {output_path} on')
  if len(sentences) > max_sentences:
    keep = sorted(random.Random(seed).sample(range(len(sentences)), max_sentences))
    sentences = [sentences[i] for i in keep]
  counts = collections.Counter(w for s in sentences for w in s.split())
  del sentences
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_word_count_lines(counts), input_format='tsv', model_writer=model,
        model_type='unigram', vocab_size=vocab_size, hard_vocab_limit=True,
        pad_id=PAD_ID, pad_piece='[PAD]', unk_id=UNK_ID, unk_piece='[UNK]',
        bos_id=-1, eos_id=-1, control_symbols=list(SPECIAL_TOKENS[2:]),
        normalization_rule_name='nmt_nfkc_cf' if lower_case else 'nmt_nfkc',
        # Rare-but-plain ASCII ('/' in a small corpus) must not fall under character_coverage.
        required_chars=''.join(sorted(set(_ASCII_PRINTABLE.lower() if lower_case
                                          else _ASCII_PRINTABLE))),
        num_sub_iterations=1, shrinking_factor=0.6,
        num_threads=_TRAIN_THREADS, input_sentence_size=0, shuffle_input_sentence=False,
        minloglevel=2)
  except RuntimeError as e:
    msg = str(e).split('] ')[-1]
    if 'too high' in msg:
      raise DataError(f'vocab_size {vocab_size} too large for this corpus; sentencepiece says: '
                      f'{msg}') from None
    raise DataError(f'sentencepiece training for {output_path} failed: {msg}') from None
  os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
  tmp = f'{output_path}.tmp-{os.getpid()}'
  with files.open(tmp, 'wb') as f:
    f.write(model.getvalue())
  os.replace(tmp, output_path)
  return SentencePieceTokenizer(output_path)



def _word_count_lines(counts: dict[str, int]) -> Iterable[str]:
  """TSV lines 'word word … word<TAB>n' whose total per word is its count.

  SentencePiece's TSV mode uses the counts in EM but mines seed pieces from the text of the
  lines alone, where every word would count once: the whole of a frequent word (`▁the`, `▁,`)
  would then never become a seed. Writing the word 1 + log2(count) times, with the count
  divided among the copies, gives seeds a log-frequency weight and keeps EM's counts exact.
  """
  for word, n in counts.items():
    copies = max(1, min(n.bit_length(), _MAX_LINE_BYTES // (len(word.encode()) + 1)))  # 1 + log2(n)
    per_copy, rest = divmod(n, copies)
    yield ' '.join([word] * copies) + '\t' + str(per_copy)
    if rest:
      yield f'{word}\t{rest}'


class SentencePieceTokenizer:
  """A SentencePiece model whose ids 0..4 are BERT's special tokens."""

  def __init__(self, path: str):
    """Loads `path`; DataError if it is missing, not a model, or lacks the specials."""
    self.path = path
    check_regular(path, 'tokenizer')
    if not files.isfile(path):
      raise DataError(f'tokenizer {path} does not exist; set --config.data.tokenizer to a '
                      '.model file or leave it empty to train one')
    try:
      self._sp = spm.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as e:
      raise DataError(f'tokenizer {path} is not a sentencepiece model ({e})') from None
    found = tuple(self._sp.id_to_piece(i) for i in range(min(NUM_SPECIAL, len(self._sp))))
    if found != SPECIAL_TOKENS:
      raise DataError(f'tokenizer {path} has {found} at ids 0..4 but bert_jax needs '
                      f'{SPECIAL_TOKENS}; train it with tokenization.train_sentencepiece')

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def serialized_model(self) -> bytes:
    """The model file's bytes (its ModelProto)."""
    return self._sp.serialized_model_proto()

  identity = serialized_model  # what defines its ids: equal for the same tokenizer

  def normalize(self, text: str) -> str:
    """`text` as the model's normalizer leaves it ('▁' for spaces, with the dummy prefix)."""
    return self._sp.normalize(text)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without [CLS]/[SEP]."""
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 0,
                   specials_as_text: bool = False) -> list[list[int]]:
    """Token ids of each text, on `num_threads` threads (0: one per core).

    `specials_as_text` changes nothing here: the specials are control symbols, which SentencePiece
    never produces from text ("[SEP]" in a text is encoded as the pieces of its characters).
    """
    del specials_as_text
    return self._sp.encode(list(texts), out_type=int, num_threads=num_threads or os.cpu_count() or 1)

  special_strings = property(lambda self: SPECIAL_TOKENS)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of `text` (no specials) and each token's (start, end) character span in it."""
    proto = self._sp.encode(text, return_type='proto')
    char_at_byte = np.zeros(len(text.encode('utf-8')) + 1, np.int64)
    pos = 0
    for i, ch in enumerate(text):
      n = len(ch.encode('utf-8'))
      char_at_byte[pos:pos + n] = i
      pos += n
    char_at_byte[pos] = len(text)
    ids, offsets = [], []
    for piece in proto.pieces:
      ids.append(piece.id)
      start, end = int(char_at_byte[piece.begin]), int(char_at_byte[piece.end])
      while start < end and text[start].isspace():  # the word-start marker covers the space
        start += 1
      offsets.append((start, end))
    return ids, offsets

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; control tokens ([CLS], [SEP], [MASK], [PAD]) decode to ''."""
    return self._sp.decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def token_to_id(self, token: str) -> int:
    """Id of a piece; [UNK]'s id for unknown pieces."""
    return self._sp.piece_to_id(token)

  # The same properties as FastTokenizer, so callers need not know which one they hold.
  pad_id = property(lambda self: PAD_ID)
  unk_id = property(lambda self: UNK_ID)
  cls_id = property(lambda self: CLS_ID)
  sep_id = property(lambda self: SEP_ID)
  mask_id = property(lambda self: MASK_ID)

  def encode_inputs(self, text_a: str, text_b: str | None = None, *,
                    max_length: int) -> tuple[list[int], list[int], bool]:
    """Model inputs for one text or a pair: [CLS] a [SEP] (b [SEP]), truncated longest-first.

    A special token spelled in the text ("[MASK]", also "[CLS]", "[SEP]", "[PAD]", "[UNK]")
    becomes its id (the text is split on them and the pieces encoded separately), so fill-mask
    works on our own checkpoints, and the ids are what WordPiece and transformers' fast
    tokenizer give (interop/hf/tokenizer_json.py); `encode` never produces special ids.

    Args:
      text_a: the first (or only) text.
      text_b: the second text of a pair, or None.
      max_length: length limit including [CLS] and [SEP]s.

    Returns:
      (input_ids, token_type_ids, truncated).
    """
    ids_b = None if text_b is None else self._encode_with_masks(text_b)
    return assemble_inputs(self._encode_with_masks(text_a), ids_b, max_length=max_length,
                           cls_id=CLS_ID, sep_id=SEP_ID)

  def _encode_with_masks(self, text: str) -> list[int]:
    ids = []
    for i, chunk in enumerate(_SPECIAL_SPLIT.split(text)):
      if i % 2:  # a special token spelled in the text
        ids.append(SPECIAL_TOKENS.index(chunk))
      elif chunk.strip():
        ids.extend(self.encode(chunk))
    return ids

  def special_table(self) -> np.ndarray:
    """bool[vocab_size]: True for ids that masking never picks or draws ([PAD], control pieces).

    [UNK] is not special: it stands for real text and is predicted like any token.
    """
    table_v = np.array([self._sp.is_control(i) or self._sp.is_unused(i)
                        for i in range(self.vocab_size)], dtype=bool)
    table_v[[PAD_ID, CLS_ID, SEP_ID, MASK_ID]] = True
    table_v[UNK_ID] = False
    return table_v

  def word_start_table(self) -> np.ndarray:
    """bool[vocab_size]: True where a piece starts a word (and for special tokens).

    Whole-word masking groups a word-start piece with the non-start pieces after it.
    """
    table_v = np.array([self._sp.id_to_piece(i).startswith(WORD_START)
                        for i in range(self.vocab_size)], dtype=bool)
    table_v[:NUM_SPECIAL] = True
    return table_v


@dataclasses.dataclass(frozen=True)
class Template:
  """Where a tokenizer puts its special tokens: `head` A `single_tail` for one text, `head` A `mid` B `tail` for a
  pair, B and `tail` of token type `b_type` (the rest 0). BERT's (`bert_template`): [CLS] A [SEP] and
  [CLS] A [SEP] B [SEP] with B [SEP] of type 1; RoBERTa's: <s> A </s> and <s> A </s></s> B </s>, all type 0.
  Callers that assemble inputs from pieces (SQuAD windows, CoNLL sentences) take it from `template_of`."""

  head: tuple[int, ...]
  single_tail: tuple[int, ...]
  mid: tuple[int, ...]
  tail: tuple[int, ...]
  b_type: int = 1

  @property
  def pair_specials(self) -> int:
    return len(self.head) + len(self.mid) + len(self.tail)

  @property
  def single_specials(self) -> int:
    return len(self.head) + len(self.single_tail)

  def single(self, ids_a: Sequence[int]) -> tuple[list[int], list[int]]:
    """(input_ids, token_type_ids) of one text's ids."""
    ids = [*self.head, *ids_a, *self.single_tail]
    return ids, [0] * len(ids)

  def pair(self, ids_a: Sequence[int], ids_b: Sequence[int]) -> tuple[list[int], list[int]]:
    """(input_ids, token_type_ids) of a pair's ids."""
    first, second = [*self.head, *ids_a, *self.mid], [*ids_b, *self.tail]
    return first + second, [0] * len(first) + [self.b_type] * len(second)


def bert_template(cls_id: int, sep_id: int) -> Template:
  return Template(head=(cls_id,), single_tail=(sep_id,), mid=(sep_id,), tail=(sep_id,))


def template_of(tokenizer) -> Template:
  """The tokenizer's own template (a Hugging Face tokenizer's post-processor), else BERT's with its ids."""
  own = getattr(tokenizer, 'template', None)
  return own() if callable(own) else bert_template(tokenizer.cls_id, tokenizer.sep_id)


def assemble_inputs(ids_a: Sequence[int], ids_b: Sequence[int] | None, *, max_length: int,
                    cls_id: int, sep_id: int) -> tuple[list[int], list[int], bool]:
  """[CLS] a [SEP] (b [SEP]) with token types, truncated longest-first to `max_length`.

  Pairs are cut the way Hugging Face's `tokenizers` cuts them (its 'longest_first'), so a
  SentencePiece pair and a WordPiece pair of the same lengths truncate alike.

  Args:
    ids_a: token ids of the first text, without specials.
    ids_b: token ids of the second text, or None for a single text.
    max_length: length limit including the special tokens.
    cls_id: id of [CLS].
    sep_id: id of [SEP].

  Returns:
    (input_ids, token_type_ids, truncated).
  """
  budget = check_max_length(max_length, is_pair=ids_b is not None)
  template = bert_template(cls_id, sep_id)
  if ids_b is None:
    return (*template.single(ids_a[:budget]), len(ids_a) > budget)
  n_a, n_b = _longest_first(len(ids_a), len(ids_b), budget)
  return (*template.pair(ids_a[:n_a], ids_b[:n_b]), (n_a, n_b) != (len(ids_a), len(ids_b)))


def check_max_length(max_length: int, *, is_pair: bool, num_specials: int | None = None) -> int:
  """Returns the room left for text after the template's `num_specials` special tokens ([CLS]/[SEP]s
  by default); ConfigError when there is none."""
  budget = max_length - (num_specials if num_specials is not None else 3 if is_pair else 2)
  if budget < 1:
    raise ConfigError(f'max_length={max_length} leaves no room for text after [CLS]/[SEP]; '
                      'use a larger max_length')
  return budget


def _longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
  # A transcription of tokenizers' LongestFirst (utils/truncation.rs), not the original
  # BERT loop: when both texts must be cut they get budget // 2 each and the longer one
  # (the second on a tie) the odd token; the original loop gives that token to the first.
  if n_a + n_b <= budget:
    return n_a, n_b
  short, long = min(n_a, n_b), max(n_a, n_b)
  long = short if short > budget else max(short, budget - short)
  if short + long > budget:
    short, long = budget // 2, budget // 2 + budget % 2
  return (long, short) if n_a > n_b else (short, long)


def check_vocab_size(tokenizer: SentencePieceTokenizer, model_vocab_size: int) -> None:
  """Raises ConfigError unless the model's embedding table matches the tokenizer (or, for a Hugging Face
  tokenizer, holds all its ids).

  Args:
    tokenizer: the tokenizer the data is encoded with.
    model_vocab_size: `config.model.vocab_size`.
  """
  if tokenizer.vocab_size < model_vocab_size and not isinstance(tokenizer, SentencePieceTokenizer):
    return  # a checkpoint's table padded past its tokenizer (ModernBERT's to a multiple of 64): ids never produced
  if tokenizer.vocab_size != model_vocab_size:
    raise ConfigError(f'model.vocab_size={model_vocab_size} but tokenizer {tokenizer.path} has '
                      f'{tokenizer.vocab_size} tokens; set '
                      f'--config.model.vocab_size={tokenizer.vocab_size}')


_TOKENIZER_JSON, _VOCAB_TXT, _TOKENIZER_CONFIG = 'tokenizer.json', 'vocab.txt', 'tokenizer_config.json'
SPIECE_FILE = 'tokenizer.model'  # the name a SentencePiece model has in a cache or workdir
HF_SPIECE_FILE = 'spiece.model'  # its name in a Hugging Face directory that bert_jax exported
UNUSED = re.compile(r'^\[unused\d+\]$')  # BERT's spare vocabulary slots, never masked or drawn


def __getattr__(name: str):
  # The Hugging Face tokenizer lives in fast_tokenizer.py, which imports this module: imported when first
  # asked for. WordPieceTokenizer is its name from when bert_jax read WordPiece only; Tokenizer is either kind.
  if name in ('FastTokenizer', 'WordPieceTokenizer', 'Tokenizer'):
    from bert_jax.data.fast_tokenizer import FastTokenizer  # pylint: disable=g-import-not-at-top
    return SentencePieceTokenizer | FastTokenizer if name == 'Tokenizer' else FastTokenizer
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')




if TYPE_CHECKING:  # for annotations (fast_tokenizer imports this module: see __getattr__)
  from bert_jax.data.fast_tokenizer import FastTokenizer
  Tokenizer = SentencePieceTokenizer | FastTokenizer


def load_tokenizer(path: str) -> Tokenizer:
  """Loads a SentencePiece model or a Hugging Face tokenizer (any tokenizer.json, or a BERT vocab.txt).

  Args:
    path: a SentencePiece `.model` file; a Hugging Face checkpoint or tokenizer directory
      (spiece.model when bert_jax exported a SentencePiece model into it, else tokenizer.json,
      else vocab.txt); such a directory's tokenizer.json or vocab.txt; or a prepared cache /
      pretraining workdir (its tokenizer.model or tokenizer.json).

  Returns:
    The tokenizer. DataError when the path holds none.
  """
  if files.is_remote(path):
    local = _local_copy(path)
    tokenizer = load_tokenizer(local)
    # The copy lives as long as the tokenizer (a SentencePiece tokenizer's `path` points into it), not past it.
    weakref.finalize(tokenizer, shutil.rmtree, local if files.isdir(local) else os.path.dirname(local), True)
    return tokenizer
  if files.isdir(path):
    for name in (SPIECE_FILE, HF_SPIECE_FILE):  # an exported directory's tokenizer.json is its conversion
      if files.isfile(os.path.join(path, name)):
        return SentencePieceTokenizer(os.path.join(path, name))
    return _hf_tokenizer(path)
  if os.path.basename(path) in (_TOKENIZER_JSON, _VOCAB_TXT) and files.isfile(path):
    return _hf_tokenizer(os.path.dirname(path) or '.')
  return SentencePieceTokenizer(path)


def _hf_tokenizer(directory: str):
  from bert_jax.data.fast_tokenizer import FastTokenizer  # pylint: disable=g-import-not-at-top  (it imports us)
  return FastTokenizer.from_directory(directory)


def tokenizer_file_name(tokenizer: Tokenizer) -> str:
  """The file `save_tokenizer` writes that `load_tokenizer` reads back."""
  return SPIECE_FILE if isinstance(tokenizer, SentencePieceTokenizer) else _TOKENIZER_JSON


_NAMES = (SPIECE_FILE, HF_SPIECE_FILE, _TOKENIZER_JSON, _VOCAB_TXT, _TOKENIZER_CONFIG, 'special_tokens_map.json')


def _local_copy(path: str) -> str:
  """A local copy (SentencePiece and tokenizers read local files only) of a remote tokenizer directory's files, or
  of a remote tokenizer file with the tokenizer files beside it (vocab.txt's tokenizer_config.json): a new
  temporary directory per load (removed with the tokenizer: `load_tokenizer`), so a copy never outlives what it
  copied."""
  is_dir = files.isdir(path)
  source = path.rstrip('/') if is_dir else os.path.dirname(path.rstrip('/'))
  local = tempfile.mkdtemp(prefix='bert_jax-remote-tokenizer-')
  for name in dict.fromkeys(_NAMES + (() if is_dir else (os.path.basename(path.rstrip('/')),))):
    if files.isfile(os.path.join(source, name)):
      files.copy_file(os.path.join(source, name), os.path.join(local, name))
  return local if is_dir else os.path.join(local, os.path.basename(path.rstrip('/')))


def save_tokenizer(tokenizer: Tokenizer, directory: str) -> str:
  """Writes the tokenizer's files into `directory`; returns what `load_tokenizer` reads back."""
  if files.is_remote(directory):  # written locally, then each file copied up
    with tempfile.TemporaryDirectory(prefix='bert_jax-tokenizer-') as local:
      name = os.path.basename(save_tokenizer(tokenizer, local))
      files.makedirs(directory)
      for written in sorted(files.listdir(local), key=lambda n: n == name):  # what readers look for last
        files.copy_file(os.path.join(local, written), os.path.join(directory, written))
    return os.path.join(directory, name)
  os.makedirs(directory, exist_ok=True)
  if isinstance(tokenizer, SentencePieceTokenizer):
    target = os.path.join(directory, SPIECE_FILE)
    if os.path.abspath(tokenizer.path) != os.path.abspath(target):
      shutil.copyfile(tokenizer.path, target + '.tmp')
      os.replace(target + '.tmp', target)
    return target
  tokenizer.save(directory)
  return os.path.join(directory, _TOKENIZER_JSON)


def tokenizer_files(tokenizer: Tokenizer) -> list[str]:
  """The files that define a tokenizer (for fingerprints)."""
  if isinstance(tokenizer, SentencePieceTokenizer):
    return [tokenizer.path]
  directory = os.path.dirname(tokenizer.path)
  return [p for p in (os.path.join(directory, n) for n in (_TOKENIZER_JSON, _VOCAB_TXT, _TOKENIZER_CONFIG))
          if files.isfile(p)]
