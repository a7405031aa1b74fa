"""Checkpoint merging: the (weighted) mean of pretraining checkpoints' parameters, written as a new workdir.

Two uses of the field's recipe: the mean of a run's last K checkpoints (a cheap stand-in for a
decayed learning rate, or a smoother end point), and a "model soup" of several runs of one
architecture (e.g. decay variants branched from one stable checkpoint, as Ettin and mmBERT release).

The merge is a pretraining workdir that every tool reads (evaluate, fill-mask, embed, export,
`init_checkpoint` of a pretraining or fine-tuning run): config.json and the tokenizer of the first
part, one checkpoint holding parameters only, merge.json naming the parts and their weights, and (once evaluated)
final_metrics.json: the merge's held-out metrics, with its parts' beside them. It is not trained in (it has no
optimizer state): continue from it with `init_checkpoint`. Merging again into a workdir that holds the same merge
writes nothing (the evaluation runs again), so a sweep or an interrupted evaluation can run the command again.

A run that trains while it is merged rotates its checkpoints away (it keeps its newest few): `pinned` reads the
steps of a workdir whose lock a run holds from hard links to their files, made first, so they stay while the
merge and its evaluation read them; a step rotated away before it was pinned is refused in one line naming the
steps the run keeps, never called unusable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import filecmp
import json
import os
import shutil
from typing import Any, Iterator

import jax
import numpy as np

from bert_jax.config import PretrainConfig, architecture_diffs
from bert_jax.data.tokenization import load_tokenizer
from bert_jax import files
from bert_jax.errors import CheckpointError, CheckpointGone, CheckpointWriteError, ConfigError
from bert_jax.interop.pretrained import describe
from bert_jax.runs import reporting
from bert_jax.runs.checkpoints import Checkpointer
from bert_jax.runs.workdir import (CHECKPOINTS_DIR, CONFIG_FILE, LOCK_FILE, MERGE_FILE, Workdir, check_outside,
                                   checkpoint_dir, inspect)


# What a merge that failed to write (full disk, read-only filesystem) leaves, for its error line: a merge has no
# checkpoint to resume from, and its workdir appears whole (renamed into place) or not at all.
KEPT = ('nothing of the merge is left half-written (its workdir appears whole or not at all): free space or fix '
        'permissions, then run the same command again (a merge already written is only evaluated again)')


@dataclasses.dataclass(frozen=True)
class Part:
  """One checkpoint of a merge: a pretraining workdir, its step (None: the latest) and its weight."""

  path: str
  step: int | None
  weight: float
  pinned: str | None = None  # a copy of the step to read instead (`pinned`): its run rotates checkpoints away

  @property
  def where(self) -> str:
    """The workdir its checkpoint is read from."""
    return self.pinned or self.path


def parse_parts(sources: list[str], last: int = 0, weights: list[float] | None = None) -> list[Part]:
  """The parts named by `sources` ('DIR' or 'DIR@STEP'), or the `last` checkpoints of one DIR.

  Raises:
    ConfigError: a malformed spec, `last` with other than one plain DIR, weights that do not match
      the parts or are not positive, or the same checkpoint twice.
  """
  if not sources:
    raise ConfigError('give the checkpoints to merge: --sources=DIR[@STEP],DIR[@STEP],... or --sources=DIR --last=K')
  specs = []
  for spec in sources:
    path, _, step = spec.partition('@')
    if not path:
      raise ConfigError(f'--sources entry {spec!r} names no directory')
    try:
      specs.append((path, int(step) if step else None))
    except ValueError:
      raise ConfigError(f'--sources entry {spec!r}: the step after @ must be a whole number') from None
  if last < 0:
    raise ConfigError(f'--last={last} must be >= 0')
  if last:
    if len(specs) != 1 or specs[0][1] is not None:
      raise ConfigError('--last=K takes one workdir without @STEP: the mean of its last K checkpoints')
    path = specs[0][0]
    steps = _steps(path)
    if len(steps) < last:
      raise ConfigError(f'--last={last}: {path} holds {len(steps)} checkpoint(s) ({steps}); keep more with '
                        '--config.keep_checkpoints when training, or merge fewer')
    specs = [(path, s) for s in steps[-last:]]
  if len(specs) < 2:
    raise ConfigError('a merge needs at least two checkpoints (give several --sources, or --last=K with K >= 2)')
  if weights is None:
    weights = [1.0] * len(specs)
  if len(weights) != len(specs):
    raise ConfigError(f'--weights has {len(weights)} value(s) for {len(specs)} checkpoints')
  if not all(np.isfinite(w) and w > 0 for w in weights):
    raise ConfigError(f'--weights must be positive numbers, got {weights}')
  seen = set()
  for path, step in specs:
    key = (os.path.realpath(path), step if step is not None else _latest(path))
    if key in seen:
      raise ConfigError(f'{path} step {key[1]} is named twice')
    seen.add(key)
  total = sum(weights)
  return [Part(path, step, w / total) for (path, step), w in zip(specs, weights)]


def _steps(path: str) -> list[int]:
  _pretraining(path)
  ckpt = Checkpointer(path, read_only=True)
  try:
    return sorted(ckpt.all_steps())
  finally:
    ckpt.close()


def _latest(path: str) -> int | None:
  steps = _steps(path)
  return steps[-1] if steps else None


def _pretraining(path: str) -> dict[str, Any]:
  """A pretraining workdir's config.json; CheckpointError for anything else."""
  found = inspect(path)
  if found.kind in ('finetuning', 'export'):
    raise CheckpointError(f'{path} is {found.describe()}: merge.py merges bert_jax pretraining checkpoints')
  source = describe(path, 'merge source')
  if source.kind != 'pretraining':
    raise CheckpointError(f'{path} is a Hugging Face directory: merge.py merges bert_jax pretraining checkpoints')
  return source.saved


