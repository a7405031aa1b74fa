"""bert_jax.interop.families: the registry is the one door. Every family module in `FAMILIES` has the same four
functions, every model_type the import accepts is a row (and every row is accepted), a config read by a family
exports as that family and as no other, and a new family needs one module and one row, nothing else."""

import inspect
import json
import os
import types

import pytest

import bert_jax
from bert_jax import config
from bert_jax.errors import CheckpointError
from bert_jax.interop import families

INTERFACE = ('exports', 'model_config', 'load_checkpoint', 'save_checkpoint')
MODERN = dict(norm_position='pre', position_embedding='rotary', mlp='geglu', type_vocab_size=0)


def _signature(function):
  return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_every_family_module_is_a_row_with_the_same_functions():
  modules = set(families.FAMILIES.values())
  package = os.path.dirname(families.__file__)
  on_disk = {n[:-len('.py')] for n in os.listdir(package) if n.endswith('.py') and n != '__init__.py'}
  assert {m.__name__.rpartition('.')[2] for m in modules} == on_disk  # no family module outside the registry
  for name in INTERFACE:
    signatures = {m.__name__: _signature(getattr(m, name)) for m in modules}
    assert len({repr(s) for s in signatures.values()}) == 1, (name, signatures)
  # The public API is the registry's door.
  assert bert_jax.load_hf_checkpoint is families.load_hf_checkpoint
  assert bert_jax.save_hf_checkpoint is families.save_hf_checkpoint


@pytest.mark.parametrize('model_type', [*families.FAMILIES, None, 'gpt2', 'deberta-v2', 'BERT', 'xlm', ''])
def test_the_import_accepts_exactly_the_rows(model_type, tmp_path):
  """config.json's model_type (absent: 'bert') is read by its row's family, whose config exports as that family;
  a model_type without a row is one line naming the rows."""
  (tmp_path / 'config.json').write_text(json.dumps({} if model_type is None else {'model_type': model_type}))
  if model_type is None or model_type in families.FAMILIES:
    family = families.FAMILIES[model_type or 'bert']
    cfg = families.read_hf_config(str(tmp_path))  # the family's defaults for what config.json leaves out
    assert families.FAMILIES[families.hf_model_type(cfg)] is family
    return
  with pytest.raises(CheckpointError, match=f'model_type={model_type!r}; bert_jax imports the model types') as e:
    families.read_hf_config(str(tmp_path))
  assert '\n' not in str(e.value)
  assert all(row in str(e.value) for row in families.FAMILIES)


@pytest.mark.parametrize('overrides, model_type', [
    ({}, 'bert'), (dict(type_vocab_size=0), 'distilbert'), (dict(embedding_size=32), 'electra'),
    (dict(position_offset=2), 'roberta'), (MODERN, 'modernbert'), (dict(MODERN, use_bias=False), 'modernbert'),
    (dict(embedding_size=32, position_offset=2), None),  # ELECTRA's with RoBERTa's: no family has both
    (dict(norm_position='pre'), None), (dict(MODERN, embedding_size=16), None), (dict(mlp='geglu'), None),
])
def test_a_config_exports_as_one_family_at_most(overrides, model_type):
  cfg = config.preset('tiny', vocab_size=64, **overrides)
  exporting = {families.FAMILIES[t] for t in families.FAMILIES if families.FAMILIES[t].exports(cfg)}
  assert len(exporting) == (model_type is not None)
  if model_type is not None:
    assert families.hf_model_type(cfg) == model_type and exporting == {families.FAMILIES[model_type]}
  else:
    with pytest.raises(CheckpointError, match='exports as bert_jax only'):
      families.hf_model_type(cfg)


def test_a_new_family_is_one_module_and_one_row(monkeypatch, tmp_path):
  """A module with the four functions, registered under a new model_type, is read, loaded, chosen and written
  through the registry's door (no other list names the families)."""
  cfg = config.preset('tiny', vocab_size=64, embedding_size=32, position_offset=2)  # no family exports it today
  calls = []

  def save_checkpoint(directory, cfg, params, tokenizer=None, *, overwrite=False, task=None):
    calls.append(('save', directory, params, tokenizer, overwrite, task))

  toy = types.ModuleType('toy')
  toy.exports = lambda c: c == cfg
  toy.model_config = lambda path, hf: calls.append(('config', path, hf)) or cfg
  toy.load_checkpoint = lambda directory, c: calls.append(('load', directory, c)) or (c, {'bert': {}}, False, False)
  toy.save_checkpoint = save_checkpoint
  monkeypatch.setitem(families.FAMILIES, 'toy', toy)
  directory = str(tmp_path)
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'toy', 'width': 3}))
  assert families.read_hf_config(directory) == cfg
  assert families.load_hf_checkpoint(directory) == (cfg, {'bert': {}}, False, False)
  assert families.hf_model_type(cfg) == 'toy'
  families.save_hf_checkpoint(str(tmp_path / 'out'), cfg, {'bert': {}}, overwrite=True)
  hf = {'model_type': 'toy', 'width': 3}
  path = os.path.join(directory, 'config.json')
  assert calls == [('config', path, hf), ('config', path, hf), ('load', directory, cfg),
                   ('save', str(tmp_path / 'out'), {'bert': {}}, None, True, None)]
