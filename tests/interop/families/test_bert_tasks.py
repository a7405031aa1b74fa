"""Exports for transformers: fine-tuned task heads as BertForSequenceClassification / BertForTokenClassification /
BertForQuestionAnswering with bert_jax's logits (SentencePiece tokenizers: tests/interop/hf/test_tokenizer_json.py).

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

from bert_jax import config
from bert_jax.data import tokenization as tk
from bert_jax.errors import CheckpointError
from bert_jax.interop import families
from bert_jax.interop.families import bert
from bert_jax.interop.hf import model_dir
from bert_jax.model import heads

TOL = 1e-5

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
  families.save_hf_checkpoint(out, cfg, params, _wordpiece(tmp_path / 'vocab'), task=task)
  with open(os.path.join(out, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  assert written['architectures'] == [bert.TASK_ARCHITECTURES[kind]] and written['finetuning_task'] == task['name']
  if kind != 'span':
    names = task['label_names'] or ['LABEL_0']
    assert written['id2label'] == {str(i): n for i, n in enumerate(names)}
    assert written['label2id'] == {n: i for i, n in enumerate(names)}
  assert written.get('problem_type') == {'classification': 'single_label_classification',
                                         'regression': 'regression'}.get(kind)
  assert bert.read_hf_task(out) == task

  cfg2, loaded, has_mlm, has_nsp = families.load_hf_checkpoint(out)
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
  assert type(model).__name__ == bert.TASK_ARCHITECTURES[kind]
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
      families.save_hf_checkpoint(out, cfg, params, task=task)
    assert '\n' not in str(e.value)
    assert not os.path.exists(out)
  # A checkpoint whose classifier disagrees with its config's labels is refused on import.
  families.save_hf_checkpoint(out, cfg, params, task=TASKS['classification'])
  with open(os.path.join(out, model_dir.CONFIG_FILE), encoding='utf-8') as f:
    written = json.load(f)
  written['id2label'] = {'0': 'a', '1': 'b'}
  with open(os.path.join(out, model_dir.CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump(written, f)
  with pytest.raises(CheckpointError, match='classifier.weight has 3 rows but config.json has 2 labels'):
    families.load_hf_checkpoint(out)
