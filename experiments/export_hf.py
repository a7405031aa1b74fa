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
spiece.model for bert_jax. `load_pretrained` reads the encoder back bit-exactly, `families.load_hf_checkpoint`
the head too. Ends with one JSON line (on stdout; stderr says when loading and writing start).

A sentence-transformers folder (the encoder as above, plus modules.json, sentence_bert_config.json,
config_sentence_transformers.json, 1_Pooling/, 2_Normalize/ and a model card; docs/embeddings.md):
  python experiments/export_hf.py --checkpoint=/tmp/retrieval --output=/tmp/retrieval_st
  python experiments/export_hf.py --checkpoint=/tmp/bert_mini --output=/tmp/bert_mini_st --sentence_transformers \
      [--pooling=cls] [--normalize=false] [--max_seq_length=256]
A multivector workdir (finetune.py:multivector) exports by default as the folder sentence-transformers'
MultiVectorEncoder loads (1_Dense/, 2_MultiVectorMask/, 3_Normalize/, its query and document lengths and markers;
interop/st_multivector.py); --nosentence_transformers: the plain encoder (without the projection).
A retrieval workdir (finetune.py:retrieval) exports as one by default, with its run's pooling, normalisation,
passage length (max_seq_length) and Matryoshka sizes (--nosentence_transformers: the plain encoder); any other
encoder with --sentence_transformers (mean pooling, normalised, the model's positions unless given; a
sentence-transformers folder keeps its own). A flag given explicitly wins over the run's, with a line saying so.
A sparse workdir (finetune.py:sparse) exports as a folder sentence-transformers' SparseEncoder loads: the encoder and
its masked-LM head (BertForMaskedLM) and 1_SpladePooling/, queries cut to the run's max_query_length, documents to
its max_seq_length (--max_seq_length: another); --nosentence_transformers: the BertForMaskedLM directory alone.
"""

import json
import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.model.pooling import POOLINGS
from bert_jax.interop import families, sentence_transformers, st_multivector
from bert_jax.interop.hf import model_dir
from bert_jax.interop.pretrained import describe, load_finetuned, load_pretrained
from bert_jax.runs import reporting, workdir

import cli

_CHECKPOINT = flags.DEFINE_string(
    'checkpoint', None, 'A bert_jax pretraining or fine-tuning workdir, or an HF directory.', required=True)
_OUTPUT = flags.DEFINE_string('output', None, 'Directory to write (must be empty or absent).', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step of a workdir (default: latest).')
_SEED = flags.DEFINE_integer('seed', None, 'Seed of a fine-tuning workdir to export (default: its first).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace the files in a non-empty --output.')
_SENTENCE_TRANSFORMERS = flags.DEFINE_bool(
    'sentence_transformers', None, 'Write a sentence-transformers folder (default: for a retrieval workdir only).')
_POOLING = flags.DEFINE_enum('pooling', None, POOLINGS, 'sentence-transformers export: mean or cls (default: the '
                             "retrieval run's, else mean).")
_NORMALIZE = flags.DEFINE_bool('normalize', None, 'sentence-transformers export: L2-normalise (default: the run\'s, '
                               'else true).')
_MAX_SEQ_LENGTH = flags.DEFINE_integer('max_seq_length', None, 'sentence-transformers export: tokens per text '
                                       "(default: the run's passage length, else the model's positions).")
_EMBEDDING_FLAGS = (_POOLING, _NORMALIZE, _MAX_SEQ_LENGTH)


def main(_):
  reporting.log_to(sys.stderr)  # stdout carries the result line
  source, output = os.path.realpath(_CHECKPOINT.value), os.path.realpath(_OUTPUT.value)
  if output == source or output.startswith(source + os.sep) or source.startswith(output + os.sep):
    raise ConfigError(f'--output {_OUTPUT.value} is (or holds, or is inside) the checkpoint being exported; '
                      'export into another directory (--overwrite never applies to the source)')
  files.check_output(_OUTPUT.value, 'directory')
  workdir.check_kind(_OUTPUT.value, 'export', what='--output')
  found = workdir.inspect(_CHECKPOINT.value)
  kind = found.kind
  if _SEED.value is not None and kind != 'finetuning':
    raise ConfigError(f'--seed applies to fine-tuning workdirs only; {_CHECKPOINT.value} is not one')
  embedding_model = workdir.embeds(found.task)  # a retrieval run's: it records its pooling
  sparse = workdir.sparse(found.task)  # a sparse run's: the encoder and its masked-LM head
  multi_vector = bool(found.task) and found.task.get('kind') == 'multivector'  # token vectors: its own folder
  as_st = (embedding_model or sparse or multi_vector if _SENTENCE_TRANSFORMERS.value is None
           else _SENTENCE_TRANSFORMERS.value)
  given = [f'--{f.name}' for f in _EMBEDDING_FLAGS if f.value is not None]
  if given and not as_st:
    raise ConfigError(f'{", ".join(given)} apply to a sentence-transformers export only: add '
                      '--sentence_transformers (a retrieval or sparse workdir exports as one by default)')
  if sparse and as_st and (_POOLING.value is not None or _NORMALIZE.value is not None):
    raise ConfigError(f'{_CHECKPOINT.value} is a sparse run: its term weights are SPLADE-pooled and not normalised '
                      '(--pooling and --normalize apply to a dense embedding model)')
  if given and multi_vector:
    raise ConfigError(f'{", ".join(given)} set a pooled embedding; a multivector workdir exports its token vectors '
                      'as a MultiVectorEncoder folder with its run\'s lengths: leave them out')
  task, seed = None, None
  reporting.log(f'export: loading {_CHECKPOINT.value}' + (f' (step {_STEP.value})' if _STEP.value is not None else '')
                + ' ...')
  if kind == 'finetuning':
    tuned = load_finetuned(_CHECKPOINT.value, seed=_SEED.value, step=_STEP.value)
    config, params, tokenizer, task, source_kind, step, seed = (
        tuned.config, tuned.params, tuned.tokenizer, tuned.task, 'bert_jax', tuned.step, tuned.seed)
    if sparse:  # the encoder and its masked-LM head
      params = {'bert': params['bert'], 'mlm': params['mlm']}
    elif (workdir.embeds(task) or as_st) and not multi_vector:  # an embedding model, or a fine-tuned encoder: the
      params = {'bert': params['bert']}  # encoder alone
  elif kind == 'export' and families.read_hf_task(_CHECKPOINT.value) is not None:  # a fine-tuned HF model, its head
    config, params, _, _ = families.load_hf_checkpoint(_CHECKPOINT.value)
    task, tokenizer, source_kind, step = (families.read_hf_task(_CHECKPOINT.value),
                                          model_dir.load_hf_tokenizer(_CHECKPOINT.value), 'hf', None)
  else:
    pretrained = load_pretrained(_CHECKPOINT.value, _STEP.value, other_heads=True)  # ELECTRA's discriminator too
    config, params, tokenizer, source_kind, step = (pretrained.config, pretrained.params, pretrained.tokenizer,
                                                    pretrained.source, pretrained.step)
  if sparse and as_st:
    tuned_cfg = tuned.finetune
    lengths = dict(max_query_length=tuned_cfg.max_query_length,
                   max_seq_length=_MAX_SEQ_LENGTH.value or tuned_cfg.max_seq_length)
    reporting.log(f'export: writing a sentence-transformers SparseEncoder folder to {_OUTPUT.value} ...')
    sentence_transformers.save_sparse_encoder(
        _OUTPUT.value, config, params, tokenizer, **lengths, overwrite=_OVERWRITE.value,
        description=f'Exported from {_CHECKPOINT.value} (step {step}).')
  elif as_st and multi_vector:
    reporting.log(f'export: writing a sentence-transformers MultiVectorEncoder folder to {_OUTPUT.value} ...')
    st_multivector.save_multi_vector(
        _OUTPUT.value, config, params, tokenizer, task, overwrite=_OVERWRITE.value,
        description=f'Exported from {_CHECKPOINT.value}' + (f' (step {step})' if step is not None else '') + '.')
  elif as_st:
    embedding = describe(_CHECKPOINT.value, log=lambda _: None).embedding() or sentence_transformers.Embedding()
    embedding = embedding.given(pooling=_POOLING.value, normalize=_NORMALIZE.value,
                                max_seq_length=_MAX_SEQ_LENGTH.value).check(config)
    if task is not None and not workdir.embeds(task):
      reporting.log(f'{_CHECKPOINT.value} is a {task["kind"]} fine-tuning run: its encoder is exported, not its '
                    'task head')
    reporting.log(f'export: writing a sentence-transformers folder to {_OUTPUT.value} ...')
    sentence_transformers.save_sentence_transformers(
        _OUTPUT.value, config, params, tokenizer, embedding, overwrite=_OVERWRITE.value,
        description=f'Exported from {_CHECKPOINT.value}' + (f' (step {step})' if step is not None else '') + '.')
  else:
    reporting.log(f'export: writing a Hugging Face directory to {_OUTPUT.value} ...')
    families.save_hf_checkpoint(_OUTPUT.value, config, params, tokenizer, overwrite=_OVERWRITE.value,
                                task=None if workdir.embeds(task) or sparse else task)
  with open(os.path.join(_OUTPUT.value, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    architecture = json.load(f)['architectures'][0]
  heads = set() if as_st else set(params) - {'bert', 'projection'}
  if families.hf_model_type(config) != 'bert':
    heads -= {'nsp'}  # ModernBERT, DistilBERT and ELECTRA have no NSP head
  line = {'output': _OUTPUT.value, 'source': source_kind, 'step': step, 'architecture': architecture,
          'heads': sorted(heads), 'tokenizer': type(tokenizer).__name__}
  if task is not None:
    line.update(task=task.get('name', ''), kind=task['kind'], seed=seed)
  if sparse and as_st:
    line.update(sentence_transformers=True, sparse=True, **lengths)
  elif as_st and multi_vector:
    line.update(sentence_transformers=True, multi_vector=True,
                **{k: task[k] for k in ('projection_dim', 'query_length', 'document_length')})
  elif as_st:
    line.update(sentence_transformers=True, pooling=embedding.pooling, normalize=embedding.normalize,
                max_seq_length=embedding.max_seq_length, matryoshka_dims=list(embedding.matryoshka_dims))
  print(json.dumps(line), flush=True)


if __name__ == '__main__':
  cli.run(main)
