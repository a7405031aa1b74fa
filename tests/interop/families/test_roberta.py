"""RoBERTa and XLM-R checkpoints, built here with transformers from small configs (random weights perturbed, LayerNorms
too) and tokenizers trained here in their style (conftest roberta_tokenizer: byte-level BPE;
xlmr_tokenizer: Unigram): they load with transformers' ids, hidden states and MLM logits (positions
offset by padding_idx + 1, one token type), export back to their own model_type, continue pretraining, fine-tune on
SST-2, and the exported fill-mask pipeline gives fill_mask.py's answers; bad checkpoints give one error line."""

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
from bert_jax.interop.hf import model_dir

from harness.digests import cut_in_half, tree_digest
from harness.entry_points import assert_export_refused, finetune_small_sst2, run_main
from harness.inputs import write_small_corpus
from harness.numerics import jitted, tolerance
from harness.references import (
  assert_embed_and_attention_match_transformers,
  assert_export_classifies_as_predict,
  assert_fill_mask_is_the_pipelines,
  assert_hf_reranker_reranks_as_transformers,
  assert_reranker_exports_score_as_predict,
  assert_task_exports_match_transformers,
  export_again,
  save_perturbed,
)

pytestmark = pytest.mark.filterwarnings('ignore::DeprecationWarning:transformers.*')
torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# name -> (model_type, transformers class, its head)
MODELS = {
    'roberta': ('roberta', 'RobertaForMaskedLM', 'mlm'),
    'roberta_base': ('roberta', 'RobertaModel', None),  # with its pooler
    'xlmr': ('xlm-roberta', 'XLMRobertaForMaskedLM', 'mlm'),
}
TEXTS = ['Paris is the capital of France.', 'Crème brûlée at the Café 東京 👍, see https://example.com/a?b=c#d',
         'def f(x):\n    return x ** 2', 'the <mask> sat on the [MASK] </s> twice']
MAX_POSITIONS = 64  # theirs: 66 (the offset of padding_idx + 1 = 2)

_CLASSIFIER = {'kernel': np.zeros((32, 2), np.float32), 'bias': np.zeros(2, np.float32)}


def build(name: str, directory: str, tokenizers: dict[str, str]) -> str:
  """A transformers model of MODELS[name] with every weight perturbed, saved with its tokenizer (a copy of the
  session's shared one of its style: `tokenizers`)."""
  model_type, cls, _ = MODELS[name]
  shutil.copytree(tokenizers['xlmr' if model_type == 'xlm-roberta' else 'roberta'], directory)
  tok = transformers.AutoTokenizer.from_pretrained(directory)
  config_cls = transformers.XLMRobertaConfig if model_type == 'xlm-roberta' else transformers.RobertaConfig
  config = config_cls(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1,
                      layer_norm_eps=1e-5, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                      eos_token_id=tok.sep_token_id)
  save_perturbed(cls, config, directory, seed=sum(map(ord, name)))
  return directory


@pytest.fixture(scope='module')
def built(tmp_path_factory, roberta_tokenizer, xlmr_tokenizer):
  root = tmp_path_factory.mktemp('roberta')
  tokenizers = {'roberta': roberta_tokenizer, 'xlmr': xlmr_tokenizer}
  return {name: build(name, str(root / name), tokenizers) for name in MODELS}


def _batch(directory):
  batch = transformers.AutoTokenizer.from_pretrained(directory)(TEXTS, TEXTS[::-1], padding=True, truncation=True,
                                                                    max_length=MAX_POSITIONS, return_tensors='pt')
  assert 'token_type_ids' not in batch
  return batch


def _theirs(directory, cls, batch):
  """transformers' (last hidden state, logits or None) of `batch`."""
  model = getattr(transformers, cls).from_pretrained(directory).eval()
  with torch.no_grad():
    out = model(**batch, output_hidden_states=True)
  return out.hidden_states[-1].numpy(), getattr(out, 'logits', None)


