"""DistilBERT and ELECTRA checkpoints, built here with transformers from small configs (random weights, a small
WordPiece vocabulary written as their own fast tokenizer): they load with transformers' outputs, export back to
their own model_type, continue pretraining, fine-tune on SST-2 and export as their task classes; bad checkpoints give one error line."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from safetensors import numpy as st_numpy

from bert_jax.errors import CheckpointError
from bert_jax.interop import families, pretrained

from harness.digests import cut_in_half, tree_digest
from harness.entry_points import assert_export_refused, finetune_small_sst2, run_main
from harness.numerics import jitted, tolerance
from harness.processes import pretrain_flags
from harness.references import (
  assert_embed_and_attention_match_transformers,
  assert_export_classifies_as_predict,
  assert_fill_mask_is_the_pipelines,
  assert_task_exports_match_transformers,
  export_again,
  save_perturbed,
)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()  # no load reports
transformers.utils.logging.disable_progress_bar()

_VOCAB = list(dict.fromkeys(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + list('abcdefghijklmnopqrstuvwxyz.,!?\'"-')
          + 'the a of and to in is was it for on with as by at he she they this that from be are were an or had not but'
          .split() + ['##' + c for c in 'abcdefghijklmnopqrstuvwxyz'] + ['##ed', '##ing', '##er', '##ly']))
# name -> (family, transformers class, its head)
MODELS = {
    'distilbert': ('distilbert', 'DistilBertForMaskedLM', 'mlm'),
    'distilbert_base': ('distilbert', 'DistilBertModel', None),
    'electra_generator': ('electra', 'ElectraForMaskedLM', 'mlm'),
    'electra_discriminator': ('electra', 'ElectraForPreTraining', 'discriminator'),
    'electra_same_width': ('electra', 'ElectraModel', None),  # embedding_size = hidden_size: no projection
}
_IDS = np.array([[2, 40, 50, 60, 4, 70, 3, 0, 0, 0], [2, 41, 42, 43, 44, 45, 46, 47, 48, 3]])
_MASK = (_IDS != 0).astype(np.int64)
_TEXTS = ['A gripping, funny film.', 'Dull and far too long.', 'An instant classic.']

_CLASSIFIER = {'kernel': np.zeros((32, 2), np.float32), 'bias': np.zeros(2, np.float32)}


def build(name: str, directory: str) -> str:
  """A transformers model of MODELS[name] with every weight perturbed (LayerNorms too), saved with its tokenizer."""
  family, cls, _ = MODELS[name]
  os.makedirs(directory)
  vocab = os.path.join(directory, 'vocab.txt')
  with open(vocab, 'w', encoding='utf-8') as f:
    f.write('\n'.join(_VOCAB) + '\n')
  if family == 'distilbert':
    config = transformers.DistilBertConfig(vocab_size=len(_VOCAB), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                           max_position_embeddings=64)
    tokenizer = transformers.DistilBertTokenizerFast(vocab=vocab)  # transformers 5: the path
  else:
    width = 32 if name == 'electra_same_width' else 16
    config = transformers.ElectraConfig(vocab_size=len(_VOCAB), embedding_size=width, hidden_size=32,
                                        num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=64)
    tokenizer = transformers.ElectraTokenizerFast(vocab=vocab)
  save_perturbed(cls, config, directory, seed=sum(map(ord, name)))
  tokenizer.save_pretrained(directory)
  return directory


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  root = tmp_path_factory.mktemp('families')
  dirs = {name: build(name, str(root / name)) for name in MODELS}
  # torch's first load and forward, and the first encoder call of this process (seconds): the setup's, not a test's
  _hidden(dirs['distilbert'], 'distilbert')
  jitted(pretrained.load_pretrained(dirs['distilbert']).encoder())(jnp.asarray(_IDS), None, jnp.asarray(_MASK))
  return dirs


def _reference(directory, cls, **kwargs):
  model = getattr(transformers, cls).from_pretrained(directory).eval()
  with torch.no_grad():
    return model(input_ids=torch.tensor(_IDS), attention_mask=torch.tensor(_MASK), **kwargs)


def _hidden(directory, family):
  return _reference(directory, 'DistilBertModel' if family == 'distilbert' else 'ElectraModel').last_hidden_state


@pytest.mark.parametrize('name', MODELS)
def test_loads_with_transformers_outputs(built, name, record_property):
  family, cls, head = MODELS[name]
  directory = built[name]
  cfg, params, has_mlm, has_nsp = families.load_hf_checkpoint(directory)
  assert (has_mlm, has_nsp) == (head == 'mlm', False)
  assert sorted(params) == sorted(['bert'] + ([head] if head else []))
  embeddings = params['bert']['embeddings']
  if family == 'distilbert':  # no token types: no table, and nothing to export
    assert cfg.type_vocab_size == 0 and 'token_type_embeddings' not in embeddings and cfg.embedding_size == 0
  else:
    assert cfg.embedding_size == (32 if name == 'electra_same_width' else 16) and cfg.hidden_size == 32
    assert ('project' in embeddings) == (name != 'electra_same_width')
  model = pretrained.load_pretrained(directory)
  seq, _ = jitted(model.encoder())(jnp.asarray(_IDS), None, jnp.asarray(_MASK))
  real = _MASK.astype(bool)
  theirs = _hidden(directory, family).numpy()
  hidden_diff = float(np.abs(np.asarray(seq) - theirs)[real].max())
  record_property('hidden_max_abs_diff', hidden_diff)
  # torch's kernels against XLA's: each layer's widest sums
  assert hidden_diff <= tolerance(np.float32, cfg.intermediate_size, magnitude=np.abs(theirs[real]).max(),
                                  depth=cfg.num_layers), hidden_diff
  if head == 'mlm':
    positions = np.tile(np.arange(_IDS.shape[1]), (2, 1))
    logits, _ = jitted(model.pretraining_model())(jnp.asarray(_IDS), jnp.zeros_like(_IDS), jnp.asarray(_MASK),
                                          jnp.asarray(positions))
    ref = _reference(directory, cls).logits.numpy()
    logits_diff = float(np.abs(np.asarray(logits) - ref)[real].max())
    record_property('mlm_logits_max_abs_diff', logits_diff)
    assert logits_diff <= 1e-4


@pytest.mark.parametrize('name', MODELS)
def test_export_is_the_same_model_type_and_outputs(built, name, tmp_path):
  family, cls, head = MODELS[name]
  out = str(tmp_path / 'export')
  written, theirs, ours = export_again(built[name], out)
  params = families.load_hf_checkpoint(built[name])[1]
  assert written['model_type'] == family and written['architectures'] == [cls]
  assert set(ours) == set(theirs)  # the same tensors: no pooler, no token types invented, the head kept
  np.testing.assert_array_equal(_hidden(out, family).numpy(), _hidden(built[name], family).numpy())
  if head is not None:
    np.testing.assert_array_equal(_reference(out, cls).logits.numpy(), _reference(built[name], cls).logits.numpy())
  fast = transformers.AutoTokenizer.from_pretrained(out)
  original = transformers.AutoTokenizer.from_pretrained(built[name])
  text = "the cat's hat, isn't it? unbelievable!"
  assert fast(text) == original(text)  # DistilBERT's: no token_type_ids
  assert len(original) == len(_VOCAB) and original(text)['input_ids'].count(1) == 0  # no [UNK]: the whole vocabulary
  assert ('token_type_ids' in fast(text)) == (family != 'distilbert')
  again = families.load_hf_checkpoint(out)[1]
  assert jax.tree.structure(again) == jax.tree.structure(params)  # and bit-exact
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_unsupported_model_type_names_the_supported_ones(built, tmp_path):
  directory = str(tmp_path / 'deberta')
  shutil.copytree(built['distilbert'], directory)
  with open(os.path.join(directory, 'config.json'), encoding='utf-8') as f:
    config = json.load(f)
  with open(os.path.join(directory, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({**config, 'model_type': 'deberta-v2'}, f)
  with pytest.raises(CheckpointError, match="model_type='deberta-v2'; bert_jax imports the model types bert, "
                                            'distilbert, electra, modernbert, roberta, xlm-roberta'):
    families.load_hf_checkpoint(directory)


def _rewrite(directory, change):
  path = os.path.join(directory, 'model.safetensors')
  tensors = st_numpy.load_file(path)
  change(tensors)
  st_numpy.save_file(tensors, path, metadata={'format': 'pt'})


@pytest.mark.parametrize('case', ['missing', 'extra', 'cut'])
@pytest.mark.parametrize('name', ['distilbert', 'electra_discriminator'])
def test_bad_checkpoint_is_one_error_line_and_writes_nothing(built, name, case, tmp_path):
  directory, out = str(tmp_path / 'model'), str(tmp_path / 'export')
  shutil.copytree(built[name], directory)
  prefix = 'distilbert.' if name == 'distilbert' else 'electra.'
  lost = prefix + ('transformer.layer.1.ffn.lin2.bias' if name == 'distilbert' else 'embeddings_project.weight')
  if case == 'missing':
    _rewrite(directory, lambda t: t.pop(lost))
    pattern = f'lacks 1 tensor(s) a 2-layer {"DistilBERT" if name == "distilbert" else "ELECTRA"} needs: {lost}'
  elif case == 'extra':
    _rewrite(directory, lambda t: t.update({prefix + 'pooler.dense.weight': np.zeros((32, 32), np.float32)}))
    pattern = f'has tensor(s) that a 2-layer {"DistilBERT" if name == "distilbert" else "ELECTRA"} lacks: ' \
              f'{prefix}pooler.dense.weight'
  else:
    cut_in_half(os.path.join(directory, 'model.safetensors'))
    pattern = 'cannot be read as safetensors'
  assert_export_refused(directory, out, pattern)


def test_export_refuses_what_the_family_cannot_hold(built, tmp_path):
  cfg, params, _, _ = families.load_hf_checkpoint(built['distilbert'])
  with pytest.raises(CheckpointError, match="pooler_activation=tanh, but DistilBERT's classification head applies relu"):
    families.save_hf_checkpoint(str(tmp_path / 'a'), dataclasses.replace(cfg, pooler_activation='tanh'),
                                {'bert': params['bert'], 'classifier': _CLASSIFIER}, task={'kind': 'classification', 'num_labels': 2})
  with pytest.raises(CheckpointError, match='LayerNorms have eps 1e-12'):
    families.save_hf_checkpoint(str(tmp_path / 'b'), dataclasses.replace(cfg, layer_norm_eps=1e-6), params)
  e_cfg, e_params, _, _ = families.load_hf_checkpoint(built['electra_discriminator'])
  mlm = families.load_hf_checkpoint(built['electra_generator'])[1]['mlm']  # the same widths
  with pytest.raises(CheckpointError, match='no ELECTRA class of transformers has them together'):
    families.save_hf_checkpoint(str(tmp_path / 'c'), e_cfg, {**e_params, 'mlm': mlm})
  assert not any(os.path.exists(tmp_path / d) for d in 'abc')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['distilbert', 'electra_discriminator'])
def test_fine_tuned_heads_export_as_the_familys_task_classes(built, name, tmp_path):
  """DistilBertFor{Sequence,Token}Classification / ForQuestionAnswering (pre_classifier + ReLU), ELECTRA's
  (classifier.dense + GELU + out_proj): transformers' logits equal ours."""
  assert families.load_hf_checkpoint(built[name])[0].pooler_activation == ('relu' if name == 'distilbert' else 'gelu')
  assert_task_exports_match_transformers(built[name], tmp_path, _TEXTS,
                                         token_types=name != 'distilbert')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['distilbert', 'electra_same_width'])
