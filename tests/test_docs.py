"""The docs cannot drift from the code: every --config field, entry-point flag and relative link they name exists,
every entry point's --help has an example, the site builds in strict mode, and the README's commands run."""

import dataclasses
import glob
import os
import re
import subprocess
import sys

import pytest

from bert_jax import config

from harness.entry_points import readme_commands, readme_script, run_readme_commands_as_a_user
from harness.inputs import REPO, shared_data_or_skip

DOCS = [os.path.join(REPO, 'README.md'), *sorted(glob.glob(os.path.join(REPO, 'docs', '*.md')))]
ENTRY_POINTS = sorted(p for p in glob.glob(os.path.join(REPO, 'experiments', '*.py')) if not p.endswith('cli.py'))
_CLI_FLAGS = ('distributed', 'coordinator_address', 'num_processes', 'process_id', 'local_device_ids')
# cli.define_launcher_flags(): the scripts that call it (sweep.py, ladder.py) take these too.
_LAUNCHER_FLAGS = ('launcher', 'gather', 'dry_run', 'slurm_template', 'slurm_sbatch', 'slurm_submit', 'noslurm_submit')


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _field(cls, dotted: str) -> bool:
  """Whether `dotted` ('optim.learning_rate', 'model.*') names a field (or a block's fields) of config class `cls`."""
  name, _, rest = dotted.partition('.')
  fields = {f.name: f for f in dataclasses.fields(cls)}
  if name not in fields:
    return False
  if name == 'phases':  # phases.NAME.FIELD: a phase of any name, a PhaseConfig field
    return rest.count('.') == 1 and _field(config.PhaseConfig, rest.split('.')[1])
  block = config._block(fields[name])  # pylint: disable=protected-access
  if not rest:
    return True
  return block is not None and (rest == '*' or _field(block, rest))


def test_the_readme_is_a_map():
  lines = _read(os.path.join(REPO, 'README.md')).splitlines()
  assert len(lines) <= 200
  assert lines.index('## The two commands') < 12  # the two commands come first
  assert len(glob.glob(os.path.join(REPO, 'docs', '*.md'))) >= 5


def test_every_config_field_the_docs_name_exists():
  missing = []
  for path in DOCS:
    for name in re.findall(r'--config\.([a-z_][a-z0-9_.*]*[a-z0-9_*])', _read(path)):
      if all(len(part) == 1 for part in name.split('.')):  # a placeholder: --config.a.b
        continue
      if not any(_field(cls, name) for cls in (config.PretrainConfig, config.FinetuneConfig) + config.CONFIG_TYPES) and not _ladder_field(
          name):
        missing.append(f'{os.path.relpath(path, REPO)}: --config.{name}')
  assert not missing, missing


def _ladder_field(dotted: str) -> bool:
  """Whether `dotted` ('seeds', 'rungs.sop.overrides') is a field of the ladder configs (experiments/configs/ladder.py)."""
  sys.path.insert(0, os.path.join(REPO, 'experiments'))
  try:
    from configs import ladder  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  node = ladder.get_config('cpu').to_dict()
  for part in dotted.split('.'):
    if not isinstance(node, dict) or part not in node:
      return False
    node = node[part]
  return True


def test_every_relative_link_resolves():
  broken = []
  for path in DOCS:
    for target in re.findall(r'\]\(([^)\s]+)\)', _read(path)):
      if re.match(r'[a-z]+:', target) or target.startswith('#'):
        continue
      if not os.path.exists(os.path.join(os.path.dirname(path), target.split('#')[0])):
        broken.append(f'{os.path.relpath(path, REPO)}: {target}')
  assert not broken, broken


def _defined_flags(script: str) -> set[str]:
  text = _read(script)
  config = {'print_config'} if 'cli.define_config(' in text else set()  # cli.define_config defines it
  return set(re.findall(r"DEFINE_[a-z_]+\(\s*'([a-z_0-9]+)'", text)) | {'config', 'help', 'helpfull'} | config


def _commands(text: str):
  """(script name, its flags) of every `experiments/NAME.py ...` command in `text`, continuation lines joined;
  the command after a sweep's ` -- ` is a command of its own."""
  text = re.sub(r'\\\n\s*', ' ', text)
  for line in text.splitlines():
    line = re.sub(r'="[^"]*"', '=""', line)  # a quoted value holds no flags of the script (e.g. --slurm_sbatch)
    for part in line.split(' -- '):
      m = re.search(r'(?<![\w/])experiments/([a-z_]+)\.py((?:\s+[^\s|`]+)*)', part)
      if m:
        yield m.group(1), re.findall(r'(?<![\w-])--([a-z_0-9]+)(?=[=\s\]`]|$)', m.group(2))


