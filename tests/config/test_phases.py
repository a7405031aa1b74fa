"""The phase plan (bert_jax/config/phases.py): a config's phases resolved once into stages, `Plan.at` and
`Plan.before`, batch-size ramps, the learning-rate segments and the prefix a branch must share. Fast: configs only."""

import dataclasses

import pytest

from bert_jax.config import PretrainConfig, fields, phases


def _run(**phase_fields) -> PretrainConfig:
  """A three-phase run of 4 + 4 + 4 steps: stable at 32 tokens, an extension to 64 with a larger RoPE theta, a
  WSD decay; `phase_fields` (phase name -> fields) change its phases."""
  plan = dict(stable=dict(order=1, steps=4, max_seq_length=32),
              extend=dict(order=2, steps=4, max_seq_length=64, rope_theta=160_000.0),
              decay=dict(order=3, steps=4, lr='decay'))
  for name, fields in phase_fields.items():
    plan[name] = {**plan.get(name, {}), **fields}
  return PretrainConfig.from_dict(dict(num_train_steps=0, batch_size=16, phases=plan,
                                       optim=dict(schedule='wsd', learning_rate=1e-3)))


def test_the_plan_is_resolved_once_and_immutable():
  cfg = _run()
  assert cfg.plan is cfg.plan  # one resolution per config, cached beside its fields
  assert 'plan' not in {f.name for f in dataclasses.fields(cfg)}  # no field: equality and to_dict ignore it
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.plan.stages[0].start = 1
  assert isinstance(cfg.plan.stages, tuple)
  assert dataclasses.replace(cfg, seed=1).plan is not cfg.plan  # another config, its own plan


def test_stages_hold_their_steps_lengths_and_theta():
  plan = _run().plan
  assert [(p.name, p.start, p.end) for p in plan.stages] == [('stable', 0, 4), ('extend', 4, 8), ('decay', 8, 12)]
  assert [p.cfg.data.max_seq_length for p in plan.stages] == [32, 64, 64]
  assert [p.cfg.model.rope_theta for p in plan.stages] == [10_000.0, 160_000.0, 160_000.0]
  assert [p.first_example for p in plan.stages] == [0, 64, 128]
  assert plan.phased and plan.total_steps == 12 and [p.decay for p in plan.stages] == [False, False, True]
  assert plan.describe().splitlines()[1] == 'phase 2/3 extend: steps 4-8, 16 x 64 tokens, 4,096 row tokens'


def test_at_and_before_name_the_stage_of_a_step():
  plan = _run().plan
  assert [plan.at(s).name for s in (0, 3, 4, 7, 8, 11, 12, 99)] == ['stable'] * 2 + ['extend'] * 2 + ['decay'] * 4
  assert [plan.before(s).name for s in (0, 1, 4, 5, 8, 9, 12)] == ['stable'] * 3 + ['extend'] * 2 + ['decay'] * 2


def test_a_run_without_phases_is_one_stage():
  plan = PretrainConfig(num_train_steps=7).plan
  (only,) = plan.stages
  assert (only.name, only.start, only.end, only.schedule_steps, plan.total_steps) == ('train', 0, 7, 7, 7)
  assert not plan.phased and plan.decay_start is None and plan.lr_levels is None
  assert plan.at(0) is only and plan.at(100) is only and plan.before(0) is only


def test_a_ramp_is_stages_of_one_phase():
  plan = _run(stable=dict(ramp_batch_size=4, ramp_tokens=2 * 4 * 32)).plan
  ramp = plan.stages[:3]
  assert [(p.start, p.end, p.cfg.batch_size, p.ramp) for p in ramp] == [(0, 1, 4, True), (1, 2, 8, True),
                                                                        (2, 4, 16, False)]
  assert [p.first_example for p in ramp] == [0, 4, 12] and plan.stages[3].first_example == 12 + 2 * 16
  assert {(p.name, p.index, p.schedule_start, p.schedule_steps) for p in ramp} == {('stable', 1, 0, 4)}
  assert [p.label for p in ramp] == ['phase 1/3 stable (batch 4)', 'phase 1/3 stable (batch 8)', 'phase 1/3 stable']
  assert plan.at(1) is ramp[1] and plan.before(2) is ramp[1] and plan.total_steps == 12


def test_the_learning_rate_segments_come_from_the_plan():
  assert _run().plan.decay_start == 8 and _run().plan.lr_levels is None
  plan = _run(extend=dict(learning_rate=5e-4)).plan
  assert plan.lr_levels == ((0, 1.0), (4, 0.5), (8, 0.5))  # the decay inherits the extension's peak
  ramped = _run(decay=dict(batch_size=32, ramp_batch_size=16, ramp_tokens=16 * 64)).plan
  assert ramped.decay_start == 8 and [p.decay for p in ramped.stages[2:]] == [True, True]


def test_a_prefix_is_what_a_branch_shares_up_to_its_step():
  plan = _run().plan
  assert len(plan.prefix(0)) == 0 and len(plan.prefix(4)) == 1 and len(plan.prefix(5)) == 2
  assert plan.prefix(6)[-1][:2] == (4, 6)  # the stage it is in, up to the step
  decayed_later = _run(extend=dict(steps=6)).plan  # a longer extension: the same run up to step 8
  assert plan.same_prefix(decayed_later, 8) and not plan.same_prefix(decayed_later, 9)
  for other in (_run(stable=dict(batch_size=8)), _run(extend=dict(rope_theta=80_000.0)),
                _run(extend=dict(max_seq_length=128)), _run(stable=dict(masked_lm_prob=0.3))):
    first_differs = 0 if other.phases['stable'] != _run().phases['stable'] else 4
    assert plan.same_prefix(other.plan, first_differs) and not plan.same_prefix(other.plan, first_differs + 1)


def test_the_views_of_earlier_versions_read_the_plan():
  cfg = _run(extend=dict(learning_rate=5e-4))
  assert cfg.phase_list() == list(cfg.plan.stages) and cfg.decay_start() == cfg.plan.decay_start
  assert cfg.learning_rate_levels() == list(cfg.plan.lr_levels)
  assert cfg.phase_at(5) is cfg.plan.at(5) and cfg.phase_before(4) is cfg.plan.before(4)
  assert phases.resolve(cfg) == cfg.plan  # resolving again gives the same plan


_CHANGED = {'batch_size': 8, 'data.max_seq_length': 64, 'data.train_files': 'data/other', 'data.train_weights': '1',
            'data.masked_lm_prob': 0.3, 'data.masked_lm_prob_end': 0.2, 'model.rope_theta': 80_000.0,
            'model.local_rope_theta': 80_000.0}


@pytest.mark.parametrize('name', fields.facts(PretrainConfig, 'layout'))
def test_every_layout_field_is_part_of_the_prefix(name):
  """A branch shares the fields marked `layout` up to its branch point (and no hand list names them)."""
  assert set(fields.facts(PretrainConfig, 'layout')) == set(_CHANGED)  # what a branch shares, as before
  base = PretrainConfig.from_dict(dict(num_train_steps=8, batch_size=16))
  section, _, field = name.rpartition('.')
  block = dataclasses.replace(getattr(base, section) if section else base, **{field: _CHANGED[name]})
  other = dataclasses.replace(base, **{section: block}) if section else block
  assert base.plan.same_prefix(base.plan, 8) and not base.plan.same_prefix(other.plan, 1), name
  assert base.plan.same_prefix(dataclasses.replace(base, log_every=7).plan, 8)  # a field free on resume is not
