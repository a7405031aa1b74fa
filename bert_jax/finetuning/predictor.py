"""A fine-tuned model on one device, for predictions (`finetuning.predict`, a kind's own): features -> logits in the
evaluation path's batches, one compile per batch shape (packed: a few row counts, `batching.bucket_rows`), progress
with an ETA."""

from __future__ import annotations

import time
from typing import Sequence

from flax import nnx
import jax
import numpy as np

from bert_jax.finetuning import batching
from bert_jax.finetuning.head_objective import Finetuning
from bert_jax.finetuning.tasks.base import Feature
from bert_jax.interop.pretrained import FinetunedBert
from bert_jax.model.heads import SEQUENCE_KINDS
from bert_jax.runs import reporting


class Predictor:
  """A fine-tuned model on one device: features -> logits, in the evaluation path's batches."""

  def __init__(self, tuned: FinetunedBert, batch_size: int = 64, log=reporting.log, pack: bool | None = None):
    self.tuned, self.batch_size, self.log = tuned, batch_size, log
    self.pack = tuned.finetune.pack if pack is None else pack  # the head tasks' field; a kind may pack always
    self.kind = tuned.task['kind']
    graphdef, state = nnx.split(tuned.head_model())
    objective = Finetuning(self.kind)
    self._state, self._compiled = state, set()  # the batch shapes compiled so far
    self._forward = jax.jit(lambda state, batch: objective.forward(nnx.merge(graphdef, state), batch,
                                                                   deterministic=True))

  def logits(self, features: Sequence[Feature]) -> list[np.ndarray]:
    """Per feature, as `predict` gives them (see tasks.base for the shapes). A batch of a new shape compiles the
    model (a line to `log` before, one with its time after); a long run says where it is every 10 s with an ETA
    (`reporting.Ticker`)."""
    out: list[np.ndarray] = []
    ft, size = self.tuned.finetune, self.batch_size
    ticker = reporting.Ticker('predicting', -(-len(features) // size))
    for i in range(0, len(features), size):
      chunk = features[i:i + size]
      host = batching.make_batch(chunk, self.kind, batch_size=size, row_length=ft.max_seq_length, pack=self.pack,
                                 rows_multiple=2, bucket=True)
      shape = host['input_ids'].shape
      compiles = shape not in self._compiled
      if compiles:
        self.log(f'predict: compiling the model for {shape[0]} x {shape[1]} tokens ...')
        t_compile = time.perf_counter()
      logits = np.asarray(jax.device_get(self._forward(self._state, host)))
      if compiles:
        self._compiled.add(shape)
        self.log(f'predict: compiled (and ran that batch) in {time.perf_counter() - t_compile:.1f} s')
      if self.kind in SEQUENCE_KINDS:
        out.extend(logits[:len(chunk)])
      else:
        out.extend(batching.rows_of_examples(logits, host, len(chunk)))
      ticker.tick(i // size + 1)
    return out

  def scores(self, features: Sequence[Feature]) -> np.ndarray:
    """float32 [n]: a one-logit head's logit of each feature (a reranker's score, `logits` flattened)."""
    return np.array([float(np.asarray(l).reshape(-1)[0]) for l in self.logits(features)], np.float32)
