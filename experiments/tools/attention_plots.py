"""PNG pictures of attention probabilities (matplotlib, headless): a grid of a layer's heads, one head.

Figures are built with `matplotlib.figure.Figure` and rendered by the Agg canvas directly (no
pyplot, so no display is needed), written atomically by `bert_jax.runs.curves.save_png`.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from matplotlib.figure import Figure
import numpy as np

from bert_jax.errors import ConfigError
from bert_jax.runs.curves import save_png as _save

_CMAP = 'viridis'
# Token labels are drawn on the grid only up to this many tokens; beyond it they overlap.
_GRID_LABEL_MAX_TOKENS = 40
_DPI = 100


def _check(tokens: Sequence[str], probs: np.ndarray, ndim: int, what: str) -> np.ndarray:
  probs = np.asarray(probs, np.float32)
  if probs.ndim != ndim or probs.shape[-1] != len(tokens) or probs.shape[-2] != len(tokens):
    raise ConfigError(f'{what} needs probabilities of shape {"[heads, " if ndim == 3 else "["}T, T] with '
                      f'T = {len(tokens)} tokens, got {probs.shape}')
  return probs


def _label_axes(ax, tokens: Sequence[str], fontsize: float, keys: bool = True, queries: bool = True) -> None:
  """Every token as a tick label: along the keys (x) and/or the queries (y); no ticks on an axis left bare."""
  ticks = np.arange(len(tokens))
  tokens = [t.replace('$', r'\$') for t in tokens]  # a '$' pair would start mathtext
  if keys:
    ax.set_xticks(ticks, labels=tokens, rotation=90, fontsize=fontsize)
  else:
    ax.set_xticks([])
  if queries:
    ax.set_yticks(ticks, labels=tokens, fontsize=fontsize)
  else:
    ax.set_yticks([])


def plot_attention_grid(tokens: Sequence[str], probs_ntt: np.ndarray, path: str, title: str) -> str:
  """One layer: a grid of heads, queries down the rows and keys along the columns.

  Args:
    tokens: the T tokens ([CLS]/[SEP] included).
    probs_ntt: [heads, T, T] attention probabilities (rows sum to 1).
    path: the PNG to write.
    title: figure title.

  Returns:
    `path`.
  """
  probs_ntt = _check(tokens, probs_ntt, 3, 'plot_attention_grid')
  heads, num_tokens = probs_ntt.shape[0], len(tokens)
  cols = math.ceil(math.sqrt(heads))
  rows = math.ceil(heads / cols)
  labels = num_tokens <= _GRID_LABEL_MAX_TOKENS
  panel = 3.2 if labels else 2.4  # inches per head; room for the tick labels when drawn
  fig = Figure(figsize=(cols * panel, rows * panel + 0.6), dpi=_DPI, layout='constrained')
  fig.suptitle(title)
  axes = fig.subplots(rows, cols, squeeze=False)
  for n, ax in enumerate(axes.flat):
    if n >= heads:
      ax.set_axis_off()
      continue
    ax.imshow(probs_ntt[n], cmap=_CMAP, vmin=0.0, vmax=1.0, interpolation='nearest')
    ax.set_title(f'head {n}', fontsize=9)
    # Every head has the same tokens: the keys are labelled under the bottom panel of each column and the queries
    # beside the first column (as shared axes are), which also draws the grid in a third of the time.
    bottom = n + cols >= heads
    _label_axes(ax, tokens, max(3.0, min(7.0, 160 / num_tokens)), keys=labels and bottom,
                queries=labels and n % cols == 0)
  return _save(fig, path)


def plot_attention_head(tokens: Sequence[str], probs_tt: np.ndarray, path: str, title: str) -> str:
  """One head, large, every token labelled on both axes.

  Args:
    tokens: the T tokens.
    probs_tt: [T, T] attention probabilities; row t is query token t's distribution over keys.
    path: the PNG to write.
    title: figure title.

  Returns:
    `path`.
  """
  probs_tt = _check(tokens, probs_tt, 2, 'plot_attention_head')
  # ~0.22 inch per token keeps 8-point labels apart; the size is capped for very long inputs.
  side = min(max(6.0, 0.22 * len(tokens) + 2.0), 30.0)
  fig = Figure(figsize=(side + 1.2, side), dpi=_DPI, layout='constrained')
  ax = fig.subplots()
  image = ax.imshow(probs_tt, cmap=_CMAP, vmin=0.0, vmax=1.0, interpolation='nearest')
  _label_axes(ax, tokens, fontsize=8)
  ax.set_xlabel('key')
  ax.set_ylabel('query')
  ax.set_title(title)
  fig.colorbar(image, ax=ax, shrink=0.8, label='attention probability')
  return _save(fig, path)


def check_layer_head(layer: int, head: int, num_layers: int, num_heads: int) -> int:
  """Returns `layer` as a non-negative index; ConfigError if layer or head is out of range."""
  if not -num_layers <= layer < num_layers:
    raise ConfigError(f'layer={layer} is out of range: the model has {num_layers} layers '
                      f'(0..{num_layers - 1})')
  if not 0 <= head < num_heads:
    raise ConfigError(f'head={head} is out of range: the model has {num_heads} heads (0..{num_heads - 1})')
  return layer % num_layers


def write_attention_pictures(tokens: Sequence[str], probs_lntt: np.ndarray, out_dir: str, *, layer: int,
                             head: int, title: str = '') -> dict[str, object]:
  """Writes attention.npz, layer_<l>.png for every layer and layer<L>_head<H>.png into out_dir.

  Args:
    tokens: the T tokens.
    probs_lntt: [layers, heads, T, T] attention probabilities.
    out_dir: created if missing.
    layer: the layer of the single-head picture (0-based; negative counts from the end).
    head: the head of the single-head picture (0-based).
    title: prefix of every figure title (e.g. the checkpoint name).

  Returns:
    {'npz': path, 'layers': [png per layer], 'head': png}.

  Raises:
    ConfigError: layer or head out of range.
  """
  probs_lntt = np.asarray(probs_lntt, np.float32)
  num_layers, num_heads = probs_lntt.shape[:2]
  layer = check_layer_head(layer, head, num_layers, num_heads)
  os.makedirs(out_dir, exist_ok=True)
  prefix = f'{title}: ' if title else ''
  npz = os.path.join(out_dir, 'attention.npz')
  np.savez(npz, probs=probs_lntt, tokens=np.array(tokens))
  layer_pngs = [plot_attention_grid(tokens, probs_lntt[l], os.path.join(out_dir, f'layer_{l}.png'),
                                    f'{prefix}layer {l}') for l in range(num_layers)]
  head_png = plot_attention_head(tokens, probs_lntt[layer, head],
                                 os.path.join(out_dir, f'layer{layer}_head{head}.png'),
                                 f'{prefix}layer {layer}, head {head}')
  return {'npz': npz, 'layers': layer_pngs, 'head': head_png}
