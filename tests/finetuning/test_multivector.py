"""The multivector task kind: bad input is one line and writes nothing; one MiniLM run trains, evaluates by exact
MaxSim and exports a folder sentence-transformers' MultiVectorEncoder loads with bert_jax's token vectors and
rankings."""

import json

import numpy as np
import pytest

from bert_jax.config import FinetuneConfig
from bert_jax.errors import ConfigError

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import finetune_config, write_retrieval_data


def test_its_fields_are_checked_when_the_config_is_built():
  with pytest.raises(ConfigError, match="loss='kl' distils teacher scores"):
    FinetuneConfig(task='multivector', loss='kl')
  with pytest.raises(ConfigError, match="score_columns and teacher_temperature are read by loss='kl'"):
    FinetuneConfig(task='multivector', score_columns='scores')
  with pytest.raises(ConfigError, match="pooling is a field of the retrieval task; this run's task is multivector"):
    FinetuneConfig(task='multivector', pooling='cls')
  with pytest.raises(ConfigError, match='query_length=2 and document_length=180 must be at least 3'):
    FinetuneConfig(task='multivector', query_length=2)


@pytest.mark.parametrize('extra, pattern', [
    ((), "projection_dim=128 must be between 1 and the model's hidden size 32"),
    (('--config.projection_dim=16', '--config.query_length=5'),
     r"query_length=5 is too short for the query marker '[Q]' (3 tokens here)"),
])
def test_bad_input_is_one_line_and_writes_nothing(extra, pattern, tiny_checkpoint, tmp_path):
  pairs, beir = write_retrieval_data(tmp_path)
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:multivector',
                    f'--workdir={tmp_path / "run"}', f'--config.init_checkpoint={tiny_checkpoint}',
                    f'--config.train_file={pairs}', f'--config.beir_dir={beir}', '--config.num_train_steps=1',
                    '--config.batch_size=8', *extra)
  assert_one_line_error(result, pattern)
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_trains_evaluates_and_exports_a_multivector_encoder_sentence_transformers_loads(tiny_checkpoint, tmp_path,
                                                                                        monkeypatch):
  """From the shared tiny checkpoint (MiniLM's vocabulary; MiniLM itself was 3 times as long here, all compiling):
  train, evaluate, export, and sentence-transformers' MultiVectorEncoder gives the same token vectors and ranking."""
  st = pytest.importorskip('sentence_transformers')
  from bert_jax.embedding import beir as beir_lib, ranking  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding.late_interaction import MultiVectorInputs, TokenSpec  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import finetune_run  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import load_finetuned  # pylint: disable=g-import-not-at-top
  from bert_jax.model.colbert import MultiVectorEncoder, MultiVectorSpec  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  pairs, beir = write_retrieval_data(tmp_path)
  cfg = finetune_config(task='multivector', init_checkpoint=tiny_checkpoint, train_file=pairs, beir_dir=beir,
                        negative_columns='negative', projection_dim=16, query_length=12, document_length=16, batch_size=8,
                        eval_batch_size=8, num_train_steps=2, learning_rate=1e-4)
  result = finetune_run.finetune(cfg, str(tmp_path / 'run'))
  assert result['task'] == 'multivector' and result['main_metric'] == 'eval_ndcg_at_10'
  assert result['eval_recall_at_10'] == 1.0 and 0.0 < result['eval_ndcg_at_10'] <= 1.0  # 8 passages
  train = [json.loads(line) for line in (tmp_path / 'run' / 'seed_0' / 'metrics_train.jsonl').read_text().split('\n')
           if line]
  assert all(np.isfinite(row['loss']) for row in train if 'loss' in row)
  # SIGTERM as step 1 trains: step 1 is saved, and the same call again trains step 2 and ends as the straight run did.
  from bert_jax.train import preemption  # pylint: disable=g-import-not-at-top
  from harness.faults import signal_at_finetuning_batch  # pylint: disable=g-import-not-at-top
  with signal_at_finetuning_batch(monkeypatch, 0), pytest.raises(preemption.Preempted, match='saved step 1'):
    finetune_run.finetune(cfg, str(tmp_path / 'stopped'))
  resumed = finetune_run.finetune(cfg, str(tmp_path / 'stopped'))
  assert {k: v for k, v in resumed.items() if k.startswith('eval_') and 'wall' not in k} == \
      {k: v for k, v in result.items() if k.startswith('eval_') and 'wall' not in k}

  assert_one_line_error(run_main('predict.py', f'--workdir={tmp_path / "run"}', '--text=who'),
                        'is a multivector run (token vectors scored by MaxSim, no task head to predict with)')
  exported = run_main('export_hf.py', f'--checkpoint={tmp_path / "run"}', f'--output={tmp_path / "st"}')
  assert exported.returncode == 0, exported.stderr[-2000:]
  assert json.loads(exported.stdout.strip().splitlines()[-1])['multi_vector'] is True
  theirs = st.MultiVectorEncoder(str(tmp_path / 'st'), device='cpu')

  tuned = load_finetuned(str(tmp_path / 'run'))
  model = MultiVectorEncoder(tuned.config, MultiVectorSpec.of(tuned.finetune), rngs=nnx.Rngs(0))
  nnx.update(model, tuned.params)
  rows = MultiVectorInputs(tuned.tokenizer, TokenSpec.of(tuned.finetune))
  data = beir_lib.read_beir(beir, 'test')

  token_vectors = nnx.jit(lambda m, ids, mask: m.token_vectors(ids, mask))

  def ours(texts, side):
    host = rows.rows(texts, side, len(texts), 12 if side == 'query' else 16)
    vectors = np.asarray(token_vectors(model, host[f'{side}_input_ids'], host[f'{side}_attention_mask']))
    return [v[m.astype(bool)] for v, m in zip(vectors, host[f'{side}_score_mask'])]

  for side, texts, encode in (('query', data.queries, theirs.encode_query),
                              ('passage', data.passages(), theirs.encode_document)):
    for a, b in zip(ours(texts, side), encode(texts)):  # the scored tokens' vectors, in order
      np.testing.assert_allclose(a, np.asarray(b), atol=2e-5)
  # sentence-transformers' MaxSim ranks the BEIR set as the run's evaluation did.
  scores = np.asarray(theirs.similarity(theirs.encode_query(data.queries), theirs.encode_document(data.passages())))
  again = ranking.ranking_metrics(np.argsort(-scores, axis=1, kind='stable')[:, :10], data.qrels)
  assert again['ndcg@10'] == pytest.approx(result['eval_ndcg_at_10'], abs=1e-6)
