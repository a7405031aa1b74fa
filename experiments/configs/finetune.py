"""Fine-tuning configs: the variant is the task, on all-MiniLM-L6-v2 unless --config.init_checkpoint says otherwise.

  python experiments/finetune.py --config=experiments/configs/finetune.py:sst2 --workdir=/tmp/sst2
  python experiments/finetune.py --config=experiments/configs/finetune.py:conll2003 --workdir=/tmp/conll \
      --config.data_dir=../shared/data/conll2003
  python experiments/finetune.py --config=experiments/configs/finetune.py:squad --workdir=/tmp/squad
  python experiments/finetune.py --config=experiments/configs/finetune.py:classify --workdir=/tmp/reviews \
      --config.train_file=reviews.csv [--config.eval_file=reviews_dev.csv]
  python experiments/finetune.py --config=experiments/configs/finetune.py:retrieval --workdir=/tmp/retrieval \
      --config.train_file=pairs.jsonl --config.beir_dir=my_beir_set [--config.negative_columns=negative]
  python experiments/finetune.py --config=experiments/configs/finetune.py:rerank --workdir=/tmp/rerank \
      --config.train_file=mined_pairs.jsonl [--config.beir_dir=my_beir_set --config.first_stage=EMBEDDING_MODEL]
  python experiments/finetune.py --config=experiments/configs/finetune.py:sparse --workdir=/tmp/sparse \
      --config.train_file=pairs.jsonl --config.beir_dir=my_beir_set [--config.negative_columns=negative]
  python experiments/finetune.py --config=experiments/configs/finetune.py:multivector --workdir=/tmp/colbert \
      --config.train_file=pairs.jsonl --config.beir_dir=my_beir_set

Variants:
  sst2, rte       GLUE, the budgets of the README results table (sst2: 300 steps x 32 on the first 9,600
                  sentences, seq 64, lr 1e-4; rte: 3 epochs x 16 on all 2,490 pairs, seq 128, lr 5e-5)
  sst2_full       all 67k SST-2 sentences, 3 epochs, lr 5e-5
  cola, mrpc, mnli, qnli, qqp, stsb, wnli
                  standard BERT settings (seq 128, batch 32, lr 2e-5, 3 epochs; GLUE files in data_dir)
  conll2003       CoNLL-2003 NER, the README budget: the first 4,000 training sentences, 1 epoch x 32,
                  seq 128, lr 1e-4; dev (testa) and test (testb) entity F1, as conlleval
  conll2003_full  all 14,041 sentences, 3 epochs, lr 5e-5
  squad           SQuAD v1.1: windows of 384 tokens overlapping by doc_stride=128 (Hugging Face run_qa),
                  questions cut to 64 tokens, n-best 20, answers up to 30 tokens; 1 epoch x 16, lr 1e-4.
                  Only dev-v1.1.json is staged, so without --config.train_file (or a train-v1.1.json in
                  data_dir) it is split by article: the first `train_articles` (40) train, the last
                  `eval_articles` (8) evaluate
  classify        your own file (CSV, TSV, JSONL; Parquet with pyarrow) by its columns: --config.train_file,
                  --config.eval_file (without one, eval_fraction=0.1 of the training rows is held out, drawn
                  with split_seed=0), --config.text_column (text, or sentence), --config.text_pair_column
                  (pairs), --config.label_column (label), --config.label_names=a,b,c (their order; default
                  the training file's labels sorted); accuracy and macro F1. Hugging Face Trainer's budget:
                  3 epochs x 32, seq 128, lr 5e-5
  regress         the same for a number per row (label_column holds it): Pearson and Spearman, as STS-B
  multilabel      the same for a set of labels per row (a JSON list, or labels separated by commas; may be
                  empty): a sigmoid per label, micro F1 (main), macro F1 and subset accuracy
  tag             a tag per word: JSONL (or Parquet) rows with lists of words and tags (columns tokens/words and
                  tags unless text_column/label_column say otherwise), or CoNLL column files (word first, tag
                  last, a blank line between sentences); BIO/IOB1 tags score conlleval's entity F1, others
                  token accuracy
  qa              extractive QA: SQuAD-format JSON, or rows (JSONL, CSV, TSV, Parquet) with question, context
                  and answers columns (Hugging Face's {"text": [...], "answer_start": [...]}, or answer texts
                  found in the context); a row without an answer makes it SQuAD v2.0 (no-answer threshold).
                  Without eval_file, eval_fraction of the contexts is held out. Hugging Face run_qa's budget:
                  2 epochs x 16, seq 384, stride 128, lr 3e-5
  retrieval       an embedding model (bi-encoder, docs/embeddings.md): InfoNCE over the global batch on the pairs of
                  --config.train_file (columns query_column, positive_column, any negative_columns; CSV, TSV,
                  JSONL, Parquet), evaluated on the BEIR-layout set in --config.beir_dir (split beir_split):
                  recall@1/@10, MRR@10, nDCG@10 (main) at the full size and each of matryoshka_dims, and with
                  --config.sts_file scored pairs' Spearman (eval_sts_spearman). Mean pooling, temperature 0.05
                  (sentence-transformers' MultipleNegativesRankingLoss), 1 epoch x 64 pairs, passages 128 tokens,
                  queries 32, lr 2e-5. --config.loss=margin_mse or kl distils the teacher scores of
                  --config.score_columns instead (mine.py --scores)
  rerank          a cross-encoder (docs/reranking.md): one logit on [CLS] query [SEP] passage [SEP], packed rows,
                  on the (query, passage, label) rows of --config.train_file (experiments/mine.py --layout=pairs
                  writes them; CSV, TSV, JSONL, Parquet): binary cross-entropy on 0/1 labels, or squared error
                  on teacher scores with --config.score_column=score; or on (query, positive, negatives) groups
                  (mine.py --layout=negatives): a listwise softmax over each group (--config.loss). With
                  --config.beir_dir and --config.first_stage (an embedding model directory, or a TREC run file) it
                  reranks its top rerank_top_k (20): nDCG@10 (main), MRR@10, recall@k before and after; without,
                  eval_fraction of the rows is held out (accuracy; groups: MRR@10). 1 epoch x 32 pairs, seq 256,
                  queries 64 tokens, lr 2e-5
  sparse          a SPLADE encoder (docs/embeddings.md): term weights max-pooled from the masked-LM head (a fresh
                  one tied to the word embeddings for MiniLM), the ranking loss on their dot products (temperature
                  1) plus FLOPS regularisers (query 5e-5, document 3e-5; --config.regularizer_warmup_steps) on the
                  pairs of --config.train_file, evaluated on --config.beir_dir by exact dot products: nDCG@10
                  (main), MRR@10, recall@k, non-zero terms per query and document. 1 epoch x 32 pairs, passages
                  128 tokens, queries 32, lr 2e-5
  multivector     a multi-vector (ColBERT) encoder (docs/embeddings.md): every token's vector projected to
                  projection_dim=128 and normalised, scored by MaxSim; trained on the pairs of --config.train_file
                  (the retrieval columns) by InfoNCE over the global batch (temperature 1), or with --config.loss=kl
                  and --config.score_columns by KL from teacher scores; exact MaxSim on --config.beir_dir: nDCG@10
                  (main), MRR@10, recall@1/@10. Queries '[Q] ' + text filled with [MASK] to 32 tokens, documents
                  '[D] ' + text cut to 180, their punctuation unscored (sentence-transformers' MultiVectorEncoder,
                  PyLate); 1 epoch x 32 pairs, lr 3e-5
  squad_v2        SQuAD v2.0 (train-v2.0.json / dev-v2.0.json in data_dir), 2 epochs, lr 5e-5, the
                  no-answer threshold tuned on dev

init_checkpoint is a Hugging Face directory (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ModernBERT; a
sentence-transformers directory too) or a bert_jax workdir (pretraining, or fine-tuning: its encoder), only ever
read; its architecture is the model's (--print_config shows it). A field of another task's (--config.temperature on
sst2) is an error naming the tasks that read it. The fields are pretraining's where they
mean the same (--config.optim.learning_rate, --config.num_train_steps, --config.model.dtype, ...;
LAMB, b1/b2 and --config.optim.grad_accum_steps too). Several seeds with mean and std:
--config.num_seeds=5. Evaluate a trained workdir again: experiments/evaluate.py --workdir=DIR [--step=N].
"""