def merge(parts: list[Part], output: str) -> dict[str, Any]:
  """Writes the weighted mean of `parts`' parameters as a new pretraining workdir `output`.

  Every part must have the first one's architecture and heads. The mean is taken in float64 on the
  host, one part at a time, and stored in the parameters' own dtype. The workdir appears whole or not
  at all (written beside it, then renamed). Returns merge.json's content.

  Raises:
    ConfigError: `output` exists and is not empty (or holds another merge), or is (inside) a part.
    CheckpointError: a part is not a pretraining workdir, has another architecture, or is unreadable.
  """
  done = _same_merge(parts, output)
  if done is not None:
    reporting.log(f'merge: {output} already holds this merge (step {done["step"]}); nothing written')
    return done
  if files.exists(output) and (not files.isdir(output) or files.listdir(output)):
    held = _merge_record(output)
    if held is not None:
      raise ConfigError(f'--workdir {output} already holds another merge {_describe(held)}: write this one to '
                        f'another --workdir, or delete {output} to replace it')
    raise ConfigError(f'--workdir {output} exists and is not empty: a merge is written into a new directory')
  for part in parts:
    check_outside(output, part.path, 'a merge source')
  saved = _pretraining(parts[0].path)
  first = PretrainConfig.from_dict(saved)
  tokenizer = Workdir(parts[0].path).tokenizer_file()
  for part in parts[1:]:
    other = PretrainConfig.from_dict(_pretraining(part.path))
    diffs = architecture_diffs(dataclasses.asdict(other.model), first.model)
    if diffs or other.data.sentence_pairs != first.data.sentence_pairs:
      heads = [] if other.data.sentence_pairs == first.data.sentence_pairs else ['the NSP/SOP head']
      raise CheckpointError(f'{part.path} is another architecture than {parts[0].path} '
                            f'({"; ".join([d.replace("(config)", f"({parts[0].path})") for d in diffs] + heads)}); '
                            'merged checkpoints must share every parameter')
    theirs = Workdir(part.path).tokenizer_file()
    if not (theirs and tokenizer and os.path.basename(theirs) == os.path.basename(tokenizer)
            and filecmp.cmp(theirs, tokenizer, shallow=False)):
      raise CheckpointError(f'{part.path} has another tokenizer than {parts[0].path}: their token ids differ')
  total, steps = None, []
  for i, part in enumerate(parts):
    params, step = describe(part.where, 'merge source').params(part.step)
    steps.append(int(step))
    reporting.log(f'merge: {i + 1}/{len(parts)} {part.path} step {step} (weight {part.weight:.4g})')
    scaled = jax.tree.map(lambda a, w=part.weight: np.asarray(a, np.float64) * w, params)
    total = scaled if total is None else jax.tree.map(np.add, total, scaled)
    dtypes = jax.tree.map(lambda a: np.asarray(a).dtype, params)
    del params, scaled
  merged = jax.tree.map(lambda a, d: a.astype(d), total, dtypes)
  record = {'parts': [{'path': os.path.abspath(p.path), 'step': s, 'weight': p.weight} for p, s in zip(parts, steps)],
            'step': max(steps)}
  _write(output, saved, tokenizer, merged, record)
  return record


@contextlib.contextmanager
def pinned(parts: list[Part], output: str) -> Iterator[list[Part]]:
  """`parts`, each of a workdir that a run holds (it trains) read from a pin of its step beside `output`:
  hard links to the step's files (copies across filesystems), removed when the block ends.

  Raises:
    CheckpointGone: a step was rotated away before it was pinned (the message names the steps kept).
  """
  for part in parts:  # the pins go beside the output: never inside a source
    check_outside(output, part.path, 'a merge source')
  pins = os.path.join(os.path.dirname(os.path.abspath(output)), f'.{os.path.basename(output)}.pinned')
  shutil.rmtree(pins, ignore_errors=True)  # left by a killed merge
  try:
    out = []
    for i, part in enumerate(parts):
      held = None if '://' in part.path else files.holder(os.path.join(part.path, LOCK_FILE))
      out.append(part if held is None else _pin(part, os.path.join(pins, str(i)), held))
    yield out
  finally:
    shutil.rmtree(pins, ignore_errors=True)


