"""Attention of every layer and head for a text (or sentence pair), or every line of a file: .npz, PNGs, a page.

  python experiments/attention.py --checkpoint=PATH --text="The cat sat on the mat." \
      --text_pair="It was asleep." --output=/tmp/attention --html=/tmp/attention.html --layer=2 --head=5
  python experiments/attention.py --checkpoint=PATH --input=texts.txt --output=/tmp/maps --html=/tmp/pages

PATH is a Hugging Face directory or a bert_jax workdir (pretraining, or fine-tuning: its encoder).
--output writes OUTPUT/attention.npz (probs [layers, heads, T, T], tokens [T]), OUTPUT/layer_<l>.png
(a grid of all heads, for every layer l) and OUTPUT/layer<L>_head<H>.png (one head, token labels
readable; --layer defaults to the last layer). --html writes one self-contained page with a head
view, a model view (all layers x heads, with a from -> to token search) and a neuron view (queries,
keys, q x k, scores and softmax), opening on --layer/--head; its numbers are the npz's. Give either
or both. With --input (one text, or two tab-separated texts, per line), the model is loaded once and
row i goes to OUTPUT/<i>/ and HTML/<i>.html (--output and --html are directories then). Layers and
heads count from 0. Prints one JSON line per text with the tokens and the paths.
"""

import json
import os
import sys

from absl import flags

from bert_jax import files, inference
from bert_jax.errors import ConfigError, DataError
from bert_jax.interop import pretrained
from bert_jax.runs import reporting

import cli
from tools import attention_page, attention_plots

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_TEXT = flags.DEFINE_string('text', None, 'The text (segment A).')
_INPUT = flags.DEFINE_string('input', None, 'Instead: a file, one text or two tab-separated texts per line.')
_TEXT_PAIR = flags.DEFINE_string('text_pair', None, 'Optional second segment (B).')
_OUTPUT = flags.DEFINE_string('output', None, 'Directory for attention.npz and the PNGs.')
_HTML = flags.DEFINE_string('html', None, 'Path of the interactive explorer page (.html).')
_LAYER = flags.DEFINE_integer('layer', -1, 'Layer of the single-head picture (negative: from the end).')
_HEAD = flags.DEFINE_integer('head', 0, 'Head of the single-head picture.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', None, 'Truncation length ([CLS]/[SEP] included; default 128, or '
                                   "the model's positions when it has fewer).")
_TITLE = flags.DEFINE_string('title', None, 'Figure title prefix (default: the checkpoint directory name).')


def _rows() -> list[tuple[str, str | None]]:
  if (_TEXT.value is None) == (_INPUT.value is None):
    raise ConfigError('give --text (with --text_pair) or --input (one text, or two tab-separated, per line)')
  if _INPUT.value:
    return [r for r in inference.read_texts(_INPUT.value) if r[0].strip()]
  if not _TEXT.value.strip() or (_TEXT_PAIR.value is not None and not _TEXT_PAIR.value.strip()):
    raise DataError('--text (and --text_pair when given) must hold some text')
  return [(_TEXT.value, _TEXT_PAIR.value)]


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result lines
  rows = _rows()
  if not _OUTPUT.value and not _HTML.value:
    raise ConfigError('give --output (npz and PNGs), --html (the explorer page) or both')
  many = _INPUT.value is not None
  if _OUTPUT.value:
    files.check_output(_OUTPUT.value, 'directory')
  if _HTML.value:
    files.check_output(_HTML.value, 'directory' if many else 'file', '--html')
  model = pretrained.load_encoder(_CHECKPOINT.value)
  max_length = inference.default_max_length(model) if _MAX_LENGTH.value is None else _MAX_LENGTH.value
  # Fail on a bad --layer/--head before the encoder runs.
  attention_plots.check_layer_head(_LAYER.value, _HEAD.value, model.config.num_layers, model.config.num_heads)
  title = _TITLE.value if _TITLE.value is not None else os.path.basename(os.path.normpath(_CHECKPOINT.value))
  for i, (text_a, text_b) in enumerate(rows, 1):
    details = inference.attention_details(model, text_a, text_b, max_length=max_length)
    paths = {}
    if _OUTPUT.value:
      out = os.path.join(_OUTPUT.value, f'{i:04d}') if many else _OUTPUT.value
      paths = attention_plots.write_attention_pictures(details.tokens, details.probs, out, layer=_LAYER.value,
                                                       head=_HEAD.value, title=title)
    if _HTML.value:
      page = os.path.join(_HTML.value, f'{i:04d}.html') if many else _HTML.value
      paths['html'] = attention_page.write(details, page, model_name=title, text_a=text_a, text_b=text_b,
                                           layer=_LAYER.value, head=_HEAD.value)
    print(json.dumps({'tokens': details.tokens, 'shape': list(details.probs.shape), **paths}), flush=True)


if __name__ == '__main__':
  cli.run(main, text_flags=('text', 'text_pair'))
