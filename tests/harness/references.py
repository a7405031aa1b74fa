"""Checks against references: transformers' models, pipelines and exports (`assert_task_exports_match_transformers`,
`assert_embed_and_attention_match_transformers`, `assert_export_classifies_as_predict`,
`assert_fill_mask_is_the_pipelines`, `assert_reranker_exports_score_as_predict`,
`assert_hf_reranker_reranks_as_transformers`, `export_again`, `save_perturbed`, `FAMILY_TASKS`), and the reference
implementation a faster one is tested against (`reference_first_fit_decreasing`).

Production behaviour changed: none beyond `entry_points.run_main`'s (the entry points checked run through it).
"""

import json
import os

import numpy as np

from harness.entry_points import run_main
from harness.numerics import model_tolerance


# A fine-tuned model's task, per head kind, as `load_finetuned` gives it (label names where the kind has them).
FAMILY_TASKS = {
    'classification': dict(name='mood', kind='classification', num_labels=3, label_names=['neg', 'neu', 'pos']),
    'token': dict(name='ner', kind='token', num_labels=4, label_names=['O', 'B-PER', 'I-PER', 'B-LOC']),
    'span': dict(name='squad', kind='span', num_labels=2, label_names=[]),
}


def assert_task_exports_match_transformers(directory: str, out_root, texts, token_types: bool) -> None:
  """A model imported from the Hugging Face `directory`, given a random task head of each kind (and a random
  pooler), exports with the task; transformers' Auto class loads it with nothing missing or unexpected, as the
  family's own class, and its logits equal ours (<= 1e-4) on a padded batch of `texts` (real tokens only for
  per-token heads)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.model import heads  # pylint: disable=g-import-not-at-top
  cfg, imported, _, _ = families.load_hf_checkpoint(directory)
  batch = transformers.AutoTokenizer.from_pretrained(directory)(list(texts), padding=True, return_tensors='np')
  ids, mask = batch['input_ids'].astype(np.int32), batch['attention_mask'].astype(np.int32)
  types = batch['token_type_ids'].astype(np.int32) if token_types else None
  auto = {'classification': 'AutoModelForSequenceClassification', 'token': 'AutoModelForTokenClassification',
          'span': 'AutoModelForQuestionAnswering'}
  for seed, (kind, task) in enumerate(FAMILY_TASKS.items()):
    model = heads.head_model(kind, cfg, task['num_labels'], rngs=nnx.Rngs(seed))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(np.float32), params)
    params['bert'] = {**imported['bert'], 'pooler': params['bert']['pooler']}
    out = os.path.join(str(out_root), kind)
    families.save_hf_checkpoint(out, cfg, params, task=task)
    theirs, info = getattr(transformers, auto[kind]).from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), (kind, info)
    with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
      written = json.load(f)
    assert written['architectures'] == [type(theirs).__name__] and written['finetuning_task'] == task['name']
    if kind != 'span':
      assert written['id2label'] == {str(i): n for i, n in enumerate(task['label_names'])}
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(model, state)
    ours = np.asarray(model(jnp.asarray(ids), None if types is None else jnp.asarray(types)))
    inputs = {'input_ids': ids, 'attention_mask': mask, **({'token_type_ids': types} if token_types else {})}
    with torch.no_grad():
      got = theirs.eval()(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()})
    if kind == 'span':
      want = np.stack([got.start_logits.numpy(), got.end_logits.numpy()], -1)
    else:
      want = got.logits.numpy()
    if kind != 'classification':
      want, ours = want[mask == 1], ours[mask == 1]
    assert np.abs(ours - want).max() <= 1e-4, (kind, type(theirs).__name__, np.abs(ours - want).max())


def assert_export_classifies_as_predict(workdir: str, out: str, text: str, architecture: str) -> None:
  """export_hf.py writes the fine-tuned `workdir` as `architecture`, whose text-classification pipeline gives
  predict.py's probabilities for `text` (up to float32 rounding: `tolerance`)."""
  import transformers  # pylint: disable=g-import-not-at-top
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])['architecture'] == architecture
  result = run_main('predict.py', f'--workdir={workdir}', f'--text={text}')
  assert result.returncode == 0, result.stderr[-3000:]
  ours = json.loads(result.stdout.strip().splitlines()[-1])['probabilities']
  pipeline = transformers.pipeline('text-classification', model=out, top_k=None)
  theirs = {s['label']: s['score'] for s in pipeline([text])[0]}
  assert theirs.keys() == ours.keys(), (theirs, ours)
  np.testing.assert_allclose([theirs[k] for k in ours], list(ours.values()),
                             atol=model_tolerance(pipeline.model.config))


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RERANK_PAIRS = [('what is the capital', 'the capital is a city'), ('who wrote the book', 'an author wrote it'),
                ('a', 'a much longer passage about nothing in particular, with commas')]