def test_embed_and_attention_tools_give_transformers_outputs(built, name, tmp_path):
  assert_embed_and_attention_match_transformers(built[name], tmp_path, _TEXTS)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['distilbert', 'electra_discriminator'])
def test_continued_pretraining_exports_back(built, name, small_corpus, tmp_path):
  """Two steps of pretraining from the Hugging Face directory (DistilBERT's MLM head loaded and tied; ELECTRA's
  discriminator has none: a fresh one), exported back to the same model_type, which transformers loads."""
  family, _, head = MODELS[name]
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'export')
  before = tree_digest(built[name])
  result = run_main('pretrain.py', *pretrain_flags(small_corpus, str(tmp_path / 'cache'), workdir, 2),
                    f'--config.init_checkpoint={built[name]}', '--config.data.objective=none')
  assert result.returncode == 0, result.stderr[-3000:]
  loaded = 'loaded encoder, MLM head' if head == 'mlm' else 'loaded encoder; fresh MLM head'
  assert loaded in result.stdout, result.stdout[-3000:]
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  line = json.loads(result.stdout.strip().splitlines()[-1])
  cls = 'DistilBertForMaskedLM' if family == 'distilbert' else 'ElectraForMaskedLM'
  assert line['architecture'] == cls and line['heads'] == ['mlm']
  trained = pretrained.load_pretrained(workdir)
  seq, _ = jitted(trained.encoder())(jnp.asarray(_IDS), None, jnp.asarray(_MASK))
  real = _MASK.astype(bool)
  theirs = _hidden(out, family).numpy()
  assert np.abs(np.asarray(seq) - theirs)[real].max() <= tolerance(
      np.float32, trained.config.intermediate_size, magnitude=np.abs(theirs[real]).max(),
      depth=trained.config.num_layers)
  positions = np.tile(np.arange(_IDS.shape[1]), (2, 1))
  logits, _ = jitted(trained.pretraining_model())(jnp.asarray(_IDS), jnp.zeros_like(_IDS), jnp.asarray(_MASK),
                                          jnp.asarray(positions))
  assert np.abs(np.asarray(logits) - _reference(out, cls).logits.numpy())[real].max() <= 1e-4
  # Trained: not the checkpoint it started from.
  assert not np.allclose(np.asarray(seq), _hidden(built[name], family).numpy(), atol=1e-5)
  assert tree_digest(built[name]) == before
  assert_fill_mask_is_the_pipelines(out, 'the cat was [MASK] on the hat .', trained.tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['distilbert', 'electra_discriminator'])
def test_finetunes_on_sst2_from_the_hugging_face_directory(built, name, tmp_path):
  assert 0 <= finetune_small_sst2(built[name], str(tmp_path / 'run'), tmp_path, steps=3)['dev_accuracy'] <= 1
  tuned = pretrained.load_finetuned(str(tmp_path / 'run'))
  assert tuned.config.type_vocab_size == (0 if name == 'distilbert' else 2)
  assert ('project' in tuned.params['bert']['embeddings']) == (name != 'distilbert')
  # Fine-tuned from the checkpoint's weights (three small steps away), not from a fresh encoder.
  start = families.load_hf_checkpoint(built[name])[1]['bert']['embeddings']['word_embeddings']['embedding']
  tuned_words = np.asarray(tuned.params['bert']['embeddings']['word_embeddings']['embedding'])
  assert np.corrcoef(start.ravel(), tuned_words.ravel())[0, 1] > 0.99 and not np.array_equal(start, tuned_words)
  assert_export_classifies_as_predict(str(tmp_path / 'run'), str(tmp_path / 'export'), _TEXTS[0],
                                      {'distilbert': 'DistilBertForSequenceClassification',
                                       'electra_discriminator': 'ElectraForSequenceClassification'}[name])
