"""The one trainer, shared by pretraining and fine-tuning.

  run          the one run scaffold: validate -> claim + preemption -> checkpointer -> resume / init from a
               source / scratch -> fit -> final metrics; and evaluating a workdir again
  step         StepModel: a module as pure jitted functions over a plain state dict
  loop         fit(): the training loop (sync points, NaN guard, preemption, logging, checkpoints, eval)
  preemption   SIGTERM/SIGINT -> save and stop
  optim        AdamW / LAMB with BERT's schedule

Checkpoints, the workdir and reporting are bert_jax.runs: the tools that only read weights need no trainer.
"""
