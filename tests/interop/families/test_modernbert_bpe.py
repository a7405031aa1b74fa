"""A ModernBERT checkpoint as published: its own byte-level BPE tokenizer ([CLS]/[SEP]/[MASK] at ids past the merges,
no token type ids) and an embedding table longer than the tokenizer.

Built here with transformers from a small ModernBertConfig (random weights, save_pretrained) and a tokenizer trained
with `tokenizers` in ModernBERT's style (harness.inputs.modernbert_style_tokenizer): it loads with transformers' hidden
states, logits and ids, continues pretraining (whole-word masking from the tokenizer's word starts), fine-tunes on
SST-2, predicts, and exports back to a ModernBertForMaskedLM that transformers loads with our logits and whose
fill-mask pipeline gives fill_mask.py's answers."""

import glob
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from bert_jax.data import tokenization as tk
from bert_jax.interop import pretrained

from harness.entry_points import assert_one_line_error, finetune_small_sst2, run_main
from harness.inputs import modernbert_style_tokenizer, write_small_corpus
from harness.numerics import tolerance
from harness.references import (assert_embed_and_attention_match_transformers, assert_fill_mask_is_the_pipelines,
                                assert_hf_reranker_reranks_as_transformers, assert_reranker_exports_score_as_predict)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore::DeprecationWarning:transformers.*')]
torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

VOCAB = 448  # the embedding table: the tokenizer's 408 tokens padded to a multiple of 64, as ModernBERT's
TEXTS = ['Paris is the capital of France.', 'Crème brûlée at the Café 東京 👍, see https://example.com/a?b=c#d',
         'def f(x):\n    return x ** 2', 'the [MASK] sat on the <mask> [SEP] twice']


@pytest.fixture(scope='module')
def modernbert(tmp_path_factory):
  directory = modernbert_style_tokenizer(str(tmp_path_factory.mktemp('modernbert') / 'hf'))
  tok = transformers.AutoTokenizer.from_pretrained(directory)
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
      max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=16, pad_token_id=tok.pad_token_id,
      cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
      eos_token_id=tok.sep_token_id)
  transformers.ModernBertForMaskedLM(config).eval().save_pretrained(directory)
  return directory


def _ours(loaded, ids, mask):
  """Our (MLM logits, last hidden state) of a padded batch."""
  model = loaded.pretraining_model()
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  mlm, _ = model(ids, None, mask, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
  return np.asarray(mlm), np.asarray(model.bert(ids, None, mask)[0])


def _assert_matches_transformers(directory, loaded):
  """transformers' ids, hidden states (up to float32 rounding: `tolerance`) and MLM logits (<= 1e-4) at the real
  positions of a padded batch."""
  theirs_tok = transformers.AutoTokenizer.from_pretrained(directory)
  for a in TEXTS:
    assert loaded.tokenizer.encode_inputs(a, TEXTS[0], max_length=128)[0] == theirs_tok(a, TEXTS[0])['input_ids']
  batch = theirs_tok(TEXTS, padding=True, return_tensors='pt')
  assert 'token_type_ids' not in batch
  mlm = transformers.ModernBertForMaskedLM.from_pretrained(directory).eval()
  with torch.no_grad():
    hidden = mlm.model(**batch).last_hidden_state.numpy()
    logits = mlm(**batch).logits.numpy()
  real = batch['attention_mask'].numpy() == 1
  our_logits, our_hidden = _ours(loaded, batch['input_ids'].numpy().astype(np.int32),
                                 batch['attention_mask'].numpy().astype(np.int32))
  cfg = loaded.config  # torch's kernels against XLA's: each layer's widest sums
  assert np.abs(hidden[real] - our_hidden[real]).max() <= tolerance(
      np.float32, cfg.intermediate_size, magnitude=np.abs(hidden[real]).max(), depth=cfg.num_layers)
  assert np.abs(logits[real] - our_logits[real]).max() <= 1e-4


def test_loads_with_transformers_ids_and_outputs(modernbert):
  loaded = pretrained.load_pretrained(modernbert)
  assert loaded.config.vocab_size == VOCAB and loaded.config.type_vocab_size == 0 and loaded.has_mlm_head
  assert (loaded.tokenizer.vocab_size, loaded.tokenizer.mask_id, loaded.tokenizer.cls_id) == (408, 404, 401)
  _assert_matches_transformers(modernbert, loaded)


def test_continued_pretraining_exports_back_to_modernbert(modernbert, tmp_path):
  corpus = write_small_corpus(tmp_path)
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'export')
  result = run_main('pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
                    f'--config.init_checkpoint={modernbert}', f'--config.data.train_files={corpus}',
                    f'--config.data.cache_dir={tmp_path / "cache"}', '--config.data.masking=whole_word',
                    '--config.data.objective=none', '--config.num_train_steps=2', '--config.batch_size=8',
                    '--config.data.max_seq_length=64', '--config.eval_every=1000', '--config.data.eval_fraction=0.4')
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])['step'] == 2
  [manifest] = glob.glob(str(tmp_path / 'cache' / '*' / 'meta.json'))
  with open(manifest, encoding='utf-8') as f:  # the records carry the model's own special ids
    assert json.load(f)['tokenizer']['special_ids']['mask'] == 404

  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  line = json.loads(result.stdout.strip().splitlines()[-1])
  assert (line['architecture'], line['tokenizer']) == ('ModernBertForMaskedLM', 'FastTokenizer')
  with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
    config = json.load(f)
  assert (config['model_type'], config['vocab_size'], config['pad_token_id'], config['cls_token_id']) == (
      'modernbert', VOCAB, 403, 401)
  ours = pretrained.load_pretrained(workdir)
  _assert_matches_transformers(out, ours)
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  original = transformers.AutoTokenizer.from_pretrained(modernbert)
  assert [theirs(t)['input_ids'] for t in TEXTS] == [original(t)['input_ids'] for t in TEXTS]

  answers = assert_fill_mask_is_the_pipelines(out, 'The capital of France is [MASK] , not [MASK].', ours.tokenizer)
  assert any(a['token'].startswith('Ġ') for top in answers for a in top)  # (so the decoding above is tested)


