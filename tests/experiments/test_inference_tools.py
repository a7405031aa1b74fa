"""embed.py, fill_mask.py, attention.py smoke-run on a tiny pretrained workdir; bad input: one error line."""

import json

import numpy as np
import pytest

from bert_jax.embedding import quantization

# The entry points run in this process (their main: flags, output, exit code); no check here is about a process.
from harness.entry_points import assert_one_line_error, run_main as run
from harness.inputs import minilm_dir_or_skip
from harness.numerics import tolerance

pytestmark = pytest.mark.slow  # the entry points on trained workdirs

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def workdir(pretrained_run):
  """The shared tiny pretraining workdir (conftest.py: checkpoints, config.json, tokenizer.model), read-only."""
  return pretrained_run.workdir


def test_embed_writes_rows_in_input_order(workdir, tmp_path):
  texts = tmp_path / 'texts.txt'
  texts.write_text('A short line .\nThe first of a pair .\tIts second text .\n'
                   'A much longer line that has quite a few more words than the others do .\n',
                   encoding='utf-8')
  out = tmp_path / 'out' / 'emb.npz'
  summary = last_json(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}',
                          '--batch_size=2'))
  assert summary['output'] == str(out) and summary['num_texts'] == 3 and summary['shape'] == [3, 64]
  saved = np.load(out)
  assert set(saved.files) == {'input_ids', 'token_type_ids', 'attention_mask', 'last_hidden_state',
                              'pooler_output', 'sentence_embedding'}
  lengths = saved['attention_mask'].sum(1)
  assert lengths[2] == lengths.max() == saved['input_ids'].shape[1] and lengths[0] < lengths[2]
  assert saved['token_type_ids'][1].any() and not saved['token_type_ids'][[0, 2]].any()
  np.testing.assert_allclose(np.linalg.norm(saved['sentence_embedding'], axis=1), 1.0, rtol=tolerance(np.float32, 64))
  floats = saved['sentence_embedding']
  (tmp_path / 'float.npz').write_bytes(out.read_bytes())
  for precision, extra in (('int8', []), ('ubinary', []), ('uint8', [f'--calibration={tmp_path / "float.npz"}'])):
    summary = last_json(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}',
                            '--batch_size=2', f'--precision={precision}', *extra))
    saved = np.load(out)
    assert summary['precision'] == precision
    assert np.array_equal(saved['sentence_embedding'], quantization.quantize(floats, precision))
    assert ('quantization_ranges' in saved.files) == precision.endswith('int8')
  assert_one_line_error(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}',
                            '--precision=int8', f'--calibration={out}'), 'not float32')
  cls = last_json(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}',
                      '--pooling=cls', '--normalize=false', '--max_length=8'))
  saved = np.load(out)
  assert cls['max_tokens'] == 8 and saved['input_ids'].shape == (3, 8)
  np.testing.assert_array_equal(saved['sentence_embedding'], saved['last_hidden_state'][:, 0])


@pytest.mark.parametrize('content,pattern', [(None, 'does not exist'), ('\n\n', 'has no text')])
def test_embed_bad_input_file(workdir, tmp_path, content, pattern):
  texts = tmp_path / 'texts.txt'
  if content is not None:
    texts.write_text(content, encoding='utf-8')
  out = tmp_path / 'emb.npz'
  assert_one_line_error(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}', f'--output={out}'),
                        pattern)
  assert not out.exists()


def test_embed_max_length_above_positions(workdir, tmp_path):
  texts = tmp_path / 'texts.txt'
  texts.write_text('Hello .\n', encoding='utf-8')
  assert_one_line_error(run('embed.py', f'--checkpoint={workdir}', f'--input={texts}',
                            f'--output={tmp_path / "e.npz"}', '--max_length=1024'),
                        'exceeds the model\'s max_position_embeddings=512')


def test_fill_mask_prints_top_k_per_mask(workdir):
  result = run('fill_mask.py', f'--checkpoint={workdir}', '--text=The [MASK] was released in [MASK] .',
               '--top_k=3')
  summary = last_json(result)
  lines = [l for l in result.stdout.splitlines() if l.startswith('[MASK]')]
  assert [l.split(':')[0] for l in lines] == ['[MASK] 1', '[MASK] 2'] and lines[0].count(' | ') == 2
  for top in summary['predictions']:
    probs = [p['probability'] for p in top]
    assert len(top) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1


def test_fill_mask_without_mask(workdir):
  assert_one_line_error(run('fill_mask.py', f'--checkpoint={workdir}', '--text=No mask here .'),
                        'no [MASK] token')


