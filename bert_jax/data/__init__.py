"""The pretraining data pipeline, in the order it runs.

  readers      corpus files (WikiText, WikiExtractor, plain, jsonl; gzip/bz2/xz) -> documents
               of sentences, streamed per work unit
    corpus_files    which files a corpus spec names (local, gs://); their bytes, decompressed
    corpus_formats  the reader options, format detection, each format's parser
    corpus_pieces   work units: byte ranges of files cut at document boundaries
    sentence_split  the regex sentence splitter
  tokenization SentencePiece (trained on a sample, or given) and Hugging Face WordPiece
  nsp          documents -> BERT's sentence pairs (next-sentence prediction)
  prepare      the parallel, resumable build: units -> memory-mappable token shards + manifest
    cache_identity    the cache's fingerprint (and an earlier version's name for it)
    work_units        a unit and its build in a worker: read, tokenise, pair, write
    worker_pool       the spawned, core-pinned worker processes, progress lines
    tokenizer_sample  the seeded sample a SentencePiece model is trained on
    unit_stats        the units' statistics merged for the manifest
  records      the record layout, the prepared cache's description, random access
  masking      dynamic masked-LM corruption, vectorised over a batch
  packing      first-fit packing of examples into rows (pretraining and fine-tuning)
  loader       prepared records -> masked, resumable per-process batches
  mixture      several prepared corpora sampled by weight (data.train_weights)

Beside the pipeline: tables, the one reader of the CSV/TSV/JSONL/Parquet files a user gives (fine-tuning data, pairs,
BEIR, STS, predict inputs): rows by column, compressed or not, local or remote.
"""
