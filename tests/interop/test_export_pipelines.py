"""transformers' pipelines on exported tiny models give bert_jax's own outputs.

A tiny pretraining workdir with its SentencePiece tokenizer is fine-tuned briefly on SST-2 and SQuAD, the tiny
WordPiece checkpoint (MiniLM's vocabulary) on CoNLL-2003 and SST-2; each is exported with experiments/export_hf.py and
run through pipeline('fill-mask' / 'text-classification' / 'token-classification' / 'question-answering'). The
reference is the library itself on the same texts: `inference.fill_mask`, and the logits of
`FinetunedBert.head_model()` on `encode_inputs` ids (SQuAD: `squad.featurize`), turned into what each pipeline reports.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import inference
from bert_jax.finetuning import finetune_run as finetuning
from bert_jax.finetuning.tasks import conll, squad
from bert_jax.interop.families import bert
from bert_jax.interop.pretrained import load_finetuned, load_pretrained

from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import finetune_config, head_of_task_file as _head, shared_data_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.e2e,
              pytest.mark.filterwarnings('ignore::DeprecationWarning:transformers.*')]  # its numpy 2 copy= notes
transformers = pytest.importorskip('transformers')
pytest.importorskip('torch')
TOL = 1e-5  # probabilities: float32 JAX on CPU against float32 PyTorch

SENTENCES = ['a charming and often affecting journey .', 'unflinchingly bleak and desperate',
             'The movie was not good, but the actors were great!', 'Crème brûlée at the Café Ångström: 3.14 stars.',
             'an EXTRAORDINARILY long-winded, over-the-top melodrama (2002)']


@pytest.fixture(scope='module')
def sp_workdir(pretrained_run):
  """A tiny pretraining workdir with the SentencePiece tokenizer it trained (1000 pieces, lower-casing): the shared
  read-only run (conftest), which the tests here export and fine-tune from, never into."""
  return pretrained_run.workdir


def _export(source, out, *flags):
  """experiments/export_hf.py in this process (its flags, result line and exit code; no process boundary is tested
  here, and a subprocess would pay for importing jax and compiling again)."""
  result = run_main('export_hf.py', f'--checkpoint={source}', f'--output={out}', *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _finetune(task, init, workdir, train_file='', eval_file='', data_dir='', **fields):
  """A few steps of fine-tuning (small train and eval files: the evaluation is not what is tested)."""
  fields = {**dict(max_seq_length=64, batch_size=16, eval_batch_size=32, learning_rate=1e-3, num_train_steps=4,
                   max_train_samples=32, log_every=2), **fields}
  cfg = finetune_config(task=task, init_checkpoint=init, data_dir=data_dir, train_file=train_file, eval_file=eval_file,
                        **fields)
  finetuning.finetune(cfg, workdir)
  return load_finetuned(workdir)


def _sst2(init, workdir, tmp, **fields):
  data = shared_data_or_skip('sst2')
  return _finetune('sst2', init, workdir, _head(os.path.join(data, 'train.tsv'), 64, tmp),
                   _head(os.path.join(data, 'dev.tsv'), 32, tmp), **fields)


def _logits(tuned, pairs):
  """The head model's float32 logits of each (text_a, text_b) as bert_jax tokenizes it (no truncation)."""
  rows = [tuned.tokenizer.encode_inputs(a, b, max_length=tuned.config.max_position_embeddings)[:2] for a, b in pairs]
  return _model_logits(tuned.head_model(), rows)


def _softmax(x: np.ndarray) -> np.ndarray:
  """A softmax over the last axis in numpy, as the pipelines compute theirs: jax's, called eagerly, compiled again
  for each row length (143 programs in the question-answering test)."""
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def _model_logits(model, rows):
  """The head model's float32 logits of each (ids, token types) row, each as long as its row (token and span heads).

  One call for all rows, padded with [PAD] (id 0) to the longest: the model attends to the non-[PAD] tokens only, so
  a row's logits are its own, and the eager model's ops compile for one shape rather than once per length (seconds a
  text)."""
  ids, types = np.zeros((2, len(rows), max(len(r[0]) for r in rows)), np.int32)
  for i, (row_ids, row_types) in enumerate(rows):
    ids[i, :len(row_ids)], types[i, :len(row_types)] = row_ids, row_types
  logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(types)), np.float32)
  return [x if x.ndim == 1 else x[:len(row_ids)] for x, (row_ids, _) in zip(logits, rows)]


