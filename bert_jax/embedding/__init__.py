"""From encoder to embedding model: pooling, contrastive losses (global in-batch negatives, Matryoshka), cached
in-batch negatives (GradCache), exact streamed retrieval with its metrics, and BEIR's on-disk layout."""
