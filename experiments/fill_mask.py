"""Top-k predictions of the masked-LM head for every [MASK] in a text.

  python experiments/fill_mask.py --checkpoint=/tmp/bert_mini \
      --text="The doctor ran to the emergency room to see [MASK] patient." --top_k=5

PATH is a bert_jax pretraining workdir or a Hugging Face BertForMaskedLM / BertForPreTraining
directory. Prints one line per [MASK] (token and probability), then one JSON line.
"""

import json

from absl import flags

from bert_jax import inference
from bert_jax.interop import pretrained

import cli

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_TEXT = flags.DEFINE_string('text', None, 'Text with one or more [MASK].', required=True)
_TOP_K = flags.DEFINE_integer('top_k', 5, 'Predictions per [MASK].')


def main(_):
  model = pretrained.load_pretrained(_CHECKPOINT.value)
  predictions = inference.fill_mask(model, _TEXT.value, top_k=_TOP_K.value)
  for i, top in enumerate(predictions, 1):
    print(f'[MASK] {i}: ' + ' | '.join(f'{token} {p:.4f}' for token, p in top), flush=True)
  listed = [[{'token': t, 'probability': p} for t, p in top] for top in predictions]
  print(json.dumps({'text': _TEXT.value, 'predictions': listed}), flush=True)


if __name__ == '__main__':
  cli.run(main)
