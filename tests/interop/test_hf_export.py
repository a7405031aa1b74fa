"""Exports for transformers: SentencePiece models as a tokenizer.json with bert_jax's ids, and fine-tuned task heads
as BertForSequenceClassification / BertForTokenClassification / BertForQuestionAnswering with bert_jax's logits.

The end-to-end pipelines (fill-mask, text-, token-classification, question answering on trained tiny models) are in
test_export_pipelines.py.
"""

import json
import os

from flax import nnx, traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

from bert_jax import config
from bert_jax.data import tokenization as tk
from bert_jax.errors import CheckpointError, DataError
from bert_jax.interop import hf, hf_tokenizer
from bert_jax.model import heads

from harness.inputs import WIKITEXT

TOL = 1e-5
TEST_RAW = os.path.join(os.path.dirname(WIKITEXT), 'wiki.test.raw')


def _lines(path):
  with open(path, encoding='utf-8') as f:
    return [line.rstrip('\n') for line in f]


@pytest.fixture(scope='module', params=[True, False], ids=['lower_case', 'cased'])
def sentencepiece(request, tmp_path_factory):
  """A 1000-piece model trained on the WikiText-2 validation file, lower-casing or not."""
  path = str(tmp_path_factory.mktemp('spm') / 'sp.model')
  return tk.train_sentencepiece(_lines(WIKITEXT), path, 1000, lower_case=request.param)


def _tiny(vocab_size=1000, max_position_embeddings=512):
  cfg = config.preset('tiny', vocab_size=vocab_size, max_position_embeddings=max_position_embeddings)
  params = nnx.to_pure_dict(nnx.state(heads.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param))
  return cfg, jax.tree.map(np.asarray, params)


ODD_TEXTS = ['Crème brûlée at the Café Ångström, naïve façade', 'E\u0301COLE normale supe\u0301rieure (decomposed)',
             '東京都 北京 서울 カタカナ', '3.14159, 1,234,567 and 2024-01-31 at 12:30',
             'pneumonoultramicroscopicsilicovolcanoconiosis',
             'the [MASK] sat on the [MASK] .', '[CLS] literal specials [SEP] [PAD] [UNK]', '  spaces\tand\nnewlines  ',
             'non\u00a0breaking\u3000space', 'ＦＵＬＬ ｗｉｄｔｈ ﬁne', 'emoji 👍🏽 and 🇫🇷', '']


@pytest.mark.slow
def test_tokenizer_json_gives_bert_jax_ids_on_wikitext(sentencepiece, tmp_path):
  """Every line of WikiText-2 valid + test, alone and paired (their first 300 characters, truncated longest-first),
  and odd texts: the exported tokenizer.json (read by the `tokenizers` library, as transformers' fast tokenizer
  does) gives encode_inputs' ids."""
  cfg, params = _tiny()
  out = str(tmp_path / 'export')
  hf.save_hf_checkpoint(out, cfg, params, sentencepiece)
  assert {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'spiece.model'} <= set(os.listdir(out))
  fast = tokenizers.Tokenizer.from_file(os.path.join(out, 'tokenizer.json'))
  texts = _lines(WIKITEXT) + _lines(TEST_RAW) + ODD_TEXTS
  ours = [sentencepiece.encode_inputs(t, max_length=1 << 20)[:2] for t in texts]
  theirs = [(e.ids, e.type_ids) for e in fast.encode_batch(texts)]
  mismatched = [t for t, a, b in zip(texts, ours, theirs) if tuple(a) != b]
  assert not mismatched, (len(mismatched), mismatched[:3])
  fast.enable_truncation(48, strategy='longest_first')
  # Each text of a pair cut to 300 characters (still truncated: 2,353 of the 4,065 pairs): `tokenizers` computes
  # the overflow windows of whole paragraphs too, 4-5 s of the test's 5.5 s.
  pairs = [(a[:300], b[:300]) for a, b in zip(texts[::2], texts[1::2])]
  theirs = [(e.ids, e.type_ids) for e in fast.encode_batch(pairs)]
  for (a, b), got in zip(pairs, theirs):
    assert tuple(sentencepiece.encode_inputs(a, b, max_length=48)[:2]) == got, (a, b)
  # bert_jax reads its own model back (bit-exact), not the conversion.
  again = hf.load_hf_tokenizer(out)
  assert isinstance(again, tk.SentencePieceTokenizer) and again.serialized_model() == sentencepiece.serialized_model()
  assert isinstance(tk.load_tokenizer(out), tk.SentencePieceTokenizer)


