"""Sentence embeddings of any loaded checkpoint: the one embedding core.

`embedding_settings` says how a checkpoint's embeddings are made (its own pooling, normalisation and length when it
records them); `embed` tokenises, batches by length (padded to buckets: one compilation per bucket), encodes, pools
and normalises. experiments/embed.py and mine.py (through `bert_jax.inference`, which re-exports these names) and
the rerank task's first stage (`embedding.first_stage`) embed with it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.errors import CheckpointError, ConfigError, DataError
from bert_jax.interop import pretrained as pretrained_lib, sentence_transformers
from bert_jax.interop.pretrained import PretrainedBert
from bert_jax.model import pooling as pooling_lib
from bert_jax.runs import reporting

POOLINGS = pooling_lib.POOLINGS
# Padded lengths are rounded up to a multiple of this, so the encoder compiles once per bucket
# rather than once per distinct text length.
LENGTH_BUCKET = 16
# Without an explicit `progress`, a progress line is printed when there are at least this many batches.
_AUTO_PROGRESS_BATCHES = 20
_PROGRESS_LINES = 20  # about this many lines over the whole run


DEFAULT_MAX_LENGTH = 128  # the encoder tools' length when neither a flag nor the checkpoint gives one


def default_max_length(pretrained: PretrainedBert) -> int:
  """DEFAULT_MAX_LENGTH, or the model's positions when it has fewer."""
  return min(DEFAULT_MAX_LENGTH, pretrained.config.max_position_embeddings)


def embedding_settings(checkpoint: str, pretrained: PretrainedBert, *, pooling: str | None = None,
                       normalize: bool | None = None, max_length: int | None = None,
                       log=reporting.log) -> sentence_transformers.Embedding:
  """How `checkpoint`'s sentence embeddings are made: its own settings when it records them (a retrieval run's
  pooling, normalisation and passage length, a sentence-transformers folder's modules), else mean, normalised,
  `default_max_length`; a value given here (not None) wins, with a line through `log` saying so. What the encoder
  tools (experiments/embed.py, mine.py) embed with."""
  try:
    own = pretrained_lib.describe(checkpoint, log=lambda _: None).embedding()
  except CheckpointError as e:  # e.g. a sentence-transformers folder with a Dense module: the encoder alone
    log(f'warning: {e}; embedding with the encoder alone, pooled as the flags say')
    own = None
  if own is not None:
    log(f'pooling {own.pooling}, {"normalised" if own.normalize else "not normalised"}, '
        f'max_length {own.max_seq_length} from {own.origin}')
  settings = (own or sentence_transformers.Embedding()).given(
      log=log, pooling=pooling, normalize=normalize, max_seq_length=max_length)
  if settings.max_seq_length is None:
    settings = dataclasses.replace(settings, max_seq_length=default_max_length(pretrained))
  return settings


def check_max_length(pretrained: PretrainedBert, max_length: int) -> None:
  limit = pretrained.config.max_position_embeddings
  if max_length > limit:
    raise ConfigError(f'max_length={max_length} exceeds the model\'s max_position_embeddings={limit}')


def tokenize(pretrained: PretrainedBert, texts: Sequence[tuple[str, str | None]], max_length: int,
              on_truncated=None):
  """(ids, types) per text; one warning for all truncated texts (or `on_truncated(count, len(texts))` instead)."""
  ids, types, num_truncated = [], [], 0
  for text_a, text_b in texts:
    input_ids, token_type_ids, truncated = pretrained.tokenizer.encode_inputs(
        text_a, text_b, max_length=max_length)
    ids.append(input_ids)
    types.append(token_type_ids)
    num_truncated += bool(truncated)
  if on_truncated is not None:
    on_truncated(num_truncated, len(texts))
  elif num_truncated:
    reporting.log(f'warning: {num_truncated} of {len(texts)} texts were longer than max_length={max_length} tokens '
                  'and were truncated')
  return ids, types


