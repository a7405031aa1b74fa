"""Exports a bert_jax workdir (or re-exports an HF directory) as a Hugging Face BERT or ModernBERT directory.

  python experiments/export_hf.py --checkpoint=/tmp/bert_mini --output=/tmp/bert_mini_hf [--step=N]

The result holds config.json, model.safetensors and the tokenizer files; transformers loads it
as BertModel / BertForPreTraining (the default architecture) or as ModernBertModel /
ModernBertForMaskedLM (a ModernBERT-shaped one: model.norm_position=pre, position_embedding=rotary,
mlp=geglu, type_vocab_size=0), and `load_pretrained` reads it back bit-exactly. Other combinations
of the architecture switches have no Hugging Face class: one error line. Ends with one JSON line.
"""

import json
import os

from absl import flags

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.interop import hf, modernbert
from bert_jax.interop.pretrained import load_pretrained
from bert_jax.train import workdir

import cli

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'A bert_jax workdir or an HF directory.', required=True)
_OUTPUT = flags.DEFINE_string('output', None, 'Directory to write (must be empty or absent).', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step of a workdir (default: latest).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace the files in a non-empty --output.')


def main(_):
  source, output = os.path.realpath(_CHECKPOINT.value), os.path.realpath(_OUTPUT.value)
  if output == source or output.startswith(source + os.sep) or source.startswith(output + os.sep):
    raise ConfigError(f'--output {_OUTPUT.value} is (or holds, or is inside) the checkpoint being exported; '
                      'export into another directory (--overwrite never applies to the source)')
  files.check_output(_OUTPUT.value, 'directory')
  workdir.check_kind(_OUTPUT.value, 'export', what='--output')
  pretrained = load_pretrained(_CHECKPOINT.value, _STEP.value)
  hf.save_hf_checkpoint(_OUTPUT.value, pretrained.config, pretrained.params, pretrained.tokenizer,
                        overwrite=_OVERWRITE.value)
  heads = set(pretrained.params) - {'bert'}
  if modernbert.hf_architecture(pretrained.config) == 'modernbert':
    heads -= {'nsp'}  # ModernBertForMaskedLM has no NSP head
  print(json.dumps({'output': _OUTPUT.value, 'source': pretrained.source, 'step': pretrained.step,
                    'architecture': modernbert.hf_architecture(pretrained.config), 'heads': sorted(heads)}),
        flush=True)


if __name__ == '__main__':
  cli.run(main)