@pytest.mark.slow
def test_transformers_autotokenizer_reads_the_export(sentencepiece, tmp_path):
  transformers = pytest.importorskip('transformers')
  cfg, params = _tiny()
  out = str(tmp_path / 'export')
  hf.save_hf_checkpoint(out, cfg, params, sentencepiece)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  assert tokenizer.is_fast and len(tokenizer) == sentencepiece.vocab_size == 1000
  assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
          tokenizer.mask_token_id) == (0, 1, 2, 3, 4)
  texts = _lines(WIKITEXT)[:400] + ODD_TEXTS
  batch = tokenizer(texts)
  for text, ids, types in zip(texts, batch['input_ids'], batch['token_type_ids']):
    assert (ids, types) == tuple(sentencepiece.encode_inputs(text, max_length=1 << 20)[:2]), text
  pair = tokenizer(texts[1], texts[3], truncation=True, max_length=40)
  assert (pair['input_ids'], pair['token_type_ids']) == tuple(
      sentencepiece.encode_inputs(texts[1], texts[3], max_length=40)[:2])
  words = 'the quick brown fox'
  assert tokenizer.decode(tokenizer(words)['input_ids'], skip_special_tokens=True) == sentencepiece.decode(
      sentencepiece.encode(words))


def _train_other_sentencepiece(path, **settings):
  """A SentencePiece model with bert_jax's special ids but `settings` (model_type, byte_fallback...) of its own."""
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_lines(WIKITEXT)[:800]), model_prefix=path, vocab_size=400, pad_id=0, pad_piece='[PAD]',
      unk_id=1, unk_piece='[UNK]', bos_id=-1, eos_id=-1, control_symbols=['[CLS]', '[SEP]', '[MASK]'], minloglevel=2,
      **settings)
  return tk.SentencePieceTokenizer(path + '.model')


@pytest.mark.parametrize('settings,reason', [(dict(model_type='bpe'), 'model_type BPE'),
                                             (dict(byte_fallback=True), 'byte_fallback'),
                                             (dict(user_defined_symbols=['<x>']), 'pieces of type USER_DEFINED'),
                                             (dict(remove_extra_whitespaces=False), 'remove_extra_whitespaces=false')])
def test_unconvertible_sentencepiece_models_are_refused(settings, reason, tmp_path):
  sp = _train_other_sentencepiece(str(tmp_path / 'other'), **settings)
  cfg, params = _tiny()
  with pytest.raises(DataError, match=f'cannot be exported as a transformers tokenizer.json .*{reason}') as e:
    hf.save_hf_checkpoint(str(tmp_path / 'out'), cfg, params, sp)
  assert '\n' not in str(e.value)
  assert not os.path.exists(tmp_path / 'out')  # nothing written


def test_a_conversion_that_differs_is_refused(sentencepiece, tmp_path):
  """check_exact catches a tokenizer.json that would give other ids (here: without the model's normalisation)."""
  fast = hf_tokenizer.sentencepiece_to_tokenizers(sentencepiece)
  spec = json.loads(fast.to_str())
  spec['normalizer']['normalizers'] = [n for n in spec['normalizer']['normalizers'] if n['type'] == 'Replace']
  with pytest.raises(DataError, match=r'gives other ids on \d+ of \d+ probe texts .*not exported') as e:
    hf_tokenizer.check_exact(sentencepiece, tokenizers.Tokenizer.from_str(json.dumps(spec)))
  assert '\n' not in str(e.value)
  hf_tokenizer.check_exact(sentencepiece, fast)


# ------------------------------------------------------------------------------------------------ task heads

TASKS = {
    'classification': dict(name='sst2', kind='classification', num_labels=3, label_names=['neg', 'neutral', 'pos']),
    'regression': dict(name='stsb', kind='regression', num_labels=1, label_names=[]),
    'token': dict(name='conll2003', kind='token', num_labels=4, label_names=['O', 'B-PER', 'I-PER', 'B-LOC']),
    'span': dict(name='squad', kind='span', num_labels=2, label_names=[]),
}
AUTO_CLASSES = {'classification': 'AutoModelForSequenceClassification',
                'regression': 'AutoModelForSequenceClassification',
                'token': 'AutoModelForTokenClassification', 'span': 'AutoModelForQuestionAnswering'}


def _head_params(kind, cfg, seed=0):
  """Random parameters of a head model (biases and LayerNorms too, so that a swapped tensor shows)."""
  task = TASKS[kind]
  model = heads.head_model(kind, cfg, task['num_labels'], rngs=nnx.Rngs(seed))
  params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(np.float32), params)


def _wordpiece(directory, words=('the', 'cat', 'sat', 'on', 'mat', '##s', '.', 'a', 'dog')):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(tk.SPECIAL_TOKENS + tuple(words)) + '\n')
  return tk.WordPieceTokenizer.from_directory(str(directory))


