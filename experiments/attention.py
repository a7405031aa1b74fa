"""Attention maps of every layer and head for one text (or sentence pair), as .npz and PNGs.

  python experiments/attention.py --checkpoint=PATH --text="The cat sat on the mat." \
      --text_pair="It was asleep." --output=/tmp/attention --layer=2 --head=5

Writes OUTPUT/attention.npz (probs [layers, heads, T, T], tokens [T]), OUTPUT/layer_<l>.png (a
grid of all heads, for every layer l) and OUTPUT/layer<L>_head<H>.png (one head, token labels
readable; --layer defaults to the last layer). Layers and heads count from 0. Ends by printing one
JSON line with the tokens and the paths.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top

from bert_jax import cli, files, inference, plots, pretrained
from bert_jax.errors import DataError

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'HF directory or bert_jax workdir.', required=True)
_TEXT = flags.DEFINE_string('text', None, 'The text (segment A).', required=True)
_TEXT_PAIR = flags.DEFINE_string('text_pair', None, 'Optional second segment (B).')
_OUTPUT = flags.DEFINE_string('output', None, 'Directory for attention.npz and the PNGs.', required=True)
_LAYER = flags.DEFINE_integer('layer', -1, 'Layer of the single-head picture (negative: from the end).')
_HEAD = flags.DEFINE_integer('head', 0, 'Head of the single-head picture.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 128, 'Truncation length ([CLS]/[SEP] included).')
_TITLE = flags.DEFINE_string('title', None, 'Figure title prefix (default: the checkpoint directory name).')


def main(_):
  if not _TEXT.value.strip() or (_TEXT_PAIR.value is not None and not _TEXT_PAIR.value.strip()):
    raise DataError('--text (and --text_pair when given) must hold some text')
  files.check_output(_OUTPUT.value, 'directory')
  model = pretrained.load_pretrained(_CHECKPOINT.value)
  # Fail on a bad --layer/--head before the encoder runs.
  plots.check_layer_head(_LAYER.value, _HEAD.value, model.config.num_layers, model.config.num_heads)
  tokens, probs_lntt = inference.attention_maps(model, _TEXT.value, _TEXT_PAIR.value,
                                                max_length=_MAX_LENGTH.value)
  title = _TITLE.value if _TITLE.value is not None else os.path.basename(os.path.normpath(_CHECKPOINT.value))
  paths = plots.write_attention_pictures(tokens, probs_lntt, _OUTPUT.value, layer=_LAYER.value,
                                         head=_HEAD.value, title=title)
  print(json.dumps({'tokens': tokens, 'shape': list(probs_lntt.shape), **paths}), flush=True)


if __name__ == '__main__':
  cli.run(main)
