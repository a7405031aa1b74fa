"""bert_jax.interop.sentence_transformers and export_hf.py's sentence-transformers folders, loaded by
sentence-transformers itself: its embeddings equal bert_jax's (embed.py's) for retrieval runs with mean and [CLS]
pooling, for any encoder with a pooling choice (an HF directory, a pretraining workdir with its SentencePiece
tokenizer) and for a ModernBERT-shaped one; embed.py reads the settings back from the workdir and the folder."""

import json
import os

import numpy as np
import pytest

from bert_jax.errors import CheckpointError
from bert_jax.interop import sentence_transformers as st_folder

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import retrieval_config, write_retrieval_data
from harness.numerics import tolerance

# Texts of every length around the runs' 16 tokens: the long ones are cut by both sides alike.
TEXTS = ['what is the apple?', 'the river is described here in detail', 'Copper, volcanoes and a penguin: a much '
         'longer sentence than sixteen tokens, with punctuation and UPPER case words!', 'x']
COSINE = 0.99999


def _last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _st_embeddings(folder, **kwargs):
  """sentence-transformers' own embeddings of TEXTS from `folder`, on CPU."""
  sentence_transformers = pytest.importorskip('sentence_transformers')
  model = sentence_transformers.SentenceTransformer(folder, device='cpu', **kwargs)
  return model, model.encode(TEXTS, convert_to_numpy=True)


def _bert_jax_embeddings(tmp_path, checkpoint, *flags):
  """embed.py's sentence_embedding of TEXTS from `checkpoint`, and its result line."""
  texts = tmp_path / 'texts.txt'
  texts.write_text(''.join(t + '\n' for t in TEXTS), encoding='utf-8')
  out = tmp_path / f'emb{len(list(tmp_path.glob("emb*.npz")))}.npz'
  r = run_main('embed.py', f'--checkpoint={checkpoint}', f'--input={texts}', f'--output={out}', *flags)
  line = _last_json(r)
  return np.load(out)['sentence_embedding'], line, r.stderr


def _assert_same(theirs, ours):
  assert theirs.shape == ours.shape
  cosine = (theirs * ours).sum(1) / np.linalg.norm(theirs, axis=1) / np.linalg.norm(ours, axis=1)
  assert cosine.min() >= COSINE, cosine
  # torch's kernels against XLA's: float32 rounding of the widest sums of the encoders here (256), in up to 3 layers.
  np.testing.assert_allclose(theirs, ours, atol=tolerance(np.float32, 256, depth=3,
                                                          magnitude=max(1.0, float(np.abs(ours).max()))))


@pytest.fixture(scope='module')
def cls_workdir(tiny_checkpoint, tmp_path_factory):
  """A retrieval run with [CLS] pooling, a fixed temperature and no Matryoshka sizes (2 steps)."""
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('retrieval_cls')
  pairs, beir = write_retrieval_data(root)
  workdir = str(root / 'run')
  finetuning.finetune(retrieval_config(tiny_checkpoint, pairs, beir, num_train_steps=2, pooling='cls',
                                             matryoshka_dims='', learn_temperature=False), workdir)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize('pooling', ['mean', 'cls'])
def test_a_retrieval_workdir_exports_a_folder_sentence_transformers_loads_with_our_embeddings(
    pooling, retrieval_workdir, cls_workdir, tmp_path):
  workdir = retrieval_workdir if pooling == 'mean' else cls_workdir
  out = tmp_path / 'st'
  line = _last_json(run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}'))
  assert line['sentence_transformers'] and line['pooling'] == pooling and line['normalize']
  assert line['max_seq_length'] == 16 and line['architecture'] == 'BertModel' and line['heads'] == []
  with open(out / 'modules.json', encoding='utf-8') as f:
    assert [m['path'] for m in json.load(f)] == ['', '1_Pooling', '2_Normalize']
  with open(out / 'sentence_bert_config.json', encoding='utf-8') as f:
    assert json.load(f) == {'max_seq_length': 16, 'do_lower_case': False}
  with open(out / 'config_sentence_transformers.json', encoding='utf-8') as f:
    st_config = json.load(f)
  assert st_config['similarity_fn_name'] == 'cosine'
  dims = [32, 16] if pooling == 'mean' else []
  assert st_config['bert_jax']['matryoshka_dims'] == dims
  assert ('Matryoshka: trained at the leading sizes 32, 16' in (out / 'README.md').read_text()) == bool(dims)

  model, theirs = _st_embeddings(str(out))
  assert model.similarity_fn_name == 'cosine' and model.max_seq_length == 16
  ours, embedded, stderr = _bert_jax_embeddings(tmp_path, workdir)  # no flags: the run's own settings
  assert (embedded['pooling'], embedded['normalize'], embedded['max_length']) == (pooling, True, 16)
  assert f'pooling {pooling}, normalised, max_length 16 from the retrieval run' in stderr
  _assert_same(theirs, ours)
  np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, rtol=tolerance(np.float32, 32))
  if dims:  # sentence-transformers' truncate_dim is our leading 16 components (renormalised: cosine)
    _, small = _st_embeddings(str(out), truncate_dim=16)
    _assert_same(small / np.linalg.norm(small, axis=1, keepdims=True),
                 ours[:, :16] / np.linalg.norm(ours[:, :16], axis=1, keepdims=True))


