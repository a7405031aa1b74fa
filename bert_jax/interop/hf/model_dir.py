"""What every Hugging Face checkpoint directory shares, for every family (`interop.families`): file names,
reading config.json, safetensors tensors and the shipped tokenizer, preparing an output directory, and our
parameter shapes for a config."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from flax import nnx, traverse_util
import numpy as np
from safetensors import SafetensorError, numpy as st_numpy, safe_open as st_safe_open

from bert_jax.config import ModelConfig
from bert_jax.data import tokenization
from bert_jax import files
from bert_jax.errors import CheckpointError, DataError
from bert_jax.files import check_regular
from bert_jax.interop.hf import tokenizer_json
from bert_jax.model.heads import BertForPreTraining, head_model

CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE = 'config.json', 'model.safetensors', 'model.safetensors.index.json'
SPIECE_FILE = tokenization.HF_SPIECE_FILE  # our SentencePiece model inside an exported directory
# Integer buffers transformers may save beside the weights (not parameters).
BUFFERS = ('embeddings.position_ids', 'embeddings.token_type_ids')

ParamPath = tuple  # a parameter path in the pure dict, e.g. ('bert', 'layers', 0, 'output', 'kernel')


def read_json_config(directory: str) -> dict[str, Any]:
  return files.read_json(os.path.join(directory, CONFIG_FILE), 'checkpoint config', error=CheckpointError,
                         missing=f'{directory} has no {CONFIG_FILE}; it is not a Hugging Face checkpoint directory '
                         '(save one with save_pretrained)')



def weight_files(directory: str) -> list[str]:
  """The safetensors files of the checkpoint (one file or an index's shards), by name; CheckpointError when there
  are none (only a pickle, or no weights at all)."""
  index = os.path.join(directory, INDEX_FILE)
  for name in (WEIGHTS_FILE, INDEX_FILE):
    check_regular(os.path.join(directory, name), 'checkpoint file')
  if files.isfile(os.path.join(directory, WEIGHTS_FILE)):
    names = [WEIGHTS_FILE]
  elif files.isfile(index):
    try:
      with files.open(index, encoding='utf-8') as f:
        names = sorted(set(json.load(f)['weight_map'].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError) as e:
      raise CheckpointError(f'{index} is not a safetensors index ({e!r})') from None
  elif any(files.isfile(os.path.join(directory, f))
           for f in ('pytorch_model.bin', 'pytorch_model.bin.index.json')):
    raise CheckpointError(
        f'{directory} has only pytorch_model.bin (a pickle, which bert_jax never loads); convert '
        f'it once with: python -c "from transformers import {hf_class(directory)} as M; '
        f"M.from_pretrained('{directory}').save_pretrained('{directory}', "
        'safe_serialization=True)"')
  else:
    raise CheckpointError(f'{directory} has no {WEIGHTS_FILE}; download the safetensors weights '
                          'of the checkpoint into it')
  return names


def check_weights(directory: str) -> None:
  """Raises CheckpointError unless every safetensors file of the checkpoint has a header that reads and covers the
  file (not a truncated download, not another format): the headers only, in a moment, before anything is written."""
  for name in weight_files(directory):
    path = os.path.join(directory, name)
    check_regular(path, 'checkpoint file')
    try:
      with st_safe_open(path, framework='numpy') as f:
        f.keys()
    except (SafetensorError, OSError, ValueError, TypeError, KeyError) as e:
      raise CheckpointError(f'{path} cannot be read as safetensors ({type(e).__name__}: {e})') from None


def read_tensors(directory: str) -> dict[str, np.ndarray]:
  """All tensors of the checkpoint (one file or an index of shards), floats as float32."""
  tensors = {}
  for name in weight_files(directory):
    path = os.path.join(directory, name)
    check_regular(path, 'checkpoint file')
    try:
      tensors.update(st_numpy.load_file(path))
    except (SafetensorError, OSError, ValueError, TypeError, KeyError) as e:
      raise CheckpointError(f'{path} cannot be read as safetensors ({type(e).__name__}: {e})') from None
  for name, x in tensors.items():
    if np.issubdtype(x.dtype, np.floating) or x.dtype.name == 'bfloat16':
      # Always a copy (exact from float16/bfloat16): the loaded arrays may map the file itself.
      tensors[name] = np.array(x, dtype=np.float32)
    elif not any(name.endswith(b) for b in BUFFERS):
      raise CheckpointError(f'{directory}: tensor {name} has dtype {x.dtype}, not a float')
  return tensors



def hf_class(directory: str) -> str:
  """The transformers class named in config.json when it is one of the families bert_jax reads, else BertModel."""
  try:
    with files.open(os.path.join(directory, CONFIG_FILE), encoding='utf-8') as f:
      arch = (json.load(f).get('architectures') or ['BertModel'])[0]
  except (OSError, ValueError, AttributeError, IndexError):
    arch = 'BertModel'
  return arch if arch.startswith(('Bert', 'DistilBert', 'Electra', 'ModernBert', 'Roberta', 'XLMRoberta')) else 'BertModel'



def load_hf_tokenizer(directory: str):
  """The tokenizer shipped in a checkpoint directory.

  Args:
    directory: holds spiece.model (a SentencePiece model bert_jax exported; its tokenizer.json is
      only the conversion for transformers), or else tokenizer.json (any model: WordPiece, BPE, Unigram) or
      vocab.txt (WordPiece).

  Returns:
    A SentencePieceTokenizer or FastTokenizer; DataError when there is no vocabulary or a special token lacks.
  """
  if files.isfile(os.path.join(directory, SPIECE_FILE)):
    return tokenization.SentencePieceTokenizer(os.path.join(directory, SPIECE_FILE))
  if any(files.isfile(os.path.join(directory, f)) for f in ('tokenizer.json', 'vocab.txt')):
    return tokenization.WordPieceTokenizer.from_directory(directory)
  raise DataError(f'{directory} has no vocabulary (tokenizer.json, vocab.txt or {SPIECE_FILE}); '
                  'copy the tokenizer files of the checkpoint into it')


@functools.lru_cache(maxsize=8)
def param_shapes(cfg: ModelConfig, num_labels: int = 2) -> dict[ParamPath, tuple]:
  """Our parameter shapes for `cfg` (and a classifier of `num_labels`), from the model code itself
  (no arrays are allocated)."""
  abstract = nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  flat = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  for kind in ('token', 'span'):  # the task heads (a sequence classifier's is a token classifier's)
    abstract = nnx.eval_shape(lambda k=kind: head_model(k, cfg, num_labels, rngs=nnx.Rngs(0)))
    flat.update((path, x) for path, x in traverse_util.flatten_dict(
        nnx.to_pure_dict(nnx.state(abstract, nnx.Param))).items() if path[0] != 'bert')
  return {path: tuple(x.shape) for path, x in flat.items()}



def prepare_directory(directory: str, overwrite: bool) -> None:
  if files.exists(directory) and not files.isdir(directory):
    raise CheckpointError(f'{directory} is a file; pass a directory to export into')
  if files.isdir(directory) and files.listdir(directory):
    if not overwrite:
      raise CheckpointError(f'{directory} is not empty; pass overwrite=True (--overwrite) to '
                            'replace its checkpoint files, or choose a new directory')
    # Stale files from an earlier export (another tokenizer, a shard index) would be read back.
    for name in (CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE, SPIECE_FILE, 'tokenizer.json', 'vocab.txt',
                 'tokenizer_config.json', 'special_tokens_map.json'):
      if files.isfile(os.path.join(directory, name)):
        files.remove(os.path.join(directory, name))
  os.makedirs(directory, exist_ok=True)



def some(names: list[str], limit: int = 6) -> str:
  shown = ', '.join(names[:limit])
  return shown + (f' (and {len(names) - limit} more)' if len(names) > limit else '')


def check_params(flat: dict, expected: set, shapes: dict, model: str) -> None:
  """Refuses, before anything is written, flattened params that are not exactly the `expected` paths at `shapes`.

  Args:
    model: what the params should be, completing 'parameters ... are not part of <model>'.
  """
  unknown = sorted('/'.join(map(str, p)) for p in set(flat) - expected)
  if unknown:
    raise CheckpointError(f'parameters {some(unknown)} are not part of {model}; nothing written')
  missing = sorted('/'.join(map(str, p)) for p in expected - set(flat))
  if missing:
    raise CheckpointError(f'params lack {some(missing)}; nothing written')
  for p in expected:
    if tuple(flat[p].shape) != shapes[p]:
      raise CheckpointError(f'parameter {"/".join(map(str, p))} has shape {tuple(flat[p].shape)} but the config '
                            f'implies {shapes[p]}; nothing written')


@dataclasses.dataclass(frozen=True)
class TokenizerExport:
  """A tokenizer checked for export before anything is written; `write` adds its files beside the weights.

  A Hugging Face tokenizer is written as transformers' own files (its tokenizer.json as read); SentencePiece as spiece.model (read now: an in-place export's
  directory is emptied first) plus the tokenizer.json transformers runs with the same ids (`tokenizer_json`).
  """

  tokenizer: Any
  spiece: bytes | None = None
  fast: Any = None  # the SentencePiece model's conversion for transformers

  @classmethod
  def check(cls, tokenizer, cfg: ModelConfig) -> 'TokenizerExport | None':
    """None for no tokenizer; TypeError, CheckpointError or DataError (not exactly convertible) otherwise."""
    if tokenizer is None:
      return None
    if not isinstance(tokenizer, (tokenization.WordPieceTokenizer, tokenization.SentencePieceTokenizer)):
      raise TypeError(f'tokenizer must be a Hugging Face or SentencePiece tokenizer, got {tokenizer!r}')
    if tokenizer.vocab_size > cfg.vocab_size:
      raise CheckpointError(f'tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the '
                            f'model only {cfg.vocab_size} embeddings; export the matching tokenizer')
    if isinstance(tokenizer, tokenization.WordPieceTokenizer):
      return cls(tokenizer)
    fast = tokenizer_json.sentencepiece_to_tokenizers(tokenizer)  # DataError: not convertible
    tokenizer_json.check_exact(tokenizer, fast)  # DataError: other ids than ours
    with files.open(tokenizer.path, 'rb') as f:
      return cls(tokenizer, f.read(), fast)

  def write(self, directory: str, model_max_length: int, token_types: bool = True) -> None:
    if self.spiece is None:
      self.tokenizer.save(directory, model_max_length=model_max_length)
      return
    with files.open(os.path.join(directory, SPIECE_FILE), 'wb') as f:
      f.write(self.spiece)
    tokenizer_json.save_for_transformers(self.tokenizer, directory, model_max_length=model_max_length, fast=self.fast,
                                         token_types=token_types)
