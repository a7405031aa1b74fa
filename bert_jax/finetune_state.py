"""A fine-tuning model as pure functions: sharded state from pretrained weights, train/predict steps.

The state is the same plain dict as pretraining's ({'step', 'params', 'opt_state', 'rng'}), so
one Checkpointer saves and restores it. Batches come from `packing.make_batch` (packed or
padded rows plus per-example positions); examples with `weights` 0 are padding and count nowhere.
The jitted steps do not depend on the seed, so one model serves every seed of a run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from bert_jax import sharding as shd
from bert_jax.config import ModelConfig
from bert_jax.heads import head_model
from bert_jax.layers import log_attention
from bert_jax.train_state import sharded_state_layout

MODEL_INPUTS = ('input_ids', 'token_type_ids', 'segment_ids', 'position_ids', 'example_row', 'example_offset')


def example_windows(values_bt, batch):
  """Each example's tokens [E, T, ...] cut from per-row values [B, T, ...], and a validity mask [E, T]."""
  width = values_bt.shape[1]
  j_t = jnp.arange(width)
  cols_et = jnp.minimum(batch['example_offset'][:, None] + j_t, width - 1)
  valid_et = j_t < batch['example_length'][:, None]
  return values_bt[batch['example_row'][:, None], cols_et], valid_et


def _mean(x, w):
  return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def task_loss(kind: str, logits, batch) -> jax.Array:
  """The mean loss over real examples (token kind: over labelled tokens), float32.

  classification: cross-entropy on `labels` [B]; regression: squared error on `labels` [B]
  (float); token: cross-entropy on per-row `labels` [B, T] where labels >= 0 (-100 = ignored);
  span: the mean of the start and end cross-entropies on `start_positions`/`end_positions`,
  each a softmax over the example's own tokens.
  """
  w_b = batch['weights'].astype(jnp.float32)
  if kind == 'classification':
    return _mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch['labels']), w_b)
  if kind == 'regression':
    return _mean(jnp.square(logits[:, 0] - batch['labels'].astype(jnp.float32)), w_b)
  if kind == 'token':
    labels_bt = batch['labels']
    w_bt = (labels_bt >= 0).astype(jnp.float32)  # per row; padding is labelled IGNORE
    xent_bt = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels_bt, 0))
    return _mean(xent_bt, w_bt)
  if kind == 'span':
    logits_et2, valid_et = example_windows(logits, batch)
    logits_et2 = jnp.where(valid_et[..., None], logits_et2, -1e9)
    start = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 0], batch['start_positions'])
    end = optax.softmax_cross_entropy_with_integer_labels(logits_et2[..., 1], batch['end_positions'])
    return _mean((start + end) / 2, w_b)
  raise ValueError(f'unknown head kind {kind!r}')


@dataclasses.dataclass
class FinetuneModel:
  """Builds the sharded train state of a head model and holds its jitted steps."""

  cfg: ModelConfig
  kind: str
  num_labels: int
  tx: optax.GradientTransformation
  mesh: Mesh

  def __post_init__(self):
    log_attention(self.cfg)
    abstract = nnx.eval_shape(self._new_model)
    self.graphdef, abs_params, _ = nnx.split(abstract, nnx.Param, ...)
    self.param_shardings, self.state_shardings, self.abstract_state = sharded_state_layout(
        abs_params, jax.eval_shape(self._init_state, None, 0), self.mesh)
    repl = shd.replicated(self.mesh)
    self.rest = jax.jit(lambda: nnx.to_pure_dict(nnx.split(self._new_model(), nnx.Param, ...)[2]),
                        out_shardings=repl)()
    self.train_step = jax.jit(shd.under_mesh(self.mesh, self._train_step), donate_argnums=(0,),
                              out_shardings=(self.state_shardings, repl))
    # Logits come back replicated: every process, not only the one holding a shard, reads them all.
    self.predict_step = jax.jit(shd.under_mesh(self.mesh, self._predict_step), out_shardings=repl)
    self._init_jit = jax.jit(self._init_state, out_shardings=self.state_shardings)

  def _new_model(self, seed=0) -> nnx.Module:
    return head_model(self.kind, self.cfg, self.num_labels, rngs=nnx.Rngs(params=jax.random.key(seed), dropout=jax.random.key(seed + 1)))

  def _init_state(self, encoder_params, seed) -> dict[str, Any]:
    params = nnx.to_pure_dict(nnx.state(self._new_model(seed), nnx.Param))
    if encoder_params is not None:
      params['bert'] = jax.tree.map(lambda new, old: jnp.asarray(old, new.dtype), params['bert'],
                                    encoder_params)
    return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': self.tx.init(params),
            'rng': jax.random.fold_in(jax.random.PRNGKey(seed), 1)}

  def init_state(self, encoder_params, seed: int) -> dict[str, Any]:
    """A fresh state: `encoder_params` (the pretrained 'bert' subtree) plus heads initialised from `seed`."""
    return self._init_jit(encoder_params, jnp.int32(seed))

  def apply(self, params, rest, batch, *, deterministic: bool = True):
    model = nnx.merge(self.graphdef, params, rest)
    return model(*(batch[k] for k in MODEL_INPUTS), deterministic=deterministic)

  def _reseed(self, params, rest, key):
    model = nnx.merge(self.graphdef, params, rest)
    nnx.reseed(model, dropout=key)
    return nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[2])

  def _train_step(self, state, batch, rest):
    rest = self._reseed(state['params'], rest, jax.random.fold_in(state['rng'], state['step']))

    def loss_fn(params):
      return task_loss(self.kind, self.apply(params, rest, batch, deterministic=False), batch)

    loss, grads = jax.value_and_grad(loss_fn)(state['params'])
    updates, opt_state = self.tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads)}
    return {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state, 'rng': state['rng']}, metrics

  def _predict_step(self, params, rest, batch):
    """Logits: [E, num_labels] for sequence heads, per row [B, T, C] for token and span heads."""
    return self.apply(params, rest, batch)

  def global_batch(self, local_batch):
    return shd.global_batch(local_batch, self.mesh)