def _pin(part: Part, target: str, held: dict[str, Any]) -> Part:
  steps = _steps(part.path)
  step = steps[-1] if part.step is None and steps else part.step
  if step not in steps:
    return part  # reported by the merge itself
  source = os.path.join(checkpoint_dir(part.path), str(step))
  try:
    _link_tree(source, os.path.join(target, CHECKPOINTS_DIR, str(step)))
    gone = not files.isdir(source)  # deleted after its files were linked: they may be a part of it
  except FileNotFoundError:
    gone = True
  if gone:
    raise CheckpointGone(f'{part.path} step {step} was rotated away by the run training there '
                         f'({files.describe_holder(held)}) before merge could pin it (it is not damaged); the run '
                         f'keeps steps {_steps(part.path)}: run the command again, or name kept steps with DIR@STEP')
  for name in files.listdir(part.path):  # config.json and the tokenizer's files: what `describe` reads
    if name == CONFIG_FILE or name.startswith(('tokenizer', 'vocab')):
      shutil.copy2(os.path.join(part.path, name), target)
  reporting.log(f'merge: {part.path} is in use by {files.describe_holder(held)}: its step {step} is read from '
                'a pinned copy (hard links), which its checkpoint rotation cannot delete')
  return dataclasses.replace(part, step=step, pinned=target)


def _link_tree(source: str, target: str) -> None:
  """Hard links of every file under `source` at the same paths under `target` (copies across filesystems);
  FileNotFoundError when anything under `source` vanishes meanwhile."""
  def fail(e: OSError) -> None:
    raise e
  for root, _, names in os.walk(source, onerror=fail):
    into = os.path.join(target, os.path.relpath(root, source))
    os.makedirs(into, exist_ok=True)
    for name in names:
      try:
        os.link(os.path.join(root, name), os.path.join(into, name))
      except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
          raise
        shutil.copy2(os.path.join(root, name), os.path.join(into, name))


def _same_merge(parts: list[Part], output: str) -> dict[str, Any] | None:
  """merge.json of `output` when it is a finished merge of these parts (same checkpoints and weights), else None."""
  record = _merge_record(output)
  if record is None:
    return None
  want = [{'path': os.path.abspath(p.path), 'step': p.step if p.step is not None else _latest(p.path),
           'weight': p.weight} for p in parts]
  return record if record.get('parts') == want else None


def _merge_record(output: str) -> dict[str, Any] | None:
  """merge.json of `output` when it holds a finished merge (its checkpoints beside it), else None."""
  try:
    with files.open(os.path.join(output, MERGE_FILE), encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(record, dict) or not files.isdir(os.path.join(output, 'checkpoints')):
    return None
  return record


def _describe(record: dict[str, Any]) -> str:
  """'of A@4 (weight 0.5), B@6 (weight 0.5)' from a merge.json, or where to read them when it is malformed."""
  try:
    return 'of ' + ', '.join(f'{p["path"]}@{p["step"]} (weight {p["weight"]:.3g})' for p in record['parts'])
  except (KeyError, TypeError, ValueError):  # a merge.json edited by hand: name where the sources are written
    return f'(its sources are in its {MERGE_FILE})'


def write_results(output: str, record: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
  """final_metrics.json of a merge: the merge's held-out metrics (`results[-1]`), each part's beside them."""
  final = {**results[-1], 'main_metric': 'mlm_accuracy',
           'parts': [{**p, **r} for p, r in zip(record['parts'], results)]}
  Workdir(output).write_results(final)
  return final


def _write(output: str, saved: dict[str, Any], tokenizer: str, params: dict[str, Any], record: dict[str, Any]) -> None:
  """The workdir, written into a sibling directory first and renamed into place."""
  staging = os.path.join(os.path.dirname(os.path.abspath(output)), f'.{os.path.basename(output)}.merging')
  shutil.rmtree(staging, ignore_errors=True)  # a merge killed before it finished
  try:
    wd = Workdir(staging)
    os.makedirs(staging)
    wd.write_config(saved)
    wd.save_tokenizer(load_tokenizer(tokenizer))
    ckpt = Checkpointer(staging, save_every=1, keep=1)
    try:
      ckpt.save(record['step'], {'params': params}, data_position=0, config=saved, force=True,
                extra={'merged_from': record['parts']})
    finally:
      ckpt.close()
    wd.write_json(wd.file(MERGE_FILE), record)
    if files.isdir(output):
      os.rmdir(output)  # empty (checked)
    os.replace(staging, output)
  except CheckpointWriteError as e:  # its own line is a training run's: a checkpoint kept, a run to resume
    raise CheckpointWriteError(f'writing the merge {output} failed: {e.reason}; {KEPT}', reason=e.reason) from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)

