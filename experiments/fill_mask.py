"""Top-k predictions of the masked-LM head for every [MASK] in a text, or in every line of a file.

  python experiments/fill_mask.py --checkpoint=/tmp/bert_mini \
      --text="The doctor ran to the emergency room to see [MASK] patient." --top_k=5
  python experiments/fill_mask.py --checkpoint=/tmp/bert_mini --input=texts.txt --output=/tmp/fills.jsonl

PATH is a bert_jax pretraining workdir or a Hugging Face BertForMaskedLM / BertForPreTraining
directory (a fine-tuning workdir has no masked-LM head: use predict.py). With --text: one line per
[MASK] (token and probability), then one JSON line. With --input (one text per line, blank lines
skipped), texts are batched in one process and each gives one JSON line, on stdout or in --output.
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


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the results
  texts = _texts()  # bad input fails before the (slow) checkpoint load
  model = pretrained.load_pretrained(_CHECKPOINT.value)
  predictions = inference.fill_masks(model, texts, top_k=_TOP_K.value, batch_size=_BATCH_SIZE.value)
  # 'token' is the vocabulary's piece ('Ġthe', '▁the', '##s'); 'token_str' its text as the tokenizer decodes it
  # (transformers' fill-mask pipeline's token_str), which the summary lines show.
  tok = model.tokenizer
  text_of = lambda token: tok.decode([tok.token_to_id(token)]).strip() or token  # pylint: disable=unnecessary-lambda-assignment
  lines = [json.dumps({'text': text, 'predictions': [[{'token': t, 'token_str': text_of(t), 'probability': p}
                                                      for t, p in top] for top in masks]}, ensure_ascii=False)
           for text, masks in zip(texts, predictions)]
  if _TEXT.value is not None:
    for i, top in enumerate(predictions[0], 1):
      print(f'[MASK] {i}: ' + ' | '.join(f'{text_of(token)} {p:.4f}' for token, p in top), flush=True)
  if _OUTPUT.value:
    files.write_text_atomic(_OUTPUT.value, '\n'.join(lines) + '\n')
    print(json.dumps({'output': _OUTPUT.value, 'texts': len(texts)}), flush=True)
  else:
    sys.stdout.write('\n'.join(lines) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
  cli.run(main, text_flags=('text',))
