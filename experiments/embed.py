"""Sentence embeddings of every line of a text file, saved as one .npz.

  python experiments/embed.py --checkpoint=PATH --input=texts.txt --output=/tmp/emb.npz
  python experiments/embed.py --checkpoint=PATH --input=pairs.tsv --output=OUT.npz --pooling=cls \
      --normalize=false --max_length=256

PATH is a Hugging Face directory or a bert_jax workdir (pretraining, or fine-tuning: its fine-tuned
encoder, first seed). The input has one text per
line, or two tab-separated texts for a sentence pair; row i of every array is line i. OUT.npz
holds input_ids, token_type_ids, attention_mask, last_hidden_state, pooler_output and
sentence_embedding (see `bert_jax.inference.embed`). Ends by printing one JSON line.

The pooling, normalisation and length are the checkpoint's own when it records them: a retrieval workdir
(finetune.py:retrieval) its run's pooling, normalisation and passage length (max_seq_length), a
sentence-transformers folder its modules' (1_Pooling, Normalize, sentence_bert_config.json); else mean,
normalised, 128 tokens. A flag given explicitly wins, with a line saying so.

A special token spelled in a text ("[SEP]", "[CLS]", "[MASK]", "[PAD]") is read as that token, as
Hugging Face's tokenizer (and sentence-transformers) read it; texts longer than --max_length are
truncated, with one warning.

--precision=int8 (or uint8, binary, ubinary) stores sentence_embedding quantized as sentence-transformers'
`quantize_embeddings` does (`bert_jax.embedding.quantization`): 4x or 32x smaller; int8/uint8 calibrate each
dimension on these texts unless --calibration=FILE.npz gives another file's float embeddings, and store the ranges
as quantization_ranges.

A sparse workdir (finetune.py:sparse) gives term weights instead, written as JSONL (--output must end in .jsonl):
line i is {"line": i, "nonzero": its number of non-zero terms, "terms": {token: weight} of its --top_terms largest}.
Texts are cut to the run's passage length (max_seq_length) unless --max_length says otherwise.
  python experiments/embed.py --checkpoint=/tmp/sparse --input=texts.txt --output=/tmp/terms.jsonl --top_terms=20
"""

import json
import os
import sys
import time

from absl import flags
import numpy as np

from bert_jax import files, inference
from bert_jax.embedding import quantization, splade
from bert_jax.errors import ConfigError
from bert_jax.interop import pretrained
from bert_jax.runs import reporting, workdir

import cli

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Text file: one text, or two tab-separated texts, per line.',
                             required=True)
_OUTPUT = flags.DEFINE_string('output', None, 'The .npz to write.', required=True)
_MAX_LENGTH = flags.DEFINE_integer('max_length', None, 'Tokens per text ([CLS]/[SEP] included); longer texts are '
                                   "truncated with a warning (default: the checkpoint's, else 128, or the model's "
                                   'positions when it has fewer).')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Texts per encoder call.')
_POOLING = flags.DEFINE_enum('pooling', None, inference.POOLINGS, "mean: over real tokens; cls: [CLS] (default: the "
                             "checkpoint's, else mean).")
_NORMALIZE = flags.DEFINE_boolean('normalize', None, "L2-normalise sentence_embedding (default: the checkpoint's, "
                                  'else true).')