def _assert_matches_transformers(directory, cls, loaded, record_property=None):
  """transformers' ids, hidden states (up to float32 rounding: `tolerance`) and MLM logits (<= 1e-4) at the real
  positions of a padded batch."""
  theirs_tok = transformers.AutoTokenizer.from_pretrained(directory)
  for a in TEXTS:
    for b in (None, TEXTS[0]):
      want = theirs_tok(a) if b is None else theirs_tok(a, b)
      ids, types, _ = loaded.tokenizer.encode_inputs(a, b, max_length=512)
      assert ids == want['input_ids'] and types == [0] * len(ids)
  batch = _batch(directory)
  hidden, logits = _theirs(directory, cls, batch)
  ids, mask = jnp.asarray(batch['input_ids'].numpy()), jnp.asarray(batch['attention_mask'].numpy())
  real = batch['attention_mask'].numpy() == 1
  seq, _ = jitted(loaded.encoder())(ids, None, mask)
  hidden_diff = float(np.abs(np.asarray(seq) - hidden)[real].max())
  cfg = loaded.config  # torch's kernels against XLA's: each layer's widest sums
  assert hidden_diff <= tolerance(np.float32, cfg.intermediate_size, magnitude=np.abs(hidden[real]).max(),
                                  depth=cfg.num_layers), hidden_diff
  if record_property:
    record_property('hidden_max_abs_diff', hidden_diff)
  if logits is not None:
    ours, _ = jitted(loaded.pretraining_model())(ids, None, mask, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
    logits_diff = float(np.abs(np.asarray(ours) - logits.numpy())[real].max())
    assert logits_diff <= 1e-4
    if record_property:
      record_property('mlm_logits_max_abs_diff', logits_diff)


@pytest.mark.parametrize('name', MODELS)
def test_loads_with_transformers_ids_and_outputs(built, name, record_property):
  _, cls, head = MODELS[name]
  cfg, params, has_mlm, has_nsp = families.load_hf_checkpoint(built[name])
  assert (has_mlm, has_nsp) == (head == 'mlm', False)
  assert (cfg.position_offset, cfg.max_position_embeddings, cfg.type_vocab_size, cfg.pad_token_id) == (
      2, MAX_POSITIONS, 1, 1)
  assert params['bert']['embeddings']['position_embeddings']['embedding'].shape == (MAX_POSITIONS + 2, 32)
  pooler = params['bert']['pooler']['kernel']
  theirs = st_numpy.load_file(os.path.join(built[name], 'model.safetensors')).get('pooler.dense.weight')
  if name == 'roberta_base':  # RobertaModel's own pooler
    np.testing.assert_array_equal(pooler, theirs.T)
  else:  # RobertaForMaskedLM has none: drawn as transformers draws a fresh head (std initializer_range = 0.02)
    assert theirs is None and 0.015 < pooler.std() < 0.025 and not np.any(params['bert']['pooler']['bias'])
  loaded = pretrained.load_pretrained(built[name])
  tok = loaded.tokenizer
  assert (tok.id_to_token(tok.cls_id), tok.id_to_token(tok.sep_id), tok.id_to_token(tok.mask_id), tok.pad_id) == (
      '<s>', '</s>', '<mask>', 1)
  _assert_matches_transformers(built[name], cls, loaded, record_property)


def test_pairs_follow_the_tokenizer_template(built):
  tok = pretrained.load_pretrained(built['roberta']).tokenizer
  ids = tok.encode_inputs('a b', 'c d', max_length=32)[0]
  a, b = tok.encode('a b'), tok.encode('c d')
  assert ids == [tok.cls_id, *a, tok.sep_id, tok.sep_id, *b, tok.sep_id]  # RoBERTa's double separator
  # One token type: a BERT-style segment B (type 1, as NSP records give) reads row 0 as transformers does.
  loaded = pretrained.load_pretrained(built['roberta'])
  x = jnp.asarray([ids])
  zeros, _ = jitted(loaded.encoder())(x, jnp.zeros_like(x), jnp.ones_like(x))
  ones, _ = jitted(loaded.encoder())(x, jnp.ones_like(x), jnp.ones_like(x))
  np.testing.assert_array_equal(np.asarray(zeros), np.asarray(ones))
  assert np.isfinite(np.asarray(ones)).all()


@pytest.mark.parametrize('name', MODELS)
def test_export_is_the_same_model_type_and_outputs(built, name, tmp_path):
  model_type, cls, head = MODELS[name]
  out = str(tmp_path / 'export')
  written, theirs, ours = export_again(built[name], out)
  cfg, params, _, _ = families.load_hf_checkpoint(built[name])
  assert (written['model_type'], written['architectures'], written['max_position_embeddings'],
          written['pad_token_id'], written['type_vocab_size']) == (model_type, [cls], MAX_POSITIONS + 2, 1, 1)
  assert set(ours) == set(theirs)  # the pooler where the class has one, no decoder copies
  for k in theirs:  # the whole position table, its unused rows too
    np.testing.assert_array_equal(ours[k], theirs[k])
  batch = _batch(built[name])
  for a, b in zip(_theirs(out, cls, batch), _theirs(built[name], cls, batch)):
    if a is not None:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  fast, original = (transformers.AutoTokenizer.from_pretrained(d) for d in (out, built[name]))
  for text in TEXTS:
    assert fast(text, TEXTS[0]) == original(text, TEXTS[0])
  again = families.load_hf_checkpoint(out)
  assert again[0] == cfg
  for x, y in zip(jax.tree.leaves(again[1]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(x, y)


def _rewrite(directory, change):
  path = os.path.join(directory, 'model.safetensors')
  tensors = st_numpy.load_file(path)
  change(tensors)
  st_numpy.save_file(tensors, path, metadata={'format': 'pt'})


@pytest.mark.parametrize('case', ['missing', 'extra', 'untied', 'cut'])
def test_bad_checkpoint_is_one_error_line_and_writes_nothing(built, case, tmp_path):
  directory, out = str(tmp_path / 'model'), str(tmp_path / 'export')
  shutil.copytree(built['roberta'], directory)
  if case == 'missing':
    _rewrite(directory, lambda t: t.pop('lm_head.layer_norm.bias'))
    pattern = 'lacks 1 tensor(s) a 2-layer RoBERTa needs: lm_head.layer_norm.bias'
  elif case == 'extra':
    _rewrite(directory, lambda t: t.update({'roberta.encoder.layer.2.output.dense.bias': np.zeros(32, np.float32)}))
    pattern = 'has tensor(s) that a 2-layer RoBERTa lacks: roberta.encoder.layer.2.output.dense.bias'
  elif case == 'untied':
    _rewrite(directory, lambda t: t.update({'lm_head.decoder.bias': t['lm_head.bias'] + 1}))
    pattern = 'lm_head.decoder.bias differs from lm_head.bias'
  else:
    cut_in_half(os.path.join(directory, 'model.safetensors'))
    pattern = 'cannot be read as safetensors'
  assert_export_refused(directory, out, pattern)


def test_stored_decoder_copies_load(built, tmp_path):
  """Older checkpoints store the tied decoder weight and bias: equal copies load as the checkpoint without them."""
  directory = str(tmp_path / 'model')
  shutil.copytree(built['roberta'], directory)
  _rewrite(directory, lambda t: t.update({'lm_head.decoder.weight': t['roberta.embeddings.word_embeddings.weight'],
                                          'lm_head.decoder.bias': t['lm_head.bias']}))
  a, b = families.load_hf_checkpoint(directory)[1], families.load_hf_checkpoint(built['roberta'])[1]
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_export_refuses_what_roberta_cannot_hold(built, tmp_path):
  cfg, params, _, _ = families.load_hf_checkpoint(built['roberta'])
  bert_tok = model_dir.load_hf_tokenizer(built['roberta'])
  with pytest.raises(CheckpointError, match="pooler_activation=relu, but RoBERTa's classification head applies tanh"):
    families.save_hf_checkpoint(str(tmp_path / 'a'), dataclasses.replace(cfg, pooler_activation='relu'),
                                {'bert': params['bert'], 'classifier': _CLASSIFIER}, task={'kind': 'classification', 'num_labels': 2})
  shifted = dataclasses.replace(cfg, position_offset=1, max_position_embeddings=MAX_POSITIONS + 1)
  with pytest.raises(CheckpointError, match='but the tokenizer pads with id 1'):
    families.save_hf_checkpoint(str(tmp_path / 'b'), shifted, params, bert_tok)
  with pytest.raises(CheckpointError, match='no Hugging Face family has both'):
    families.save_hf_checkpoint(str(tmp_path / 'c'), dataclasses.replace(cfg, embedding_size=16), params)
  assert not any(os.path.exists(tmp_path / d) for d in 'abc')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['roberta', 'xlmr'])
def test_fine_tuned_heads_export_as_the_familys_task_classes(built, name, tmp_path):
  """{Roberta,XLMRoberta}For{Sequence,Token}Classification (classifier.dense + tanh + out_proj on <s>) and
  ForQuestionAnswering: transformers' logits equal ours."""
  assert_task_exports_match_transformers(built[name], tmp_path, TEXTS[:3], token_types=False)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['roberta', 'xlmr'])
def test_embed_and_attention_tools_give_transformers_outputs(built, name, tmp_path):
  assert_embed_and_attention_match_transformers(built[name], tmp_path, TEXTS[:3])


@pytest.mark.slow
@pytest.mark.parametrize('name', ['roberta', 'xlmr'])
def test_continued_pretraining_exports_back_and_fills_masks(built, name, tmp_path):
  model_type, cls, _ = MODELS[name]
  corpus = write_small_corpus(tmp_path)
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'export')
  before = tree_digest(built[name])
  flags = [f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
           f'--config.init_checkpoint={built[name]}', f'--config.data.train_files={corpus}',
           f'--config.data.cache_dir={tmp_path / "cache"}', '--config.data.masking=whole_word',
           '--config.num_train_steps=2', '--config.batch_size=8', '--config.data.max_seq_length=64',
           '--config.eval_every=1000', '--config.data.eval_fraction=0.4']
  result = run_main('pretrain.py', *flags, '--config.data.objective=none')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'loaded encoder, MLM head' in result.stdout, result.stdout[-3000:]
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  line = json.loads(result.stdout.strip().splitlines()[-1])
  assert (line['architecture'], line['heads']) == (cls, ['mlm'])
  with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
    assert json.load(f)['model_type'] == model_type
  trained = pretrained.load_pretrained(workdir)
  assert trained.config.position_offset == 2
  _assert_matches_transformers(out, cls, trained)
  hidden_before = _theirs(built[name], cls, _batch(built[name]))[0]
  assert not np.allclose(_theirs(out, cls, _batch(out))[0], hidden_before, atol=1e-5)  # trained
  assert tree_digest(built[name]) == before

  assert_fill_mask_is_the_pipelines(out, 'The capital of France is <mask>, not <mask>.', trained.tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['roberta', 'xlmr'])
