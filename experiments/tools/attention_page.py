"""The attention explorer: one self-contained HTML file with head, model and neuron views.

The page (`attention_page.html`, plain JavaScript, no network) gets the numbers of
`inference.attention_details` embedded as base64 little-endian float32, so what it draws is
bit for bit what the model computed (and what attention.npz holds). The model view ranks every
layer × head by the weight from one token to another (the search), thumbnails name their tokens on
hover, and the URL's hash (#view=head&layer=3&head=1&token=10&from=10&to=2) holds what is shown.
"""

from __future__ import annotations

import base64
import json
import os

import numpy as np

from bert_jax import files
from bert_jax.inference import AttentionDetails

_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'attention_page.html')
_PLACEHOLDER = '/*DATA*/'


def _float32_base64(a: np.ndarray) -> str:
  return base64.b64encode(np.ascontiguousarray(a, '<f4').tobytes()).decode('ascii')


def render(details: AttentionDetails, *, model_name: str, text_a: str, text_b: str | None,
           layer: int = 0, head: int = 0) -> str:
  """The explorer page for `details`; it opens on `layer` and `head` (counted from 0)."""
  num_layers, num_heads, _, head_dim = details.query.shape
  data = dict(model=model_name, num_layers=num_layers, num_heads=num_heads, head_dim=head_dim,
              text_a=text_a, text_b=text_b, layer=layer % num_layers, head=head,
              tokens=list(details.tokens), segments=[int(x) for x in details.segment_ids],
              special=[bool(x) for x in details.special],
              probs=_float32_base64(details.probs), query=_float32_base64(details.query),
              key=_float32_base64(details.key), scores=_float32_base64(details.scores))
  # Inside <script>, '</script', '<!--' and '<script' in a text change how the page parses: no '<' (nor
  # '>', '&') is left unescaped; JSON strings may write any character as \uXXXX.
  payload = json.dumps(data, ensure_ascii=False)
  for c in '<>&':
    payload = payload.replace(c, f'\\u{ord(c):04x}')
  with open(_TEMPLATE, encoding='utf-8') as f:
    template = f.read()
  return template.replace(_PLACEHOLDER, payload, 1)


def write(details: AttentionDetails, path: str, **kwargs) -> str:
  """Writes `render(details, **kwargs)` to `path` atomically; returns the path."""
  files.write_text_atomic(path, render(details, **kwargs))
  return path
