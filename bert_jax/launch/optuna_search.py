"""Hyperparameter search with Optuna (`sweep.py --search=optuna`): a TPE sampler over a search space of config
fields, median pruning on the evaluations each trial writes, every trial a normal workdir; reads no flags.

The study lives in OUTPUT_DIR/optuna_journal.log (Optuna's journal file storage: appends under a file lock, so SLURM
array tasks on a shared filesystem write one study; SQLite's locking is not safe on NFS). Trials fill numbered slots
1..N (`trial_001` ...): a slot whose trial finished (complete, pruned, failed) is skipped; a slot whose trial is still
marked running was cut short (kill -9, a preemption, a SLURM requeue of the same array task) and runs again with the
same parameters, resuming its workdir, then reports to the same trial — so no trial is lost or counted twice, and a
sweep started again (or the same array task requeued) completes the study.

Space grammar, shell words of `key=kind:...`: `log:LOW:HIGH` (log-uniform float), `float:LOW:HIGH`, `int:LOW:HIGH`
(inclusive), `choice:a,b,c`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import time
from typing import Any, Sequence

from bert_jax import files
from bert_jax.config.overrides import KEY, shell_words
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.launch import cells
from bert_jax.runs.workdir import Workdir

STUDY_FILE = 'optuna_journal.log'
STUDY_NAME = 'sweep'
KINDS = ('log', 'float', 'int', 'choice')
POLL_S = 2.0  # how often a running trial's new evaluations are read


@dataclasses.dataclass(frozen=True)
class Param:
  """One searched field: `kind` of KINDS, bounds or choices."""

  key: str
  kind: str
  low: float = 0.0
  high: float = 0.0
  choices: tuple[str, ...] = ()

  def distribution(self):
    import optuna  # pylint: disable=g-import-not-at-top
    d = optuna.distributions
    if self.kind == 'choice':
      return d.CategoricalDistribution(self.choices)
    if self.kind == 'int':
      return d.IntDistribution(int(self.low), int(self.high))
    return d.FloatDistribution(self.low, self.high, log=self.kind == 'log')


def parse_space(text: str) -> list[Param]:
  """The search space of `--space`; ConfigError naming the entry for a bad one."""
  params = []
  for entry in shell_words('--space', text or ''):
    key, _, spec = entry.partition('=')
    kind, _, rest = spec.partition(':')
    where = f'search space entry {entry!r}'
    if not KEY.fullmatch(key) or kind not in KINDS or not rest:
      raise ConfigError(f'{where}: expected key=kind:..., kind one of {", ".join(KINDS)} (e.g. '
                        'config.optim.learning_rate=log:1e-5:1e-3, config.seed=choice:0,1)')
    if key in (p.key for p in params):
      raise ConfigError(f'{where}: {key} appears twice')
    if kind == 'choice':
      choices = tuple(rest.split(','))
      if not all(choices):
        raise ConfigError(f'{where}: an empty choice')
      params.append(Param(key, kind, choices=choices))
      continue
    low_text, _, high_text = rest.partition(':')
    try:
      low, high = (int(low_text), int(high_text)) if kind == 'int' else (float(low_text), float(high_text))
    except ValueError:
      raise ConfigError(f'{where}: LOW:HIGH must be {"integers" if kind == "int" else "numbers"}') from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high) or (kind == 'log' and low <= 0):
      raise ConfigError(f'{where}: an empty range (give LOW < HIGH{", both > 0" if kind == "log" else ""})')
    params.append(Param(key, kind, low, high))
  if not params:
    raise ConfigError('empty search space: give --space="config.optim.learning_rate=log:1e-5:1e-3 ..."')
  return params


def check_fields(params: Sequence[Param], config_types: Sequence[type]) -> None:
  """ConfigError for a `config.` key that names no field of any of `config_types` (dataclasses, nested)."""
  for p in params:
    if not p.key.startswith('config.'):
      continue
    if not any(_has_field(t, p.key.split('.')[1:]) for t in config_types):
      raise ConfigError(f'search space key {p.key}: no such config field')


def _has_field(cls, parts: Sequence[str]) -> bool:
  fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
  if not parts or parts[0] not in fields:
    return False
  if len(parts) == 1:
    return True
  default = fields[parts[0]].default_factory if fields[parts[0]].default_factory is not dataclasses.MISSING else None
  return default is not None and _has_field(type(default()), parts[1:])


def open_study(output_dir: str, space: Sequence[Param], template: Sequence[str], metric: str | None, mode: str):
  """The sweep's study (created on first use); ConfigError when the file holds another search's study."""
  try:
    import optuna  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError('--search=optuna needs Optuna: pip install -e ".[hpo]" (or pip install optuna)') from None
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  files.makedirs(output_dir)
  backend = optuna.storages.journal.JournalFileBackend(os.path.join(output_dir, STUDY_FILE))
  storage = optuna.storages.JournalStorage(backend)
  identity = {'space': [dataclasses.asdict(p) for p in space], 'command': list(template), 'metric': metric,
              'mode': mode}
  identity = json.loads(json.dumps(identity))  # tuples as lists: what the journal gives back
  study = optuna.create_study(storage=storage, study_name=STUDY_NAME, load_if_exists=True,
                              direction='maximize' if mode == 'max' else 'minimize',
                              sampler=optuna.samplers.TPESampler(seed=0),
                              pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
  saved = study.user_attrs.get('search')
  if saved is None:
    study.set_user_attr('search', identity)
  elif saved != identity:
    raise ConfigError(f'{os.path.join(output_dir, STUDY_FILE)} holds another search\'s study (its space, command, '
                      'metric or mode differ): give another --output_dir, or the same settings to continue it')
  return study


def slot_name(slot: int) -> str:
  return f'trial_{slot:03d}'


def trial_cell(template: Sequence[str], space: Sequence[Param], params: dict[str, Any], slot: int) -> cells.Cell:
  """The command of a trial: the template's {name}/{index} filled in and `--key=value` per searched field."""
  name = slot_name(slot)
  argv = [a.replace('{name}', name).replace('{index}', str(slot)) for a in template]
  argv += [f'--{p.key}={params[p.key]}' for p in space]
  workdir = cells.workdir_of(argv)
  if not workdir or not any('{name}' in a for a in template):
    raise ConfigError('the command needs --workdir=DIR/{name}: each trial is a workdir of its own')
  return cells.Cell(slot, name, argv, workdir, {p.key: str(params[p.key]) for p in space})