def test_fine_tunes_on_sst2_and_predicts(built, name, tmp_path):
  workdir = str(tmp_path / 'sst2')
  assert 0 <= finetune_small_sst2(built[name], workdir, tmp_path)['dev_accuracy'] <= 1
  result = run_main('predict.py', f'--workdir={workdir}', '--text=a charming and often affecting journey')
  assert result.returncode == 0, result.stderr[-3000:]
  row = json.loads(result.stdout.strip().splitlines()[-1])
  assert row['label'] in ('negative', 'positive') and abs(sum(row['probabilities'].values()) - 1) < 1e-6
  tuned = pretrained.load_finetuned(workdir)
  assert (tuned.config.position_offset, tuned.config.type_vocab_size) == (2, 1)
  start = families.load_hf_checkpoint(built[name])[1]['bert']['embeddings']['position_embeddings']['embedding']
  tuned_positions = np.asarray(tuned.params['bert']['embeddings']['position_embeddings']['embedding'])
  assert np.corrcoef(start.ravel(), tuned_positions.ravel())[0, 1] > 0.99  # from the checkpoint's table
  assert_export_classifies_as_predict(workdir, str(tmp_path / 'export'), 'a charming and often affecting journey',
                                      {'roberta': 'RobertaForSequenceClassification',
                                       'xlmr': 'XLMRobertaForSequenceClassification'}[name])


