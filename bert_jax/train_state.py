"""The pretraining model as pure functions: sharded state creation, train_step and eval_step.

The train state is a plain dict {'step', 'params', 'opt_state', 'rng'} of arrays, born
sharded under `jax.jit(out_shardings=...)` so no device ever holds more than its shard.
The step is pure: dropout keys derive from (rng, step), so a resumed run replays exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from bert_jax import sharding as shd
from bert_jax.config import ModelConfig
from bert_jax.model import BertForPreTraining
from bert_jax.layers import log_attention

MODEL_INPUTS = ('input_ids', 'token_type_ids', 'attention_mask', 'masked_lm_positions')
# Only in packed batches (data.loader.pack_batch): keyword arguments of BertForPreTraining.
PACKED_INPUTS = {'segment_ids': 'segment_ids_bt', 'cls_positions': 'cls_positions_bk'}


def pretraining_sums(mlm_logits_bpv, nsp_logits_b2, batch) -> dict[str, jax.Array]:
  """Summed losses, correct counts and weights for MLM and NSP (float32).

  Packed batches give NSP logits [R, K, 2] with labels and weights [R, K]: the same sums.
  Without an NSP head (`nsp_logits_b2` None) the NSP sums are zero.
  """
  w_bp = batch['masked_lm_weights'].astype(jnp.float32)
  labels_bp = batch['masked_lm_ids']
  mlm_xent_bp = optax.softmax_cross_entropy_with_integer_labels(mlm_logits_bpv, labels_bp)
  sums = {
      'mlm_loss_sum': jnp.sum(mlm_xent_bp * w_bp),
      'mlm_correct': jnp.sum((jnp.argmax(mlm_logits_bpv, -1) == labels_bp) * w_bp),
      'mlm_count': jnp.sum(w_bp),
  }
  if nsp_logits_b2 is None:
    zero = jnp.zeros((), jnp.float32)
    return {**sums, 'nsp_loss_sum': zero, 'nsp_correct': zero, 'nsp_count': zero}
  w_b = batch['nsp_weights'].astype(jnp.float32)
  nsp_labels_b = batch['next_sentence_labels']
  nsp_xent_b = optax.softmax_cross_entropy_with_integer_labels(nsp_logits_b2, nsp_labels_b)
  return {
      **sums,
      'nsp_loss_sum': jnp.sum(nsp_xent_b * w_b),
      'nsp_correct': jnp.sum((jnp.argmax(nsp_logits_b2, -1) == nsp_labels_b) * w_b),
      'nsp_count': jnp.sum(w_b),
  }


def _match_param_shardings(tree, param_shardings: dict[str, NamedSharding], default: NamedSharding):
  # Optimizer moments mirror the params tree inside optax's state; give them the param's
  # sharding by matching the trailing key path, and replicate everything else (counts).
  def pick(path, _):
    key = jax.tree_util.keystr(path)
    for pkey, s in param_shardings.items():
      if key.endswith(pkey):
        return s
    return default
  return jax.tree_util.tree_map_with_path(pick, tree)


def sharded_state_layout(abs_params: nnx.State, abs_state: dict[str, Any], mesh: Mesh):
  """(param shardings, state shardings, abstract sharded state) of a {'step', 'params', 'opt_state', 'rng'} state.

  Parameters follow their logical axes; optimizer moments follow their parameters; the rest is replicated.
  """
  param_shardings = nnx.to_pure_dict(shd.state_shardings(abs_params, mesh))
  flat = jax.tree_util.tree_flatten_with_path(param_shardings)[0]
  by_path = {jax.tree_util.keystr(p): s for p, s in flat}
  repl = shd.replicated(mesh)
  state_shardings = {'step': repl, 'rng': repl, 'params': param_shardings,
                     'opt_state': _match_param_shardings(abs_state['opt_state'], by_path, repl)}
  abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abs_state,
                                state_shardings)
  return param_shardings, state_shardings, abstract_state


@dataclasses.dataclass
class PretrainingModel:
  """Builds sharded train states and holds the jitted train/eval steps for one config."""

  cfg: ModelConfig
  tx: optax.GradientTransformation
  mesh: Mesh
  seed: int = 0
  grad_accum_steps: int = 1
  schedule: Callable[[Any], Any] | None = None
  nsp: bool = True  # the NSP head and loss (data.nsp)

  def __post_init__(self):
    log_attention(self.cfg)
    abstract = nnx.eval_shape(lambda: self._new_model())
    self.graphdef, abs_params, _ = nnx.split(abstract, nnx.Param, ...)
    self.param_shardings, self.state_shardings, self.abstract_state = sharded_state_layout(
        abs_params, jax.eval_shape(self._init_state), self.mesh)
    repl = shd.replicated(self.mesh)
    # The dropout RNG streams the merged module needs; reseeded every step, so their values
    # never matter. Created under jit (cheap: the unused parameters are dead code).
    # Kept as a pure dict: merging fresh Variables inside jax.grad avoids nnx trace errors.
    self.rest = jax.jit(lambda: nnx.to_pure_dict(nnx.split(self._new_model(), nnx.Param, ...)[2]),
                        out_shardings=repl)()
    batch_sh = shd.batch_sharding(self.mesh)
    self.train_step = jax.jit(shd.under_mesh(self.mesh, self._train_step), donate_argnums=(0,),
                              out_shardings=(self.state_shardings, repl))
    self.eval_step = jax.jit(shd.under_mesh(self.mesh, self._eval_step), out_shardings=repl)
    self._batch_sharding = batch_sh

  def _new_model(self) -> BertForPreTraining:
    return BertForPreTraining(self.cfg, rngs=nnx.Rngs(params=self.seed, dropout=self.seed + 1),
                              nsp_head=self.nsp)

  def _init_state(self, init_params=None) -> dict[str, Any]:
    params = nnx.to_pure_dict(nnx.state(self._new_model(), nnx.Param))
    for name, subtree in (init_params or {}).items():  # the loaded parts replace the fresh ones
      params[name] = jax.tree.map(lambda new, old: jnp.asarray(old, new.dtype), params[name], subtree)
    return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': self.tx.init(params),
            'rng': jax.random.PRNGKey(self.seed)}

  def init_state(self, init_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh train state, each array created directly in its sharding.

    Args:
      init_params: top-level parameter subtrees ('bert', 'mlm', 'nsp') that replace the
        randomly initialised ones, e.g. a published encoder; their shapes must match.
    """
    return jax.jit(self._init_state, out_shardings=self.state_shardings)(init_params)

  def init_opt_state(self, params) -> Any:
    """A fresh optimizer state for `params` (a resume that changed the optimizer), born sharded."""
    return jax.jit(self.tx.init, out_shardings=self.state_shardings['opt_state'])(params)

  def apply(self, params, rest, batch, *, deterministic: bool = True):
    """Runs the model on a batch (dropout streams come from `rest`, see `reseed`)."""
    model = nnx.merge(self.graphdef, params, rest)
    packed = {arg: batch[k] for k, arg in PACKED_INPUTS.items() if k in batch}
    return model(*(batch[k] for k in MODEL_INPUTS), batch.get('position_ids'), **packed,
                 deterministic=deterministic)

  def reseed(self, params, rest, key):
    """`rest` with every dropout stream reset from `key`.

    Done outside `jax.grad`: nnx refuses to mutate RNG variables from an inner trace.
    """
    model = nnx.merge(self.graphdef, params, rest)
    nnx.reseed(model, dropout=key)
    return nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[2])

  def _train_step(self, state, batch, rest):
    key = jax.random.fold_in(state['rng'], state['step'])
    # Normalise by the whole global batch's counts so accumulated micro-batches give
    # exactly the gradient of one big batch.
    n_mlm = jnp.maximum(jnp.sum(batch['masked_lm_weights']), 1.0)
    n_nsp = jnp.maximum(jnp.sum(batch['nsp_weights']), 1.0)

    def loss_fn(params, micro, micro_rest):
      mlm_logits, nsp_logits = self.apply(params, micro_rest, micro, deterministic=False)
      sums = pretraining_sums(mlm_logits, nsp_logits, micro)
      return sums['mlm_loss_sum'] / n_mlm + sums['nsp_loss_sum'] / n_nsp, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    k = self.grad_accum_steps
    if k == 1:
      (_, sums), grads = grad_fn(state['params'], batch, self.reseed(state['params'], rest, key))
    else:
      # [B, ...] -> [k, B/k, ...] taking every k-th row, so each micro-batch stays spread
      # over all batch shards instead of landing on a few devices.
      micro_batches = jax.tree.map(
          lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1), batch)

      def body(carry, inputs):
        i, micro = inputs
        micro_rest = self.reseed(state['params'], rest, jax.random.fold_in(key, i))
        (_, sums), grads = grad_fn(state['params'], micro, micro_rest)
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

      (_, sums_shape), grads_shape = jax.eval_shape(
          grad_fn, state['params'], jax.tree.map(lambda x: x[0], micro_batches), rest)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (grads_shape, sums_shape))
      (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro_batches))

    updates, opt_state = self.tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = summarize(sums)
    metrics['grad_norm'] = optax.tree.norm(grads)
    if self.schedule is not None:
      metrics['learning_rate'] = jnp.asarray(self.schedule(state['step']), jnp.float32)
    new_state = {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state, 'rng': state['rng']}
    return new_state, metrics

  def _eval_step(self, params, rest, batch, baseline_token):
    mlm_logits, nsp_logits = self.apply(params, rest, batch)
    sums = pretraining_sums(mlm_logits, nsp_logits, batch)
    sums['mlm_baseline_correct'] = jnp.sum(
        (batch['masked_lm_ids'] == baseline_token) * batch['masked_lm_weights'])
    sums['num_sequences'] = jnp.sum(jnp.any(batch['attention_mask'] > 0, axis=-1).astype(jnp.float32))
    # Label 1 = random next: with the label counts, the NSP majority-class baseline.
    sums['nsp_label1'] = jnp.sum(batch['next_sentence_labels'] * batch['nsp_weights'].astype(jnp.float32))
    return sums

  def global_batch(self, local_batch):
    return shd.global_batch(local_batch, self.mesh)


def summarize(sums: dict[str, Any]) -> dict[str, Any]:
  """Mean losses and accuracies from summed counts (works on jax or numpy values)."""
  mlm_n = jnp.maximum(sums['mlm_count'], 1.0)
  nsp_n = jnp.maximum(sums['nsp_count'], 1.0)
  out = {
      'mlm_loss': sums['mlm_loss_sum'] / mlm_n,
      'nsp_loss': sums['nsp_loss_sum'] / nsp_n,
      'mlm_accuracy': sums['mlm_correct'] / mlm_n,
      'nsp_accuracy': sums['nsp_correct'] / nsp_n,
  }
  out['loss'] = out['mlm_loss'] + out['nsp_loss']
  if 'mlm_baseline_correct' in sums:
    out['mlm_baseline_accuracy'] = sums['mlm_baseline_correct'] / mlm_n
  if 'nsp_label1' in sums:  # always predicting the held-out majority class
    share = sums['nsp_label1'] / nsp_n
    out['nsp_baseline_accuracy'] = jnp.maximum(share, 1.0 - share)
  return out
