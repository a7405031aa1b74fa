"""The pretraining data pipeline, in the order it runs.

  readers      corpus files (WikiText, WikiExtractor, plain, jsonl; gzip/bz2/xz) -> documents
               of sentences, streamed per work unit
  tokenization SentencePiece (trained on a sample, or given) and Hugging Face WordPiece
  nsp          documents -> BERT's sentence pairs (next-sentence prediction)
  prepare      the parallel, resumable build: units -> memory-mappable token shards + manifest
  records      the record layout, the prepared cache's description, random access
  masking      dynamic masked-LM corruption, vectorised over a batch
  packing      first-fit packing of examples into rows (pretraining and fine-tuning)
  loader       prepared records -> masked, resumable per-process batches
  mixture      several prepared corpora sampled by weight (data.train_weights)
"""