@pytest.mark.slow
def test_a_reranker_exports_as_a_cross_encoder_that_scores_as_predict(built, tmp_path):
  """A RoBERTa-shaped reranker (<s> q </s></s> p </s>, one token type; classifier.dense + tanh + out_proj on <s>):
  sentence-transformers' CrossEncoder gives predict.py's scores."""
  pytest.importorskip('sentence_transformers')
  assert_reranker_exports_score_as_predict(built['roberta'], tmp_path, 'RobertaForSequenceClassification')


@pytest.mark.slow
def test_a_transformers_reranker_reranks_in_the_two_stage_command(roberta_tokenizer, tmp_path):
  """A random one-logit RobertaForSequenceClassification (<s> q </s></s> p </s>; classifier.dense + tanh +
  out_proj on <s>, our pooler and classifier) imports and experiments/rerank.py scores its pairs as transformers."""
  directory = str(tmp_path / 'hf')
  shutil.copytree(roberta_tokenizer, directory)
  tok = transformers.AutoTokenizer.from_pretrained(directory)
  config = transformers.RobertaConfig(
      vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1, layer_norm_eps=1e-5, num_labels=1,
      pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
  save_perturbed('RobertaForSequenceClassification', config, directory, seed=3)
  result = assert_hf_reranker_reranks_as_transformers(directory, tmp_path)
  assert result['pairs'] == 40 and 0 <= result['eval_ndcg_at_10'] <= 1
