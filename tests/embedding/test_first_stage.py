"""The first stage of a two-stage retrieval: an embedding model embeds as the encoder tools do, and a TREC run file
ranks as the model it was written from."""

import numpy as np
import pytest

from bert_jax.embedding import beir, first_stage, trec
from bert_jax.errors import DataError


@pytest.mark.slow
def test_the_first_stage_embeds_as_the_encoder_tools_do(retrieval_workdir):
  from bert_jax import inference  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import pretrained  # pylint: disable=g-import-not-at-top
  texts = ['what is the apple?', 'the river is described here in detail ' * 3, 'x']
  ours = first_stage.embedder(retrieval_workdir, batch_size=2)(texts)
  model = pretrained.load_encoder(retrieval_workdir)
  settings = inference.embedding_settings(retrieval_workdir, model)
  theirs = inference.embed(model, [(t, None) for t in texts], max_length=settings.max_seq_length, batch_size=4,
                           pooling=settings.pooling, normalize=True, sentence_only=True)['sentence_embedding']
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.slow
def test_a_run_file_ranks_as_the_model_it_was_written_from(retrieval_workdir, tmp_path):
  """A run written from the embedding model's retrieval, read back as the first stage: the same ranking."""
  import os  # pylint: disable=g-import-not-at-top
  data = beir.read_beir(os.path.join(os.path.dirname(retrieval_workdir), 'data', 'beir'))
  ids, scores = first_stage.retrieve(retrieval_workdir, data, 5, batch_size=4)
  trec.write_run(str(tmp_path / 'run.trec.gz'), data, ids, scores)
  np.testing.assert_array_equal(first_stage.ranking(str(tmp_path / 'run.trec.gz'), data, 5, 4), ids)
  np.testing.assert_array_equal(first_stage.ranking(retrieval_workdir, data, 5, 4), ids)


def test_a_first_stage_that_is_neither_a_directory_nor_a_file_is_one_error(tmp_path):
  with pytest.raises(DataError, match=r'first_stage .*nothing does not exist; give an embedding model directory .* '
                     'or a TREC run file'):
    first_stage.check(str(tmp_path / 'nothing'))
  first_stage.check(str(tmp_path))
  assert not first_stage.is_run_file(str(tmp_path))