def assert_reranker_exports_score_as_predict(checkpoint: str, tmp_path, architecture: str) -> str:
  """A reranker fine-tuned from `checkpoint` (finetune.py:rerank, 3 steps on the bundled sample's labelled pairs) and
  exported by export_hf.py as `architecture`: sentence-transformers' CrossEncoder gives predict.py's scores (logits)
  on RERANK_PAIRS, up to float32 rounding against torch (`model_tolerance`), and its default scores are predict.py's
  probabilities (their sigmoid). Returns the workdir."""
  import torch  # pylint: disable=g-import-not-at-top
  from sentence_transformers import CrossEncoder  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'data', 'samples', 'retrieval', 'pairs.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  pairs, workdir, out = tmp_path / 'rerank_pairs.jsonl', str(tmp_path / 'reranker'), str(tmp_path / 'reranker_hf')
  pairs.write_text(''.join(json.dumps({'query': r['query'], 'passage': r[side], 'label': int(side == 'positive')}) + '\n'
                           for r in rows for side in ('positive', 'negative')), encoding='utf-8')
  result = run_main('finetune.py', '--config=experiments/configs/finetune.py:rerank', f'--workdir={workdir}',
                    f'--config.init_checkpoint={checkpoint}', f'--config.train_file={pairs}',
                    '--config.num_train_steps=3', '--config.batch_size=8', '--config.eval_batch_size=16',
                    '--config.max_seq_length=64', '--config.max_query_length=16', '--config.eval_fraction=0.25',
                    '--config.optim.learning_rate=1e-2')
  assert result.returncode == 0, result.stderr[-3000:]
  result = run_main('export_hf.py', f'--checkpoint={workdir}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])['architecture'] == architecture
  (tmp_path / 'score.txt').write_text(''.join(f'{q}\t{p}\n' for q, p in RERANK_PAIRS), encoding='utf-8')
  result = run_main('predict.py', f'--workdir={workdir}', f'--input={tmp_path / "score.txt"}')
  assert result.returncode == 0, result.stderr[-3000:]
  ours = [json.loads(line) for line in result.stdout.splitlines()]
  assert [(r['query'], r['passage']) for r in ours] == RERANK_PAIRS
  peer = CrossEncoder(out, device='cpu')
  atol = model_tolerance(peer.model.config)
  np.testing.assert_allclose(peer.predict(RERANK_PAIRS, activation_fn=torch.nn.Identity()), [r['score'] for r in ours],
                             rtol=0, atol=atol)
  np.testing.assert_allclose(peer.predict(RERANK_PAIRS), [r['probability'] for r in ours], rtol=0, atol=atol)
  return workdir


def assert_hf_reranker_reranks_as_transformers(directory: str, tmp_path) -> dict:
  """experiments/rerank.py with the Hugging Face one-logit sequence classifier `directory` as --reranker and, as the
  first stage, a TREC run of 5 documents per query of the bundled BEIR sample: the reranked run's scores are
  transformers' logits of those (query, passage) pairs (the tokenizer's pair template, longest-first truncation to
  min(512, the model's positions)), up to float32 rounding (`model_tolerance`) and the run's 6 decimals. Returns
  the command's result line."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.embedding import beir, trec  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  beir_dir = os.path.join(REPO, 'data', 'samples', 'retrieval', 'beir')
  data = beir.read_beir(beir_dir)
  ids = (np.arange(5)[None, :] + 3 * np.arange(len(data.query_ids))[:, None]) % len(data.corpus_ids)
  first, reranked = str(tmp_path / 'first.trec'), str(tmp_path / 'reranked.trec')
  trec.write_run(first, data, ids, np.tile(-np.arange(5, dtype=np.float32), (len(ids), 1)))
  result = run_main('rerank.py', f'--first_stage={first}', f'--reranker={directory}', f'--beir_dir={beir_dir}',
                    '--top_k=5', '--batch_size=16', f'--output_run={reranked}')
  assert result.returncode == 0, result.stderr[-3000:]
  with open(reranked, encoding='utf-8') as f:
    ours = {(q, d): float(score) for q, _, d, _, score, _ in (line.split() for line in f)}
  assert len(ours) == ids.size
  text = dict(zip(data.query_ids, data.queries))
  passage = dict(zip(data.corpus_ids, data.passages()))
  pairs = sorted(ours)
  length = min(512, families.read_hf_config(directory).max_position_embeddings)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
  batch = tokenizer([text[q] for q, _ in pairs], [passage[d] for _, d in pairs], truncation='longest_first',
                    max_length=length, padding=True, return_tensors='pt')
  with torch.no_grad():
    theirs = model(**batch).logits[:, 0].numpy()
  np.testing.assert_allclose([ours[p] for p in pairs], theirs, rtol=0,
                             atol=model_tolerance(model.config, np.abs(theirs).max()) + 1e-6)
  return json.loads(result.stdout.strip().splitlines()[-1])


def assert_fill_mask_is_the_pipelines(checkpoint: str, text: str, tokenizer) -> list:
  """fill_mask.py on `checkpoint` gives transformers' fill-mask pipeline's top 5 for each mask of `text`: the same
  ids, the same decoded texts (token_str: ' the', not 'Ġthe') and probabilities up to float32 rounding (`tolerance`).
  Returns our predictions."""
  import transformers  # pylint: disable=g-import-not-at-top
  result = run_main('fill_mask.py', f'--checkpoint={checkpoint}', f'--text={text}')
  assert result.returncode == 0, result.stderr[-3000:]
  answers = json.loads(result.stdout.strip().splitlines()[-1])['predictions']
  fill = transformers.pipeline('fill-mask', model=checkpoint, top_k=5)
  pipeline = fill(text)
  pipeline = [pipeline] if isinstance(pipeline[0], dict) else pipeline  # one mask: one list, not a list of them
  assert len(pipeline) == len(answers) == text.count(tokenizer.special_names['mask'])
  for their_top, our_top in zip(pipeline, answers):
    assert [t['token'] for t in their_top] == [tokenizer.token_to_id(a['token']) for a in our_top]
    assert [t['token_str'] for t in their_top] == [a['token_str'] for a in our_top]
    np.testing.assert_allclose([t['score'] for t in their_top], [a['probability'] for a in our_top],
                               atol=model_tolerance(fill.model.config))
  return answers


def export_again(directory: str, out: str) -> tuple[dict, dict, dict]:
  """A Hugging Face `directory` imported and exported to `out` as it is (no training between): returns (the
  written config.json, `directory`'s tensors, `out`'s tensors)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.interop.hf import model_dir  # pylint: disable=g-import-not-at-top
  cfg, params, _, _ = families.load_hf_checkpoint(directory)
  families.save_hf_checkpoint(out, cfg, params, model_dir.load_hf_tokenizer(directory))
  with open(os.path.join(out, 'config.json'), encoding='utf-8') as f:
    written = json.load(f)
  return written, *(st_numpy.load_file(os.path.join(d, 'model.safetensors')) for d in (directory, out))


def save_perturbed(cls: str, config, directory: str, seed: int) -> None:
  """A transformers `cls` model of `config` with every weight perturbed (LayerNorms and biases too, so that a
  swapped tensor shows), saved to `directory`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  model = getattr(transformers, cls)(config)
  with torch.no_grad():
    for p in model.parameters():  # tied tensors are one parameter: they stay tied
      p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)


def assert_embed_and_attention_match_transformers(directory: str, tmp_path, texts) -> None:
  """embed.py on `texts` gives transformers' last hidden states (at real positions) and attention.py on the first
  text its attention probabilities (every layer and head), for the Hugging Face `directory`, up to float32 rounding
  (`tolerance`)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  texts_file, out = os.path.join(str(tmp_path), 'texts.txt'), os.path.join(str(tmp_path), 'emb.npz')
  with open(texts_file, 'w', encoding='utf-8') as f:
    f.write('\n'.join(texts) + '\n')
  result = run_main('embed.py', f'--checkpoint={directory}', f'--input={texts_file}', f'--output={out}')
  assert result.returncode == 0, result.stderr[-3000:]
  ours = np.load(out)
  model = transformers.AutoModel.from_pretrained(directory, attn_implementation='eager').eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ours['input_ids'].astype(np.int64)),
                   attention_mask=torch.from_numpy(ours['attention_mask'].astype(np.int64))).last_hidden_state
  real = ours['attention_mask'] == 1
  np.testing.assert_allclose(ours['last_hidden_state'][real], theirs.numpy()[real],
                             atol=model_tolerance(model.config, magnitude=np.abs(theirs.numpy()[real]).max()))
  result = run_main('attention.py', f'--checkpoint={directory}', f'--text={texts[0]}',
                    f'--output={tmp_path / "attention"}', f'--html={tmp_path / "attention.html"}')
  assert result.returncode == 0, result.stderr[-3000:]
  probs = np.load(os.path.join(str(tmp_path), 'attention', 'attention.npz'))['probs']
  ids = transformers.AutoTokenizer.from_pretrained(directory)(texts[0], return_tensors='pt')['input_ids']
  with torch.no_grad():
    maps = model(input_ids=ids, output_attentions=True).attentions
  want = np.stack([m[0].numpy() for m in maps])  # [layers, heads, T, T]
  assert probs.shape == want.shape
  np.testing.assert_allclose(probs, want, atol=model_tolerance(model.config))
  assert os.path.getsize(os.path.join(str(tmp_path), 'attention.html')) > 0


def reference_first_fit_decreasing(lengths, row_length, max_per_row=None):
  """packing.first_fit_decreasing as first written (every length, longest first, scans every row in order): the
  spec the faster one is tested against (tests/data/test_packing.py, test_loader.py)."""
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  free, count, placed = [], [], [(0, 0)] * len(lengths)
  for i in order:
    n = lengths[i]
    if n > row_length:
      raise ValueError(f'feature of length {n} does not fit rows of {row_length}')
    for r, room in enumerate(free):
      if room >= n and (max_per_row is None or count[r] < max_per_row):
        placed[i] = (r, row_length - room)
        free[r] -= n
        count[r] += 1
        break
    else:
      placed[i] = (len(free), 0)
      free.append(row_length - n)
      count.append(1)
  return placed
