"""experiments/pretrain.py, recording the training rows this process reads (for test_distributed.py).

Same flags and the same `main` as the real entry point. Each global batch this process builds is
appended to `$BERT_JAX_READS_DIR/reads_<process>.jsonl` as {"k": batch position, "indices":
training records read, "input_ids": the (masked) rows built from them}.
"""

import importlib.util
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'experiments'))  # as when experiments/pretrain.py runs

import jax  # pylint: disable=g-import-not-at-top

from bert_jax.data import loader as input_pipeline  # pylint: disable=g-import-not-at-top
from bert_jax.pretraining import pretrain_run as pretraining  # pylint: disable=g-import-not-at-top

import cli  # pylint: disable=g-import-not-at-top

_batch_at = input_pipeline.PretrainingBatches.batch_at


def _recording_batch_at(self, k):
  # The training dataset is read only here (in the prefetch thread): wrap its reads for this batch.
  dataset, reads = self.maker.dataset, []
  gather = dataset.gather

  def recording_gather(indices, width):
    reads.extend(int(i) for i in indices)
    return gather(indices, width)

  dataset.gather = recording_gather
  try:
    batch = _batch_at(self, k)
  finally:
    del dataset.gather
  path = os.path.join(os.environ['BERT_JAX_READS_DIR'], f'reads_{jax.process_index()}.jsonl')
  with open(path, 'a', encoding='utf-8') as f:
    f.write(json.dumps({'k': k, 'indices': reads, 'input_ids': batch['input_ids'].tolist()}) + '\n')
  return batch


def record_reads(set_attribute=setattr) -> None:
  """Wraps the loader so that each batch's reads are recorded (into $BERT_JAX_READS_DIR); a test running the
  reference in its own process passes its monkeypatch's setattr, undone after the test."""
  set_attribute(input_pipeline.PretrainingBatches, 'batch_at', _recording_batch_at)
  # Loader worker processes would build batches with their own copy of the BatchMaker, never
  # calling batch_at here: keep the loader thread (what data.loader_workers=-1 gives on CPU anyway).
  set_attribute(pretraining, 'loader_workers', lambda cfg, mesh=None: 0)


if __name__ == '__main__':
  record_reads()
  spec = importlib.util.spec_from_file_location('pretrain', os.path.join(REPO, 'experiments', 'pretrain.py'))
  pretrain = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(pretrain)  # defines --config and --workdir
  cli.run(pretrain.main)
