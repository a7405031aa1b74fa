"""Writes tests/fixtures/hf_pretraining/: a small random BertForPreTraining and transformers' logits.

An offline preparation script (never imported). It builds transformers' BertForPreTraining
(PyTorch, float32, eval mode, eager attention) with a tiny random config, saves it as
safetensors, and stores its masked-LM logits at chosen positions and its NSP logits for a padded
batch, so `tests/interop/families/test_bert.py` checks bert_jax's heads (MLM transform + tied decoder + bias, pooler
+ NSP) against transformers in CI, where PyTorch is not installed.

Needs (not in requirements.txt; CPU torch only):

  python3 -m pip install torch==2.13.0 && python3 -m pip install transformers

Run from the repository root:

  python3 data/make_hf_pretraining_reference.py [--output=tests/fixtures/hf_pretraining]
"""

import argparse
import os

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64, type_vocab_size=2, pad_token_id=0)
BATCH, LENGTHS, SEQ, PREDS = 4, (24, 17, 9, 30), 32, 5


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--output', default=os.path.join(REPO, 'tests', 'fixtures', 'hf_pretraining'))
  args = parser.parse_args()
  torch.manual_seed(0)
  config = transformers.BertConfig(**CONFIG)
  model = transformers.BertForPreTraining(config).eval()
  with torch.no_grad():  # non-zero biases and LayerNorm affine, so every term of the heads is checked
    for name, p in model.named_parameters():
      if name.endswith('bias') or 'LayerNorm' in name:
        p.add_(0.1 * torch.randn_like(p))
  model.config.attn_implementation = 'eager'
  rng = np.random.default_rng(0)
  ids = np.zeros((BATCH, SEQ), np.int64)
  types = np.zeros((BATCH, SEQ), np.int64)
  mask = np.zeros((BATCH, SEQ), np.int64)
  positions = np.zeros((BATCH, PREDS), np.int64)
  for b, n in enumerate(LENGTHS[:BATCH]):
    n = min(n, SEQ)
    ids[b, :n] = rng.integers(5, CONFIG['vocab_size'], n)
    ids[b, 0], ids[b, n - 1] = 2, 3  # [CLS] ... [SEP]
    types[b, n // 2:n] = 1
    mask[b, :n] = 1
    positions[b] = np.sort(rng.choice(np.arange(1, n - 1), PREDS, replace=False))
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types),
                attention_mask=torch.from_numpy(mask))
  mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[:, :, None], axis=1)
  model.save_pretrained(args.output, safe_serialization=True)
  np.savez_compressed(os.path.join(args.output, 'reference.npz'), input_ids=ids.astype(np.int32),
                      token_type_ids=types.astype(np.int32), attention_mask=mask.astype(np.int32),
                      masked_lm_positions=positions.astype(np.int32), mlm_logits=mlm.astype(np.float32),
                      nsp_logits=out.seq_relationship_logits.numpy().astype(np.float32),
                      transformers_version=np.array(transformers.__version__),
                      torch_version=np.array(torch.__version__))
  print(f'wrote {args.output} (transformers {transformers.__version__}, torch {torch.__version__})')


if __name__ == '__main__':
  main()
