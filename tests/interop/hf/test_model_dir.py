"""A Hugging Face directory's safetensors files: a truncated or garbled one is refused from its header
(`model_dir.check_weights`), and a run starting from it says so in one line before it writes anything."""

import json
import os
import shutil

import pytest

from bert_jax.errors import CheckpointError
from bert_jax.interop.hf import model_dir

from harness.digests import tree_digest
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import write_retrieval_data, write_small_corpus


def _truncated(checkpoint: str, directory) -> str:
  """A copy of `checkpoint` whose model.safetensors lost all but its first 10,000 bytes (a broken download)."""
  shutil.copytree(checkpoint, directory)
  path = os.path.join(directory, model_dir.WEIGHTS_FILE)
  with open(path, 'rb') as f:
    head = f.read(10_000)
  with open(path, 'wb') as f:
    f.write(head)
  return str(directory)


def test_check_weights_reads_the_headers(tiny_checkpoint, tmp_path):
  model_dir.check_weights(tiny_checkpoint)  # whole
  broken = _truncated(tiny_checkpoint, tmp_path / 'truncated')
  with pytest.raises(CheckpointError, match='model.safetensors cannot be read as safetensors .*not fully covered'):
    model_dir.check_weights(broken)
  sharded = tmp_path / 'sharded'  # an index naming a shard that is not there
  sharded.mkdir()
  (sharded / model_dir.INDEX_FILE).write_text(json.dumps({'weight_map': {'a': 'model-00001-of-00002.safetensors'}}))
  with pytest.raises(CheckpointError, match='model-00001-of-00002.safetensors cannot be read as safetensors'):
    model_dir.check_weights(str(sharded))


@pytest.mark.parametrize('entry', ['pretrain', 'finetune', 'retrieval'])
def test_a_broken_init_checkpoint_is_one_error_line_and_nothing_written(entry, tiny_checkpoint, tmp_path):
  broken = _truncated(tiny_checkpoint, tmp_path / 'broken')
  out = tmp_path / 'out'
  out.mkdir()
  corpus = write_small_corpus(out)
  pairs, beir = write_retrieval_data(out)
  argv = {
      'pretrain': ['pretrain.py', '--config=experiments/configs/pretrain.py:tiny', f'--config.data.train_files={corpus}',
                   f'--config.data.cache_dir={out}/cache', '--config.num_train_steps=1'],
      'finetune': ['finetune.py', '--config=experiments/configs/finetune.py:sst2', '--config.num_train_steps=1'],
      'retrieval': ['finetune.py', '--config=experiments/configs/finetune.py:retrieval', f'--config.train_file={pairs}',
                    f'--config.beir_dir={beir}', '--config.num_train_steps=1'],
  }[entry]
  before = tree_digest(tmp_path)
  result = run_main(*argv, f'--workdir={out}/runs/{entry}', f'--config.init_checkpoint={broken}')
  assert_one_line_error(result, f'{broken}/model.safetensors cannot be read as safetensors')
  assert tree_digest(tmp_path) == before and not os.path.exists(out / 'runs')