def test_embed_and_attention_tools_give_transformers_outputs(modernbert, tmp_path):
  assert_embed_and_attention_match_transformers(modernbert, tmp_path, TEXTS[:3])


def test_fine_tunes_on_sst2_and_predicts(modernbert, tmp_path):
  workdir = str(tmp_path / 'sst2')
  assert 'dev_accuracy' in finetune_small_sst2(modernbert, workdir, tmp_path)
  result = run_main('predict.py', f'--workdir={workdir}', '--text=a charming and often affecting journey')
  assert result.returncode == 0, result.stderr[-3000:]
  row = json.loads(result.stdout.strip().splitlines()[-1])
  assert row['label'] in ('negative', 'positive') and abs(sum(row['probabilities'].values()) - 1) < 1e-6
  tuned = pretrained.load_finetuned(workdir)
  assert tuned.tokenizer.identity() == tk.load_tokenizer(modernbert).identity()


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def test_bad_tokenizers_are_one_error_line_and_write_nothing(modernbert, tmp_path):
  corpus = write_small_corpus(tmp_path)
  no_mask = _copy(modernbert, tmp_path / 'no_mask')
  with open(os.path.join(no_mask, 'tokenizer.json'), encoding='utf-8') as f:
    spec = json.load(f)
  spec['added_tokens'] = [a for a in spec['added_tokens'] if a['content'] != '[MASK]']
  with open(os.path.join(no_mask, 'tokenizer.json'), 'w', encoding='utf-8') as f:
    json.dump(spec, f)
  small = _copy(modernbert, tmp_path / 'small')  # an embedding table shorter than the tokenizer
  tensors = st_numpy.load_file(os.path.join(small, 'model.safetensors'))
  tensors = {name: x[:400] if x.shape[0] == VOCAB else x for name, x in tensors.items()}  # embeddings, decoder bias
  st_numpy.save_file(tensors, os.path.join(small, 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(small, 'config.json'), encoding='utf-8') as f:
    config = json.load(f)
  with open(os.path.join(small, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({**config, 'vocab_size': 400}, f)
  for source, pattern in ((no_mask, 'lacks the special token(s) [MASK] (mask)'),
                          (small, 'has 408 tokens')):
    workdir = tmp_path / f'run_{os.path.basename(source)}'
    result = run_main('pretrain.py', f'--workdir={workdir}', '--config=experiments/configs/pretrain.py:tiny',
                      f'--config.init_checkpoint={source}', f'--config.data.train_files={corpus}',
                      f'--config.data.cache_dir={tmp_path / "cache"}', '--config.num_train_steps=1')
    assert_one_line_error(result, pattern)
    assert not workdir.exists() and not (tmp_path / 'cache').exists()


def test_a_reranker_exports_as_a_cross_encoder_that_scores_as_predict(modernbert, tmp_path):
  """A ModernBERT-shaped reranker ([CLS] q [SEP] p [SEP], no token types; its head the import's: dense, GELU,
  LayerNorm on [CLS], then the classifier) exports as ModernBertForSequenceClassification, which
  sentence-transformers' CrossEncoder loads and scores as predict.py."""
  pytest.importorskip('sentence_transformers')
  assert_reranker_exports_score_as_predict(modernbert, tmp_path, 'ModernBertForSequenceClassification')


def test_a_transformers_reranker_reranks_in_the_two_stage_command(modernbert, tmp_path):
  """A one-logit ModernBertForSequenceClassification started by transformers from the masked-LM checkpoint (its head
  the MLM head's dense and LayerNorm, a random classifier) imports and experiments/rerank.py scores its pairs as
  transformers; with classifier_pooling='mean' (a mean over tokens that bert_jax's classifier does not compute) the
  command refuses it in one line."""
  directory = str(tmp_path / 'hf')
  shutil.copytree(modernbert, directory)
  model = transformers.ModernBertForSequenceClassification.from_pretrained(modernbert, num_labels=1)
  model.save_pretrained(directory)
  result = assert_hf_reranker_reranks_as_transformers(directory, tmp_path)
  assert result['pairs'] == 40
  # export_hf.py writes it again as the same classifier (the same tensors; its tokenizer)
  again = run_main('export_hf.py', f'--checkpoint={directory}', f'--output={tmp_path / "again"}')
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.loads(again.stdout.strip().splitlines()[-1])['architecture'] == 'ModernBertForSequenceClassification'
  original, exported = (st_numpy.load_file(os.path.join(d, 'model.safetensors')) for d in (directory, tmp_path / 'again'))
  assert sorted(original) == sorted(exported) and all(np.array_equal(original[k], exported[k]) for k in original)
  with open(os.path.join(directory, 'config.json'), encoding='utf-8') as f:
    config = json.load(f)
  with open(os.path.join(directory, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({**config, 'classifier_pooling': 'mean'}, f)
  beir_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))), 'data', 'samples', 'retrieval', 'beir')
  assert_one_line_error(run_main('rerank.py', f'--first_stage={tmp_path / "first.trec"}', f'--reranker={directory}',
                                 f'--beir_dir={beir_dir}'), "classifier_pooling='mean'; bert_jax's sequence classifier")