def run_slot(study, slot: int, template: Sequence[str], space: Sequence[Param], metric: str | None) -> str:
  """Runs (or resumes, or skips) the trial of `slot`; returns what happened, in words."""
  import optuna  # pylint: disable=g-import-not-at-top
  state = optuna.trial.TrialState
  mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get('slot') == slot]
  if mine and mine[-1].state != state.RUNNING:
    return f'{slot_name(slot)}: {mine[-1].state.name.lower()} before, skipped'
  if mine:  # cut short: the same trial, its parameters, its workdir resumed
    trial = optuna.trial.Trial(study, mine[-1]._trial_id)  # pylint: disable=protected-access
    params, how = dict(mine[-1].params), 'resumed'
  else:
    trial = study.ask({p.key: p.distribution() for p in space})
    trial.set_user_attr('slot', slot)
    params, how = dict(trial.params), 'started'
  metric = metric or study.user_attrs.get('metric')  # else the main metric the first finished trial named
  cell = trial_cell(template, space, params, slot)
  print(f'[search {slot}] {cell.name} {how}: ' + ' '.join(cell.argv), flush=True)
  cells._record(cell)  # pylint: disable=protected-access  (the sweep's own record of what ran)
  process = subprocess.Popen(cell.argv)  # pylint: disable=consider-using-with
  pruned, seen = False, set()
  while process.poll() is None:
    time.sleep(POLL_S)
    if metric and not pruned:
      for step, value in _new_evaluations(cell.workdir, metric, seen):
        trial.report(value, step)
      if seen and trial.should_prune():
        pruned = True
        print(f'[search {slot}] {cell.name} pruned at step {max(seen)} (below the median of earlier trials)',
              flush=True)
        process.send_signal(signal.SIGTERM)  # it saves and stops
  if pruned:
    study.tell(trial.number, state=state.PRUNED)
    return f'{cell.name}: pruned'
  try:
    results = Workdir(cell.workdir).results() if process.returncode == 0 else None
  except CheckpointError:  # unreadable final metrics: the trial failed
    results = None
  name = metric or (results or {}).get('main_metric')
  value = (results or {}).get(name) if name else None
  if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
    study.tell(trial.number, state=state.FAIL)
    return f'{cell.name}: failed (exit code {process.returncode}{", no " + str(name) if name else ""})'
  study.set_user_attr('metric', name)
  study.tell(trial.number, float(value))
  return f'{cell.name}: {name} {value:.4f}'


