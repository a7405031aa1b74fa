"""A sentence-transformers folder: an encoder exported with how its sentence embeddings are made.

The folder is the one sentence-transformers 2–5 writes, which sentence-transformers 6 still loads (all-MiniLM-L6-v2
on the Hub is one):

  config.json, model.safetensors, tokenizer files   the encoder (module 0, `Transformer`, at the root): the Hugging
                                                    Face export of `families.save_hf_checkpoint` (BERT or ModernBERT)
  modules.json                                      the module list: Transformer, Pooling[, Normalize]
  sentence_bert_config.json                         max_seq_length; do_lower_case false (the tokenizer files
                                                    lower-case themselves when the vocabulary is uncased)
  config_sentence_transformers.json                 similarity_fn_name 'cosine', model_type
  1_Pooling/config.json                             the pooling (mean over real tokens, or [CLS])
  2_Normalize/                                      when the embeddings are L2-normalised
  README.md                                         a model card: the pooling, the length, the Matryoshka sizes

sentence-transformers has no field for the Matryoshka sizes a model was trained at (its `truncate_dim` is one
default truncation for every call, not a list): they are in README.md and under the 'bert_jax' key of
config_sentence_transformers.json (which sentence-transformers ignores); `SentenceTransformer(folder,
truncate_dim=d)` gives the size-d embedding.

`read_embedding` reads such a folder's settings back, so `experiments/embed.py` embeds an exported (or any
sentence-transformers) folder the way sentence-transformers does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.model.pooling import POOLINGS
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.interop import families
from bert_jax.interop.hf import model_dir
from bert_jax.runs import reporting

MODULES_FILE, ST_CONFIG_FILE = 'modules.json', 'config_sentence_transformers.json'
SBERT_CONFIG_FILE, POOLING_DIR, NORMALIZE_DIR = 'sentence_bert_config.json', '1_Pooling', '2_Normalize'
CARD_FILE = 'README.md'
# The module class names as sentence-transformers 2–5 write them (6 maps them to its own).
_TYPES = {'transformer': 'sentence_transformers.models.Transformer',
          'pooling': 'sentence_transformers.models.Pooling',
          'normalize': 'sentence_transformers.models.Normalize'}
# Legacy pooling config keys (sentence-transformers <= 5): one is true.
_POOLING_KEYS = {'cls': 'pooling_mode_cls_token', 'mean': 'pooling_mode_mean_tokens'}
_OTHER_POOLING_KEYS = ('pooling_mode_max_tokens', 'pooling_mode_mean_sqrt_len_tokens',
                       'pooling_mode_weightedmean_tokens', 'pooling_mode_lasttoken')


@dataclasses.dataclass(frozen=True)
class Embedding:
  """How an encoder's sentence embeddings are made.

  Attributes:
    pooling: 'mean' (over real tokens, [CLS]/[SEP] included) or 'cls'.
    normalize: L2-normalised.
    max_seq_length: texts are cut to this many tokens ([CLS]/[SEP] included); None: the model's positions.
    matryoshka_dims: the leading sizes the model was trained at besides the full one (largest first), or ().
    origin: where these settings come from, for log lines ('the retrieval run', 'the sentence-transformers folder').
  """

  pooling: str = 'mean'
  normalize: bool = True
  max_seq_length: int | None = None
  matryoshka_dims: tuple[int, ...] = ()
  origin: str = ''

  def given(self, log=reporting.log, **values) -> Embedding:
    """This with the values a user gave (None: not given); a given value that differs from a checkpoint's own
    (`origin`) wins, with one line through `log` saying so."""
    values = {k: v for k, v in values.items() if v is not None}
    if self.origin:
      for name, value in values.items():
        if value != getattr(self, name):
          log(f'{name}={value} as given, not {getattr(self, name)} as {self.origin} has it')
    return dataclasses.replace(self, **values)

  def check(self, cfg: ModelConfig) -> Embedding:
    """This with max_seq_length resolved against `cfg`; ConfigError for a bad pooling, length or size."""
    if self.pooling not in POOLINGS:
      raise ConfigError(f'pooling must be one of {", ".join(POOLINGS)}, got {self.pooling!r}')
    length = cfg.max_position_embeddings if self.max_seq_length is None else self.max_seq_length
    if not 2 <= length <= cfg.max_position_embeddings:
      raise ConfigError(f'max_seq_length={length} must be between 2 and the model\'s max_position_embeddings='
                        f'{cfg.max_position_embeddings}')
    dims = tuple(int(d) for d in self.matryoshka_dims)
    if any(not 0 < d <= cfg.hidden_size for d in dims) or any(a <= b for a, b in zip(dims, dims[1:])):
      raise ConfigError(f'matryoshka dims {list(dims)} must be strictly decreasing sizes in (0, hidden size '
                        f'{cfg.hidden_size}]')
    return dataclasses.replace(self, max_seq_length=length, matryoshka_dims=dims)


def save_sentence_transformers(directory: str, cfg: ModelConfig, params, tokenizer, embedding: Embedding, *,
                               overwrite: bool = False, description: str = '') -> None:
  """Writes `directory` as a sentence-transformers folder of the encoder `params['bert']` (see the module doc).

  Args:
    directory: must be empty or absent unless `overwrite` (then this function's files in it are replaced).
    cfg, params, tokenizer: as `families.save_hf_checkpoint` takes them; only the encoder ('bert') is exported.
    embedding: the pooling, normalisation, length and Matryoshka sizes.
    description: one line for the model card (what the model is, where it comes from).

  Raises:
    ConfigError: bad embedding settings; CheckpointError: a non-empty directory without `overwrite`, or what
      `families.save_hf_checkpoint` refuses. Nothing is written then.
  """
  embedding = embedding.check(cfg)
  families.save_hf_checkpoint(directory, cfg, {'bert': params['bert']}, tokenizer, overwrite=overwrite)
  # Files of an earlier export into this directory that this one does not write (a Normalize it no longer has).
  if files.isdir(os.path.join(directory, NORMALIZE_DIR)) and not embedding.normalize:
    shutil.rmtree(os.path.join(directory, NORMALIZE_DIR))
  modules = [{'idx': 0, 'name': '0', 'path': '', 'type': _TYPES['transformer']},
             {'idx': 1, 'name': '1', 'path': POOLING_DIR, 'type': _TYPES['pooling']}]
  if embedding.normalize:
    modules.append({'idx': 2, 'name': '2', 'path': NORMALIZE_DIR, 'type': _TYPES['normalize']})
    os.makedirs(os.path.join(directory, NORMALIZE_DIR), exist_ok=True)  # Normalize has no files
  os.makedirs(os.path.join(directory, POOLING_DIR), exist_ok=True)
  pooling = {'word_embedding_dimension': cfg.hidden_size,
             **{key: embedding.pooling == mode for mode, key in _POOLING_KEYS.items()},
             **{key: False for key in _OTHER_POOLING_KEYS}, 'include_prompt': True}
  _write_json(os.path.join(directory, POOLING_DIR, model_dir.CONFIG_FILE), pooling)
  _write_json(os.path.join(directory, SBERT_CONFIG_FILE),
              {'max_seq_length': embedding.max_seq_length, 'do_lower_case': False})
  _write_json(os.path.join(directory, ST_CONFIG_FILE),
              {'model_type': 'SentenceTransformer', 'prompts': {}, 'default_prompt_name': None,
               'similarity_fn_name': 'cosine',
               'bert_jax': {'pooling': embedding.pooling, 'normalize': embedding.normalize,
                            'matryoshka_dims': list(embedding.matryoshka_dims)}})
  with files.open(os.path.join(directory, CARD_FILE), 'w', encoding='utf-8') as f:
    f.write(_card(cfg, embedding, description))
  _write_json(os.path.join(directory, MODULES_FILE), modules)  # last: a folder without it is not loadable


# A SparseEncoder folder (sentence-transformers >= 5): the masked-LM model at the root, then SPLADE pooling.
SPLADE_POOLING_DIR = '1_SpladePooling'
_SPARSE_TYPES = {'transformer': 'sentence_transformers.base.modules.transformer.Transformer',
                 'pooling': 'sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling'}


def save_sparse_encoder(directory: str, cfg: ModelConfig, params, tokenizer, *, max_query_length: int,
                        max_seq_length: int, overwrite: bool = False, description: str = '') -> None:
  """Writes `directory` as a folder sentence-transformers' `SparseEncoder` loads: the encoder and its masked-LM head
  (`params['bert']`, `params['mlm']`) as a Hugging Face masked-LM directory at the root (module 0, a `Transformer`
  with transformer_task 'fill-mask'; queries cut to `max_query_length` tokens, documents to `max_seq_length`), then
  `SpladePooling` (max over tokens of log(1 + ReLU(logits)): `model.sparse_encoder.splade_pool`). Dot products.

  Raises:
    ConfigError: a length outside [2, the model's positions]; CheckpointError: no masked-LM head in `params`, a
      non-empty directory without `overwrite`, or what `families.save_hf_checkpoint` refuses.
  """
  if 'mlm' not in params:
    raise CheckpointError('a SparseEncoder export needs the masked-LM head (params["mlm"]): export a sparse run')
  for name, length in (('max_query_length', max_query_length), ('max_seq_length', max_seq_length)):
    if not 2 <= length <= cfg.max_position_embeddings:
      raise ConfigError(f'{name}={length} must be between 2 and the model\'s max_position_embeddings='
                        f'{cfg.max_position_embeddings}')
  families.save_hf_checkpoint(directory, cfg, {'bert': params['bert'], 'mlm': params['mlm']}, tokenizer,
                              overwrite=overwrite)
  os.makedirs(os.path.join(directory, SPLADE_POOLING_DIR), exist_ok=True)
  _write_json(os.path.join(directory, SPLADE_POOLING_DIR, model_dir.CONFIG_FILE),
              {'pooling_strategy': 'max', 'activation_function': 'relu', 'embedding_dimension': cfg.vocab_size})
  _write_json(os.path.join(directory, SBERT_CONFIG_FILE),
              {'transformer_task': 'fill-mask',
               'modality_config': {'text': {'method': 'forward', 'method_output_name': 'logits'}},
               'module_output_name': 'token_embeddings', 'query_length': max_query_length,
               'document_length': max_seq_length, 'max_seq_length': max_seq_length, 'do_lower_case': False})
  _write_json(os.path.join(directory, ST_CONFIG_FILE),
              {'model_type': 'SparseEncoder', 'prompts': {'query': '', 'document': ''}, 'default_prompt_name': None,
               'similarity_fn_name': 'dot', 'bert_jax': {'term_weights': 'splade_max'}})
  with files.open(os.path.join(directory, CARD_FILE), 'w', encoding='utf-8') as f:
    f.write('\n'.join([
        '---', 'library_name: sentence-transformers', 'pipeline_tag: feature-extraction',
        'tags: [sentence-transformers, sparse-encoder, splade, bert_jax]', '---', '',
        '# A SPLADE sparse encoder exported by bert_jax', '', *([description, ''] if description else []),
        f'- One weight per vocabulary term ({cfg.vocab_size}): the max over tokens of log(1 + ReLU(MLM logits))',
        f'- Queries are cut to {max_query_length} tokens, documents to {max_seq_length}; similarity: dot product',
        '', '```python', 'from sentence_transformers import SparseEncoder',
        'model = SparseEncoder("path/to/this/folder")',
        'queries = model.encode_query(["what is SPLADE?"])',
        'documents = model.encode_document(["SPLADE expands texts into weighted vocabulary terms."])',
        'scores = model.similarity(queries, documents)', '```', '']))
  modules = [{'idx': 0, 'name': '0', 'path': '', 'type': _SPARSE_TYPES['transformer']},
             {'idx': 1, 'name': '1', 'path': SPLADE_POOLING_DIR, 'type': _SPARSE_TYPES['pooling']}]
  _write_json(os.path.join(directory, MODULES_FILE), modules)  # last: a folder without it is not loadable


def _write_json(path: str, value: Any) -> None:
  with files.open(path, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=2)


def _card(cfg: ModelConfig, embedding: Embedding, description: str) -> str:
  dims = embedding.matryoshka_dims
  lines = ['---', 'library_name: sentence-transformers', 'pipeline_tag: sentence-similarity',
           'tags: [sentence-transformers, feature-extraction, bert_jax]', '---', '',
           '# A sentence-transformers model exported by bert_jax', '']
  if description:
    lines += [description, '']
  lines += [f'- Embedding size: {cfg.hidden_size}; similarity: cosine',
            f'- Pooling: {"mean over the real tokens" if embedding.pooling == "mean" else "the [CLS] token"}'
            f'{", L2-normalised" if embedding.normalize else ", not normalised"}',
            f'- Texts are cut to {embedding.max_seq_length} tokens']
  if dims:
    lines.append(f'- Matryoshka: trained at the leading sizes {", ".join(map(str, dims))}; '
                 f'`SentenceTransformer(path, truncate_dim={dims[-1]})` gives the size-{dims[-1]} embedding')
  lines += ['', '```python', 'from sentence_transformers import SentenceTransformer',
            'model = SentenceTransformer("path/to/this/folder")',
            'embeddings = model.encode(["A sentence.", "Another one."])', '```', '']
  return '\n'.join(lines)


def read_embedding(directory: str) -> Embedding | None:
  """A sentence-transformers folder's pooling, normalisation and length; None when `directory` is not one.

  Raises:
    CheckpointError: a folder whose files are malformed, or whose pipeline bert_jax cannot reproduce (another
      pooling than mean or [CLS], a module after the pooling other than Normalize, e.g. a Dense projection).
  """
  path = os.path.join(directory, MODULES_FILE)
  if not files.isfile(path):
    return None
  modules = _read_json(path)
  if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
    raise CheckpointError(f'{path} is not a list of modules')
  kinds = [str(m.get('type', '')).rsplit('.', 1)[-1] for m in modules]
  if kinds not in (['Transformer', 'Pooling'], ['Transformer', 'Pooling', 'Normalize']):
    raise CheckpointError(f'{directory} is a sentence-transformers folder with the modules {", ".join(kinds)}; '
                          'bert_jax reproduces Transformer, Pooling and an optional Normalize only')
  pooling_config = _read_json(os.path.join(directory, str(modules[1].get('path', '')), model_dir.CONFIG_FILE))
  if not isinstance(pooling_config, dict):
    raise CheckpointError(f'{directory}: its pooling config is not a JSON object')
  if 'pooling_mode' in pooling_config:  # sentence-transformers 6
    pooling = pooling_config['pooling_mode']
  else:
    # 'pooling_mode_cls_token' -> 'cls', 'pooling_mode_mean_tokens' -> 'mean', ...; several at once: concatenated
    chosen = [k.removeprefix('pooling_mode_').removesuffix('_tokens').removesuffix('_token')
              for k, v in pooling_config.items() if k.startswith('pooling_mode_') and v]
    pooling = chosen[0] if len(chosen) == 1 else '+'.join(chosen)
  if pooling not in POOLINGS:
    raise CheckpointError(f'{directory}: its pooling {pooling!r} is not one bert_jax reproduces (mean or cls)')
  sbert = os.path.join(directory, SBERT_CONFIG_FILE)
  length = _read_json(sbert, dict).get('max_seq_length') if files.isfile(sbert) else None
  extra = _read_json(os.path.join(directory, ST_CONFIG_FILE), dict) if files.isfile(
      os.path.join(directory, ST_CONFIG_FILE)) else {}
  dims = tuple((extra.get('bert_jax') or {}).get('matryoshka_dims') or ())
  return Embedding(pooling=pooling, normalize=len(modules) == 3, max_seq_length=length, matryoshka_dims=dims,
                   origin=f'the sentence-transformers folder {directory}')


def _read_json(path: str, kind: type = object) -> Any:
  return files.read_json(path, 'sentence-transformers file', kind=kind, error=CheckpointError,
                         missing=f'{path} is missing: an incomplete sentence-transformers folder')
