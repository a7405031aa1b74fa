"""Fine-tuning: the task objective, batches of variable-length features, the run, and the tasks."""
