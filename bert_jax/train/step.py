"""A model as pure jitted functions over a plain state dict: the one train step of every run.

The state is {'step', 'params', 'opt_state', 'rng'}, born sharded under
`jax.jit(out_shardings=...)` so no device ever holds more than its shard. What differs between
pretraining and fine-tuning is an `Objective`: how a batch goes through the module and which
summed losses and counts come out. The train step is pure: dropout keys derive from
(rng, step), so a resumed run replays exactly, and gradient accumulation over micro-batches
gives the gradient of the whole batch (each loss term is divided by its count over all of it).
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Any, Callable, Protocol, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import optax

from bert_jax import sharding as shd
from bert_jax.train import gradcache


class Objective(Protocol):
  """What a run trains: its module's call on a batch, summed losses and what it reports.

  Every loss term `t` in `terms` has `sums['<t>_loss_sum']` (summed over the examples, tokens or
  positions it covers) and a count over a batch, `counts(batch)[t]`; the loss is the sum over
  terms of loss_sum / max(count of the whole global batch, 1).
  """

  terms: tuple[str, ...]
  # True: the loss couples the batch's rows (a contrastive loss: every query against every passage), so gradient
  # accumulation runs GradCache over `embed` (per row) and `head` (the whole batch), not a sum of micro-batch losses.
  couples_rows: bool

  def forward(self, module: nnx.Module, batch: dict[str, jax.Array], *, deterministic: bool) -> Any:
    """The module's outputs on `batch` (logits)."""

  def sums(self, outputs: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Summed losses (`<term>_loss_sum`), counts and whatever `summarize` needs, float32."""

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Each loss term's count over `batch` (computable without the model)."""

  def summarize(self, sums: dict[str, Any]) -> dict[str, Any]:
    """Mean losses and metrics from `sums` (jax or numpy values)."""

  def eval_sums(self, outputs: Any, batch: dict[str, jax.Array], aux: Any) -> dict[str, jax.Array]:
    """Held-out sums of a batch (`sums` plus what evaluation reports, e.g. baselines)."""

  def embed(self, module: nnx.Module, batch: dict[str, jax.Array], *, deterministic: bool) -> Any:
    """With `couples_rows`: the per-row half of `forward` (e.g. embeddings); unused otherwise."""

  def head(self, module: nnx.Module, embeddings: Any) -> Any:
    """With `couples_rows`: the whole-batch half of `forward`, from `embed`'s outputs; unused otherwise."""


def _new_rngs(seed) -> nnx.Rngs:
  return nnx.Rngs(params=jax.random.key(seed), dropout=jax.random.key(seed + 1))


def _new_rest(new_module: Callable[[nnx.Rngs], nnx.Module], abstract_rest: nnx.State, sharding) -> dict[str, Any]:
  """The values of a module's non-parameter state (`abstract_rest`: their shapes), as a pure dict.

  Dropout streams only (this project's models): `StepModel.reseed` sets each stream's key and count at every
  training step and evaluation draws none, so their values never matter: key(0)s and zeros, made from the shapes.
  Any other state is the module's own, built under jit (the whole module traced and its program compiled again, at
  every run's start).
  """
  if all(isinstance(v, nnx.RngState) and v.tag == 'dropout' for _, v in nnx.to_flat_state(abstract_rest)):
    shapes = nnx.to_pure_dict(abstract_rest)

    def placeholders():  # under jit: global arrays on a mesh of several processes too
      key = jax.random.key(0)
      return jax.tree.map(lambda a: jnp.broadcast_to(key, a.shape) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key)
                          else jnp.zeros(a.shape, a.dtype), shapes)
    return jax.jit(placeholders, out_shardings=sharding)()
  return jax.jit(lambda: nnx.to_pure_dict(nnx.split(new_module(_new_rngs(0)), nnx.Param, ...)[2]),
                 out_shardings=sharding)()


def opt_state_shardings(tx: optax.GradientTransformation, abstract_params: Any, param_shardings: Any,
                        default) -> Any:
  """Shardings of `tx`'s state for `abstract_params`: moments follow their parameter, the rest `default`.

  optax's own param-tree mapping finds which leaves of the optimizer state mirror the parameters.
  """
  return optax.tree_utils.tree_map_params(tx, lambda _, s: s, jax.eval_shape(tx.init, abstract_params),
                                          param_shardings, transform_non_params=lambda _: default)


# Step models built in this process, most recently used last (`reused`).
_BUILT: collections.OrderedDict[tuple, StepModel] = collections.OrderedDict()
_BUILT_LOCK = threading.Lock()
STEP_MODELS_KEPT = 4  # each holds its steps' executables (code, not parameters)


