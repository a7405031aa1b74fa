"""Ablation ladders: pretraining variants (rungs), each fine-tuned on downstream tasks over seeds, one table.

  python experiments/ladder.py --config=experiments/configs/ladder.py:tiny --workdir=/tmp/ladder_tiny
  python experiments/ladder.py --config=experiments/configs/ladder.py:cpu --workdir=/tmp/ladder

Variants:
  tiny         the `tiny` pretraining config and masked LM alone, x SST-2 (40 steps on 1,280 sentences) x 2
               seeds: a few minutes on 2 CPU cores (the tests run it).
  cpu          the README's ablations of the main job (the main job, SOP, MLM-only, span masking, a 30% -> 15%
               mask schedule, ModernBERT-shaped) x SST-2 and RTE at the README's fine-tuning budgets (at lr 1e-3)
               x 3 seeds: about 45 minutes on 2 CPU cores.
  accelerator  BERT-base rungs (BERT's recipe, SOP, span masking, ModernBERT-shaped) on ../shared/data/enwiki
               x GLUE (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE) x 5 seeds, at BERT's fine-tuning settings:
               for a cluster (--launcher=slurm), never run here.

A ladder: `pretrain` (FILE:VARIANT, the base), `pretrain_overrides` (FIELD=VALUE for every rung: the budget),
`rungs` (name -> order, variant of the base's file or '' for the base's, overrides), `finetune` (the fine-tuning
config file), `tasks` (name -> order, variant, overrides: the task and its budget), `seeds`, `checkpoint_step`
(-1: each rung's final checkpoint). Any of them is a flag, e.g. --config.seeds=5,
--config.rungs.sop.overrides="data.objective=sop optim.learning_rate=1e-3", --config.tasks.rte.overrides=...
Overrides are shell words: quote a value with spaces, data.train_files='/my data/corpus.txt'.
"""

import ml_collections


def _ordered(**specs) -> dict:
  return {name: dict(order=i + 1, variant=spec.get('variant', ''), overrides=spec.get('overrides', ''))
          for i, (name, spec) in enumerate(specs.items())}


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  variant = arg or 'tiny'
  cfg = dict(pretrain='experiments/configs/pretrain.py:cpu', pretrain_overrides='',
             finetune='experiments/configs/finetune.py', seeds=3, checkpoint_step=-1)
  if variant == 'tiny':
    cfg.update(pretrain='experiments/configs/pretrain.py:tiny', seeds=2,
               rungs=_ordered(bert={}, mlm_only=dict(overrides='data.objective=none')),
               tasks=_ordered(sst2=dict(variant='sst2',
                                        overrides='num_train_epochs=0 num_train_steps=40 max_train_samples=1280')))
  elif variant == 'cpu':
    cfg['rungs'] = _ordered(bert={}, sop=dict(variant='sop'), mlm_only=dict(variant='mlm_only'),
                            span=dict(variant='span'), mask_schedule=dict(variant='mask_schedule'),
                            modern=dict(variant='modern'))
    # The README's fine-tuning budgets at a learning rate for a 2-layer, hidden-128 model: at all-MiniLM's 1e-4,
    # 5 of the first 6 SST-2 cells stayed at (or within 0.001 of) the majority class.
    cfg['tasks'] = _ordered(sst2=dict(variant='sst2', overrides='optim.learning_rate=1e-3'),
                            rte=dict(variant='rte', overrides='optim.learning_rate=1e-3'))
  elif variant == 'accelerator':
    cfg.update(pretrain='experiments/configs/pretrain.py:base', seeds=5)
    cfg['rungs'] = _ordered(bert={}, sop=dict(overrides='data.objective=sop'),
                            span=dict(overrides='data.masking=span'),
                            modern=dict(overrides='model.norm_position=pre model.position_embedding=rotary '
                                                  'model.mlp=geglu model.use_bias=false model.type_vocab_size=0'))
    cfg['tasks'] = _ordered(**{t: dict(variant=t) for t in ('cola', 'sst2_full', 'mrpc', 'stsb', 'qqp', 'mnli',
                                                              'qnli', 'rte')})
  else:
    raise ValueError(f'unknown ladder config variant {variant!r}: tiny, cpu, accelerator')
  return ml_collections.ConfigDict(cfg)
