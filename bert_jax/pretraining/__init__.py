"""Pretraining: the MLM (+ NSP) objective, continuing from published weights, and the run."""