def test_attention_writes_npz_and_pictures(workdir, tmp_path):
  out = tmp_path / 'maps'
  summary = last_json(run('attention.py', f'--checkpoint={workdir}', '--text=The game began .',
                          '--text_pair=It was released .', f'--output={out}', '--layer=1', '--head=1'))
  saved = np.load(out / 'attention.npz')
  tokens = saved['tokens'].tolist()
  assert tokens == summary['tokens'] and tokens[0] == '[CLS]' and tokens.count('[SEP]') == 2
  assert saved['probs'].shape == (2, 2, len(tokens), len(tokens)) == tuple(summary['shape'])
  np.testing.assert_allclose(saved['probs'].sum(-1), 1.0, rtol=tolerance(np.float32, len(tokens)))
  for name in ('layer_0.png', 'layer_1.png', 'layer1_head1.png'):
    assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
  assert summary['head'] == str(out / 'layer1_head1.png')


def test_attention_head_out_of_range(workdir, tmp_path):
  assert_one_line_error(run('attention.py', f'--checkpoint={workdir}', '--text=Hi .',
                            f'--output={tmp_path / "maps"}', '--head=7'), 'head=7 is out of range')


@pytest.mark.parametrize('script', ['embed.py', 'fill_mask.py', 'attention.py'])
def test_missing_checkpoint(tmp_path, script):
  (tmp_path / 'in.txt').write_text('a text\n', encoding='utf-8')
  extra = {'embed.py': [f'--input={tmp_path / "in.txt"}', f'--output={tmp_path / "e.npz"}'],
           'fill_mask.py': ['--text=The [MASK] .'],
           'attention.py': ['--text=A text .', f'--output={tmp_path / "maps"}']}[script]
  assert_one_line_error(run(script, f'--checkpoint={tmp_path / "nowhere"}', *extra), 'does not exist')


def test_fill_mask_on_encoder_only_minilm():
  path = minilm_dir_or_skip()
  assert_one_line_error(run('fill_mask.py', f'--checkpoint={path}', '--text=Paris is the [MASK] of France.'),
                        'no masked-LM head')


def test_many_texts_in_one_process(workdir, tmp_path):
  texts = tmp_path / 'masks.txt'
  texts.write_text('The game [MASK] development .\n\nIt was [MASK] in [MASK] .\n', encoding='utf-8')
  r = run('fill_mask.py', f'--checkpoint={workdir}', f'--input={texts}', '--top_k=3')
  lines = [json.loads(l) for l in r.stdout.strip().splitlines()]
  assert r.returncode == 0 and [l['text'] for l in lines] == ['The game [MASK] development .',
                                                              'It was [MASK] in [MASK] .']
  assert [len(l['predictions']) for l in lines] == [1, 2] and all(len(m) == 3 for l in lines for m in l['predictions'])
  alone = last_json(run('fill_mask.py', f'--checkpoint={workdir}', '--text=It was [MASK] in [MASK] .', '--top_k=3'))
  assert [[p['token'] for p in m] for m in alone['predictions']] == \
      [[p['token'] for p in m] for m in lines[1]['predictions']]  # batched with another text: the same
  pairs = tmp_path / 'pairs.txt'
  pairs.write_text('The game began .\nIt was released .\tIn Japan .\n', encoding='utf-8')
  r = run('attention.py', f'--checkpoint={workdir}', f'--input={pairs}', f'--output={tmp_path}/maps',
          f'--html={tmp_path}/pages')
  summaries = [json.loads(l) for l in r.stdout.strip().splitlines()]
  assert r.returncode == 0 and len(summaries) == 2, r.stderr[-2000:]
  assert [s['html'] for s in summaries] == [f'{tmp_path}/pages/0001.html', f'{tmp_path}/pages/0002.html']
  assert np.load(tmp_path / 'maps' / '0002' / 'attention.npz')['probs'].shape[-1] == len(summaries[1]['tokens'])
  assert_one_line_error(run('fill_mask.py', f'--checkpoint={workdir}', '--text=a [MASK]', f'--input={texts}'),
                        'give --text or --input')


def test_encoder_tools_take_a_fine_tuning_workdir(finetuned_workdir, tmp_path):
  tuned = finetuned_workdir  # the shared one (conftest.py): SST-2 from tiny_checkpoint, read-only
  texts = tmp_path / 'texts.txt'
  texts.write_text('A fine film .\n', encoding='utf-8')
  summary = last_json(run('embed.py', f'--checkpoint={tuned}', f'--input={texts}', f'--output={tmp_path}/e.npz'))
  assert summary['shape'] == [1, 32]  # the fine-tuned encoder (hidden 32)
  assert 'html' in last_json(run('attention.py', f'--checkpoint={tuned}', '--text=A fine film .',
                                 f'--html={tmp_path}/a.html'))
  assert_one_line_error(run('fill_mask.py', f'--checkpoint={tuned}', '--text=A [MASK] film .'),
                        'is a fine-tuning workdir: its encoder was fine-tuned with a task head')
