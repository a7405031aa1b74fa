"""Fine-tuning from a checkpoint, every task kind through one job.
  finetune_run    finetune() and evaluate_again(): the library's entry points
  job             FinetuningJob: the starting checkpoint, tokenizer, seeds, resume; the task's part its kind's
  kinds           the task kinds (the one extension point) and their registry, KINDS
  head_tasks      the head tasks' kind: an encoder + task head on a task's features (tasks/)
  retrieval       the retrieval kind: a bi-encoder trained contrastively on pairs, evaluated on a BEIR set
  rerank          the rerank kind: a cross-encoder on labelled or scored pairs or on groups, reranking a first
                  stage's top k
  sparse          the sparse kind: a SPLADE encoder (term weights from the masked-LM head) trained on pairs
  multivector     the multivector kind: a ColBERT-style encoder (token vectors, MaxSim) trained on pairs
  rerank_groups   the reranker's groups (query, positive, negatives): reading, the listwise loss, their ranking
  seeds           each seed's run directory and line, the summary over the seeds
  head_objective  the head models' loss per head kind
  batching        packed/padded rows of features, micro-batches, process blocks
  plan            what a config will train, read without weights (--print_config)
  predict         a fine-tuned head model's predictions on new texts
  tasks/          the head tasks: GLUE, CoNLL-2003, SQuAD, your own files (by columns), tagging, QA
"""