@pytest.mark.slow
@pytest.mark.parametrize('kind', list(TASKS))
def test_task_head_export_round_trip_and_transformers_logits(kind, tmp_path):
  cfg = config.preset('tiny', vocab_size=64, max_position_embeddings=40)
  params, task = _head_params(kind, cfg), TASKS[kind]
  out = str(tmp_path / kind)
  hf.save_hf_checkpoint(out, cfg, params, _wordpiece(tmp_path / 'vocab'), task=task)
  with open(os.path.join(out, hf.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  assert written['architectures'] == [hf.TASK_ARCHITECTURES[kind]] and written['finetuning_task'] == task['name']
  if kind != 'span':
    names = task['label_names'] or ['LABEL_0']
    assert written['id2label'] == {str(i): n for i, n in enumerate(names)}
    assert written['label2id'] == {n: i for i, n in enumerate(names)}
  assert written.get('problem_type') == {'classification': 'single_label_classification',
                                         'regression': 'regression'}.get(kind)
  assert hf.read_hf_task(out) == task

  cfg2, loaded, has_mlm, has_nsp = hf.load_hf_checkpoint(out)
  assert cfg2 == cfg and not has_mlm and not has_nsp
  flat, flat2 = traverse_util.flatten_dict(params), traverse_util.flatten_dict(loaded)
  assert flat.keys() == flat2.keys()
  for path, x in flat.items():
    if kind in ('token', 'span') and path[:2] == ('bert', 'pooler'):
      assert not np.any(flat2[path]), path  # transformers has no pooler there: not exported, read back as zeros
    else:
      assert np.array_equal(x, flat2[path]), path  # the head and the encoder: bit-exact

  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  model, info = getattr(transformers, AUTO_CLASSES[kind]).from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == hf.TASK_ARCHITECTURES[kind]
  assert not any(info.values()), info  # nothing missing, unexpected or mismatched
  rng = np.random.default_rng(1)
  ids = rng.integers(5, 64, (3, 12)).astype(np.int32)
  ids[1, 8:] = 0  # padding
  ids[2, 5:] = 0
  types = (np.arange(12)[None] >= 4).astype(np.int32) * (ids > 0)
  mask = (ids > 0).astype(np.int32)
  head_model = heads.head_model(kind, cfg, task['num_labels'], rngs=nnx.Rngs(1))
  state = nnx.state(head_model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(head_model, state)
  ours = np.asarray(head_model(jnp.asarray(ids), jnp.asarray(types)))  # attends to the non-[PAD] tokens
  with torch.no_grad():
    out_t = model.eval()(**{k: torch.from_numpy(v.astype(np.int64))
                            for k, v in dict(input_ids=ids, token_type_ids=types, attention_mask=mask).items()})
  if kind in ('classification', 'regression'):
    theirs = out_t.logits.numpy()
  elif kind == 'token':
    theirs, ours = out_t.logits.numpy()[mask == 1], ours[mask == 1]
  else:
    theirs = np.stack([out_t.start_logits.numpy(), out_t.end_logits.numpy()], -1)[mask == 1]
    ours = ours[mask == 1]
  assert np.abs(theirs - ours).max() <= TOL


def test_bad_task_exports_write_nothing(tmp_path):
  cfg = config.preset('tiny', vocab_size=64, max_position_embeddings=40)
  params = _head_params('classification', cfg)
  out = str(tmp_path / 'out')
  cases = [(None, 'params hold the task head classifier but no task was given'),
           (TASKS['span'], "a span model has the head 'qa_outputs' only, but params hold classifier"),
           ({**TASKS['classification'], 'label_names': ['a', 'b']}, 'task has 3 labels but 2 label names'),
           ({**TASKS['classification'], 'kind': 'ranking'}, "task kind 'ranking' is not one of"),
           ({**TASKS['classification'], 'num_labels': 5}, r'parameter classifier/kernel has shape \(64, 3\) but '
            r'the config implies \(64, 5\)')]
  for task, message in cases:
    if task is not None and task.get('num_labels') == 5:
      task = {**task, 'label_names': []}
    with pytest.raises(CheckpointError, match=message) as e:
      hf.save_hf_checkpoint(out, cfg, params, task=task)
    assert '\n' not in str(e.value)
    assert not os.path.exists(out)
  # A checkpoint whose classifier disagrees with its config's labels is refused on import.
  hf.save_hf_checkpoint(out, cfg, params, task=TASKS['classification'])
  with open(os.path.join(out, hf.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  written['id2label'] = {'0': 'a', '1': 'b'}
  with open(os.path.join(out, hf.CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump(written, f)
  with pytest.raises(CheckpointError, match='classifier.weight has 3 rows but config.json has 2 labels'):
    hf.load_hf_checkpoint(out)
