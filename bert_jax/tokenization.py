"""SentencePiece tokenizers with BERT's special tokens at fixed ids.

Ids 0..4 are always [PAD], [UNK], [CLS], [SEP], [MASK], so model code, masking and
checkpoints can rely on constants instead of asking the tokenizer.
"""

from __future__ import annotations

import io
import os
import random
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from bert_jax.errors import ConfigError, DataError

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
NUM_SPECIAL = len(SPECIAL_TOKENS)
WORD_START = '\u2581'  # '▁', SentencePiece's word-boundary mark

# SentencePiece splits the EM statistics by thread index, so the model bytes depend on
# the thread count (not on timing): fix it so every host trains the identical model.
_TRAIN_THREADS = 4
_ASCII_PRINTABLE = ''.join(chr(c) for c in range(33, 127))


def train_sentencepiece(sentences: Iterable[str], output_path: str, vocab_size: int,
                        lower_case: bool, seed: int = 0,
                        max_sentences: int = 2_000_000) -> 'SentencePieceTokenizer':
  """Trains a unigram SentencePiece model in-process; same input, same bytes.

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
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model,
        model_type='unigram', vocab_size=vocab_size, hard_vocab_limit=True,
        pad_id=PAD_ID, pad_piece='[PAD]', unk_id=UNK_ID, unk_piece='[UNK]',
        bos_id=-1, eos_id=-1, control_symbols=list(SPECIAL_TOKENS[2:]),
        normalization_rule_name='nmt_nfkc_cf' if lower_case else 'nmt_nfkc',
        # Rare-but-plain ASCII ('/' in a small corpus) must not fall under character_coverage.
        required_chars=''.join(sorted(set(_ASCII_PRINTABLE.lower() if lower_case
                                          else _ASCII_PRINTABLE))),
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
  with open(tmp, 'wb') as f:
    f.write(model.getvalue())
  os.replace(tmp, output_path)
  return SentencePieceTokenizer(output_path)


class SentencePieceTokenizer:
  """A SentencePiece model whose ids 0..4 are BERT's special tokens."""

  def __init__(self, path: str):
    """Loads `path`; DataError if it is missing, not a model, or lacks the specials."""
    self.path = path
    if not os.path.isfile(path):
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

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without [CLS]/[SEP]."""
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (sentencepiece's multi-threaded batch path)."""
    return self._sp.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; control tokens ([CLS], [SEP], [MASK], [PAD]) decode to ''."""
    return self._sp.decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def token_to_id(self, token: str) -> int:
    """Id of a piece; [UNK]'s id for unknown pieces."""
    return self._sp.piece_to_id(token)

  def word_start_table(self) -> np.ndarray:
    """bool[vocab_size]: True where a piece starts a word (and for special tokens).

    Whole-word masking groups a word-start piece with the non-start pieces after it.
    """
    table_v = np.array([self._sp.id_to_piece(i).startswith(WORD_START)
                        for i in range(self.vocab_size)], dtype=bool)
    table_v[:NUM_SPECIAL] = True
    return table_v


def check_vocab_size(tokenizer: SentencePieceTokenizer, model_vocab_size: int) -> None:
  """Raises ConfigError unless the model's embedding table matches the tokenizer.

  Args:
    tokenizer: the tokenizer the data is encoded with.
    model_vocab_size: `config.model.vocab_size`.
  """
  if tokenizer.vocab_size != model_vocab_size:
    raise ConfigError(f'model.vocab_size={model_vocab_size} but tokenizer {tokenizer.path} has '
                      f'{tokenizer.vocab_size} tokens; set '
                      f'--config.model.vocab_size={tokenizer.vocab_size}')
