"""Predictions of a fine-tuned model on new text: labels and probabilities, word tags, answer spans.

  python experiments/predict.py --workdir=/tmp/sst2 --text="A gripping, funny film."
  python experiments/predict.py --workdir=/tmp/rte --text="A man eats." --text_pair="Someone eats."
  python experiments/predict.py --workdir=/tmp/conll --text="John Smith flew to Paris on Monday."
  python experiments/predict.py --workdir=/tmp/squad --question="Who flew?" --context="John Smith flew to Paris."
  python experiments/predict.py --workdir=/tmp/sst2 --input=reviews.txt --output=/tmp/reviews.jsonl
  python experiments/predict.py --workdir=/tmp/reranker --text="what is bert" --text_pair="BERT is an encoder."

--input takes plain text (one row per line; 'a<TAB>b' for pairs, 'question<TAB>context' for
SQuAD), JSONL, or the task's own files (a GLUE TSV with its header, CoNLL columns, SQuAD JSON; a model
fine-tuned on your own files (classify/regress) reads a .csv/.tsv/.jsonl by the run's text columns);
see `bert_jax.finetuning.predict.read_rows`. A reranker (finetune.py:rerank) scores (query, passage) pairs: --text
and --text_pair, query<TAB>passage lines, or a table with the run's query and passage columns; its 'score' is the
logit, and 'probability' its sigmoid when it was trained on 0/1 labels. Rows are batched in one process. The predictions
go to stdout as one JSON line each, or to --output (.jsonl or .tsv); stderr says when each phase starts (loading the
checkpoint, compiling, writing) and where a long prediction is, with an ETA. --seed and --step pick the
checkpoint (default: the run's first seed, latest step). The workdir is only read.

A special token spelled in the text ("[SEP]", "[CLS]", "[MASK]", "[PAD]") is read as that token,
as Hugging Face's tokenizer and its pipelines read it: "a [SEP] b" is two segments. Texts longer
than the run's max_seq_length are truncated, with one warning line on stderr. A GLUE task takes
what it was fine-tuned on: one sentence (SST-2, CoLA) or a pair (RTE, MRPC, ...), else one error line.
"""

import json
import os
import sys

from absl import flags

from bert_jax import files
from bert_jax.errors import ConfigError, DataError
from bert_jax.finetuning import predict
from bert_jax.interop.pretrained import load_finetuned
from bert_jax.runs import reporting, workdir

import cli

_WORKDIR = flags.DEFINE_string('workdir', None, 'A fine-tuning workdir (experiments/finetune.py).', required=True)
_TEXT = flags.DEFINE_string('text', None, 'One text (classification, NER), or the question (QA).')
_TEXT_PAIR = flags.DEFINE_string('text_pair', None, 'The second text of a pair, or the context (QA).')
_QUESTION = flags.DEFINE_string('question', None, 'QA: the question.')
_CONTEXT = flags.DEFINE_string('context', None, 'QA: the paragraph to answer from.')
_INPUT = flags.DEFINE_string('input', None, 'A file of rows (txt, tsv, jsonl, GLUE TSV, CoNLL, SQuAD JSON).')
_FORMAT = flags.DEFINE_enum('format', 'auto', predict.FORMATS, 'Format of --input (auto: from name and content).')
_OUTPUT = flags.DEFINE_string('output', None, 'Write the predictions here (.jsonl or .tsv) instead of stdout.')
_SEED = flags.DEFINE_integer('seed', None, 'Which seed of the run (default: its first).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 64, 'Rows (features) per forward pass.')
_N_BEST = flags.DEFINE_integer('n_best', 5, 'QA: answers per question (the best and the next).')


def _check_flags() -> None:
  given = [f.name for f in (_TEXT, _QUESTION) if f.value is not None] + (['input'] if _INPUT.value else [])
  if len(given) != 1:
    raise ConfigError('give one of --text (with --text_pair), --question (with --context) or --input')
  if _BATCH_SIZE.value <= 0 or _N_BEST.value <= 0:
    raise ConfigError('--batch_size and --n_best must be positive')
  if _OUTPUT.value:
    if os.path.splitext(_OUTPUT.value)[1] not in ('.jsonl', '.tsv'):
      raise ConfigError(f'--output {_OUTPUT.value}: give a .jsonl or .tsv file')
    files.check_output(_OUTPUT.value, 'file', '--output')
    work, out = os.path.realpath(_WORKDIR.value), os.path.realpath(_OUTPUT.value)
    if out.startswith(work + os.sep):
      raise ConfigError(f'--output {_OUTPUT.value} is inside the workdir, which predict only reads: write it '
                        'elsewhere')


def main(_):
  _check_flags()
  task = workdir.inspect(_WORKDIR.value).task
  if workdir.embeds(task) or workdir.sparse(task):  # before the (slow) checkpoint load
    raise ConfigError(f'{_WORKDIR.value} is a {task["kind"]} run (an embedding model, no task head to predict with): '
                      f'embed texts with experiments/embed.py --checkpoint={_WORKDIR.value}, or evaluate it with '
                      'experiments/evaluate.py')
  if task and task.get('kind') == 'multivector':
    raise ConfigError(f'{_WORKDIR.value} is a multivector run (token vectors scored by MaxSim, no task head to predict '
                      f'with): evaluate it with experiments/evaluate.py, or export it with experiments/export_hf.py '
                      f'--checkpoint={_WORKDIR.value} for sentence-transformers\' MultiVectorEncoder')
  reporting.log_to(sys.stderr)  # stdout carries the results
  reporting.log(f'predict: loading {_WORKDIR.value} (seed {"the first" if _SEED.value is None else _SEED.value}, '
                f'step {"the latest" if _STEP.value is None else _STEP.value}) ...')
  tuned = load_finetuned(_WORKDIR.value, _SEED.value, _STEP.value, log=reporting.log)
  kind = tuned.task['kind']
  if _INPUT.value:
    rows = predict.read_rows(_INPUT.value, kind, tuned.task['name'], _FORMAT.value, tuned.finetune)
  else:
    rows = [predict.text_row(kind, _TEXT.value, _TEXT_PAIR.value, _QUESTION.value, _CONTEXT.value,
                             task_name=tuned.task['name'])]
  if not rows:
    raise DataError(f'no rows to predict in {_INPUT.value}')
  reporting.log(f'predict: {len(rows):,} rows, {tuned.task["name"]} ({kind}), seed {tuned.seed} step {tuned.step}')
  outputs = predict.predict(tuned, rows, batch_size=_BATCH_SIZE.value, n_best=_N_BEST.value, log=reporting.log)
  if _OUTPUT.value:
    reporting.log(f'predict: writing {len(outputs):,} predictions to {_OUTPUT.value}')
  if _OUTPUT.value and _OUTPUT.value.endswith('.tsv'):
    lines = predict.tsv_lines(kind, rows, outputs, tuned.task['name'])
    files.write_text_atomic(_OUTPUT.value, '\n'.join(lines) + '\n')
  else:
    lines = [json.dumps({**row, **out}, ensure_ascii=False) for row, out in zip(rows, outputs)]
    if _OUTPUT.value:
      files.write_text_atomic(_OUTPUT.value, '\n'.join(lines) + '\n')
    else:
      for line in lines:
        print(line, flush=True)
  if _OUTPUT.value:
    print(json.dumps({'output': _OUTPUT.value, 'rows': len(rows), 'task': tuned.task['name'], 'seed': tuned.seed,
                      'step': tuned.step}), flush=True)


if __name__ == '__main__':
  cli.run(main, text_flags=('text', 'text_pair', 'question', 'context'))