@pytest.mark.slow
def test_flags_given_win_over_the_run_with_a_line(retrieval_workdir, tmp_path):
  out = tmp_path / 'st'
  r = run_main('export_hf.py', f'--checkpoint={retrieval_workdir}', f'--output={out}', '--pooling=cls',
               '--max_seq_length=12')
  line = _last_json(r)
  assert line['pooling'] == 'cls' and line['max_seq_length'] == 12
  assert 'pooling=cls as given, not mean as the retrieval run' in r.stderr
  assert 'max_seq_length=12 as given, not 16 as the retrieval run' in r.stderr
  _, theirs = _st_embeddings(str(out))
  ours, embedded, stderr = _bert_jax_embeddings(tmp_path, retrieval_workdir, '--pooling=cls', '--max_length=12')
  assert 'pooling=cls as given, not mean' in stderr and embedded['max_length'] == 12
  _assert_same(theirs, ours)
  # --nosentence_transformers: the plain encoder (BertModel) a transformers user loads
  line = _last_json(run_main('export_hf.py', f'--checkpoint={retrieval_workdir}', f'--output={tmp_path / "hf"}',
                             '--nosentence_transformers'))
  assert 'sentence_transformers' not in line and not (tmp_path / 'hf' / 'modules.json').exists()
  assert line['architecture'] == 'BertModel'


@pytest.mark.slow
@pytest.mark.parametrize('source', ['hf', 'pretraining'])
def test_any_encoder_exports_with_a_pooling_choice(source, tiny_checkpoint, pretrained_run, tmp_path):
  checkpoint = tiny_checkpoint if source == 'hf' else pretrained_run.workdir
  out = tmp_path / 'st'
  flags = ['--pooling=cls', '--normalize=false', '--max_seq_length=24']
  line = _last_json(run_main('export_hf.py', f'--checkpoint={checkpoint}', f'--output={out}',
                             '--sentence_transformers', *flags))
  assert (line['pooling'], line['normalize'], line['max_seq_length']) == ('cls', False, 24)
  with open(out / 'modules.json', encoding='utf-8') as f:
    assert [m['path'] for m in json.load(f)] == ['', '1_Pooling']  # no Normalize
  model, theirs = _st_embeddings(str(out))
  assert model.max_seq_length == 24
  ours, _, _ = _bert_jax_embeddings(tmp_path, checkpoint, '--pooling=cls', '--normalize=false', '--max_length=24')
  _assert_same(theirs, ours)
  assert np.abs(np.linalg.norm(ours, axis=1) - 1).max() > 1e-3  # really not normalised
  # embed.py on the exported folder reads its modules: the same embeddings without a flag
  again, embedded, stderr = _bert_jax_embeddings(tmp_path, str(out))
  assert (embedded['pooling'], embedded['normalize'], embedded['max_length']) == ('cls', False, 24)
  assert 'from the sentence-transformers folder' in stderr
  np.testing.assert_array_equal(again, ours)


