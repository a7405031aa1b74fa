"""Your own question answering files (bert_jax/finetuning/tasks/answering.py): SQuAD JSON or rows by column names,
answers as Hugging Face writes them or as texts found in the context, v2.0 scoring when a question has no answer,
a held-out split by context; bad input is one DataError naming the file and line; fine-tuned in process."""

import json

import pytest

from bert_jax.errors import DataError
from bert_jax.finetuning.tasks import answering, get_task
from harness.inputs import finetune_config

_ROWS = [
    {'question': 'Where was the game released?', 'context': 'The game was released in Japan in 1998.',
     'answers': {'text': ['Japan'], 'answer_start': [25]}},
    {'question': 'When was the game released?', 'context': 'The game was released in Japan in 1998.',
     'answers': ['1998']},
    {'question': 'Who wrote the song?', 'context': 'The song was written by Mary Jones for the film.',
     'answers': [{'text': 'Mary Jones', 'answer_start': 24}]},
    {'question': 'Which river runs through the town?', 'context': 'The Avon runs through the town from the north.',
     'answers': 'Avon'},
]


def _jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows), encoding='utf-8')
  return str(path)


def test_every_way_of_writing_answers_gives_the_same_spans(tmp_path):
  examples = answering.read_examples(_jsonl(tmp_path / 'qa.jsonl', _ROWS), finetune_config(task='qa'))
  assert [(e.answers, e.is_impossible) for e in examples] == [
      ([{'text': 'Japan', 'answer_start': 25}], False), ([{'text': '1998', 'answer_start': 34}], False),
      ([{'text': 'Mary Jones', 'answer_start': 24}], False), ([{'text': 'Avon', 'answer_start': 4}], False)]
  assert [e.id for e in examples] == ['1', '2', '3', '4']  # no id column: the line


def test_a_csv_under_its_own_columns_and_a_question_without_answer(tmp_path):
  path = tmp_path / 'qa.csv'
  path.write_text('q,passage,gold\n"Who wrote it?","It was written by Ann.","[""Ann""]"\n'
                  '"Who sang it?","It was written by Ann.",\n', encoding='utf-8')
  cfg = finetune_config(task='qa', text_column='q', text_pair_column='passage', label_column='gold')
  examples = answering.read_examples(str(path), cfg)
  assert [e.answers for e in examples] == [[{'text': 'Ann', 'answer_start': 18}], []]
  assert examples[1].is_impossible


def test_held_out_by_context_and_v2_when_unanswerable(tmp_path, wordpiece):
  rows = _ROWS + [{'question': 'Who directed it?', 'context': 'The song was written by Mary Jones for the film.',
                   'answers': []}]
  task = get_task('qa')
  cfg = finetune_config(task='qa', train_file=_jsonl(tmp_path / 'qa.jsonl', rows), eval_fraction=0.34,
                        max_seq_length=64, doc_stride=16)
  train, evals = task.examples(cfg)
  assert len(evals) in (1, 2, 3) and not {e.context for e in train} & {e.context for e in evals}
  assert task.version_2 and len(task.train_features(cfg, wordpiece)) >= len(train)
  assert task.eval_sets(cfg, wordpiece)[0].name == 'eval'


@pytest.mark.parametrize('row,pattern', [
    ({'question': 'Q?', 'context': 'Some context.', 'answers': ['missing']}, r"qa\.jsonl:1: answer 'missing' is not "
                                                                             r'in its context'),
    ({'question': 'Q?', 'context': 'Some context.', 'answers': [{'text': 'Some', 'answer_start': 3}]},
     r"qa\.jsonl:1: answer 'Some' is not in its context at character 3"),
    ({'question': '', 'context': 'Some context.', 'answers': []}, r"qa\.jsonl:1: 'question' must be a non-empty"),
    ({'query': 'Q?', 'context': 'Some context.', 'answers': []}, r"qa\.jsonl:1: no column 'text'; the file has"),
])
def test_bad_rows_name_the_file_and_line(tmp_path, row, pattern):
  with pytest.raises(DataError, match=pattern):
    answering.read_examples(_jsonl(tmp_path / 'qa.jsonl', [row]), finetune_config(task='qa'))


@pytest.mark.slow
def test_own_questions_fine_tune_and_evaluate(tiny_checkpoint, tmp_path):
  from harness.entry_points import run_main  # pylint: disable=g-import-not-at-top
  train = _jsonl(tmp_path / 'train.jsonl', _ROWS * 3)
  dev = _jsonl(tmp_path / 'dev.jsonl', _ROWS[:2])
  workdir = tmp_path / 'work'
  trained = run_main('finetune.py', '--config=experiments/configs/finetune.py:qa', f'--workdir={workdir}',
                     f'--config.init_checkpoint={tiny_checkpoint}', f'--config.train_file={train}',
                     f'--config.eval_file={dev}', '--config.num_train_steps=2', '--config.batch_size=8',
                     '--config.max_seq_length=64', '--config.doc_stride=16', '--config.eval_batch_size=8')
  assert trained.returncode == 0, trained.stderr[-3000:]
  result = json.loads(trained.stdout.strip().splitlines()[-1])
  assert result['main_metric'] == 'eval_f1' and 0 <= result['eval_exact_match'] <= 1
  with open(workdir / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['task']['name'] == 'qa'
  again = run_main('evaluate.py', f'--workdir={workdir}')
  assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])['eval_f1'] == result['eval_f1']