import os

import ml_collections

from bert_jax.config import FinetuneConfig
from bert_jax.interop.packaged import packaged_minilm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DATA = os.path.join(os.path.dirname(REPO), 'shared', 'data')
GLUE_TASKS = ('cola', 'mrpc', 'mnli', 'qnli', 'qqp', 'stsb', 'wnli')
# variant: (task, data folder (None: the config's own files), learning rate, fields)
VARIANTS = {
    'sst2': ('sst2', 'sst2', 1e-4, dict(max_seq_length=64, batch_size=32, num_train_epochs=1.0,
                                        max_train_samples=9600)),
    'sst2_full': ('sst2', 'sst2', 5e-5, dict(max_seq_length=64, batch_size=32, num_train_epochs=3.0)),
    'rte': ('rte', 'rte', 5e-5, dict(max_seq_length=128, batch_size=16, num_train_epochs=3.0)),
    **{t: (t, t, 2e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)) for t in GLUE_TASKS},
    'conll2003': ('conll2003', 'conll2003', 1e-4, dict(max_seq_length=128, batch_size=32, num_train_epochs=1.0,
                                                       max_train_samples=4000)),
    'conll2003_full': ('conll2003', 'conll2003', 5e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)),
    'squad': ('squad', 'squad-v1.1', 1e-4, dict(max_seq_length=384, batch_size=16, num_train_epochs=1.0,
                                                eval_batch_size=32)),
    'squad_v2': ('squad_v2', 'squad-v2.0', 5e-5, dict(max_seq_length=384, batch_size=16, num_train_epochs=2.0,
                                                      eval_batch_size=32)),
    # Your own files (no data folder): finetuning.tasks.own_data.
    'classify': ('classify', None, 5e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)),
    'regress': ('regress', None, 5e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)),
    'multilabel': ('multilabel', None, 5e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)),
    'tag': ('tag', None, 5e-5, dict(max_seq_length=128, batch_size=32, num_train_epochs=3.0)),
    'retrieval': ('retrieval', None, 2e-5, dict(max_seq_length=128, max_query_length=32, batch_size=64,
                                                num_train_epochs=1.0, eval_batch_size=64)),
    'rerank': ('rerank', None, 2e-5, dict(max_seq_length=256, max_query_length=64, batch_size=32,
                                          num_train_epochs=1.0, eval_batch_size=64)),
    'sparse': ('sparse', None, 2e-5, dict(max_seq_length=128, max_query_length=32, batch_size=32,
                                          num_train_epochs=1.0, eval_batch_size=32)),
    'multivector': ('multivector', None, 3e-5, dict(query_length=32, document_length=180, batch_size=32,
                                                    num_train_epochs=1.0, eval_batch_size=64)),
    'qa': ('qa', None, 3e-5, dict(max_seq_length=384, batch_size=16, num_train_epochs=2.0, eval_batch_size=32)),
}


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  variant = arg or 'sst2'
  if variant not in VARIANTS:
    raise ValueError(f'unknown finetune config variant {variant!r}: {", ".join(VARIANTS)}')
  task, folder, learning_rate, fields = VARIANTS[variant]
  cfg = FinetuneConfig(task=task, init_checkpoint=packaged_minilm(),
                       **(dict(data_dir=os.path.join(SHARED_DATA, folder)) if folder else {})).to_dict()
  cfg.update(fields)
  cfg['optim']['learning_rate'] = learning_rate
  return ml_collections.ConfigDict(cfg)
