"""The one trainer, shared by pretraining and fine-tuning.

  step         StepModel: a module as pure jitted functions over a plain state dict
  loop         fit(): the training loop (sync points, NaN guard, preemption, logging, checkpoints, eval)
  objective    the Objective protocol: what differs between runs (loss terms, metrics)
  checkpoints  the one Orbax manager (fallback past unusable checkpoints, params-only restores)
  workdir      kinds of workdir, the lock, config history
  preemption   SIGTERM/SIGINT -> save and stop
  reporting    process-0 log lines, JSONL and TensorBoard writers, progress
  curves       curves.png of a run
  optim        AdamW / LAMB with BERT's schedule
"""
