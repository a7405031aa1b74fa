"""Fine-tuning tasks: readers, featurisers, metrics and prediction writers.

Each task module (glue, conll, squad) turns its files into `Feature`s for the shared loop in
`finetuning.run` and scores the per-feature logits it gets back. See `base.Task`.
"""
