"""Inference with a loaded checkpoint: sentence embeddings, fill-mask and attention (maps and details).

All three take a `pretrained.PretrainedBert` (a Hugging Face directory or a bert_jax workdir,
see `pretrained.load_pretrained`) and plain text; tokenisation, padding and batching happen here. The
sentence-embedding core (`embed`, `embedding_settings`, `default_max_length`) lives in `embedding.encoding`, below
the fine-tuning tasks that embed too (the rerank task's first stage), and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import files
from bert_jax.embedding import encoding
from bert_jax.errors import ConfigError, DataError
from bert_jax.interop.pretrained import PretrainedBert
from bert_jax.model.encoder import attention_mask_b11s
from bert_jax.runs import reporting

# The sentence-embedding core, re-exported: experiments/embed.py, mine.py and the tests call it from here.
POOLINGS, LENGTH_BUCKET, DEFAULT_MAX_LENGTH = encoding.POOLINGS, encoding.LENGTH_BUCKET, encoding.DEFAULT_MAX_LENGTH
default_max_length, embedding_settings, embed = encoding.default_max_length, encoding.embedding_settings, encoding.embed


def _encode_one(pretrained: PretrainedBert, text_a: str, text_b: str | None, max_length: int):
  ids, types = encoding.tokenize(pretrained, [(text_a, text_b)], max_length)
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
    width = encoding.bucket_length(max(len(ids) for ids, _ in chunk), limit)
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
  encoding.check_max_length(pretrained, max_length)
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