def bucket_length(length: int, limit: int) -> int:
  # Capped at the position table: positions past it do not exist (even at padding).
  return min(-(-length // LENGTH_BUCKET) * LENGTH_BUCKET, limit)


@functools.partial(jax.jit, static_argnames=('graphdef', 'pooling', 'normalize'))
def _encode(graphdef, state, input_ids_bt, token_type_ids_bt, attention_mask_bt, *, pooling: str,
            normalize: bool):
  """Encoder + pooling; jitted once per (model, padded shape, pooling)."""
  encoder = nnx.merge(graphdef, state)
  seq_btd, pooled_bd = encoder(input_ids_bt, token_type_ids_bt, attention_mask_bt, deterministic=True)
  seq_btd, pooled_bd = seq_btd.astype(jnp.float32), pooled_bd.astype(jnp.float32)
  seq_btd = seq_btd * attention_mask_bt[..., None].astype(jnp.float32)  # padded positions are zero in the output
  # The pooling contrastive training uses (model/pooling.py): the mean over every real token, [CLS] and [SEP]
  # included, as sentence-transformers; the normalisation with torch's eps, as its Normalize module.
  emb_bd = pooling_lib.pool(seq_btd, attention_mask_bt, pooling)
  if normalize:
    emb_bd = pooling_lib.l2_normalize(emb_bd)
  return seq_btd, pooled_bd, emb_bd


def embed(pretrained: PretrainedBert, texts: Sequence[tuple[str, str | None]], *, max_length: int = 128,
          batch_size: int = 32, pooling: str = 'mean', normalize: bool = True,
          progress: bool | None = None, sentence_only: bool = False,
          on_truncated=None) -> dict[str, np.ndarray]:
  """Encodes texts (or text pairs) and pools one embedding per text.

  Texts are sorted by length and batched so that each batch is padded only to its own
  (bucketed) length; results come back in input order.

  Args:
    pretrained: the loaded checkpoint.
    texts: (text_a, text_b or None) per row; text_b gets token_type 1.
    max_length: tokens per row including [CLS]/[SEP]; longer texts are truncated (one warning).
    batch_size: rows per encoder call.
    pooling: 'mean' (over real tokens, [CLS]/[SEP] included: sentence-transformers) or 'cls'.
    normalize: L2-normalise `sentence_embedding`.
    progress: print progress lines with ETA on process 0; None does so for long inputs.
    sentence_only: return `sentence_embedding` alone (no [N, T, D] hidden states on the host: a tool that embeds
      many texts at a time, such as mining).
    on_truncated: called with (texts truncated, texts) instead of the warning line (a caller that embeds in many
      calls says it once).

  Returns:
    input_ids, token_type_ids, attention_mask: int32 [N, T] with T the longest row;
    last_hidden_state: float32 [N, T, D], zero at padding; pooler_output: float32 [N, D];
    sentence_embedding: float32 [N, D] (with `sentence_only`, the one entry).

  Raises:
    ConfigError: bad max_length, batch_size or pooling.
    DataError: no texts.
  """
  check_max_length(pretrained, max_length)
  if pooling not in POOLINGS:
    raise ConfigError(f'pooling must be one of {", ".join(POOLINGS)}, got {pooling!r}')
  if batch_size < 1:
    raise ConfigError(f'batch_size must be positive, got {batch_size}')
  if not texts:
    raise DataError('no texts to embed')
  ids, types = tokenize(pretrained, texts, max_length, on_truncated)
  lengths_n = np.array([len(x) for x in ids])
  num, width, dim = len(ids), int(lengths_n.max()), pretrained.config.hidden_size
  out = {
      'input_ids': np.full((num, width), pretrained.tokenizer.pad_id, np.int32),
      'token_type_ids': np.zeros((num, width), np.int32),
      'attention_mask': np.zeros((num, width), np.int32),
  }
  for i, (row_ids, row_types) in enumerate(zip(ids, types)):
    out['input_ids'][i, :len(row_ids)] = row_ids
    out['token_type_ids'][i, :len(row_types)] = row_types
    out['attention_mask'][i, :len(row_ids)] = 1
  hidden_ntd = None if sentence_only else np.zeros((num, width, dim), np.float32)
  pooled_nd = None if sentence_only else np.zeros((num, dim), np.float32)
  emb_nd = np.zeros((num, dim), np.float32)

  graphdef, state = nnx.split(pretrained.encoder())
  state = jax.device_put(state)  # once, not per batch
  order = np.argsort(-lengths_n, kind='stable')  # longest first: a memory problem shows at once
  batches = [order[i:i + batch_size] for i in range(0, num, batch_size)]
  show = progress if progress is not None else len(batches) >= _AUTO_PROGRESS_BATCHES
  every = max(1, len(batches) // _PROGRESS_LINES)
  start, pending, done = time.time(), None, 0
  for b, rows in enumerate(batches):
    seq_len = bucket_length(int(lengths_n[rows].max()), pretrained.config.max_position_embeddings)
    # The last batch is padded to batch_size too, so it reuses the compiled full-batch shape.
    feed = {k: np.zeros((batch_size, seq_len), np.int32) for k in out}
    feed['input_ids'][:] = pretrained.tokenizer.pad_id
    cols = min(seq_len, width)  # every real token of these rows lies within both
    for k in out:
      feed[k][:len(rows), :cols] = out[k][rows, :cols]
    feed['attention_mask'][len(rows):, 0] = 1  # filler rows: keep every softmax row non-empty
    result = _encode(graphdef, state, feed['input_ids'], feed['token_type_ids'], feed['attention_mask'],
                     pooling=pooling, normalize=normalize)
    # Fetch the previous batch only after dispatching this one, so the host copy overlaps compute.
    if pending is not None:
      _store(pending, hidden_ntd, pooled_nd, emb_nd, width)
    pending, done = (rows, result), done + len(rows)
    if show and ((b + 1) % every == 0 or b + 1 == len(batches)):
      elapsed = time.time() - start
      eta = elapsed / (b + 1) * (len(batches) - b - 1)
      reporting.log(f'embed: batch {b + 1}/{len(batches)} | {done / elapsed:.1f} texts/s '
                  f'| elapsed {reporting.format_duration(elapsed)} | ETA {reporting.format_duration(eta)}')
  _store(pending, hidden_ntd, pooled_nd, emb_nd, width)
  if sentence_only:
    return {'sentence_embedding': emb_nd}
  return {**out, 'last_hidden_state': hidden_ntd, 'pooler_output': pooled_nd, 'sentence_embedding': emb_nd}


def _store(pending, hidden_ntd, pooled_nd, emb_nd, width: int) -> None:
  rows, (seq_btd, pooled_bd, emb_bd) = pending
  if hidden_ntd is None:  # the sentence embeddings alone
    emb_nd[rows] = jax.device_get(emb_bd)[:len(rows)]
    return
  seq_btd, pooled_bd, emb_bd = jax.device_get((seq_btd, pooled_bd, emb_bd))
  n, t = len(rows), min(seq_btd.shape[1], width)
  hidden_ntd[rows, :t] = seq_btd[:n, :t]
  pooled_nd[rows] = pooled_bd[:n]
  emb_nd[rows] = emb_bd[:n]
