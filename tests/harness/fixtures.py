"""The shared fixtures, loaded by tests/conftest.py as a pytest plugin (`pytest_plugins`): a small prepared corpus,
a GCS emulator's bucket, and the shared read-only runs.

Production behaviour changed: none. The shared runs (a tiny Hugging Face checkpoint, pretrained, fine-tuned and
retrieval workdirs, an uninterrupted 40-step pretraining run, tokenizers trained here, the README's ladder) are built
once per test run, by the library's own functions or by its entry points through `entry_points.run_main` (which
changes what its docstring says while it runs), and shared read-only: a write into one fails the run at the end of
the session. `fake_bucket` serves gs://bucket from an emulator in the test process, points gcsfs and tensorstore at
it through environment variables, and resets bert_jax.object_stores' caches (`gcs_emulator.probe_afresh`).
"""

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
from typing import Any

import pytest

from harness.entry_points import readme_commands, readme_script, run_main, run_readme_command
from harness.gcs_emulator import emulator_read_with_generation, probe_afresh
from harness.inputs import (
  SMALL_VOCAB,
  finetune_config,
  head_of_task_file,
  minilm_dir_or_skip,
  retrieval_config,
  shared_data_or_skip,
  small_data_config,
  tiny_pretrain_config,
  write_retrieval_data,
  write_small_corpus,
)
from harness.processes import free_port, pretrain_flags


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """(config, PreparedData) of `small_data_config`, built once per test module."""
  from bert_jax.data import prepare as pretraining_data  # pylint: disable=g-import-not-at-top
  cfg = small_data_config(str(tmp_path_factory.mktemp('data')))
  return cfg, pretraining_data.prepare_pretraining_data(cfg, vocab_size=SMALL_VOCAB, seed=0)


@pytest.fixture
def small_corpus(tmp_path):
  return write_small_corpus(tmp_path)