def _new_evaluations(workdir: str, metric: str, seen: set[int]) -> list[tuple[int, float]]:
  """(step, value) of `metric` in the first seed's metrics_eval.jsonl (or the workdir's) not yet in `seen`."""
  out = []
  for path in (os.path.join(workdir, 'seed_0', 'metrics_eval.jsonl'), os.path.join(workdir, 'metrics_eval.jsonl')):
    if not files.isfile(path):
      continue
    with files.open(path, encoding='utf-8') as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # a line being written
          continue
        step, value = row.get('step'), row.get(metric)
        if isinstance(step, int) and isinstance(value, (int, float)) and step not in seen:
          seen.add(step)
          out.append((step, float(value)))
    break
  return out


def rows(study, space: Sequence[Param]) -> list[dict[str, Any]]:
  """One table row per trial, slot order: name, values, status, metrics (the metric's value)."""
  metric = study.user_attrs.get('metric') or 'value'
  out = []
  for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.user_attrs.get('slot', 0)):
    values = {p.key: str(t.params.get(p.key, '')) for p in space}
    metrics = {metric: t.value} if t.value is not None else {}
    out.append({'name': slot_name(t.user_attrs.get('slot', 0)), 'values': values, 'status': t.state.name.lower(),
                'metrics': metrics, 'main_metric': metric})
  return out


def plot(study, space: Sequence[Param], path: str) -> str:
  """search.png: the metric of each finished trial against each searched parameter."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  done = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
  fig = Figure(figsize=(4 * len(space), 3.2))
  FigureCanvasAgg(fig)
  for i, p in enumerate(space):
    ax = fig.add_subplot(1, len(space), i + 1)
    xs = [t.params[p.key] for t in done]
    ax.scatter(range(len(xs)) if p.kind == 'choice' else xs, [t.value for t in done])
    if p.kind == 'choice':
      ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    if p.kind == 'log':
      ax.set_xscale('log')
    ax.set_xlabel(p.key.rsplit('.', 1)[-1])
    ax.set_ylabel(study.user_attrs.get('metric') or 'value')
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  return path


def search(study, trials: int, template: Sequence[str], space: Sequence[Param], metric: str | None,
           slots: Sequence[int] | None = None) -> list[str]:
  """Runs `slots` (default 1..trials) one after another; their outcomes in words. BertJaxError when one failed."""
  outcomes = [run_slot(study, s, template, space, metric) for s in (slots or range(1, trials + 1))]
  for line in outcomes:
    print(f'[search] {line}', flush=True)
  failed = [o for o in outcomes if ': failed' in o]
  if failed:
    raise BertJaxError(f'{len(failed)} of {len(outcomes)} trials failed: ' + '; '.join(failed))
  return outcomes
