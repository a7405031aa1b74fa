"""Exports a bert_jax workdir (or re-exports an HF directory) as a Hugging Face BERT, DistilBERT, ELECTRA or
ModernBERT directory.

  python experiments/export_hf.py --checkpoint=/tmp/bert_mini --output=/tmp/bert_mini_hf [--step=N]
  python experiments/export_hf.py --checkpoint=/tmp/sst2 --output=/tmp/sst2_hf [--seed=N] [--step=N]

A pretraining workdir becomes BertForPreTraining (BertForMaskedLM without NSP), or
ModernBertForMaskedLM for a ModernBERT-shaped one (model.norm_position=pre, position_embedding=rotary,
mlp=geglu, type_vocab_size=0), DistilBertForMaskedLM for a BERT without token types (type_vocab_size=0),
ElectraForMaskedLM for one with model.embedding_size (ElectraForPreTraining when re-exporting an ELECTRA
discriminator directory; a model without an MLM head: DistilBertModel / ElectraModel); other combinations of the architecture switches have no Hugging Face
class: one error line. A fine-tuning workdir (one seed, default its first) becomes
BertForSequenceClassification, BertForTokenClassification or BertForQuestionAnswering with its task's
label names as id2label. The result holds config.json, model.safetensors and the tokenizer files:
WordPiece as transformers' own, SentencePiece as a tokenizer.json that transformers' fast tokenizer
runs with the same ids as bert_jax (a model for which that cannot be made exact is refused) plus
spiece.model for bert_jax. `load_pretrained` reads the encoder back bit-exactly, `hf.load_hf_checkpoint`
the head too. Ends with one JSON line.
"""

import json
import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.interop import hf
from bert_jax.interop.pretrained import load_finetuned, load_pretrained
from bert_jax.runs import reporting, workdir

import cli

_CHECKPOINT = flags.DEFINE_string(
    'checkpoint', None, 'A bert_jax pretraining or fine-tuning workdir, or an HF directory.', required=True)
_OUTPUT = flags.DEFINE_string('output', None, 'Directory to write (must be empty or absent).', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step of a workdir (default: latest).')
_SEED = flags.DEFINE_integer('seed', None, 'Seed of a fine-tuning workdir to export (default: its first).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace the files in a non-empty --output.')


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result line
  source, output = os.path.realpath(_CHECKPOINT.value), os.path.realpath(_OUTPUT.value)
  if output == source or output.startswith(source + os.sep) or source.startswith(output + os.sep):
    raise ConfigError(f'--output {_OUTPUT.value} is (or holds, or is inside) the checkpoint being exported; '
                      'export into another directory (--overwrite never applies to the source)')
  files.check_output(_OUTPUT.value, 'directory')
  workdir.check_kind(_OUTPUT.value, 'export', what='--output')
  kind = workdir.inspect(_CHECKPOINT.value).kind
  if _SEED.value is not None and kind != 'finetuning':
    raise ConfigError(f'--seed applies to fine-tuning workdirs only; {_CHECKPOINT.value} is not one')
  task, seed = None, None
  if kind == 'finetuning':
    tuned = load_finetuned(_CHECKPOINT.value, seed=_SEED.value, step=_STEP.value)
    config, params, tokenizer, task, source_kind, step, seed = (
        tuned.config, tuned.params, tuned.tokenizer, tuned.task, 'bert_jax', tuned.step, tuned.seed)
  elif kind == 'export' and hf.read_hf_task(_CHECKPOINT.value) is not None:  # a fine-tuned HF model, with its head
    config, params, _, _ = hf.load_hf_checkpoint(_CHECKPOINT.value)
    task, tokenizer, source_kind, step = (hf.read_hf_task(_CHECKPOINT.value), hf.load_hf_tokenizer(_CHECKPOINT.value),
                                          'hf', None)
  else:
    pretrained = load_pretrained(_CHECKPOINT.value, _STEP.value, other_heads=True)  # ELECTRA's discriminator too
    config, params, tokenizer, source_kind, step = (pretrained.config, pretrained.params, pretrained.tokenizer,
                                                    pretrained.source, pretrained.step)
  hf.save_hf_checkpoint(_OUTPUT.value, config, params, tokenizer, overwrite=_OVERWRITE.value, task=task)
  with open(os.path.join(_OUTPUT.value, hf.CONFIG_FILE), encoding='utf-8') as f:
    architecture = json.load(f)['architectures'][0]
  heads = set(params) - {'bert'}
  if hf.hf_model_type(config) != 'bert':
    heads -= {'nsp'}  # ModernBERT, DistilBERT and ELECTRA have no NSP head
  line = {'output': _OUTPUT.value, 'source': source_kind, 'step': step, 'architecture': architecture,
          'heads': sorted(heads), 'tokenizer': type(tokenizer).__name__}
  if task is not None:
    line.update(task=task.get('name', ''), kind=task['kind'], seed=seed)
  print(json.dumps(line), flush=True)


if __name__ == '__main__':
  cli.run(main)
