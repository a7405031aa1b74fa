"""A jax fix that building the models needs on jax < 0.11.2, applied once when `bert_jax.model` is imported.

Before jax 0.11.2, asking a tracer for `.sharding` raised an AttributeError whose message carried the tracer's
origin: a walk over the jaxpr traced so far and a pretty-print of up to five of its equations. Flax nnx asks
`getattr(value, 'sharding', None)` twice at every RNG draw (the stream's counter update, in `Variable.set_value`),
so building a module under a trace (`nnx.eval_shape`, a jitted init, the dropout streams of a train step) cost time
quadratic in the model's size (abstract construction before and after this fix: docs/results.md). jax 0.11.2 raises
the same AttributeError without the origin; this is that change. `getattr`/`hasattr` answer as before, and the
message a user sees is unchanged (`Tracer.__getattr__` raises its own for 'sharding' when the property fails).
"""

import jax


def _no_sharding(self):
  raise AttributeError(f"The 'sharding' attribute is not available on {self._error_repr()}.")  # pylint: disable=protected-access


if jax.__version_info__ < (0, 11, 2):
  from jax._src import core  # pylint: disable=g-import-not-at-top  (private: imported only where it is patched)
  if isinstance(core.Tracer.__dict__.get('sharding'), property):
    core.Tracer.sharding = property(_no_sharding)
