"""bert_jax: BERT pretraining and fine-tuning in JAX/Flax (nnx), sharded with jax.sharding.

The public API, importable from the package itself:

  import bert_jax
  cfg = bert_jax.PretrainConfig(model=bert_jax.preset('tiny', vocab_size=1000))
  result = bert_jax.train_and_evaluate(cfg, '/tmp/run')           # pretrain or resume
  model = bert_jax.load_pretrained('/tmp/run')                    # any checkpoint, for inference
  bert_jax.embed(model, [('A sentence.', None)])

The package is laid out as the pipeline, each package on the floors below it (tests/test_layers.py):
`files.py` (the I/O layer), `data/` (corpus -> prepared records -> batches; tables of your files),
`model/` (nnx modules), `runs/` (workdir layout, checkpoints, reporting), `interop/` (Hugging Face families,
loading weights), `train/` (the one trainer: step, loop, the run scaffold), `embedding/` (retrieval features),
`pretraining/` and `finetuning/` (their runs; a fine-tuning task kind is one row of `finetuning.kinds`), and
`launch/` (what starts processes: a sweep's cells, SLURM arrays). Names are imported on first use, so `import bert_jax.data...` in a
data worker process does not start jax.
"""

import importlib

__version__ = '0.1.0'

# name -> the module that defines it
_API = {
    **dict.fromkeys(('DataConfig', 'FinetuneConfig', 'MeshConfig', 'ModelConfig', 'OptimConfig', 'PretrainConfig',
                     'preset'), 'bert_jax.config'),
    **dict.fromkeys(('BertJaxError', 'CheckpointError', 'ConfigError', 'DataError', 'Preempted'), 'bert_jax.errors'),
    **dict.fromkeys(('train_and_evaluate', 'evaluate_checkpoint', 'evaluate_all_checkpoints', 'prepare_data'),
                    'bert_jax.pretraining.pretrain_run'),
    **dict.fromkeys(('finetune', 'evaluate_again'), 'bert_jax.finetuning.finetune_run'),
    **dict.fromkeys(('PretrainedBert', 'load_pretrained'), 'bert_jax.interop.pretrained'),
    **dict.fromkeys(('load_hf_checkpoint', 'save_hf_checkpoint'), 'bert_jax.interop.families'),
    **dict.fromkeys(('embed', 'fill_mask', 'attention_maps', 'attention_details'), 'bert_jax.inference'),
    'BertEncoder': 'bert_jax.model.encoder',
    **dict.fromkeys(('BertForPreTraining', 'BertForSequenceClassification', 'BertForTokenClassification',
                     'BertForQuestionAnswering'), 'bert_jax.model.heads'),
    **dict.fromkeys(('StepModel',), 'bert_jax.train.step'),
    **dict.fromkeys(('fit',), 'bert_jax.train.loop'),
}

__all__ = sorted(_API)


def __getattr__(name: str):
  if name not in _API:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(_API[name]), name)


def __dir__():
  return sorted(list(globals()) + __all__)
