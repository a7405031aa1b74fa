"""bert_jax: BERT pretraining and fine-tuning in JAX/Flax (nnx), sharded with jax.sharding."""

__version__ = '0.1.0'
