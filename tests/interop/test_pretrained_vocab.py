"""A tokenizer with more tokens than the model has embeddings: its extra ids would embed as NaN, silently, so every
entry point refuses it at load in one `error:` line, before anything is written (`pretrained.check_tokenizer`)."""

import json
import os
import pathlib
import shutil

import pytest

from bert_jax.data.tokenization import load_tokenizer
from bert_jax.errors import CheckpointError
from bert_jax.interop import pretrained

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import minilm_dir_or_skip, write_retrieval_data, write_small_corpus

EXTRA = 200  # tokens added past MiniLM's 30,522 embeddings
_WORDS = ('hello', 'extratok5', 'extratok7')


def _add_tokens(directory: str) -> None:
  """Adds EXTRA WordPiece tokens (extratok0, ...) to the tokenizer.json and vocab.txt in `directory`."""
  path = os.path.join(directory, 'tokenizer.json')
  with open(path, encoding='utf-8') as f:
    spec = json.load(f)
  vocab = spec['model']['vocab']
  start = len(vocab)
  vocab.update({f'extratok{i}': start + i for i in range(EXTRA)})
  os.remove(path)  # a copy, never the package's file through a link
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(spec, f)
  vocab_txt = os.path.join(directory, 'vocab.txt')
  if os.path.exists(vocab_txt):
    with open(vocab_txt, encoding='utf-8') as f:
      lines = f.read()
    os.remove(vocab_txt)
    with open(vocab_txt, 'w', encoding='utf-8') as f:
      f.write(lines + ''.join(f'extratok{i}\n' for i in range(EXTRA)))


@pytest.fixture(scope='module')
def larger_tokenizer(tmp_path_factory):
  """all-MiniLM-L6-v2 (its weights linked) whose tokenizer has EXTRA more tokens than its 30,522 embeddings."""
  source = minilm_dir_or_skip()
  directory = tmp_path_factory.mktemp('vocab') / 'minilm_larger_tokenizer'
  shutil.copytree(source, directory, copy_function=os.symlink)
  _add_tokens(str(directory))
  return str(directory)


@pytest.fixture(scope='module')
def larger_workdir(finetuned_workdir, tmp_path_factory):
  """A copy of the shared fine-tuning run (MiniLM's vocabulary) whose own tokenizer has EXTRA more tokens."""
  directory = tmp_path_factory.mktemp('vocab') / 'sst2_larger_tokenizer'
  shutil.copytree(finetuned_workdir, directory)
  _add_tokens(str(directory))
  return str(directory)


def test_the_extra_ids_are_past_the_embedding_table(larger_tokenizer):
  tokenizer = load_tokenizer(larger_tokenizer)
  model = pretrained.describe(larger_tokenizer).model
  assert tokenizer.vocab_size == model.vocab_size + EXTRA
  ids = tokenizer.encode(' '.join(_WORDS))
  assert [i >= model.vocab_size for i in ids] == [False, True, True]  # 30527 and 30529: NaN rows, unchecked
  with pytest.raises(CheckpointError, match=f'has {model.vocab_size + EXTRA} tokens but the model only '
                                            f'{model.vocab_size} embeddings'):
    pretrained.load_encoder(larger_tokenizer)


def _entry_points(checkpoint: str, out: str) -> dict[str, list[str]]:
  texts = os.path.join(out, 'texts.txt')
  return {
      'embed': ['embed.py', f'--checkpoint={checkpoint}', f'--input={texts}', f'--output={out}/emb.npz'],
      'attention': ['attention.py', f'--checkpoint={checkpoint}', f'--text={" ".join(_WORDS)}', f'--output={out}/att'],
      'fill_mask': ['fill_mask.py', f'--checkpoint={checkpoint}', '--text=hello [MASK] extratok5'],
      'export': ['export_hf.py', f'--checkpoint={checkpoint}', f'--output={out}/hf'],
      'finetune': ['finetune.py', '--config=experiments/configs/finetune.py:sst2', f'--workdir={out}/ft',
                   f'--config.init_checkpoint={checkpoint}', '--config.num_train_steps=1'],
      'retrieval': ['finetune.py', '--config=experiments/configs/finetune.py:retrieval', f'--workdir={out}/rt',
                    f'--config.init_checkpoint={checkpoint}', f'--config.train_file={out}/pairs.jsonl',
                    f'--config.beir_dir={out}/beir', '--config.num_train_steps=1'],
      'pretrain': ['pretrain.py', '--config=experiments/configs/pretrain.py:tiny', f'--workdir={out}/pt',
                   f'--config.init_checkpoint={checkpoint}', f'--config.data.train_files={out}/corpus.txt',
                   f'--config.data.cache_dir={out}/cache', '--config.num_train_steps=1'],
  }


def _assert_refused(argv, out, checkpoint, pattern):
  with open(os.path.join(out, 'texts.txt'), 'w', encoding='utf-8') as f:
    f.write(' '.join(_WORDS) + '\nplain text\n')
  write_small_corpus(out)
  write_retrieval_data(pathlib.Path(out))
  before = tree_digest(out), tree_digest(checkpoint)
  result = run_main(*argv)
  assert_one_line_error(result, pattern)
  assert (tree_digest(out), tree_digest(checkpoint)) == before


@pytest.mark.parametrize('entry', ['embed', 'attention', 'fill_mask', 'export', 'finetune', 'retrieval',
                                   'pretrain'])
def test_a_hugging_face_directory_is_refused_by_every_entry_point(entry, larger_tokenizer, tmp_path):
  out = str(tmp_path)
  _assert_refused(_entry_points(larger_tokenizer, out)[entry], out, larger_tokenizer,
                  f'{larger_tokenizer}: its tokenizer {larger_tokenizer}/tokenizer.json has 30722 tokens but the '
                  'model only 30522 embeddings')


@pytest.mark.parametrize('entry', ['embed', 'attention', 'export', 'predict', 'evaluate', 'finetune', 'pretrain'])
def test_a_workdir_whose_tokenizer_is_larger_is_refused(entry, larger_workdir, tmp_path):
  out = str(tmp_path)
  argv = {**_entry_points(larger_workdir, out),
          'predict': ['predict.py', f'--workdir={larger_workdir}', '--text=hello extratok5'],
          'evaluate': ['evaluate.py', f'--workdir={larger_workdir}', f'--output_dir={out}/eval']}[entry]
  _assert_refused(argv, out, larger_workdir, f'{larger_workdir}: its tokenizer {larger_workdir}/tokenizer.json has '
                  '30722 tokens but the model only 30522 embeddings')
