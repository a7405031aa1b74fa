"""Top-k predictions of the masked-LM head for every [MASK] in a text, or in every line of a file.

  python experiments/fill_mask.py --checkpoint=/tmp/bert_mini \
      --text="The doctor ran to the emergency room to see [MASK] patient." --top_k=5
  python experiments/fill_mask.py --checkpoint=/tmp/bert_mini --input=texts.txt --output=/tmp/fills.jsonl

PATH is a bert_jax pretraining workdir or a Hugging Face BertForMaskedLM / BertForPreTraining
directory (a fine-tuning workdir has no masked-LM head: use predict.py). With --text: one line per
[MASK] (the predicted token as text, and its probability), then one JSON line. With --input (one text per line,
blank lines skipped), texts are batched in one process and each gives one JSON line, on stdout or in --output.
Each prediction in the JSON: `token` (the vocabulary's piece, e.g. 'Ġparis' of a byte-level BPE), `token_str` (that
piece decoded as transformers' fill-mask pipeline gives it, ' paris') and `probability`.
"""

import json
import sys

from absl import flags

from bert_jax import files, inference
from bert_jax.errors import ConfigError, DataError
from bert_jax.interop import pretrained
from bert_jax.runs import reporting

import cli

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_TEXT = flags.DEFINE_string('text', None, 'Text with one or more [MASK].')
_INPUT = flags.DEFINE_string('input', None, 'Instead: a text file, one text with [MASK] per line.')
_OUTPUT = flags.DEFINE_string('output', None, 'With --input: the .jsonl to write (default: stdout).')
_TOP_K = flags.DEFINE_integer('top_k', 5, 'Predictions per [MASK].')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Texts per forward pass.')


def _texts() -> list[str]:
  if (_TEXT.value is None) == (_INPUT.value is None):
    raise ConfigError('give --text or --input (one text with [MASK] per line)')
  if _TEXT.value is not None:
    if _OUTPUT.value:
      raise ConfigError('--output applies with --input')
    return [_TEXT.value]
  files.check_regular(_INPUT.value, 'input file')
  try:
    with open(_INPUT.value, encoding='utf-8', errors='replace') as f:
      texts = [line.rstrip('\n').rstrip('\r') for line in f if line.strip()]
  except FileNotFoundError:
    raise DataError(f'input file {_INPUT.value} does not exist') from None
  if not texts:
    raise DataError(f'input file {_INPUT.value} has no text')
  if _OUTPUT.value:
    files.check_output(_OUTPUT.value, 'file', '--output')
  return texts


def _token_str(tokenizer, token: str) -> str:
  """`token` decoded alone, as transformers' fill-mask pipeline shows it (byte-level BPE's 'Ġparis' -> ' paris',
  SentencePiece's '▁paris' -> 'paris', WordPiece's '##s' stays); a special token, which decodes to '', stays
  itself."""
  return tokenizer.decode([tokenizer.token_to_id(token)]) or token


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the results
  texts = _texts()  # bad input fails before the (slow) checkpoint load
  model = pretrained.load_pretrained(_CHECKPOINT.value)
  predictions = inference.fill_masks(model, texts, top_k=_TOP_K.value, batch_size=_BATCH_SIZE.value)
  shown = {t: _token_str(model.tokenizer, t) for masks in predictions for top in masks for t, _ in top}
  lines = [json.dumps({'text': text, 'predictions': [[{'token': t, 'token_str': shown[t], 'probability': p}
                                                      for t, p in top] for top in masks]}, ensure_ascii=False)
           for text, masks in zip(texts, predictions)]
  if _TEXT.value is not None:
    for i, top in enumerate(predictions[0], 1):
      print(f'[MASK] {i}: ' + ' | '.join(f'{shown[t].strip() or t} {p:.4f}' for t, p in top), flush=True)
  if _OUTPUT.value:
    files.write_text_atomic(_OUTPUT.value, '\n'.join(lines) + '\n')
    print(json.dumps({'output': _OUTPUT.value, 'texts': len(texts)}), flush=True)
  else:
    sys.stdout.write('\n'.join(lines) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
  cli.run(main, text_flags=('text',))