# A measured figure (an accuracy to four places, a wall time) lives in docs/results.md with its date; other pages
# link there, so that no two pages give two figures for one thing.
_FIGURE = re.compile(r'\b0\.\d{4}\b|\b\d+ min \d+ s\b|\babout \d+(\.\d+)? (minutes?|hours?)\b')


def test_no_page_but_the_results_restates_a_figure():
  found = [f'{os.path.relpath(path, REPO)}:{n}: {line.strip()[:120]}' for path in DOCS
           if os.path.basename(path) != 'results.md'
           for n, line in enumerate(_read(path).splitlines(), 1) if _FIGURE.search(line)]
  assert not found, found


def test_every_entry_point_flag_the_docs_name_exists():
  missing = []
  for path in DOCS:
    for script, used in _commands(_read(path)):
      source = os.path.join(REPO, 'experiments', f'{script}.py')
      if not os.path.exists(source):
        missing.append(f'{os.path.relpath(path, REPO)}: experiments/{script}.py does not exist')
        continue
      known = _defined_flags(source) | set(_CLI_FLAGS)
      if 'define_launcher_flags' in _read(source):
        known |= set(_LAUNCHER_FLAGS)
      missing += [f'{os.path.relpath(path, REPO)}: {script}.py --{flag}' for flag in used if flag not in known]
  assert not missing, missing


@pytest.mark.parametrize('script', [os.path.basename(p) for p in ENTRY_POINTS])
def test_every_entry_point_says_what_it_does_with_an_example(script):
  """Its docstring, which absl prints first in --help: what it does, an example, every required flag."""
  source = _read(os.path.join(REPO, 'experiments', script))
  doc = re.match(r'\s*"""(.*?)"""', source, re.S)
  assert doc, f'{script} has no module docstring'
  assert re.search(rf'python3? experiments/{script}', doc.group(1)), f'{script}: no example in its docstring'
  for flag in re.findall(r"DEFINE_[a-z_]+\(\s*'([a-z_0-9]+)'[^)]*required=True", source, re.S):
    assert f'--{flag}' in doc.group(1), f'{script}: its docstring does not show the required --{flag}'


def test_the_site_builds_in_strict_mode(tmp_path):
  pytest.importorskip('mkdocs', reason='MkDocs is not installed (tests/requirements.txt installs it)')
  r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', str(tmp_path / 'site')],
                     cwd=REPO, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert os.path.exists(tmp_path / 'site' / 'results' / 'index.html')


@pytest.mark.slow
@pytest.mark.e2e
def test_the_readmes_commands_run(tmp_path, readme_ladder):
  shared_data_or_skip('sst2')
  commands = readme_commands(tmp_path)
  assert len(commands) >= 10 and commands[0][1] == 'experiments/pretrain.py'
  # The README's tiny ladder is minutes, and tests/experiments/test_ladder.py needs the same run: a session fixture
  # (conftest) runs it once, in a test worker (run_readme_command); here, that it is this command and it succeeded.
  shared = {'ladder.py': readme_ladder}
  own = []
  for argv in commands:
    run = shared.pop(readme_script(argv), None)
    if run:
      assert run.argv == [a.replace(str(tmp_path), run.root) for a in argv], (run.argv, argv)
      assert run.result.returncode == 0, (argv, run.result.stderr[-3000:])
    else:
      own.append(argv)
  # The others as a user runs them, in order: one process with this machine's devices and XLA's defaults.
  results = run_readme_commands_as_a_user(own, str(tmp_path))
  for argv, r in zip(own, results):
    assert r.returncode == 0, (argv, r.stdout[-3000:], r.stderr[-3000:])
  assert len(results) == len(own), f'{len(own) - len(results)} of the README commands did not run'
  assert not shared, f'the README has no command of {", ".join(shared)}'
  assert os.path.exists(tmp_path / 'sst2_hf' / 'model.safetensors') and os.path.exists(tmp_path / 'attn.html')
  assert os.path.exists(tmp_path / 'recipe_merged' / 'merge.json')
  assert os.path.exists(tmp_path / 'retrieval_st' / 'modules.json')  # a sentence-transformers folder
