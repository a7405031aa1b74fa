"""A sentence-transformers `MultiVectorEncoder` folder: a multivector run's encoder and token projection, exported
with how its token vectors are made (the layout sentence-transformers 6.2 itself saves):

  config.json, model.safetensors, tokenizer files   the encoder (module 0, `Transformer`, at the root), as
                                                    `families.save_hf_checkpoint` writes it
  sentence_bert_config.json                         the Transformer's query_length, document_length and
                                                    query_expansion (strategy 'fixed', not attended, length
                                                    query_length: the [MASK] filling)
  1_Dense/                                          the projection: config.json (no bias, identity activation, on
                                                    token_embeddings) and model.safetensors 'linear.weight' [D, H]
  2_MultiVectorMask/config.json                     the document-side skiplist (string.punctuation, or none)
  3_Normalize/config.json                           L2 normalisation of every token vector
  modules.json, config_sentence_transformers.json   the modules; model_type 'MultiVectorEncoder', the prompts
                                                    ('[Q] ', '[D] ' with markers), similarity 'maxsim', and under
                                                    'bert_jax' the run's settings (ignored by sentence-transformers)
  README.md                                         a model card

`MultiVectorEncoder(folder).encode_query` / `encode_document` then give bert_jax's token vectors
(tests/interop/test_st_multivector.py).
"""

from __future__ import annotations

import json
import os
import string
from typing import Any

import numpy as np
from safetensors import numpy as st_numpy

from bert_jax import files
from bert_jax.config import ModelConfig
from bert_jax.errors import ConfigError
from bert_jax.interop import families
from bert_jax.interop.hf import model_dir
from bert_jax.model.colbert import DOCUMENT_MARKER as DOCUMENT_PROMPT, QUERY_MARKER as QUERY_PROMPT

_PREFIX = 'sentence_transformers.'
_MODULES = (('', 'base.modules.transformer.Transformer'), ('1_Dense', 'base.modules.dense.Dense'),
            ('2_MultiVectorMask', 'multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask'),
            ('3_Normalize', 'base.modules.normalize.Normalize'))
_TOKENS = {'module_input_name': 'token_embeddings', 'module_output_name': 'token_embeddings'}


def save_multi_vector(directory: str, cfg: ModelConfig, params, tokenizer, settings: dict[str, Any], *,
                      overwrite: bool = False, description: str = '') -> None:
  """Writes `directory` as a sentence-transformers MultiVectorEncoder folder (the module doc).

  Args:
    params: the `model.colbert.MultiVectorEncoder`'s ('bert', 'projection').
    settings: the run's token settings (`finetuning.multivector.token_settings`: projection_dim, query_length,
      document_length, markers, skip_punctuation).

  Raises:
    ConfigError: settings that disagree with the projection; CheckpointError: what `families.save_hf_checkpoint`
      refuses (a non-empty directory without `overwrite`).
  """
  kernel = np.asarray(params['projection']['kernel'], np.float32)  # [hidden, dim]
  if kernel.shape != (cfg.hidden_size, settings['projection_dim']):
    raise ConfigError(f'the projection {list(kernel.shape)} is not [hidden size {cfg.hidden_size}, projection_dim '
                      f'{settings["projection_dim"]}]')
  families.save_hf_checkpoint(directory, cfg, {'bert': params['bert']}, tokenizer, overwrite=overwrite)
  for sub, _ in _MODULES[1:]:
    os.makedirs(os.path.join(directory, sub), exist_ok=True)
  query_length = settings['query_length']
  _write_json(os.path.join(directory, 'sentence_bert_config.json'), {
      'transformer_task': 'feature-extraction',
      'modality_config': {'text': {'method': 'forward', 'method_output_name': 'last_hidden_state'}},
      'module_output_name': 'token_embeddings', 'query_length': query_length,
      'document_length': settings['document_length'],
      'query_expansion': {'strategy': 'fixed', 'attend': False, 'token': None, 'length': query_length}})
  _write_json(os.path.join(directory, '1_Dense', model_dir.CONFIG_FILE), {
      'in_features': cfg.hidden_size, 'out_features': int(kernel.shape[1]), 'bias': False,
      'activation_function': 'torch.nn.modules.linear.Identity', **_TOKENS})
  st_numpy.save_file({'linear.weight': np.ascontiguousarray(kernel.T)},
                     os.path.join(directory, '1_Dense', model_dir.WEIGHTS_FILE), metadata={'format': 'pt'})
  _write_json(os.path.join(directory, '2_MultiVectorMask', model_dir.CONFIG_FILE), {
      'skiplist_words': list(string.punctuation) if settings['skip_punctuation'] else [],
      'skiplist_tasks': ['document'], 'keep_only_token_ids': None})
  _write_json(os.path.join(directory, '3_Normalize', model_dir.CONFIG_FILE), dict(_TOKENS))
  prompts = {'query': QUERY_PROMPT, 'document': DOCUMENT_PROMPT} if settings['markers'] else {}
  _write_json(os.path.join(directory, 'config_sentence_transformers.json'), {
      'model_type': 'MultiVectorEncoder', 'prompts': prompts, 'default_prompt_name': None,
      'similarity_fn_name': 'maxsim', 'bert_jax': dict(settings)})
  with files.open(os.path.join(directory, 'README.md'), 'w', encoding='utf-8') as f:
    f.write(_card(settings, description))
  _write_json(os.path.join(directory, 'modules.json'),  # last: a folder without it is not loadable
              [{'idx': i, 'name': str(i), 'path': path, 'type': _PREFIX + kind} for i, (path, kind) in
               enumerate(_MODULES)])


def _write_json(path: str, value: Any) -> None:
  with files.open(path, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=2)


def _card(settings: dict[str, Any], description: str) -> str:
  lines = ['---', 'library_name: sentence-transformers', 'pipeline_tag: feature-extraction',
           'tags: [sentence-transformers, multi-vector, colbert, late-interaction, bert_jax]', '---', '',
           '# A multi-vector (ColBERT) model exported by bert_jax', '']
  if description:
    lines += [description, '']
  lines += [f'- Token vectors: {settings["projection_dim"]} components, L2-normalised; similarity: MaxSim',
            f'- Queries: {settings["query_length"]} tokens (filled with [MASK]); documents: at most '
            f'{settings["document_length"]} tokens' + (', punctuation not scored' if settings['skip_punctuation']
                                                       else ''),
            '- Markers: ' + (f'{QUERY_PROMPT.strip()} / {DOCUMENT_PROMPT.strip()} (the prompts)' if settings['markers']
                             else 'none'),
            '', '```python', 'from sentence_transformers import MultiVectorEncoder',
            'model = MultiVectorEncoder("path/to/this/folder")',
            'scores = model.similarity(model.encode_query(["a question"]), model.encode_document(["a passage"]))',
            '```', '']
  return '\n'.join(lines)
