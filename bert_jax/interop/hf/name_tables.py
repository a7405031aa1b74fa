"""What the BERT-layout families' name tables (`families.bert`, `distilbert`, `electra`, `roberta`) are made of:
the conversion rules between our layouts and PyTorch's, one table entry per tensor, and BertModel's encoder table,
which ELECTRA and RoBERTa reuse as it is; and the checks of their config.json that they share.

Our attention kernels keep an explicit heads axis ((D, N, H) for q/k/v, (N, H, D) for the output projection)
where PyTorch stores flat (out, in) Linear weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from bert_jax.errors import CheckpointError
from bert_jax.interop.hf.model_dir import ParamPath


@dataclasses.dataclass(frozen=True)
class Rule:
  """Converts one tensor: `to_hf(ours)` and `from_hf(theirs, our_shape)`; both are exact."""
  to_hf: Callable[[Any], Any]
  from_hf: Callable[[Any, tuple], Any]


SAME = Rule(lambda x: x, lambda x, shape: x)
# nn.Linear stores (out, in); our Dense kernels are (in, out).
LINEAR = Rule(lambda x: x.T, lambda x, shape: x.T)
# q/k/v: ours (D, N, H) <-> theirs (N*H, D); their biases (N*H,) <-> ours (N, H).
QKV_KERNEL = Rule(lambda x: x.reshape(x.shape[0], -1).T, lambda x, shape: x.T.reshape(shape))
QKV_BIAS = Rule(lambda x: x.reshape(-1), lambda x, shape: x.reshape(shape))
# attention output: ours (N, H, D) <-> theirs (D, N*H).
OUT_KERNEL = Rule(lambda x: x.reshape(-1, x.shape[-1]).T, lambda x, shape: x.T.reshape(shape))


@dataclasses.dataclass(frozen=True)
class Entry:
  path: ParamPath
  hf_name: str  # encoder names without the prefix ('bert.', 'electra.', ...) that models with heads add
  rule: Rule
  group: str  # 'bert' (the encoder), 'pooler', or a head: 'mlm', 'nsp', 'classifier', 'qa_outputs', 'discriminator'


def norm(path: ParamPath, hf: str, group: str = 'bert') -> list[Entry]:
  return [Entry(path + ('scale',), hf + '.weight', SAME, group), Entry(path + ('bias',), hf + '.bias', SAME, group)]


def dense(path: ParamPath, hf: str, group: str = 'bert', kernel_rule: Rule = LINEAR,
          bias_rule: Rule = SAME) -> list[Entry]:
  return [Entry(path + ('kernel',), hf + '.weight', kernel_rule, group),
          Entry(path + ('bias',), hf + '.bias', bias_rule, group)]


def attention(ours: ParamPath, q: str, k: str, v: str, out: str) -> list[Entry]:
  """One layer's q/k/v and output projections, under their Hugging Face names."""
  table = []
  for name, hf in (('query', q), ('key', k), ('value', v)):
    table += dense(ours + ('attention', name), hf, kernel_rule=QKV_KERNEL, bias_rule=QKV_BIAS)
  return table + dense(ours + ('attention', 'output'), out, kernel_rule=OUT_KERNEL)


def bert_encoder_table(num_layers: int, token_types: bool = True) -> list[Entry]:
  """BertModel's embeddings and layers (no pooler), as ELECTRA names them too."""
  emb = ('bert', 'embeddings')
  names = ('word_embeddings', 'position_embeddings') + (('token_type_embeddings',) if token_types else ())
  table = [Entry(emb + (name, 'embedding'), f'embeddings.{name}.weight', SAME, 'bert') for name in names]
  table += norm(emb + ('layer_norm',), 'embeddings.LayerNorm')
  for i in range(num_layers):
    ours, theirs = ('bert', 'layers', i), f'encoder.layer.{i}'
    table += attention(ours, *(f'{theirs}.attention.self.{n}' for n in ('query', 'key', 'value')),
                       f'{theirs}.attention.output.dense')
    table += norm(ours + ('attention_norm',), f'{theirs}.attention.output.LayerNorm')
    table += dense(ours + ('intermediate',), f'{theirs}.intermediate.dense')
    table += dense(ours + ('output',), f'{theirs}.output.dense')
    table += norm(ours + ('output_norm',), f'{theirs}.output.LayerNorm')
  return table


def hf_shape(entry: Entry, our_shape: tuple) -> tuple:
  """The Hugging Face shape of a tensor of ours of `our_shape`."""
  # A zero-stride view: the rule's reshape/transpose yield the shape without allocating.
  return entry.rule.to_hf(np.broadcast_to(np.float32(0), our_shape)).shape


def check_bert_layers(path: str, hf: dict[str, Any]) -> None:
  """Refuses a BERT-layout config.json (`hf`, defaults filled in) whose layers bert_jax does not compute alike."""
  if hf['hidden_act'] != 'gelu':
    raise CheckpointError(f"{path}: hidden_act={hf['hidden_act']!r}, but bert_jax implements only "
                          "BERT's exact (erf) GELU, 'gelu'; this model's outputs would not match")
  if hf['position_embedding_type'] != 'absolute':
    raise CheckpointError(f"{path}: position_embedding_type={hf['position_embedding_type']!r}; "
                          "bert_jax implements only 'absolute' (learned) positions")
  if hf.get('is_decoder'):
    raise CheckpointError(f'{path}: is_decoder=true (causal attention); bert_jax is an encoder only')


def check_tied(path: str, hf: dict[str, Any]) -> None:
  """Refuses a config.json (`hf`, defaults filled in) whose MLM decoder is not tied to the word embeddings."""
  if not hf['tie_word_embeddings']:
    raise CheckpointError(f'{path}: tie_word_embeddings=false; bert_jax ties the MLM decoder to the word '
                          'embeddings, so an untied decoder cannot be imported')
