"""Attention of every layer and head for one text (or sentence pair): .npz, PNGs and an explorer.

  python experiments/attention.py --checkpoint=PATH --text="The cat sat on the mat." \
      --text_pair="It was asleep." --output=/tmp/attention --html=/tmp/attention.html --layer=2 --head=5

--output writes OUTPUT/attention.npz (probs [layers, heads, T, T], tokens [T]), OUTPUT/layer_<l>.png
(a grid of all heads, for every layer l) and OUTPUT/layer<L>_head<H>.png (one head, token labels
readable; --layer defaults to the last layer). --html writes one self-contained page with a head
view, a model view (all layers x heads) and a neuron view (queries, keys, q x k, scores and
softmax), opening on --layer/--head; its numbers are the npz's. Give either or both. Layers and
heads count from 0. Ends by printing one JSON line with the tokens and the paths.
"""

import json
import os

from absl import flags

from bert_jax import files, inference
from bert_jax.errors import ConfigError, DataError
from bert_jax.interop import pretrained

import cli
from tools import attention_page, attention_plots

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_TEXT = flags.DEFINE_string('text', None, 'The text (segment A).', required=True)
_TEXT_PAIR = flags.DEFINE_string('text_pair', None, 'Optional second segment (B).')
_OUTPUT = flags.DEFINE_string('output', None, 'Directory for attention.npz and the PNGs.')
_HTML = flags.DEFINE_string('html', None, 'Path of the interactive explorer page (.html).')
_LAYER = flags.DEFINE_integer('layer', -1, 'Layer of the single-head picture (negative: from the end).')
_HEAD = flags.DEFINE_integer('head', 0, 'Head of the single-head picture.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 128, 'Truncation length ([CLS]/[SEP] included).')
_TITLE = flags.DEFINE_string('title', None, 'Figure title prefix (default: the checkpoint directory name).')


def main(_):
  if not _TEXT.value.strip() or (_TEXT_PAIR.value is not None and not _TEXT_PAIR.value.strip()):
    raise DataError('--text (and --text_pair when given) must hold some text')
  if not _OUTPUT.value and not _HTML.value:
    raise ConfigError('give --output (npz and PNGs), --html (the explorer page) or both')
  if _OUTPUT.value:
    files.check_output(_OUTPUT.value, 'directory')
  if _HTML.value:
    files.check_output(_HTML.value, 'file', '--html')
  model = pretrained.load_pretrained(_CHECKPOINT.value)
  # Fail on a bad --layer/--head before the encoder runs.
  attention_plots.check_layer_head(_LAYER.value, _HEAD.value, model.config.num_layers, model.config.num_heads)
  details = inference.attention_details(model, _TEXT.value, _TEXT_PAIR.value, max_length=_MAX_LENGTH.value)
  title = _TITLE.value if _TITLE.value is not None else os.path.basename(os.path.normpath(_CHECKPOINT.value))
  paths = {}
  if _OUTPUT.value:
    paths = attention_plots.write_attention_pictures(details.tokens, details.probs, _OUTPUT.value, layer=_LAYER.value,
                                           head=_HEAD.value, title=title)
  if _HTML.value:
    paths['html'] = attention_page.write(details, _HTML.value, model_name=title, text_a=_TEXT.value,
                                         text_b=_TEXT_PAIR.value, layer=_LAYER.value, head=_HEAD.value)
  print(json.dumps({'tokens': details.tokens, 'shape': list(details.probs.shape), **paths}), flush=True)


if __name__ == '__main__':
  cli.run(main)
