"""Frozen configuration blocks: model presets, data, optimizer, and the two runs' configs.

One schema: `TrainingConfig` is what every run shares (optimizer, mesh, seed, batch sizes, steps or
epochs, log/eval/checkpoint cadence, checkpoints kept, resume rules, the checkpoint to start from);
`PretrainConfig` adds the model and the corpus, `FinetuneConfig` the task and its data, each task kind's own
fields in its config type (`HeadTaskConfig`, `RetrievalConfig`, `RerankConfig`, `SparseConfig`). The
dataclasses are the one source of truth for defaults and for the facts about each field, kept as
field metadata (`facts`): free on resume, free on a branch, a path, fixed by a checkpoint, an evaluation
setting, shaping the prepared records, covered by the data fingerprint.

Experiment configs (`experiments/configs/*.py`) start from `PretrainConfig().to_dict()` (or
`FinetuneConfig`) as an ml_collections ConfigDict and turn the result back with `from_dict`, which
rejects unknown keys with a message naming them, and names the new field of a renamed one.
Configs saved by earlier versions load through `upgrade_saved`.

The package is one module per concern; every name is importable from `bert_jax.config` itself:

  fields     `_f` (a field with its facts as metadata), `facts` (the fields with a fact), `_block`
  model      `ModelConfig`, the presets (`PRESETS`, `preset`) and its fields' values (`ATTENTION_IMPLS`, ...)
  training   `TrainingConfig` (the shared block; `from_dict`), `OptimConfig`, `MeshConfig`
  pretrain   `PretrainConfig`, `DataConfig` (`OBJECTIVES`, `MASKINGS`), `PhaseConfig`
  phases     the phase plan: a PretrainConfig's phases resolved once (`Plan`, its stages `Phase`, `resolve`)
  finetune   `FinetuneConfig` (the fields every task kind shares; FinetuneConfig(task=...) builds the task's config
             type: `config_type`), `kind_fields` (every type's fields)
  task_configs  each task kind's config type (`HeadTaskConfig`, `RetrievalConfig`, `RerankConfig`, `SparseConfig`,
             `MultiVectorConfig`) and their registry `CONFIG_TYPES`
  migration  configs saved by earlier versions: `upgrade_saved`, `RENAMED`, `REMOVED`
  overrides  FIELD=VALUE text as shell words (`parse_overrides`), set into a ConfigDict by each field's type and
             checked against a config class (`apply_overrides`)
  resume     identity checks: `from_checkpoint`, `architecture_diffs`, `config_diffs`, `check_resume`,
             `check_resume_allow`
"""

from bert_jax.config.fields import _block, facts
from bert_jax.config.finetune import FinetuneConfig, config_type, kind_fields
from bert_jax.config.migration import REMOVED, RENAMED, upgrade_saved
from bert_jax.config.model_config import (ATTENTION_IMPLS, DROPOUT_IMPLS, FUSED_MASKS, LOGITS_BACKWARDS, MLPS,
                                   NORM_POSITIONS, POSITION_EMBEDDINGS, PRESETS, REMAT_POLICIES, ModelConfig, preset)
from bert_jax.config.overrides import apply_overrides, parse_overrides
from bert_jax.config.phases import Phase, Plan
from bert_jax.config.pretrain import MASKINGS, OBJECTIVES, DataConfig, PhaseConfig, PretrainConfig
from bert_jax.config.task_configs import CONFIG_TYPES, HeadTaskConfig, RerankConfig, RetrievalConfig, SparseConfig
from bert_jax.config.task_configs import MultiVectorConfig
from bert_jax.config.resume import (architecture_diffs, check_resume, check_resume_allow, config_diffs,
                                    from_checkpoint)
from bert_jax.config.training import DECAYS, OPTIMIZERS, SCHEDULES, MeshConfig, OptimConfig, TrainingConfig

__all__ = [
    'ATTENTION_IMPLS', 'DECAYS', 'DROPOUT_IMPLS', 'FUSED_MASKS', 'LOGITS_BACKWARDS', 'MASKINGS', 'MLPS',
    'NORM_POSITIONS', 'OBJECTIVES', 'OPTIMIZERS', 'POSITION_EMBEDDINGS', 'PRESETS', 'REMAT_POLICIES', 'REMOVED',
    'RENAMED', 'SCHEDULES',
    'CONFIG_TYPES', 'DataConfig', 'FinetuneConfig', 'HeadTaskConfig', 'RetrievalConfig', 'RerankConfig',
    'SparseConfig', 'MultiVectorConfig', 'MeshConfig', 'ModelConfig', 'OptimConfig', 'Phase', 'PhaseConfig', 'Plan',
    'PretrainConfig', 'TrainingConfig',
    'apply_overrides', 'architecture_diffs', 'check_resume', 'check_resume_allow', 'config_diffs', 'facts',
    'config_type', 'from_checkpoint', 'kind_fields', 'parse_overrides', 'preset', 'upgrade_saved',
    '_block',  # the block a field holds: tests/test_docs.py reads it
]