def test_fill_mask_pipeline_on_an_exported_sentencepiece_workdir(sp_workdir, tmp_path):
  out = str(tmp_path / 'hf')
  line = _export(sp_workdir, out)
  assert line['architecture'] == 'BertForPreTraining' and line['tokenizer'] == 'SentencePieceTokenizer'
  fill = transformers.pipeline('fill-mask', model=out, top_k=5)
  pretrained = load_pretrained(sp_workdir)
  worst = 0.0
  for text in ['the [MASK] of the song was released .', 'In 1998 , the [MASK] won the cup in [MASK] .',
               'Crème brûlée and [MASK] at the café']:
    theirs = fill(text)
    theirs = [theirs] if isinstance(theirs[0], dict) else theirs  # one list per [MASK]
    ours = inference.fill_mask(pretrained, text, top_k=5)
    assert len(theirs) == len(ours) == text.count('[MASK]')
    for their_top, our_top in zip(theirs, ours):
      assert [t['token'] for t in their_top] == [pretrained.tokenizer.token_to_id(tok) for tok, _ in our_top], text
      diff = np.abs(np.array([t['score'] for t in their_top]) - [p for _, p in our_top]).max()
      worst = max(worst, float(diff))
      assert diff <= TOL
      words = [(t['token_str'], pretrained.tokenizer.decode([t['token']])) for t in their_top if t['token'] >= 5]
      assert all(a == b for a, b in words), words  # a piece's text ([CLS]... decode to '' in bert_jax)
  print(f'fill-mask: top-5 ids equal, max |probability difference| {worst:.2e}')


def _sst2_exported(init, tmp):
  """SST-2 fine-tuned for 4 steps from `init` in tmp/sst2 and exported to tmp/hf: (workdir, export, FinetunedBert)."""
  workdir, out = str(tmp / 'sst2'), str(tmp / 'hf')
  tuned = _sst2(init, workdir, tmp)
  line = _export(workdir, out)
  assert (line['architecture'], line['kind'], line['task'], line['seed']) == (
      'BertForSequenceClassification', 'classification', 'sst2', 0)
  return workdir, out, tuned


# Fine-tuned and exported once per module, read (never written) by the tests that take them: the text-classification
# pipeline test, and for the WordPiece one the export refusals too (a fine-tuning and an export each fewer).
@pytest.fixture(scope='module')
def sst2_sentencepiece(sp_workdir, tmp_path_factory):
  return _sst2_exported(sp_workdir, tmp_path_factory.mktemp('sst2_sentencepiece'))


@pytest.fixture(scope='module')
def sst2_wordpiece(tiny_checkpoint, tmp_path_factory):
  return _sst2_exported(tiny_checkpoint, tmp_path_factory.mktemp('sst2_wordpiece'))


@pytest.mark.parametrize('init', ['sentencepiece', 'wordpiece'])
def test_text_classification_pipeline(init, request, tmp_path):
  workdir, out, tuned = request.getfixturevalue(f'sst2_{init}')
  classify = transformers.pipeline('text-classification', model=out, top_k=None)
  labels = tuned.task['label_names']
  assert transformers.AutoConfig.from_pretrained(out).id2label == dict(enumerate(labels))
  pairs = [(s, None) for s in SENTENCES] + [(SENTENCES[0], SENTENCES[1])]
  theirs = classify(SENTENCES) + [classify({'text': SENTENCES[0], 'text_pair': SENTENCES[1]})]
  worst = 0.0
  for logits, scores in zip(_logits(tuned, pairs), theirs):
    probs = _softmax(logits)
    assert {s['label']: s['score'] for s in scores}.keys() == set(labels)
    worst = max(worst, float(np.abs(np.array([{s['label']: s['score'] for s in scores}[n] for n in labels])
                                    - probs).max()))
    assert worst <= TOL
    assert scores[0]['label'] == labels[int(np.argmax(probs))]
  print(f'text-classification ({init}): labels equal, max |probability difference| {worst:.2e}')
  # predict.py on the workdir gives the pipeline's labels and probabilities.
  texts = tmp_path / 'texts.txt'
  texts.write_text('\n'.join(SENTENCES) + '\n', encoding='utf-8')
  result = run_main('predict.py', f'--workdir={workdir}', f'--input={texts}')
  assert result.returncode == 0, result.stderr[-3000:]
  predicted = [json.loads(line) for line in result.stdout.strip().splitlines()]
  assert [p['text'] for p in predicted] == list(SENTENCES)
  for p, scores in zip(predicted, theirs):
    assert p['label'] == scores[0]['label']
    for s in scores:
      assert abs(p['probabilities'][s['label']] - s['score']) <= TOL


def test_token_classification_pipeline(tiny_checkpoint, tmp_path):
  data = shared_data_or_skip('conll2003')
  tuned = _finetune('conll2003', tiny_checkpoint, str(tmp_path / 'conll'), _head(os.path.join(data, conll.TRAIN_FILE),
                    64, tmp_path), _head(os.path.join(data, conll.DEV_FILE), 16, tmp_path), learning_rate=5e-3,
                    num_train_steps=8)
  out = str(tmp_path / 'hf')
  assert _export(str(tmp_path / 'conll'), out)['architecture'] == 'BertForTokenClassification'
  tag = transformers.pipeline('token-classification', model=out, ignore_labels=[])
  sentences = [' '.join(words) for words, _ in conll.read_conll(
      os.path.join(shared_data_or_skip('conll2003'), conll.DEV_FILE))[:20]] + SENTENCES
  worst, tokens = 0.0, 0
  for text, logits in zip(sentences, _logits(tuned, [(s, None) for s in sentences])):
    probs = _softmax(logits)[1:-1]  # [CLS] and [SEP] are not reported
    theirs = tag(text)
    assert [t['index'] for t in theirs] == list(range(1, len(probs) + 1)), text
    assert [t['entity'] for t in theirs] == [conll.LABELS[i] for i in probs.argmax(-1)], text
    worst, tokens = max(worst, float(np.abs(np.array([t['score'] for t in theirs]) - probs.max(-1)).max())), \
        tokens + len(theirs)
    assert worst <= TOL
  print(f'token-classification: {tokens} tokens, tags equal, max |score difference| {worst:.2e}')