@pytest.fixture
def fake_bucket(monkeypatch):
  """gs://bucket on a GCS emulator in this process (in memory), for gcsfs and tensorstore alike (tests of remote
  paths: tests/test_remote_paths.py)."""
  gcsfs = pytest.importorskip('gcsfs', reason='the [gcs] extra (gcsfs) is not installed: tests/requirements.txt')
  emulator = pytest.importorskip('gcp_storage_emulator.server',
                                 reason='gcp-storage-emulator is not installed: tests/requirements.txt')
  for _, methods in emulator.HANDLERS:  # restored by monkeypatch after the test
    for method, handler in methods.items():
      if handler.__name__ in ('get', 'download'):
        monkeypatch.setitem(methods, method, emulator_read_with_generation(handler))
  port = free_port()
  server = emulator.create_server('localhost', port, in_memory=True, default_bucket='bucket')
  server.start()
  url = f'http://localhost:{port}'
  probe_afresh(monkeypatch)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', url)  # gcsfs
  monkeypatch.setenv('TENSORSTORE_GCS_HTTP_URL', url)  # tensorstore's GCS driver
  monkeypatch.setenv('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'fake')  # tensorstore: no credential lookup
  gcsfs.GCSFileSystem.clear_instance_cache()
  try:
    yield 'gs://bucket'
  finally:
    gcsfs.GCSFileSystem.clear_instance_cache()
    server.stop()


# --- Shared read-only runs ---------------------------------------------------------------------------------------
# A tiny Hugging Face checkpoint, a tiny pretraining run, a tiny fine-tuning run and a tiny retrieval run, each built
# once per test run (by the first xdist worker to ask: `_built_once`) and shared by every module whose checks hold for any such run: building them per module
# was minutes of the suite. They are READ-ONLY: a test that writes into one (resumes it, damages a checkpoint,
# evaluates with outputs inside) first copies it, e.g. `shutil.copytree(pretrained_run.workdir, tmp_path / 'run')`.
# Each file's digest is taken when it is built and compared at the end of the session: a write into one fails the
# run (an error at the teardown of the last test, naming the fixture and the files).


def _file_digests(root) -> dict[str, str]:
  """{path under root: sha256 of its bytes} of every file (a link: its target's)."""
  digests = {}
  for directory, _, names in os.walk(root):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, 'rb') as f:
        digests[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def _assert_unchanged(name, root, digests):
  now = _file_digests(root)
  changed = sorted(p for p in now.keys() | digests.keys() if now.get(p) != digests.get(p))
  assert not changed, (f'the shared fixture {name} ({root}) was written to (files added, removed or changed: '
                       f'{", ".join(changed[:10])}): it is shared read-only; copy it to tmp_path before changing it')


def _shared_root(tmp_path_factory):
  """Where the shared runs are built: the xdist workers share their basetemp's parent."""
  root = tmp_path_factory.getbasetemp()
  return root.parent if os.environ.get('PYTEST_XDIST_WORKER') else root


@contextlib.contextmanager
def _flock(path, exclusive: bool = True):
  import fcntl  # pylint: disable=g-import-not-at-top
  with open(path, 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    yield


def _built_once(tmp_path_factory, name: str, build) -> str:
  """A directory that `build(directory)` fills, built once per test run: the xdist workers share their basetemp's
  parent, the first to ask builds there under a lock and the others wait for it and read (each worker building its
  own was a minute of the suite; a waiting worker leaves the core to the builder). Its digests are taken once built."""
  root = _shared_root(tmp_path_factory)
  directory, done = root / f'shared_{name}', root / f'shared_{name}.done'
  with _flock(root / f'shared_{name}.lock'):
    if not done.exists():
      shutil.rmtree(directory, ignore_errors=True)
      directory.mkdir()
      build(directory)
      done.touch()
  return directory


@pytest.fixture(scope='session')
def built_once(tmp_path_factory):
  """`built_once(name, build)`: the directory `build(directory)` fills, built once per test run and shared by the
  xdist workers (`_built_once`), for a module's own costly run: a module-scoped fixture is built again by each worker
  that runs one of the module's tests (tests/pretraining/test_phases.py's run in phases: 20-44 s, twice in two of
  five suite runs)."""
  return functools.partial(_built_once, tmp_path_factory)


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory):
  """A 2-layer, hidden-32 BERT with MiniLM's WordPiece vocabulary, saved as a Hugging Face directory. Shared
  read-only (above)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from bert_jax.config import preset  # pylint: disable=g-import-not-at-top
  from bert_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import families  # pylint: disable=g-import-not-at-top
  from bert_jax.model.heads import BertForPreTraining  # pylint: disable=g-import-not-at-top
  vocab = minilm_dir_or_skip()
  cfg = preset('tiny', vocab_size=30522, hidden_size=32, num_heads=2, intermediate_size=64)
  model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  params = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  directory = str(_built_once(tmp_path_factory, 'tiny_checkpoint', lambda d: families.save_hf_checkpoint(
      str(d / 'hf'), cfg, {'bert': params['bert']}, WordPieceTokenizer.from_directory(vocab))) / 'hf')
  digests = _file_digests(directory)
  yield directory
  _assert_unchanged('tiny_checkpoint', directory, digests)


@dataclasses.dataclass(frozen=True)
class PretrainedRun:
  cfg: Any  # the PretrainConfig it was trained with (inputs.tiny_pretrain_config)
  workdir: str  # checkpoints of steps 2 and 4, config.json, tokenizer.model, final_metrics.json
  corpus: str  # its data.train_files (inputs.write_small_corpus)
  cache: str  # its data.cache_dir (the prepared data)


@pytest.fixture(scope='session')
def pretrained_run(tmp_path_factory):
  """A finished tiny pretraining run (inputs.tiny_pretrain_config: 4 steps, checkpoints at 2 and 4, the final
  evaluation only), as the main job leaves one (SentencePiece tokenizer). Shared read-only (above): its workdir,
  corpus and cache."""
  from bert_jax.pretraining import pretrain_run as pretraining  # pylint: disable=g-import-not-at-top

  def build(root):
    corpus = write_small_corpus(root)
    pretraining.train_and_evaluate(tiny_pretrain_config(corpus, str(root / 'cache'), num_train_steps=4,
                                                        eval_every=100), str(root / 'run'))

  root = _built_once(tmp_path_factory, 'pretrained_run', build)
  corpus = str(root / 'corpus.txt')
  cfg = tiny_pretrain_config(corpus, str(root / 'cache'), num_train_steps=4, eval_every=100)
  run = PretrainedRun(cfg, str(root / 'run'), corpus, str(root / 'cache'))
  digests = _file_digests(root)
  yield run
  _assert_unchanged('pretrained_run', root, digests)


@pytest.fixture(scope='session')
def straight_pretraining(tmp_path_factory):
  """The workdir of an uninterrupted experiments/pretrain.py run (in a test worker) with processes.pretrain_flags for
  40 steps: what the tests that kill or preempt the same run (tests/pretraining/test_pretrain_run.py, tests/test_faults.py)
  resume to and compare with bitwise. Shared read-only (above); its corpus is inputs.write_small_corpus (the same
  text in every directory)."""
  def build(root):
    corpus = write_small_corpus(root)
    r = run_main('pretrain.py', *pretrain_flags(corpus, str(root / 'cache'), str(root / 'run'), 40))
    assert r.returncode == 0, r.stderr[-2000:]

  root = _built_once(tmp_path_factory, 'straight_pretraining', build)
  digests = _file_digests(root / 'run')
  yield str(root / 'run')
  _assert_unchanged('straight_pretraining', root / 'run', digests)


@pytest.fixture(scope='session')
def finetuned_workdir(tiny_checkpoint, tmp_path_factory):
  """A finished fine-tuning workdir: SST-2 from `tiny_checkpoint` (hidden 32, WordPiece), 2 steps of 16 at seq 32
  on 32 sentences, seed 0, evaluated on the first 64 dev sentences (its readers never look at the dev set's size;
  all 872 were 2.1 of its 10 s, built in the fast tier). Shared read-only (above); skips where the shared SST-2 data
  is absent."""
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top
  data = shared_data_or_skip('sst2')

  def build(root):
    cfg = finetune_config(task='sst2', init_checkpoint=tiny_checkpoint, data_dir=data,
                          eval_file=head_of_task_file(os.path.join(data, 'dev.tsv'), 64, root),
                          max_seq_length=32, batch_size=16, num_train_steps=2, max_train_samples=32)
    finetuning.finetune(cfg, str(root / 'sst2'))

  workdir = str(_built_once(tmp_path_factory, 'finetuned_workdir', build) / 'sst2')
  digests = _file_digests(workdir)
  yield workdir
  _assert_unchanged('finetuned_workdir', workdir, digests)


@pytest.fixture(scope='session')
def retrieval_workdir(tiny_checkpoint, tmp_path_factory):
  """A finished retrieval run (finetune.py:retrieval): 2 steps of 8 pairs from `tiny_checkpoint`, mean pooling,
  Matryoshka sizes 32,16, learned temperature, evaluated on a BEIR set of 4 queries against 8 passages
  (inputs.write_retrieval_data, in its `data` directory beside it). Shared read-only (above)."""
  from bert_jax.finetuning import finetune_run as finetuning  # pylint: disable=g-import-not-at-top

  def build(root):
    (root / 'data').mkdir()
    pairs, beir = write_retrieval_data(root / 'data')
    finetuning.finetune(retrieval_config(tiny_checkpoint, pairs, beir, num_train_steps=2), str(root / 'run'))

  workdir = str(_built_once(tmp_path_factory, 'retrieval_workdir', build) / 'run')
  digests = _file_digests(workdir)
  yield workdir
  _assert_unchanged('retrieval_workdir', workdir, digests)


@dataclasses.dataclass(frozen=True)
class ReadmeRun:
  """A README command run once per test run (`readme_commands`: tiny budgets, /tmp/ moved to `root`)."""
  argv: list[str]  # the command as run
  root: str  # where the README's /tmp/ went
  result: subprocess.CompletedProcess  # its exit code and output (run_readme_command)
  lock: str  # the fixture's lock file (`writing`)

  def flag(self, name: str) -> str:
    """The value of --NAME= in the command."""
    return next(a.split('=', 1)[1] for a in self.argv if a.startswith(f'--{name}='))

  @contextlib.contextmanager
  def writing(self):
    """The run's files to one test alone (the other workers' digests wait), for a test that must work in the run's own
    directory (a ladder rerun: its cells' commands name it) and leaves every file as it found it (the digests at the
    end of the session say so)."""
    with _flock(self.lock):
      yield


def _readme_run(tmp_path_factory, script: str):
  """The README's one command of `script`, run once per test run by `run_readme_command` (as the README's test runs
  the others): that test checks its exit code and the tests of the same command read its files. Shared read-only
  (above), but for `ReadmeRun.writing`."""
  import json  # pylint: disable=g-import-not-at-top

  def build(root):
    [argv] = [a for a in readme_commands(root) if readme_script(a) == script]
    result = run_readme_command(argv)
    (root / 'result.json').write_text(json.dumps(dict(argv=argv, returncode=result.returncode, stdout=result.stdout,
                                                      stderr=result.stderr)))

  name = f'readme_{script.removesuffix(".py")}'
  root = _built_once(tmp_path_factory, name, build)
  run = json.loads((root / 'result.json').read_text())
  run = ReadmeRun(run['argv'], str(root), subprocess.CompletedProcess(run['argv'], run['returncode'], run['stdout'],
                                                                       run['stderr']),
                  str(_shared_root(tmp_path_factory) / f'shared_{name}.lock'))
  with _flock(run.lock, exclusive=False):
    digests = _file_digests(root)
  yield run
  with _flock(run.lock, exclusive=False):
    _assert_unchanged(name, root, digests)


@pytest.fixture(scope='session')
def readme_ladder(tmp_path_factory):
  """The README's tiny ladder (`ladder.py --config=...ladder.py:tiny`, its --workdir under `root`): minutes, run once
  for the README's test and tests/experiments/test_ladder.py. Skips where the shared SST-2 data is absent."""
  shared_data_or_skip('sst2')
  yield from _readme_run(tmp_path_factory, 'ladder.py')


