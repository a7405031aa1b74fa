"""Config blocks: presets, round trip through dicts, unknown keys and bad values named clearly."""

import copy
import dataclasses

import pytest

from bert_jax import config
from bert_jax.errors import CheckpointError, ConfigError


def test_presets_match_the_issue():
  assert dataclasses.astuple(config.preset('mini'))[1:5] == (256, 4, 4, 1024)
  base = config.preset('base')
  assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (12, 768, 12, 3072)
  large = config.preset('large')
  assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (24, 1024, 16, 4096)
  small, medium = config.preset('small'), config.preset('medium')
  assert (small.num_layers, small.hidden_size, small.num_heads) == (4, 512, 8)
  assert (medium.num_layers, medium.hidden_size, medium.num_heads) == (8, 512, 8)
  assert (base.max_position_embeddings, base.type_vocab_size, base.hidden_dropout) == (512, 2, 0.1)
  assert base.layer_norm_eps == 1e-12


def test_round_trip_and_unknown_keys():
  cfg = config.PretrainConfig()
  assert config.PretrainConfig.from_dict(cfg.to_dict()) == cfg
  bad = cfg.to_dict()
  bad['model']['hiden_size'] = 3
  with pytest.raises(ConfigError, match='unknown config key.*model.hiden_size'):
    config.PretrainConfig.from_dict(bad)


def test_bad_values():
  with pytest.raises(ConfigError, match='not divisible'):
    config.preset('base', num_heads=7)
  with pytest.raises(ConfigError, match='unknown model preset'):
    config.preset('huge')
  with pytest.raises(ConfigError, match='dtype'):
    config.preset('tiny', dtype='float16')


def test_model_diff_ignores_dropout_but_names_shape_changes():
  saved = dataclasses.asdict(config.preset('tiny'))
  assert config.architecture_diffs(saved, config.preset('tiny', hidden_dropout=0.0)) == []
  assert config.architecture_diffs(saved, config.preset('tiny', num_layers=3)) == [
      'num_layers: 2 (checkpoint) vs 3 (config)']


def test_resume_identity_compares_paths_as_the_files_they_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  old = {'data_dir': 'glue/sst2', 'data': {'train_files': 'a.txt,b/*.txt', 'tokenizer': ''}, 'seed': 0}
  same = {'data_dir': str(tmp_path / 'glue' / 'sst2'), 'data': {'train_files': f'./a.txt, {tmp_path}/b/*.txt',
                                                                'tokenizer': ''}, 'seed': 0}
  assert config.config_diffs(old, same, ()) == []
  moved = {**same, 'data_dir': str(tmp_path / 'other'), 'seed': 1}
  assert config.config_diffs(old, moved, ()) == [f"data_dir: 'glue/sst2' -> '{tmp_path}/other'", 'seed: 0 -> 1']


def test_objective_and_masking_values_and_the_schedule():
  for bad, pattern in ((dict(objective='nsp+sop'), 'data.objective must be one of nsp, sop, none'),
                       (dict(masking='ngram'), 'data.masking must be one of token, whole_word, span'),
                       (dict(masked_lm_prob_end=1.0), r'masked_lm_prob_end must lie in \[0, 1\)'),
                       (dict(span_p=0.0), 'span_p must lie in'), (dict(span_max_words=0), 'span_max_words')):
    with pytest.raises(ConfigError, match=pattern):
      config.DataConfig(**bad)
  data = config.DataConfig(masked_lm_prob=0.3, masked_lm_prob_end=0.15)
  assert data.max_predictions_per_seq == 39  # ceil(0.3 * 128): the highest rate's
  assert [data.masked_lm_prob_at(f) for f in (0, 0.5, 1, 2)] == pytest.approx([0.3, 0.225, 0.15, 0.15])
  assert data.eval_masked_lm_prob == 0.15 and config.DataConfig().eval_masked_lm_prob == 0.15
  assert config.DataConfig().masked_lm_prob_at(0.7) == 0.15
  assert config.DataConfig(objective='sop').sentence_pairs and not config.DataConfig(objective='none').sentence_pairs


def test_configs_saved_before_objective_and_masking_resume_as_the_same_run():
  for nsp, wwm, objective, masking in ((True, False, 'nsp', 'token'), (False, True, 'none', 'whole_word')):
    new = config.PretrainConfig(data=config.DataConfig(objective=objective, masking=masking)).to_dict()
    old = copy.deepcopy(new)
    for name in ('objective', 'masking', 'masked_lm_prob_end', 'span_p', 'span_max_words'):
      del old['data'][name]
    old['data'].update(nsp=nsp, whole_word_masking=wwm)
    upgraded = config.upgrade_saved(old)
    assert 'nsp' in old['data'] and 'nsp' not in upgraded['data']  # a new dict; the old one untouched
    config.check_resume(upgraded, new, (), '', 'workdir w')  # no difference
    assert config.PretrainConfig.from_dict({**upgraded, 'data': {**new['data'], **upgraded['data']}}) \
        == config.PretrainConfig.from_dict(new)
    with pytest.raises(CheckpointError, match="data.objective: 'nsp' -> 'sop'" if nsp else 'data.objective'):
      config.check_resume(upgraded, config.PretrainConfig(data=config.DataConfig(objective='sop')).to_dict(), (),
                          '', 'workdir w')
  assert config.upgrade_saved(new) is new


def test_saved_resume_allow_entries_are_renamed_with_their_fields():
  """A workdir whose run allowed a field renamed since still loads, the allowance under the new name."""
  old = config.PretrainConfig().to_dict()
  old['data'] = {k: v for k, v in old['data'].items() if k not in ('objective', 'masking')}
  old['data'].update(nsp=True, whole_word_masking=False)
  old['resume_allow'] = 'num_train_steps, data.nsp'
  upgraded = config.upgrade_saved(old)
  assert upgraded['resume_allow'] == 'num_train_steps,data.objective' and old['resume_allow'].endswith('data.nsp')
  flat = {'task': 'sst2', 'max_steps': 5, 'learning_rate': 1e-4, 'resume_allow': 'max_steps,learning_rate'}
  loaded = config.FinetuneConfig.from_dict(config.upgrade_saved(flat))
  assert loaded.resume_allow == 'num_train_steps,optim.learning_rate' and loaded.num_train_steps == 5
  nested = config.upgrade_saved({'finetune': flat, 'model': {'hidden_size': 32}})
  assert nested['finetune']['resume_allow'] == 'num_train_steps,optim.learning_rate'
  # A name no field has is refused when a run starts, not when a saved config loads.
  assert config.PretrainConfig(resume_allow='num_steps').resume_allow == 'num_steps'