def test_question_answering_pipeline(sp_workdir, tmp_path):
  """Answers of the pipeline equal the best span of bert_jax's logits under the pipeline's rule: start and end
  probabilities (a softmax over the context tokens and [CLS], [CLS] then zeroed), the best product with end >= start
  and at most max_answer_len tokens. Contexts short enough for one window, so windows cannot differ."""
  if 'question-answering' not in transformers.pipelines.SUPPORTED_TASKS:
    pytest.skip(f'transformers {transformers.__version__} has no question-answering pipeline (removed in 5.3); '
                'tests/requirements.txt pins 5.2.0')
  tuned = _finetune('squad', sp_workdir, str(tmp_path / 'squad'), data_dir=shared_data_or_skip('squad-v1.1'),
                    max_seq_length=128, doc_stride=32, train_articles=1, eval_articles=1, num_train_steps=4)
  out = str(tmp_path / 'hf')
  assert _export(str(tmp_path / 'squad'), out)['architecture'] == 'BertForQuestionAnswering'
  max_answer_len, max_seq_len = 15, tuned.config.max_position_embeddings
  answer = transformers.pipeline('question-answering', model=out)
  examples = squad.articles_to_examples(squad.read_articles(
      os.path.join(shared_data_or_skip('squad-v1.1'), 'dev-v1.1.json'))[:1])[:25]
  features, offsets = squad.featurize(examples, tuned.tokenizer, max_seq_length=max_seq_len, doc_stride=128,
                                      max_query_length=64, train=False)
  assert len(features) == len(examples)  # one window each
  all_logits = _model_logits(tuned.head_model(), [(f.input_ids, f.token_type_ids) for f in features])
  worst = 0.0
  for example, logits, offs in zip(examples, all_logits, offsets):
    allowed = np.array([o is not None for o in offs])
    allowed[0] = True  # the pipeline keeps [CLS] in the softmax, then zeroes it
    probs = [_softmax(np.where(allowed, logits[:, k], -10000.0)) for k in (0, 1)]
    for p in probs:
      p[0] = 0.0
    span = np.triu(np.outer(*probs)) * np.tril(np.ones((len(offs),) * 2), max_answer_len - 1)
    span[~allowed] = span[:, ~allowed] = 0
    s, e = np.unravel_index(np.argmax(span), span.shape)
    # align_to_words=False: the span's own tokens (by default the pipeline widens it to whole words).
    theirs = answer(question=example.question, context=example.context, max_answer_len=max_answer_len,
                    max_seq_len=max_seq_len, align_to_words=False)
    # A SentencePiece word's first piece covers the space before it ('▁' stands for it): strip that.
    assert theirs['answer'].strip() == example.context[offs[s][0]:offs[e][1]], example.question
    worst = max(worst, abs(theirs['score'] - float(span[s, e])))
    assert worst <= TOL
    assert example.context[theirs['start']:theirs['end']] == theirs['answer']
  print(f'question-answering: {len(examples)} answers equal, max |score difference| {worst:.2e}')


def test_export_refuses_bad_fine_tuning_input(sst2_wordpiece, tiny_checkpoint, tmp_path):
  workdir, exported, _ = sst2_wordpiece  # fine-tuned for 4 steps: one checkpoint, of step 4
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={tmp_path / "a"}',
                                 '--seed=3'), 'has no seed 3 (it has seed_0)')
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={tmp_path / "b"}',
                                 '--step=1'), 'no checkpoint for step 1')
  assert_one_line_error(run_main('export_hf.py', f'--checkpoint={tiny_checkpoint}',
                                 f'--output={tmp_path / "c"}', '--seed=0'), '--seed applies to fine-tuning')
  assert not any(os.path.exists(tmp_path / name) for name in 'abc')
  # An exported fine-tuned model (the fixture's) re-exports with its head; bert_jax reads its encoder as a
  # pretrained BERT.
  line = _export(exported, str(tmp_path / 'again'))
  assert (line['architecture'], line['source']) == ('BertForSequenceClassification', 'hf')
  assert set(load_pretrained(str(tmp_path / 'again')).params) == {'bert'}
  assert bert.read_hf_task(str(tmp_path / 'again')) == bert.read_hf_task(exported)