_TOP_TERMS = flags.DEFINE_integer('top_terms', 32, 'A sparse workdir: the largest term weights written per text.')
_PRECISION = flags.DEFINE_enum('precision', 'float32', quantization.PRECISIONS, 'sentence_embedding\'s precision.')
_CALIBRATION = flags.DEFINE_string('calibration', None, 'int8/uint8: an embed.py .npz (float32) whose '
                                   'sentence_embedding gives the ranges; default these texts\'.')


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result lines
  start = time.time()
  texts = inference.read_texts(_INPUT.value)  # bad input fails before the (slow) checkpoint load
  files.check_output(_OUTPUT.value, 'file')
  if workdir.sparse(workdir.inspect(_CHECKPOINT.value).task):
    return _sparse(texts, start)
  model = pretrained.load_encoder(_CHECKPOINT.value)
  settings = inference.embedding_settings(_CHECKPOINT.value, model, pooling=_POOLING.value,
                                          normalize=_NORMALIZE.value, max_length=_MAX_LENGTH.value)
  result = inference.embed(model, texts, max_length=settings.max_seq_length, batch_size=_BATCH_SIZE.value,
                           pooling=settings.pooling, normalize=settings.normalize)
  result.update(_quantized(result['sentence_embedding']))
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  with open(_OUTPUT.value, 'wb') as f:  # a file object: np.savez would otherwise append '.npz'
    np.savez(f, **result)
  print(json.dumps({'output': _OUTPUT.value, 'num_texts': len(texts),
                    'shape': list(result['sentence_embedding'].shape),
                    'max_tokens': int(result['attention_mask'].sum(1).max()),
                    'pooling': settings.pooling, 'normalize': settings.normalize,
                    'max_length': settings.max_seq_length, 'precision': _PRECISION.value,
                    'seconds': round(time.time() - start, 2)}), flush=True)


def _quantized(embeddings: np.ndarray) -> dict[str, np.ndarray]:
  """sentence_embedding at --precision (and the int8 ranges used)."""
  precision = _PRECISION.value
  if precision == 'float32':
    return {}
  ranges = None
  if precision.endswith('int8'):
    calibration = embeddings
    if _CALIBRATION.value:
      with files.open(_CALIBRATION.value, 'rb') as f:
        calibration = np.load(f)['sentence_embedding']
      if calibration.dtype != np.float32 or calibration.shape[1:] != embeddings.shape[1:]:
        raise ConfigError(f'--calibration={_CALIBRATION.value}: its sentence_embedding is {calibration.dtype} '
                          f'{list(calibration.shape)}, not float32 [n, {embeddings.shape[1]}]')
    ranges = quantization.calibration_ranges(calibration)
  out = {'sentence_embedding': quantization.quantize(embeddings, precision, ranges)}
  return out if ranges is None else {**out, 'quantization_ranges': ranges}


def _sparse(texts, start: float) -> None:
  """A sparse run's term weights of `texts`, the largest --top_terms of each as one JSON line per text."""
  if _POOLING.value is not None or _NORMALIZE.value is not None:
    raise ConfigError(f'{_CHECKPOINT.value} is a sparse run: its term weights are SPLADE-pooled and not normalised '
                      '(--pooling and --normalize apply to a dense embedding model)')
  if _PRECISION.value != 'float32':
    raise ConfigError(f'--precision={_PRECISION.value} quantizes dense embeddings; a sparse run writes term weights')
  if not _OUTPUT.value.endswith('.jsonl'):
    raise ConfigError(f'--output={_OUTPUT.value}: a sparse run writes its term weights as JSONL; name a .jsonl file')
  if _TOP_TERMS.value < 1:
    raise ConfigError(f'--top_terms={_TOP_TERMS.value} must be at least 1')
  tuned = pretrained.load_finetuned(_CHECKPOINT.value)
  max_length = _MAX_LENGTH.value or tuned.finetune.max_seq_length
  if any(b is not None for _, b in texts):
    raise ConfigError(f'{_INPUT.value}: a sparse run encodes single texts, not tab-separated pairs')
  weights = splade.encode(tuned.sparse_encoder(), tuned.tokenizer, [a for a, _ in texts], max_length=max_length,
                          batch_size=_BATCH_SIZE.value)
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  nonzero = np.count_nonzero(weights, axis=1)
  with open(_OUTPUT.value, 'w', encoding='utf-8') as f:
    for i, w in enumerate(weights):
      f.write(json.dumps({'line': i, 'nonzero': int(nonzero[i]),
                          'terms': splade.top_terms(w, tuned.tokenizer, _TOP_TERMS.value)}) + '\n')
  print(json.dumps({'output': _OUTPUT.value, 'num_texts': len(texts), 'sparse': True,
                    'vocab_size': int(weights.shape[1]), 'mean_nonzero': float(nonzero.mean()) if len(texts) else 0.0,
                    'max_length': max_length, 'seconds': round(time.time() - start, 2)}), flush=True)


if __name__ == '__main__':
  cli.run(main)
