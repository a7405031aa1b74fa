"""Inference with a loaded checkpoint: sentence embeddings, fill-mask and attention (maps and details).

All three take a `pretrained.PretrainedBert` (a Hugging Face directory or a bert_jax workdir,
see `pretrained.load_pretrained`) and plain text; tokenisation, padding and batching happen here.
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

from bert_jax import files
from bert_jax.model import pooling as pooling_lib
from bert_jax.errors import CheckpointError, ConfigError, DataError
from bert_jax.interop import pretrained as pretrained_lib, sentence_transformers
from bert_jax.interop.pretrained import PretrainedBert
from bert_jax.model.encoder import attention_mask_b11s
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


def _check_max_length(pretrained: PretrainedBert, max_length: int) -> None:
  limit = pretrained.config.max_position_embeddings
  if max_length > limit:
    raise ConfigError(f'max_length={max_length} exceeds the model\'s max_position_embeddings={limit}')


def _tokenize(pretrained: PretrainedBert, texts: Sequence[tuple[str, str | None]], max_length: int,
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


def _bucket_length(length: int, limit: int) -> int:
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
  _check_max_length(pretrained, max_length)
  if pooling not in POOLINGS:
    raise ConfigError(f'pooling must be one of {", ".join(POOLINGS)}, got {pooling!r}')
  if batch_size < 1:
    raise ConfigError(f'batch_size must be positive, got {batch_size}')
  if not texts:
    raise DataError('no texts to embed')
  ids, types = _tokenize(pretrained, texts, max_length, on_truncated)
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
    seq_len = _bucket_length(int(lengths_n[rows].max()), pretrained.config.max_position_embeddings)
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


def _encode_one(pretrained: PretrainedBert, text_a: str, text_b: str | None, max_length: int):
  ids, types = _tokenize(pretrained, [(text_a, text_b)], max_length)
  return np.array(ids, np.int32), np.array(types, np.int32)  # [1, T]


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _mlm_probs(graphdef, state, input_ids_bt, token_type_ids_bt, attention_mask_bt, positions_bp):
  """Softmax over the vocabulary at the masked positions: float32 [B, P, V]."""
  model = nnx.merge(graphdef, state)
  logits_bpv, _ = model(input_ids_bt, token_type_ids_bt, attention_mask_bt, positions_bp, deterministic=True)
  return jax.nn.softmax(logits_bpv.astype(jnp.float32), axis=-1)


def fill_mask(pretrained: PretrainedBert, text: str, *, top_k: int = 5) -> list[list[tuple[str, float]]]:
  """Predicts the token at every [MASK] in `text` with the masked-LM head (see `fill_masks`)."""
  return fill_masks(pretrained, [text], top_k=top_k)[0]


def fill_masks(pretrained: PretrainedBert, texts: Sequence[str], *, top_k: int = 5, batch_size: int = 32,
               ) -> list[list[list[tuple[str, float]]]]:
  """Predicts the token at every [MASK] of each text, texts batched (padded to bucketed lengths).

  Args:
    pretrained: a checkpoint with an MLM head (bert_jax workdir, HF BertForMaskedLM/BertForPreTraining).
    texts: texts each containing one or more literal '[MASK]'.
    top_k: predictions per mask.
    batch_size: texts per forward pass.

  Returns:
    Per text, per [MASK] in text order, the top_k (token, probability) pairs, most probable first;
    the probabilities are a softmax over the whole vocabulary.

  Raises:
    CheckpointError: the checkpoint has no MLM head.
    DataError: a text has no [MASK], or one past the model's positions.
    ConfigError: top_k or batch_size < 1.
  """
  if top_k < 1 or batch_size < 1:
    raise ConfigError(f'top_k and batch_size must be positive, got {top_k} and {batch_size}')
  tokenizer, limit = pretrained.tokenizer, pretrained.config.max_position_embeddings
  rows = [_masked_row(tokenizer, text, limit, i if len(texts) > 1 else None) for i, text in enumerate(texts)]
  graphdef, state = nnx.split(pretrained.pretraining_model())  # CheckpointError without an MLM head
  state = jax.device_put(state)
  results = []
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    width = _bucket_length(max(len(ids) for ids, _ in chunk), limit)
    masks = max(len(p) for _, p in chunk)
    ids_bt = np.full((batch_size, width), tokenizer.pad_id, np.int32)
    mask_bt = np.zeros((batch_size, width), np.int32)
    mask_bt[:, 0] = 1  # filler rows: keep every softmax row non-empty
    positions_bp = np.zeros((batch_size, masks), np.int32)
    for r, (ids, positions) in enumerate(chunk):
      ids_bt[r, :len(ids)], mask_bt[r, :len(ids)], positions_bp[r, :len(positions)] = ids, 1, positions
    probs_bpv = np.asarray(_mlm_probs(graphdef, state, ids_bt, np.zeros_like(ids_bt), mask_bt, positions_bp))
    k = min(top_k, probs_bpv.shape[-1])
    for r, (_, positions) in enumerate(chunk):
      per_mask = []
      for probs_v in probs_bpv[r, :len(positions)]:
        top = np.argsort(-probs_v, kind='stable')[:k]
        per_mask.append([(tokenizer.id_to_token(int(i)), float(probs_v[i])) for i in top])
      results.append(per_mask)
  return results


def _masked_row(tokenizer, text: str, limit: int, row: int | None) -> tuple[list[int], np.ndarray]:
  """(ids with [CLS]/[SEP], the [MASK] positions) of one text; DataError when it has none in reach."""
  where = f'text {row + 1}' if row is not None else 'the text'
  ids, _, _ = tokenizer.encode_inputs(text, None, max_length=limit)
  positions = np.flatnonzero(np.asarray(ids) == tokenizer.mask_id).astype(np.int32)
  if len(ids) == limit:  # possibly cut: count the [MASK] of the whole text
    full, _, _ = tokenizer.encode_inputs(text, None, max_length=1 << 30)
    in_text = sum(1 for i in full if i == tokenizer.mask_id)
    if positions.size < in_text:
      raise DataError(f'{in_text - positions.size} of {where}\'s {in_text} [MASK] lie beyond the model\'s '
                      f'{limit} positions (it is {len(full)} tokens with [CLS]/[SEP]); shorten it')
  if not positions.size:
    raise DataError(f'{where} has no [MASK] token to fill: {text!r}')
  return list(ids), positions


@dataclasses.dataclass(frozen=True)
class AttentionDetails:
  """Everything the attention explorer shows for one text (or pair), from one forward pass.

  probs[l, n, t] is query token t's distribution over the keys in layer l, head n; query and
  key are that head's projected vectors (rotated, with rotary positions) and scores their scaled
  dot products q·k/√d (before the mask: a single text has none), so softmax(scores[l, n, t]) is
  probs[l, n, t]; in a local-attention layer (model.attention_window) the keys outside the
  window are masked first.
  """
  tokens: list[str]  # as the tokenizer made them, [CLS]/[SEP] included
  segment_ids: np.ndarray  # int32 [T]: 0 for segment A, 1 for B
  special: np.ndarray  # bool [T]: [CLS], [SEP] and the like
  probs: np.ndarray  # float32 [L, N, T, T]
  query: np.ndarray  # float32 [L, N, T, H]
  key: np.ndarray  # float32 [L, N, T, H]
  scores: np.ndarray  # float32 [L, N, T, T]


def attention_details(pretrained: PretrainedBert, text_a: str, text_b: str | None = None, *,
                      max_length: int = 128) -> AttentionDetails:
  """Attention of every layer and head for one text (or pair), with the queries and keys behind it.

  The probabilities come from the explicit softmax path of `SelfAttention` (what the PNGs,
  the npz and the HTML explorer all show), whatever fused kernel the model's
  `attention_impl` would otherwise pick.
  """
  _check_max_length(pretrained, max_length)
  ids_1t, types_1t = _encode_one(pretrained, text_a, text_b, max_length)
  graphdef, state = nnx.split(pretrained.encoder())
  probs, query, key, scores = jax.device_get(_attention_details(graphdef, state, ids_1t, types_1t))
  tokenizer = pretrained.tokenizer
  special = tokenizer.special_table()[ids_1t[0]]
  return AttentionDetails(tokens=[tokenizer.id_to_token(int(i)) for i in ids_1t[0]],
                          segment_ids=types_1t[0], special=np.asarray(special, bool),
                          probs=probs, query=query, key=key, scores=scores)


def attention_maps(pretrained: PretrainedBert, text_a: str, text_b: str | None = None, *,
                   max_length: int = 128) -> tuple[list[str], np.ndarray]:
  """(tokens [T], float32 probs [layers, heads, T, T]) of `attention_details`."""
  details = attention_details(pretrained, text_a, text_b, max_length=max_length)
  return details.tokens, details.probs


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _attention_details(graphdef, state, input_ids_1t, token_type_ids_1t):
  """float32 probs, queries, keys and scores [L, N, ...] of the one text in the batch.

  The encoder's own loop (embeddings, padding mask, layers with `return_probs`), keeping each
  layer's input to project its queries and keys as `SelfAttention` does.
  """
  encoder = nnx.merge(graphdef, state)
  positions_1t = jnp.arange(input_ids_1t.shape[1])[None]
  x_btd = encoder.embeddings(input_ids_1t, token_type_ids_1t, positions_1t, deterministic=True)
  contexts, kinds = encoder.layer_contexts(attention_mask_b11s(jnp.ones_like(input_ids_1t)), positions_1t,
                                           full_masks=True)  # maps need every score
  out = []
  for layer, kind in zip(encoder.layers, kinds):
    # The queries and keys as the layer's attention forms them (after a pre-LN norm, rotated with rotary positions).
    q_btnh, k_btnh = layer.attention.queries_keys(layer.attention_input(x_btd), contexts[kind][1])
    scores_bnts = jnp.einsum('btnh,bsnh->bnts', q_btnh, k_btnh,
                             preferred_element_type=jnp.float32) * q_btnh.shape[-1] ** -0.5
    x_btd, probs_bnts = layer(x_btd, *contexts[kind], deterministic=True, return_probs=True)
    out.append((probs_bnts[0], q_btnh[0].transpose(1, 0, 2), k_btnh[0].transpose(1, 0, 2), scores_bnts[0]))
  return tuple(jnp.stack(a).astype(jnp.float32) for a in zip(*out))


def read_texts(path: str) -> list[tuple[str, str | None]]:
  """Reads an embedding input file: one text per line, or two tab-separated texts for a pair.

  Row i is line i: blank lines inside the file are kept (as empty texts) so rows stay aligned.

  Raises:
    DataError: the file is missing, has no text, or a line has more than one tab.
  """
  files.check_regular(path, 'input file')
  try:
    with files.open(path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    raise DataError(f'input file {path} does not exist') from None
  except IsADirectoryError:
    raise DataError(f'input file {path} is a directory') from None
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    text = data.decode('utf-8', errors='replace')
    reporting.log(f'warning: {path} is not valid UTF-8: {text.count(chr(0xfffd))} undecodable byte sequences were '
                  'replaced by U+FFFD')
  # Only '\n' ends a line (str.splitlines would also split at form feeds, U+2028, ...).
  lines = [line.removesuffix('\r') for line in text.split('\n')]
  while lines and not lines[-1].strip():
    lines.pop()
  if not lines:
    raise DataError(f'input file {path} has no text')
  texts = []
  for i, line in enumerate(lines, 1):
    fields = line.split('\t')
    if len(fields) > 2:
      raise DataError(f'{path} line {i} has {len(fields)} tab-separated fields; expected one text or two '
                      '(a pair)')
    texts.append((fields[0], fields[1] if len(fields) == 2 else None))
  return texts
