"""Your own token classification files (bert_jax/finetuning/tasks/tagging.py): JSONL rows of words and tags or
CoNLL columns, tags named as written, entity F1 for chunk tags and token accuracy otherwise; bad input is one
DataError naming the file and line; fine-tuned in process, predicted and exported with the tag names."""

import json
import os

import numpy as np
import pytest

from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import get_task, tagging
from bert_jax.finetuning.tasks.base import EvalSet

# Sentences with people and places (BIO), for the end-to-end run: a person's name follows "met", a place "in".
_PEOPLE = ['Anna', 'Bruno', 'Chen', 'Dara', 'Emil']
_PLACES = ['Paris', 'Oslo', 'Lima', 'Quito', 'Rome']


def _sentences(n: int):
  out = []
  for i in range(n):
    person, place = _PEOPLE[i % 5], _PLACES[(i * 2) % 5]
    words = ['we', 'met', person, 'in', place, 'on', 'monday']
    tags = ['O', 'O', 'B-PER', 'O', 'B-LOC', 'O', 'O']
    if i % 3 == 0:
      words[2:3], tags[2:3] = [person, 'Smith'], ['B-PER', 'I-PER']
    out.append((words, tags))
  return out


def _jsonl(path, sentences, words_key='tokens', tags_key='tags'):
  path.write_text(''.join(json.dumps({words_key: w, tags_key: t}) + '\n' for w, t in sentences), encoding='utf-8')
  return str(path)


def test_jsonl_and_conll_columns_read_the_same_sentences(tmp_path):
  sentences = _sentences(4)
  conll = tmp_path / 'train.conll'
  conll.write_text('-DOCSTART- O\n\n' + '\n\n'.join('\n'.join(f'{w} X {t}' for w, t in zip(*s)) for s in sentences)
                   + '\n', encoding='utf-8')
  from_jsonl = tagging.read_sentences(_jsonl(tmp_path / 'train.jsonl', sentences), 'text', 'label')
  from_conll = tagging.read_sentences(str(conll), 'text', 'label')
  assert [(r.text, r.label) for r in from_jsonl] == [(r.text, r.label) for r in from_conll] == sentences
  named = tagging.read_sentences(_jsonl(tmp_path / 'named.jsonl', sentences, 'w', 't'), 'w', 't')
  assert [(r.text, r.label) for r in named] == sentences


def test_tags_are_named_as_written_o_first():
  assert tagging.sorted_tags(['I-PER', 'O', 'B-LOC', 'B-PER', 'O']) == ['O', 'B-LOC', 'B-PER', 'I-PER']
  assert tagging.is_chunked(['O', 'B-LOC', 'I-LOC']) and not tagging.is_chunked(['NOUN', 'VERB'])


@pytest.mark.parametrize('rows,pattern', [
    ([{'tokens': ['a', 'b'], 'tags': ['O']}], r'bad\.jsonl:1: 2 words but 1 tags'),
    ([{'tokens': ['a'], 'tags': ['O']}, {'tokens': 'a b', 'tags': ['O', 'O']}],
     r"bad\.jsonl:2: 'tokens' must be a non-empty list"),
    ([{'words_here': ['a'], 'tags': ['O']}], r"bad\.jsonl:1: no column 'text'; the file has 'words_here', 'tags'"),
])
def test_bad_rows_name_the_file_and_line(tmp_path, rows, pattern):
  path = tmp_path / 'bad.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  with pytest.raises(DataError, match=pattern):
    tagging.read_sentences(str(path), 'text', 'label')


def test_an_eval_tag_unseen_in_training_is_one_error(tmp_path, wordpiece):
  from harness.inputs import finetune_config  # pylint: disable=g-import-not-at-top
  train = _jsonl(tmp_path / 'train.jsonl', _sentences(3))
  dev = _jsonl(tmp_path / 'dev.jsonl', [(['in', 'Rome'], ['O', 'B-GPE'])])
  task = get_task('tag')
  cfg = finetune_config(task='tag', train_file=train, eval_file=dev, max_seq_length=32)
  assert len(task.train_features(cfg, wordpiece)) == 3 and task.main_metric == 'f1'
  with pytest.raises(DataError, match=r"dev\.jsonl:1: tag 'B-GPE' never appears in the training file"):
    task.eval_sets(cfg, wordpiece)


def test_scores_are_entity_f1_for_chunk_tags_and_token_accuracy_otherwise(tmp_path, wordpiece):
  from harness.inputs import finetune_config  # pylint: disable=g-import-not-at-top
  for sentences, main in ((_sentences(2), 'f1'), ([(['run', 'fast'], ['VERB', 'ADV'])] * 2, 'token_accuracy')):
    path = _jsonl(tmp_path / f'{main}.jsonl', sentences)
    task = get_task('tag')
    cfg = finetune_config(task='tag', train_file=path, eval_file=path, max_seq_length=32)
    task.train_features(cfg, wordpiece)
    (dev,) = task.eval_sets(cfg, wordpiece)
    gold = [np.eye(task.num_labels)[np.maximum(f.token_labels, 0)] for f in dev.features]  # logits = one-hot gold
    result = task.evaluate(EvalSet('dev', dev.features, dev.data), gold, None)
    assert task.main_metric == main and result[main] == 1.0 and result['token_accuracy'] == 1.0


@pytest.mark.slow
def test_own_tags_fine_tune_predict_and_export_by_name(tiny_checkpoint, tmp_path):
  """A JSONL of tagged sentences: trained in process, its tag names recorded, predicted and exported by name."""
  transformers = pytest.importorskip('transformers')
  from harness.entry_points import finetune_own_file, run_main  # pylint: disable=g-import-not-at-top
  workdir, export = tmp_path / 'work', tmp_path / 'hf'
  result = finetune_own_file('tag', workdir, tiny_checkpoint, _jsonl(tmp_path / 'train.jsonl', _sentences(20)))
  assert result['main_metric'] == 'dev_f1' and 0 <= result['dev_token_accuracy'] <= 1
  names = ['O', 'B-LOC', 'B-PER', 'I-PER']
  with open(workdir / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task'] == {'name': 'tag', 'kind': 'token', 'num_labels': 4, 'label_names': names}
  to_predict = _jsonl(tmp_path / 'new.jsonl', _sentences(2))
  predicted = run_main('predict.py', f'--workdir={workdir}', f'--input={to_predict}')
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  outputs = [json.loads(line) for line in predicted.stdout.strip().splitlines()]
  assert len(outputs) == 2 and all(set(o['tags']) <= set(names) for o in outputs)
  exported = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={export}')
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert transformers.AutoConfig.from_pretrained(str(export)).id2label == dict(enumerate(names))
  assert os.path.isfile(export / 'model.safetensors')
