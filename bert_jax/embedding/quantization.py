"""Embeddings at lower precision for a smaller index: sentence-transformers' `quantize_embeddings` conventions, so a
vector database or an index built by either library holds the same bytes.

- int8 / uint8: each dimension cut into 256 buckets between its minimum and maximum over calibration embeddings
  (`ranges` [2, D]), floor((x - min) / step) clipped to 0..255 (int8: minus 128); 4x smaller than float32.
- binary / ubinary: one bit per dimension (x > 0), packed 8 to a byte (numpy's packbits; binary: minus 128 as int8);
  32x smaller. Hamming distance between two packed vectors ranks as the dot product of their ±1 vectors.

`search_vectors` gives float vectors whose dot products rank as each precision scores: the int8 codes themselves,
and ±1 for the bits (dot = D - 2 * Hamming), so the exact streamed search scores every precision.
"""

from __future__ import annotations

import numpy as np

from bert_jax.errors import ConfigError

PRECISIONS = ('float32', 'int8', 'uint8', 'binary', 'ubinary')


def check_precision(precision: str) -> str:
  if precision not in PRECISIONS:
    raise ConfigError(f'precision {precision!r}: choose one of {", ".join(PRECISIONS)}')
  return precision


def calibration_ranges(embeddings: np.ndarray) -> np.ndarray:
  """[2, D]: each dimension's minimum and maximum over `embeddings` (at least 2 rows)."""
  embeddings = np.asarray(embeddings, np.float32)
  if embeddings.ndim != 2 or len(embeddings) < 2:
    raise ConfigError(f'int8 ranges need at least 2 calibration embeddings [n, D], got shape {embeddings.shape}')
  return np.vstack((embeddings.min(axis=0), embeddings.max(axis=0)))


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
  """`embeddings` [n, D] float at `precision` (see the module docstring); int8/uint8 calibrate on `embeddings`
  themselves unless `ranges` are given."""
  check_precision(precision)
  x = np.asarray(embeddings, np.float32)
  if precision == 'float32':
    return x
  if precision.endswith('int8'):
    ranges = (calibration_ranges(x) if ranges is None else np.asarray(ranges)).astype(np.float32, copy=False)
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    codes = np.clip(np.floor((x - starts) / steps), 0, 255)
    return (codes - 128).astype(np.int8) if precision == 'int8' else codes.astype(np.uint8)
  bits = np.packbits(x > 0, axis=-1)
  return (bits - 128).astype(np.int8) if precision == 'binary' else bits


def search_vectors(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
  """Float32 vectors whose dot products rank as `precision` scores (int8 codes as numbers; bits as ±1)."""
  if precision.endswith('binary'):
    return np.where(np.asarray(embeddings) > 0, 1.0, -1.0).astype(np.float32)
  return quantize(embeddings, precision, ranges).astype(np.float32)