@pytest.fixture
def readme_ladder_alone(readme_ladder):
  """`readme_ladder`, its files to the asking test alone while it runs (`ReadmeRun.writing`)."""
  with readme_ladder.writing():
    yield readme_ladder


def _style_tokenizer(tmp_path_factory, style: str):
  from harness import inputs  # pylint: disable=g-import-not-at-top
  build = getattr(inputs, f'{style}_style_tokenizer')
  directory = str(_built_once(tmp_path_factory, f'{style}_tokenizer', lambda d: build(str(d / 'tok'))) / 'tok')
  digests = _file_digests(directory)
  yield directory
  _assert_unchanged(f'{style}_tokenizer', directory, digests)


@pytest.fixture(scope='session')
def roberta_tokenizer(tmp_path_factory):
  """A RoBERTa-style byte-level BPE directory (inputs.roberta_style_tokenizer), trained once per test run and
  shared read-only (training it was 1-3 s of each test that used one)."""
  pytest.importorskip('transformers')
  yield from _style_tokenizer(tmp_path_factory, 'roberta')


@pytest.fixture(scope='session')
def xlmr_tokenizer(tmp_path_factory):
  """An XLM-R-style Unigram directory (inputs.xlmr_style_tokenizer), trained once and shared read-only."""
  pytest.importorskip('transformers')
  yield from _style_tokenizer(tmp_path_factory, 'xlmr')


@pytest.fixture(params=['roberta', 'xlmr'])
def styled_tokenizer(request):
  """(style, directory) of the shared RoBERTa- or XLM-R-style tokenizer, one test each, built at setup: a test asking
  for one in its body counted its training (the XLM-R-style one: 1.6 s, 3.5 s before it read 1,500 lines) against the
  fast tier's 5 s."""
  return request.param, request.getfixturevalue(f'{request.param}_tokenizer')


@pytest.fixture(scope='session')
def wordpiece():
  """all-MiniLM-L6-v2's WordPiece tokenizer; the test skips when the package is not installed."""
  from bert_jax.data.tokenization import WordPieceTokenizer  # pylint: disable=g-import-not-at-top
  return WordPieceTokenizer.from_directory(minilm_dir_or_skip())