@pytest.mark.slow
def test_a_modernbert_shaped_encoder_exports(tmp_path):
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  from bert_jax import config, inference  # pylint: disable=g-import-not-at-top
  from bert_jax.data import tokenization as tk  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.hf import model_dir  # pylint: disable=g-import-not-at-top
  cfg = config.preset('tiny', vocab_size=64, num_layers=3, max_position_embeddings=40, attention_window=6,
                      global_attention_every=2, rope_theta=160000.0, use_bias=False, layer_norm_eps=1e-5,
                      norm_position='pre', position_embedding='rotary', mlp='geglu', type_vocab_size=0)
  rng = np.random.default_rng(0)
  params = traverse_util.unflatten_dict({
      path: (path[-1] == 'scale') + rng.normal(0, 0.1, shape).astype(np.float32)
      for path, shape in model_dir.param_shapes(cfg).items() if path[0] == 'bert'})
  vocab = tmp_path / 'vocab'
  vocab.mkdir()
  (vocab / 'vocab.txt').write_text('\n'.join(tk.SPECIAL_TOKENS + ('what', 'is', 'the', 'apple', 'river', '?',
                                                                  ',', '!', 'a', 'x', '##s')) + '\n')
  out = str(tmp_path / 'st')
  st_folder.save_sentence_transformers(out, cfg, params, tk.WordPieceTokenizer.from_directory(str(vocab)),
                                       st_folder.Embedding(pooling='mean', max_seq_length=16))
  with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
    assert json.load(f)['model_type'] == 'modernbert'
  _, theirs = _st_embeddings(out)
  settings = st_folder.read_embedding(out)
  assert (settings.pooling, settings.normalize, settings.max_seq_length) == ('mean', True, 16)
  ours = inference.embed(pretrained.load_encoder(out), [(t, None) for t in TEXTS], max_length=16, pooling='mean',
                         normalize=True)['sentence_embedding']
  _assert_same(theirs, np.asarray(ours))


def test_an_export_target_that_exists_is_one_line_and_untouched(tiny_checkpoint, tmp_path):
  out = tmp_path / 'taken'
  out.mkdir()
  (out / 'notes.txt').write_text('mine')
  before = tree_digest(out)
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={tiny_checkpoint}', f'--output={out}',
                                 '--sentence_transformers'), 'is not empty')
  assert tree_digest(out) == before


@pytest.mark.parametrize('flags, pattern', [
    (['--pooling=cls'], '--pooling apply to a sentence-transformers export only'),
    (['--sentence_transformers', '--max_seq_length=1000'], "max_seq_length=1000 must be between 2 and the model's "
     'max_position_embeddings=512'),
    (['--sentence_transformers', '--pooling=max'], 'pooling'),
])
def test_bad_export_flags_are_one_line_and_write_nothing(flags, pattern, tiny_checkpoint, tmp_path):
  out = tmp_path / 'st'
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={tiny_checkpoint}', f'--output={out}', *flags),
                        pattern)
  assert not out.exists()


def test_read_embedding_refuses_what_bert_jax_cannot_reproduce(tmp_path):
  assert st_folder.read_embedding(str(tmp_path)) is None  # not a sentence-transformers folder
  modules = [{'idx': 0, 'name': '0', 'path': '', 'type': 'sentence_transformers.models.Transformer'},
             {'idx': 1, 'name': '1', 'path': '1_Pooling', 'type': 'sentence_transformers.models.Pooling'},
             {'idx': 2, 'name': '2', 'path': '2_Dense', 'type': 'sentence_transformers.models.Dense'}]
  (tmp_path / 'modules.json').write_text(json.dumps(modules))
  with pytest.raises(CheckpointError, match='Transformer, Pooling, Dense'):
    st_folder.read_embedding(str(tmp_path))
  (tmp_path / 'modules.json').write_text(json.dumps(modules[:2]))
  (tmp_path / '1_Pooling').mkdir()
  (tmp_path / '1_Pooling' / 'config.json').write_text(json.dumps({'pooling_mode_max_tokens': True}))
  with pytest.raises(CheckpointError, match='is not one bert_jax reproduces'):
    st_folder.read_embedding(str(tmp_path))
  (tmp_path / '1_Pooling' / 'config.json').write_text(json.dumps({'pooling_mode': 'cls'}))  # sentence-transformers 6
  settings = st_folder.read_embedding(str(tmp_path))
  assert (settings.pooling, settings.normalize, settings.max_seq_length) == ('cls', False, None)


@pytest.mark.slow
def test_embed_warns_on_a_folder_it_cannot_reproduce_and_embeds_the_encoder(tiny_checkpoint, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  folder = tmp_path / 'dense'
  shutil.copytree(tiny_checkpoint, folder)
  (folder / 'modules.json').write_text(json.dumps([{'path': '', 'type': 'sentence_transformers.models.Transformer'},
                                                   {'path': '1_Pooling', 'type': 'sentence_transformers.models.Pooling'},
                                                   {'path': '2_Dense', 'type': 'sentence_transformers.models.Dense'}]))
  ours, line, stderr = _bert_jax_embeddings(tmp_path, str(folder), '--pooling=cls')
  assert 'warning: ' in stderr and 'Transformer, Pooling, Dense' in stderr
  assert line['pooling'] == 'cls' and line['max_length'] == 128
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={folder}', f'--output={tmp_path / "st"}',
                                 '--sentence_transformers'), 'Transformer, Pooling, Dense')
  assert not (tmp_path / 'st').exists()
