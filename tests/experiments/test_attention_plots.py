"""Attention pictures: valid PNG files of sane size, one per layer plus one head; bad shapes refused."""


import numpy as np
import pytest

from bert_jax.errors import ConfigError

from harness.digests import png_size
from tools import attention_plots as plots


def _probs(shape, seed=0):
  p = np.random.default_rng(seed).random(shape).astype(np.float32) ** 4
  return p / p.sum(-1, keepdims=True)


TOKENS = ['[CLS]', '▁the', '▁cat', '▁costs', '▁$', '5', '$', '[SEP]', '▁it', '▁slept', '[SEP]']


def test_grid_and_head_pictures(tmp_path):
  probs = _probs((4, len(TOKENS), len(TOKENS)))
  grid = plots.plot_attention_grid(TOKENS, probs, str(tmp_path / 'grid.png'), 'layer 0')
  head = plots.plot_attention_head(TOKENS, probs[1], str(tmp_path / 'sub' / 'head.png'), 'layer 0, head 1')
  for path in (grid, head):
    width, height = png_size(path)
    assert 300 <= width <= 4000 and 300 <= height <= 4000, (path, width, height)
    assert 5_000 < (tmp_path / path).stat().st_size < 1_000_000


# Long inputs: the grid of 12 heads and one head, each a test (together 4.3-5.1 s, over the fast tier's 5 s).
_LONG = [f'▁w{i}' for i in range(200)]


def test_a_long_input_keeps_the_grid_bounded(tmp_path):
  width, height = png_size(plots.plot_attention_grid(_LONG, _probs((12, 200, 200)), str(tmp_path / 'g.png'), 'long'))
  assert width <= 2000 and height <= 2000


def test_a_long_input_keeps_one_head_bounded(tmp_path):
  # 140 tokens: past the head's size cap (reached at 128), with 280 labels to lay out instead of 400 (3.7 s -> ~2.5 s).
  width, height = png_size(plots.plot_attention_head(_LONG[:140], _probs((140, 140)), str(tmp_path / 'h.png'), 'long'))
  assert width <= 3200 and height <= 3200 and max(width, height) > 2400, (width, height)  # capped, not shrunk


def test_write_attention_pictures(tmp_path):
  probs = _probs((3, 2, len(TOKENS), len(TOKENS)))
  out = plots.write_attention_pictures(TOKENS, probs, str(tmp_path / 'maps'), layer=-1, head=1, title='t')
  assert [p.rsplit('/', 1)[1] for p in out['layers']] == ['layer_0.png', 'layer_1.png', 'layer_2.png']
  assert out['head'].endswith('layer2_head1.png')
  for path in out['layers'] + [out['head']]:
    png_size(path)
  saved = np.load(out['npz'])
  np.testing.assert_array_equal(saved['probs'], probs)
  assert saved['tokens'].tolist() == TOKENS


@pytest.mark.parametrize('layer,head,pattern', [(3, 0, 'layer=3 is out of range'),
                                                 (0, 2, 'head=2 is out of range')])
def test_layer_or_head_out_of_range(tmp_path, layer, head, pattern):
  probs = _probs((3, 2, len(TOKENS), len(TOKENS)))
  with pytest.raises(ConfigError, match=pattern):
    plots.write_attention_pictures(TOKENS, probs, str(tmp_path / 'maps'), layer=layer, head=head)
  assert not (tmp_path / 'maps').exists()


def test_shape_mismatch_is_refused(tmp_path):
  with pytest.raises(ConfigError, match='T = 11 tokens'):
    plots.plot_attention_head(TOKENS, _probs((5, 5)), str(tmp_path / 'h.png'), 'x')
  with pytest.raises(ConfigError, match='heads'):
    plots.plot_attention_grid(TOKENS, _probs((len(TOKENS), len(TOKENS))), str(tmp_path / 'g.png'), 'x')





def _train_records(steps, loss0=8.0, lr=True):
  return [{'step': s, 'time': 0.0, 'loss': loss0 / s, 'mlm_accuracy': s / 100, 'nsp_accuracy': 0.5 + s / 200,
           'tokens_per_s': 1000.0 + s, **({'learning_rate': 1e-3 * s} if lr else {})} for s in steps]


def test_grid_labels_keys_under_each_column_and_queries_beside_the_first(tmp_path, monkeypatch):
  figures = []
  monkeypatch.setattr(plots, '_save', lambda fig, path: figures.append(fig) or path)
  plots.plot_attention_grid(TOKENS, _probs((5, len(TOKENS), len(TOKENS))), str(tmp_path / 'g.png'), 'x')
  axes = figures[0].axes  # 2 rows x 3 columns: heads 0-2, then 3-4 and an empty panel
  keys = [len(ax.get_xticklabels()) for ax in axes[:5]]
  queries = [len(ax.get_yticklabels()) for ax in axes[:5]]
  n = len(TOKENS)
  assert keys == [0, 0, n, n, n] and queries == [n, 0, 0, n, 0], (keys, queries)  # head 2: its column's last
