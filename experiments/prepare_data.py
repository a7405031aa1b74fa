"""Prepares a pretraining corpus once, before training: the same cache pretrain.py would build.

  python experiments/prepare_data.py --config=experiments/configs/pretrain.py:base
  python experiments/prepare_data.py --config=experiments/configs/pretrain.py:cpu \
      --config.data.train_files=/corpora/c4/en/*.json.gz --config.data.num_workers=16

Work units are spread over `data.num_workers` local processes (0 = every core) and, when
started on every host of a pod (the multi-host flags, as for pretrain.py), over the hosts: each
builds its share into the shared `data.cache_dir`. A run killed part-way resumes where it
stopped. Ends by printing one JSON line: the cache directory and its statistics (a run in phases: one per
phase's records, and one per corpus of a mixture).
"""

import json
import os

from bert_jax.config import PretrainConfig

import cli

_CONFIG = cli.define_config(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'pretrain.py'),
    'Pretraining config file, optionally with :VARIANT; its data and model.vocab_size are used.',
    schema=PretrainConfig)


def main(_):
  # jax, flax and orbax take seconds to import: only after the flags and the config are checked.
  from bert_jax.data.mixture import Mixture  # pylint: disable=g-import-not-at-top
  from bert_jax.pretraining import pretrain_run as pretrain  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import reporting  # pylint: disable=g-import-not-at-top
  from bert_jax.train.preemption import Preemption  # pylint: disable=g-import-not-at-top
  cfg = PretrainConfig.from_dict(_CONFIG.value.to_dict())
  # SIGTERM/Ctrl-C: the workers stop, finished units stay, exit code 75; the same command resumes.
  with Preemption() as preempt, preempt.immediately('preparing the data'):
    # A run in phases: the records of each data config of its plan.
    phases = pretrain.prepare_phase_data(cfg, log=cfg.plan.phased).values()
  caches = [part for p, _ in phases for part in (p.parts if isinstance(p, Mixture) else [p])]  # a mixture: each corpus
  for prepared in {p.dir: p for p in caches}.values():
    reporting.log(json.dumps({'dir': prepared.dir, 'num_train': prepared.num_train, 'num_eval': prepared.num_eval,
                              **prepared.stats}))


if __name__ == '__main__':
  cli.run(main)
