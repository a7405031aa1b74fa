"""The Hugging Face format's machinery, shared by every family (`interop.families`): a checkpoint directory's files
(`model_dir`), name tables and their conversion rules (`name_tables`), the BERT-layout families' description
and import/export (`bert_layout`), fine-tuned task heads' classes and config keys (`task_classes`), and SentencePiece
models as a tokenizer.json (`tokenizer_json`)."""
