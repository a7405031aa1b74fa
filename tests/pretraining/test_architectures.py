"""Pretraining and fine-tuning with the architecture switches, end to end on the bundled corpus.

Each combination pretrains through the real pipeline and lowers the loss; the ModernBERT-shaped one
(packed rows, scanned and rematerialised layers) exports as a Hugging Face ModernBERT that reloads
with the same logits, continues pretraining with its own architecture, and fine-tunes.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import inference
from bert_jax.finetuning import finetune_run as finetuning
from bert_jax.interop import families
from bert_jax.interop.hf import model_dir
from bert_jax.interop.pretrained import load_pretrained
from bert_jax.pretraining import init, pretrain_run as pretraining

from harness.inputs import finetune_config, shared_data_or_skip, tiny_pretrain_config, write_small_corpus
from harness.numerics import tolerance

pytestmark = pytest.mark.slow

MODERN = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', use_bias=False, type_vocab_size=0,
              attention_window=16, global_attention_every=2, rope_theta=160000.0)
COMBOS = {
    'pre_ln': dict(norm_position='pre'),
    'rotary': dict(position_embedding='rotary'),
    'geglu': dict(mlp='geglu'),
    'no_bias': dict(use_bias=False),
    'local_window': dict(attention_window=16, global_attention_every=2),
    # A mix no Hugging Face class has (it trains, and exports as bert_jax only).
    'pre_ln_geglu_learned_window': dict(norm_position='pre', mlp='geglu', attention_window=8),
}  # and MODERN, in the last test


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """(corpus file, data cache shared by every run: one preparation)."""
  directory = tmp_path_factory.mktemp('corpus')
  return write_small_corpus(directory), str(directory / 'cache')


def _train(corpus, workdir, switches, steps=30, **data):
  path, cache = corpus
  cfg = tiny_pretrain_config(path, cache, num_train_steps=steps, log_every=1, eval_every=steps,
                             checkpoint_every=steps)
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **switches),
                            data=dataclasses.replace(cfg.data, **data))
  result = pretraining.train_and_evaluate(cfg, workdir)
  with open(os.path.join(workdir, 'metrics_train.jsonl'), encoding='utf-8') as f:
    losses = [json.loads(line)['loss'] for line in f]
  return cfg, result, losses


@pytest.mark.parametrize('name', list(COMBOS))
def test_pretraining_lowers_the_loss(name, corpus, tmp_path):
  _, result, losses = _train(corpus, str(tmp_path / 'run'), COMBOS[name])
  assert result['step'] == 30 and np.isfinite(result['mlm_loss'])
  assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses


def test_modernbert_shaped_pretrains_exports_and_finetunes(corpus, tmp_path):
  workdir = str(tmp_path / 'run')
  switches = dict(MODERN, scan_layers=True, remat_policy='full')
  cfg, result, losses = _train(corpus, workdir, switches, pack=True)
  assert result['step'] == 30 and np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses

  # Hugging Face ModernBERT: the NSP head and pooler stay behind; the encoder and MLM head reload exactly.
  trained = load_pretrained(workdir)
  export = str(tmp_path / 'hf')
  families.save_hf_checkpoint(export, trained.config, trained.params, trained.tokenizer)
  with open(os.path.join(export, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    assert json.load(f)['architectures'] == ['ModernBertForMaskedLM']
  reloaded = load_pretrained(export)
  # (its pooler is ModernBERT's classification head, started from the MLM head: ours stays behind)
  assert reloaded.config == dataclasses.replace(trained.config, scan_layers=False, remat_policy='none',
                                                pooler_activation='gelu', pooler_norm=True)
  ids = jnp.asarray(trained.tokenizer.encode_inputs('The game was released in Japan .', max_length=32)[0])[None]
  positions = jnp.arange(ids.shape[1])[None]
  logits = [np.asarray(jax.jit(lambda m: m(ids, None, None, positions)[0])(p.pretraining_model()))
            for p in (trained, reloaded)]
  # Scanned against a plain loop (the export's config): float32 rounding of each layer's widest sums.
  np.testing.assert_allclose(logits[1], logits[0], atol=tolerance(
      np.float32, trained.config.intermediate_size, magnitude=np.abs(logits[0]).max(), depth=trained.config.num_layers))
  _check_fill_mask_pipeline(trained, export)

  # Continued pretraining from the export takes its architecture.
  cont, _ = init.resolve_init_checkpoint(dataclasses.replace(cfg, init_checkpoint=export))
  assert all(getattr(cont.model, k) == v for k, v in MODERN.items())

  # Fine-tuning from the export (its pooler starts from the MLM head, as transformers' classifier) lowers the loss.
  ft = finetune_config(task='sst2', init_checkpoint=export, data_dir=shared_data_or_skip('sst2'), max_seq_length=64,
                       batch_size=16, eval_batch_size=64, learning_rate=5e-3, num_train_steps=24, max_train_samples=16,
                       log_every=4)
  ft_result = finetuning.finetune(ft, str(tmp_path / 'ft'))
  assert 0 <= ft_result['dev_accuracy'] <= 1
  with open(tmp_path / 'ft' / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    ft_losses = [json.loads(line)['loss'] for line in f]
  assert ft_losses[-1] < ft_losses[0], ft_losses


def _check_fill_mask_pipeline(trained, export):
  """transformers' fill-mask pipeline on the export (its tokenizer.json gives bert_jax's ids, without token
  types) ranks the same top token as bert_jax, with the same probabilities (where transformers is installed)."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  fill = transformers.pipeline('fill-mask', model=export, top_k=3)
  for text in ['the [MASK] was released in japan .', 'In 1998 , the [MASK] won the cup .']:
    theirs = fill(text)
    (ours,) = inference.fill_mask(trained, text, top_k=3)
    assert theirs[0]['token'] == trained.tokenizer.token_to_id(ours[0][0]), (text, theirs, ours)
    np.testing.assert_allclose([t['score'] for t in theirs], [p for _, p in ours], atol=1e-4)
