"""Hugging Face's `FlaxBertForPreTraining` train step: the baseline of `benchmark.py --compare_hf`.

transformers 4.57.6 is the last release with Flax models and is no dependency of this project:
install it beside it (`INSTALL_HINT`). It runs unmodified on jax 0.10 / flax 0.12 (no shim
needed). The step mirrors ours: the same BertConfig numbers, synthetic batch, optimizer
(`optim.make_optimizer`, whose decay mask reads HF's 'bias'/'scale' leaf names the same way),
dropout on with a fresh key per step, `dtype` as HF's compute-dtype argument, jit with donation,
same mesh (parameters replicated, batch split) and the same timing (`benchmarking.time_step`).
What differs is HF's model itself: e.g. its MLM head scores all T positions (labels -100 where
nothing is masked), ours only the gathered masked positions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import benchmarking, optim, sharding as shd
from bert_jax.config import MeshConfig, ModelConfig, OptimConfig
from bert_jax.errors import ConfigError

HF_VERSION = '4.57.6'
INSTALL_HINT = (f'python3 -m venv --system-site-packages /tmp/hfvenv && /tmp/hfvenv/bin/pip install '
                f'transformers=={HF_VERSION}, then run the benchmark with /tmp/hfvenv/bin/python3')


def require_transformers():
  """(BertConfig, FlaxBertForPreTraining) from an installed transformers with Flax BERT, or a ConfigError."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    found = 'none'
  else:
    found = transformers.__version__  # any release with Flax BERT will do; 4.57.6 is the one tested
    try:
      from transformers import BertConfig, FlaxBertForPreTraining  # pylint: disable=g-import-not-at-top
      return BertConfig, FlaxBertForPreTraining
    except ImportError:
      pass
  raise ConfigError(f'--compare_hf needs transformers=={HF_VERSION} (the last release with Flax BERT; '
                    f'found {found}): {INSTALL_HINT}')


def hf_bert_config(cfg: ModelConfig):
  """The transformers BertConfig of our ModelConfig (exact GELU, BERT's LayerNorm eps)."""
  bert_config, _ = require_transformers()
  return bert_config(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act='gelu',
      hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
      max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
      initializer_range=cfg.initializer_range, layer_norm_eps=cfg.layer_norm_eps)


def hf_labels(batch: dict[str, np.ndarray]) -> np.ndarray:
  """HF's MLM labels [B, T]: the masked ids at `masked_lm_positions`, -100 (ignored) elsewhere."""
  b, t = batch['input_ids'].shape
  labels_bt = np.full((b, t), -100, np.int32)
  rows, cols = np.nonzero(batch['masked_lm_weights'] > 0)
  labels_bt[rows, batch['masked_lm_positions'][rows, cols]] = batch['masked_lm_ids'][rows, cols]
  return labels_bt


def make_train_step(model, tx: optax.GradientTransformation):
  """A jitted, donating `step(state, batch) -> (state, {'loss'})` for an HF Flax BERT model.

  The loss is HF's pretraining objective: mean cross-entropy over the labelled positions of the
  [B, T, V] logits plus the NSP cross-entropy (float32).
  """
  def loss_fn(params, batch, key):
    out = model(batch['input_ids'], batch['attention_mask'], batch['token_type_ids'], params=params,
                dropout_rng=key, train=True)
    labels_bt = batch['labels']
    mask_bt = (labels_bt != -100).astype(jnp.float32)
    xent_bt = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits.astype(jnp.float32), jnp.where(labels_bt == -100, 0, labels_bt))
    mlm = jnp.sum(xent_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32), batch['next_sentence_labels']).mean()
    return mlm + nsp

  def step(state, batch):
    key = jax.random.fold_in(state['rng'], state['step'])  # fresh dropout key per step
    loss, grads = jax.value_and_grad(loss_fn)(state['params'], batch, key)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    new_state = {'step': state['step'] + 1, 'params': optax.apply_updates(state['params'], updates),
                 'opt_state': opt_state, 'rng': state['rng']}
    return new_state, {'loss': loss}

  return jax.jit(step, donate_argnums=(0,))


def benchmark_hf_train_step(cfg: ModelConfig, batch: dict[str, np.ndarray], *, steps: int = 10,
                            mesh_cfg: MeshConfig = MeshConfig()) -> dict[str, Any]:
  """Times HF's FlaxBertForPreTraining train step on `batch` (a `benchmarking.synthetic_batch`)."""
  _, flax_bert = require_transformers()
  model = flax_bert(hf_bert_config(cfg), dtype=jnp.dtype(cfg.dtype), _do_init=False)
  mesh = shd.make_mesh(mesh_cfg)
  tx = optim.make_optimizer(OptimConfig(), 1000)
  repl = shd.replicated(mesh)
  params = jax.jit(model.init_weights, static_argnums=1, out_shardings=repl)(jax.random.PRNGKey(0), (1, 1))
  state = jax.jit(lambda p: {'step': jnp.zeros((), jnp.int32), 'params': p, 'opt_state': tx.init(p),
                             'rng': jax.random.PRNGKey(1)}, out_shardings=repl)(params)
  del params
  hf_batch = {k: batch[k] for k in ('input_ids', 'attention_mask', 'token_type_ids', 'next_sentence_labels')}
  hf_batch['labels'] = hf_labels(batch)
  timing = benchmarking.time_step(make_train_step(model, tx), state, shd.global_batch(hf_batch, mesh),
                                  steps=steps)
  b, t = batch['input_ids'].shape
  return {'step_time_s': timing.step_time_s, 'tokens_per_s': b * t / timing.step_time_s,
          'compile_s': timing.compile_s, 'loss': timing.loss, 'step_times_s': timing.step_times_s,
          'transformers_version': _transformers_version()}


def _transformers_version() -> str:
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.__version__
