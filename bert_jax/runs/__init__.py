"""What every run and every tool stands on, below the trainer and the interop code.
  workdir      Workdir: one owner of a workdir's layout (config.json, checkpoints/, seed_<n>/, the
               tokenizer files, final_metrics.json), what kind of directory a path is, the lock
  checkpoints  the one Orbax manager (fallback past unusable checkpoints, params-only restores, the best kept)
  reporting    the library's one log channel (process 0), JSONL and TensorBoard writers, progress
  curves       curves.png of a run, the plot of a workdir's evaluated checkpoints, values per group (seeds)
  interrupts   SIGINT/SIGTERM while jax compiles: acknowledged at once, acted on when it returns; a second stops
  tracking     the run's metrics mirrored to W&B / MLflow when asked
Processes (the sweep's cells, SLURM arrays, the stderr filter) are bert_jax.launch: nothing here starts one.
"""
