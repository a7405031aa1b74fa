"""Flax nnx modules only (no logging, optimizer or files).

  layers     Dense, LayerNorm, Embed, Embeddings and the post-LN encoder layer
  attention  self-attention and the choice of its kernel (cuDNN flash, XLA, explicit einsums)
  encoder    BertEncoder (+ pooler), masks, remat and scan over layers
  heads      the pretraining heads (masked LM, NSP) and the fine-tuning heads (BertFor*)
  dropout    hashed dropout masks
  jax_compat a jax fix building modules under a trace needs on jax < 0.11.2
"""

from bert_jax.model import jax_compat  # pylint: disable=unused-import  (applies the fix before any module is built)
