"""Writes tests/fixtures/hf_modernbert/: a small random ModernBertForMaskedLM and transformers' logits.

An offline preparation script (never imported). It builds transformers' ModernBertForMaskedLM
(PyTorch, float32, eval mode) with a tiny random config — 3 layers, global attention in layers 0
and 2, a local window of 8 (4 positions to each side) in layer 1, ModernBERT's RoPE bases (160000
global, 10000 local), no biases — saves it as safetensors, and stores its masked-LM logits at the
real positions of a padded batch longer than the window, so tests/interop/families/test_modernbert.py checks
bert_jax's pre-LN / rotary / GeGLU / local-window encoder and MLM head against transformers in CI,
where PyTorch is not installed. The eager and sdpa attention paths are checked to agree first.

Needs (not in requirements.txt; CPU torch only):

  python3 -m pip install torch==2.13.0 && python3 -m pip install transformers

Run from the repository root:

  python3 data/make_hf_modernbert_reference.py [--output=tests/fixtures/hf_modernbert]
"""

import argparse
import os

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=8,
              global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=0, cls_token_id=2,
              sep_token_id=3, bos_token_id=2, eos_token_id=3)
LENGTHS, SEQ = (32, 21, 9, 27), 32


def build(seed=0, **overrides):
  """A random ModernBertForMaskedLM (eval mode) with LayerNorm weights and biases moved off 1 and 0."""
  torch.manual_seed(seed)
  model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**{**CONFIG, **overrides})).eval()
  with torch.no_grad():  # so that every scale, bias and the decoder bias is checked
    for name, p in model.named_parameters():
      if name.endswith('bias') or 'norm' in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def batch(seed=0):
  """A padded batch: [CLS] ... [SEP] rows of LENGTHS, zeros after."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(LENGTHS), SEQ), np.int64)
  mask = np.zeros((len(LENGTHS), SEQ), np.int64)
  for b, n in enumerate(LENGTHS):
    ids[b, :n] = rng.integers(5, CONFIG['vocab_size'], n)
    ids[b, 0], ids[b, n - 1] = 2, 3
    mask[b, :n] = 1
  return ids, mask


def logits(directory, ids, mask, attn_implementation):
  """The MLM logits [B, T, V] of the saved model, loaded with one attention implementation."""
  model = transformers.ModernBertForMaskedLM.from_pretrained(directory, attn_implementation=attn_implementation)
  assert model.config._attn_implementation == attn_implementation  # pylint: disable=protected-access
  with torch.no_grad():
    return model.eval()(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--output', default=os.path.join(REPO, 'tests', 'fixtures', 'hf_modernbert'))
  args = parser.parse_args()
  build().save_pretrained(args.output, safe_serialization=True)
  os.chmod(os.path.join(args.output, 'model.safetensors'), 0o644)
  ids, mask = batch()
  eager, sdpa = logits(args.output, ids, mask, 'eager'), logits(args.output, ids, mask, 'sdpa')
  real = mask == 1
  diff = float(np.abs(eager[real] - sdpa[real]).max())
  assert diff < 1e-5, diff
  np.savez_compressed(os.path.join(args.output, 'reference.npz'), input_ids=ids.astype(np.int32),
                      attention_mask=mask.astype(np.int32), mlm_logits=eager[real].astype(np.float32),
                      transformers_version=np.array(transformers.__version__),
                      torch_version=np.array(torch.__version__))
  print(f'wrote {args.output} (transformers {transformers.__version__}, torch {torch.__version__}; '
        f'eager vs sdpa {diff:.1e})')


if __name__ == '__main__':
  main()