def reused(build: Callable[..., StepModel]) -> Callable[..., StepModel]:
  """`build` (a pure function of its arguments: configs, sizes, the mesh) memoised on them in this process.

  A second run of the same step model in one process (fine-tuning's seeds share one already; a notebook, evaluations
  of several workdirs, the tests) reuses it, and with it its jitted steps' traces, lowerings and executables: those
  are most of a short run's time, and the persistent compilation cache saves only the compile. A StepModel is never
  changed after it is built, and the same executable gives the same numbers. The key is each argument's repr (a
  frozen dataclass's names every field with its type's spelling: 1 and 1.0 differ) and the mesh itself (its
  devices, in order); the last STEP_MODELS_KEPT are kept.
  """

  @functools.wraps(build)
  def built(*args):
    key = (build.__module__, build.__qualname__) + tuple(a if isinstance(a, Mesh) else repr(a) for a in args)
    with _BUILT_LOCK:
      model = _BUILT.pop(key, None)
      if model is None:
        model = build(*args)
      _BUILT[key] = model
      while len(_BUILT) > STEP_MODELS_KEPT:
        _BUILT.popitem(last=False)
    return model

  return built


class StepModel:
  """Builds sharded train states of a module and holds its jitted train, eval and predict steps.

  Args:
    new_module: rngs -> the nnx module (its parameters initialised from rngs.params).
    objective: the `Objective` trained and evaluated.
    tx: the optimizer.
    mesh: the (data, fsdp, tensor) mesh.
    grad_accum_steps: micro-batches per step (the batch's rows are split every k-th); for an objective whose
      rows are coupled (`couples_rows`: a contrastive loss), GradCache over them.
    schedule: step -> learning rate, reported beside the loss.
    state_rng: seed -> the state's RNG key, from which every step's dropout keys derive.
    rules: the logical-axis rules table (`sharding.rules(mesh_config.rules)`).
  """

  def __init__(self, new_module: Callable[[nnx.Rngs], nnx.Module], objective: Objective,
               tx: optax.GradientTransformation, mesh: Mesh, *, grad_accum_steps: int = 1,
               schedule: Callable[[Any], Any] | None = None,
               state_rng: Callable[[Any], jax.Array] = jax.random.PRNGKey,
               rules: Sequence[tuple[str, Any]] = shd.LOGICAL_AXIS_RULES):
    self.new_module, self.objective, self.tx, self.mesh = new_module, objective, tx, mesh
    self.grad_accum_steps, self.schedule, self.state_rng = grad_accum_steps, schedule, state_rng
    abstract = nnx.eval_shape(lambda: new_module(_new_rngs(0)))
    self.graphdef, abs_params, abs_rest = nnx.split(abstract, nnx.Param, ...)
    repl = shd.replicated(mesh)
    self.param_shardings = nnx.to_pure_dict(shd.state_shardings(abs_params, mesh, rules))
    pure_params = nnx.to_pure_dict(abs_params)
    self.state_shardings = {'step': repl, 'rng': repl, 'params': self.param_shardings,
                            'opt_state': opt_state_shardings(tx, pure_params, self.param_shardings, repl)}
    self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                       jax.eval_shape(self._init_state, None, 0), self.state_shardings)
    # The merged module's other state: its dropout streams. Kept as a pure dict: merging fresh Variables inside
    # jax.grad avoids nnx trace errors.
    self.rest = _new_rest(new_module, abs_rest, repl)
    self.train_step = jax.jit(shd.under_mesh(mesh, self._train_step, rules), donate_argnums=(0,),
                              out_shardings=(self.state_shardings, repl))
    self.eval_step = jax.jit(shd.under_mesh(mesh, self._eval_step, rules), out_shardings=repl)
    # Outputs come back replicated: every process, not only the one holding a shard, reads them all.
    self.predict_step = jax.jit(shd.under_mesh(mesh, self._predict_step, rules), out_shardings=repl)
    self._init_jit = jax.jit(self._init_state, out_shardings=self.state_shardings)
    self._init_opt_jit = jax.jit(tx.init, out_shardings=self.state_shardings['opt_state'])

  # ------------------------------------------------------------------------------------ state

  def _init_state(self, init_params, seed) -> dict[str, Any]:
    params = nnx.to_pure_dict(nnx.state(self.new_module(_new_rngs(seed)), nnx.Param))
    for name, subtree in (init_params or {}).items():  # the loaded parts replace the fresh ones
      params[name] = jax.tree.map(lambda new, old: jnp.asarray(old, new.dtype), params[name], subtree)
    return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': self.tx.init(params),
            'rng': self.state_rng(seed)}

  def init_state(self, init_params: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """A fresh train state, each array created directly in its sharding.

    Args:
      init_params: top-level parameter subtrees (e.g. 'bert', 'mlm') that replace the randomly
        initialised ones, e.g. a published encoder; their shapes must match.
      seed: initialises the rest of the parameters and the state's RNG.
    """
    return self._init_jit(init_params, jnp.int32(seed))

  def init_opt_state(self, params) -> Any:
    """A fresh optimizer state for `params` (a resume that changed the optimizer), born sharded."""
    return self._init_opt_jit(params)

  @property
  def abstract_params(self) -> dict[str, Any]:
    """{'params': the parameters' shapes, dtypes and shardings}: a params-only restore target."""
    return {'params': self.abstract_state['params']}

  def global_batch(self, local_batch):
    return shd.global_batch(local_batch, self.mesh)

  # ------------------------------------------------------------------------------------ steps

  def merge(self, params, rest) -> nnx.Module:
    return nnx.merge(self.graphdef, params, rest)

  def apply(self, params, rest, batch, *, deterministic: bool = True):
    """The objective's forward pass of the module holding `params` (dropout streams from `rest`)."""
    return self.objective.forward(self.merge(params, rest), batch, deterministic=deterministic)

  def reseed(self, params, rest, key):
    """`rest` with every dropout stream reset from `key`.

    Done outside `jax.grad`: nnx refuses to mutate RNG variables from an inner trace.
    """
    module = self.merge(params, rest)
    nnx.reseed(module, dropout=key)
    return nnx.to_pure_dict(nnx.split(module, nnx.Param, ...)[2])

  def _train_step(self, state, batch, rest):
    key = jax.random.fold_in(state['rng'], state['step'])
    objective = self.objective
    # Each term is normalised by its count over the whole global batch, so accumulated
    # micro-batches give exactly the gradient of one big batch. A count is a number of examples or a sum of their
    # weights (class weights may be < 1): only an empty one (0, its loss sum 0 too) is raised, to keep 0 / 0 out.
    counts = {t: jnp.where(c > 0, c, 1.0) for t, c in objective.counts(batch).items()}

    def loss_fn(params, micro, micro_rest):
      outputs = self.apply(params, micro_rest, micro, deterministic=False)
      sums = objective.sums(outputs, micro)
      loss = sums[f'{objective.terms[0]}_loss_sum'] / counts[objective.terms[0]]
      for t in objective.terms[1:]:
        loss = loss + sums[f'{t}_loss_sum'] / counts[t]
      return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    k = self.grad_accum_steps
    if k > 1 and objective.couples_rows:
      # A loss over the whole batch's rows (contrastive: every query against every passage) is not a sum of
      # micro-batch losses: accumulate by GradCache, its exact gradient at one micro-batch's activations.
      (_, sums), grads = self._cached_grads(state['params'], batch, rest, key, k, counts)
    elif k == 1:
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
    metrics = objective.summarize(sums)
    metrics['grad_norm'] = optax.tree.norm(grads)
    if self.schedule is not None:
      metrics['learning_rate'] = jnp.asarray(self.schedule(state['step']), jnp.float32)
    new_state = {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state, 'rng': state['rng']}
    return new_state, metrics

  def _cached_grads(self, params, batch, rest, key, k, counts):
    """((loss, sums), grads) of an objective whose rows are coupled, by `train.gradcache` over k micro-batches
    (every k-th row, as plain accumulation; micro-batch j's dropout from fold_in(key, j) in both passes)."""
    objective = self.objective

    def embed_fn(params, micro, micro_key):
      module = self.merge(params, rest)  # a module of this trace: reseeding it inside the vjp is allowed
      nnx.reseed(module, dropout=micro_key)
      return objective.embed(module, micro, deterministic=False)

    def loss_fn(params, embeddings):
      sums = objective.sums(objective.head(self.merge(params, rest), embeddings), batch)
      loss = sum(sums[f'{t}_loss_sum'] / counts[t] for t in objective.terms)
      return loss, sums

    return gradcache.grad_cache(embed_fn, loss_fn, params, batch, key, micro_batches=k)

  def _eval_step(self, params, rest, batch, aux):
    return self.objective.eval_sums(self.apply(params, rest, batch), batch, aux)

  def _predict_step(self, params, rest, batch):
    return self.apply(params, rest, batch)
