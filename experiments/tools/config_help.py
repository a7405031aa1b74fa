"""What an entry point's --help and --print_config say about its config (experiments/cli.py calls these).

--help: the config file's variants (one line each, from its docstring's "Variants" block, else its VARIANTS names)
and the main fields with one line each (their comments in the config dataclasses). --print_config: the resolved
config, what the --config.* flags changed (old -> new), the parameter count and the tokens per step.

Only light modules are imported at the top: --help and a config error come before jax is imported.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import re
from typing import Any

# The fields users set most, per config class: (dotted field, help when the field has no comment).
_MAIN_FIELDS = {
    'PretrainConfig': (
        ('data.train_files', ''),
        ('data.max_seq_length', 'tokens per sequence'),
        ('data.objective', ''),
        ('model.num_layers', 'encoder layers'),
        ('model.hidden_size', 'width of the encoder'),
        ('batch_size', ''),
        ('num_train_steps', ''),
        ('optim.learning_rate', 'peak learning rate, after the warmup'),
        ('optim.warmup_steps', 'linear warmup from 0 to the peak'),
        ('optim.grad_accum_steps', 'micro-batches per optimizer step (the same tokens per step, less memory)'),
        ('eval_every', 'evaluate every N steps'),
        ('checkpoint_every', 'save every N steps'),
        ('init_checkpoint', ''),
        ('model.dtype', ''),
    ),
    'FinetuneConfig': (
        ('task', ''),
        ('init_checkpoint', ''),
        ('data_dir', 'the folder of the task\'s files'),
        ('train_file', ''),
        ('eval_file', 'evaluate on this file instead of the task\'s dev set'),
        ('text_column', ''),
        ('label_column', ''),
        ('max_seq_length', 'tokens per example (longer ones are cut)'),
        ('batch_size', ''),
        ('num_train_epochs', 'passes over the training set'),
        ('num_train_steps', '> 0: train this many steps instead of num_train_epochs'),
        ('optim.learning_rate', 'peak learning rate, after the warmup'),
        ('num_seeds', ''),
        ('max_train_samples', 'train on fewer examples'),
        ('eval_every', 'evaluate every N steps'),
    ),
}
_WIDTH = 100  # a help line's longest length


def load_config_module(spec: str):
  """The config file of a --config value ('path/to/file.py[:VARIANT]') as a module, and the variant ('' if none)."""
  path, _, variant = spec.partition(':')
  loader = importlib.util.spec_from_file_location('_config_help_' + re.sub(r'\W', '_', path), path)
  module = importlib.util.module_from_spec(loader)
  loader.loader.exec_module(module)
  return module, variant


def variant_lines(module) -> list[str]:
  """One line per variant: its docstring entry's names and first sentence; the VARIANTS names without one."""
  entries = _docstring_variants(module.__doc__ or '')
  named = {n for names, _ in entries for n in names}
  for table in ('VARIANTS', 'ABLATIONS'):
    for name in getattr(module, table, {}):
      if name not in named:
        entries.append(([name], ''))
        named.add(name)
  lines = []
  for names, text in entries:
    label = ', '.join(names)
    if len(label) > 16 and text:  # a long list of names: the text on its own line below them
      lines += [f'  {label}', _clip(f'  {"":<16} {text}')]
    else:
      lines.append(_clip(f'  {label:<16} {text}'))
  return lines


def _docstring_variants(doc: str) -> list[tuple[list[str], str]]:
  """([names], first sentence) of each entry of the docstring's 'Variants' block: an entry starts at the block's
  indent ('  name[, name...]  text'), its continuation lines are indented deeper; a blank line ends the block."""
  lines = doc.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith('Variants')), None)
  if start is None:
    return []
  entries, indent = [], None
  for line in lines[start + 1:]:
    if not line.strip():
      break
    depth = len(line) - len(line.lstrip())
    indent = depth if indent is None else indent
    entry = re.match(r'\s*(\w+(?:,\s*\w+)*)\s*(.*)', line) if depth == indent else None
    if entry:
      entries.append(([n.strip() for n in entry.group(1).split(',') if n.strip()], entry.group(2).strip()))
    elif entries and not re.match(r'\s*(python|--)', line) and not entries[-1][1].endswith('.'):
      entries[-1] = (entries[-1][0], f'{entries[-1][1]} {line.strip()}'.strip())
  return [(names, _first_sentence(text)) for names, text in entries]


def _first_sentence(text: str) -> str:
  match = re.match(r'(.+?\.)\s+[A-Z(]', text)  # a period before a capital: the first sentence's end
  return match.group(1) if match else text


def _clip(line: str) -> str:
  return line if len(line) <= _WIDTH else line[:_WIDTH - 3].rsplit(' ', 1)[0] + ' ...'


def field_docs(cls, prefix: str = '') -> dict[str, str]:
  """dotted field -> its comment in `cls`'s source (the trailing one, or the lines just above), blocks too."""
  docs: dict[str, str] = {}
  for klass in reversed(cls.__mro__):  # a subclass's comment wins over its base's
    if dataclasses.is_dataclass(klass):
      docs.update(_comments(klass))
  out = {}
  for f in dataclasses.fields(cls):
    out[prefix + f.name] = docs.get(f.name, '')
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(default):
      out.update(field_docs(type(default), f'{prefix}{f.name}.'))
  return out


def _comments(klass) -> dict[str, str]:
  out, above = {}, []
  for line in inspect.getsource(klass).splitlines()[1:]:
    text = line.strip()
    field = re.match(r'(\w+): [^=]+(?:=.*)?$', text)
    if text.startswith('#'):
      above.append(text.lstrip('# ').strip())
    elif field and line.startswith('  ') and not line.startswith('   '):
      trailing = text.split('  # ', 1)[1] if '  # ' in text else ''
      out[field.group(1)] = trailing or ' '.join(a for a in above if not a.startswith('---'))
      above = []
    else:
      above = []
  return out


def help_text(spec: str, schema) -> str:
  """The --help section of a config: its variants and, with a config class, its main fields with defaults."""
  module, _ = load_config_module(spec)
  variants = variant_lines(module)
  parts = [f'Config variants (--config={spec.partition(":")[0]}:VARIANT):', *variants] if variants else []
  if schema is not None and schema.__name__ in _MAIN_FIELDS:
    from bert_jax.config import CONFIG_TYPES, FinetuneConfig  # pylint: disable=g-import-not-at-top
    docs, defaults = {}, _flatten(module.get_config().to_dict())
    for cls in (schema,) + (CONFIG_TYPES if schema is FinetuneConfig else ()):  # each task kind's fields too
      docs = {**field_docs(cls), **docs}
    parts += ['' if parts else None,
              'Main fields (--config.FIELD=VALUE; the default variant\'s values; all: --print_config):']
    for name, fallback in _MAIN_FIELDS[schema.__name__]:
      if name in docs:  # a field this version has
        text = '; '.join(t for t in (fallback, _first_sentence(docs[name])) if t)
        value = repr(defaults.get(name))
        value = value if len(value) <= 24 else value[:20] + '...' + value[-1]
        parts.append(_clip(f'  {name} = {value}'.ljust(42) + f' {text}'))
  return '\n'.join(p for p in parts if p is not None)


def _flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(_flatten(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = value
  return out


def changes(spec: str, resolved: dict[str, Any]) -> list[str]:
  """'field: old -> new' for each field of `resolved` that differs from the variant's own config."""
  module, variant = load_config_module(spec)
  old, new = _flatten(module.get_config(variant).to_dict()), _flatten(resolved)
  return [f'{k}: {old.get(k, "(none)")!r} -> {new.get(k, "(none)")!r}' for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k)]


def print_config(spec: str, config: dict[str, Any], schema, explicit_model_fields=()) -> None:
  """Prints the resolved config (as the run uses it), the --config.* changes, parameters and tokens per step."""
  cfg = schema.from_dict(config) if schema is not None else None
  plan = None
  if cfg is not None and hasattr(cfg, 'task'):  # fine-tuning: the model is the starting checkpoint's
    from bert_jax.finetuning.plan import plan as finetuning_plan  # pylint: disable=g-import-not-at-top
    plan = finetuning_plan(cfg, explicit_model_fields)
    cfg = plan.cfg
  resolved = cfg.to_dict() if cfg is not None else config
  print(f'# config {spec}, resolved:')
  print(json.dumps(resolved, indent=2, sort_keys=True, default=str))
  diffs = changes(spec, config)
  print(f'# changed by --config.* flags ({len(diffs)}):' + ''.join(f'\n  {d}' for d in diffs))
  for note in plan.notes if plan is not None else ():
    print(f'# {note}')
  if cfg is not None and hasattr(cfg, 'model'):
    print(f'# parameters: {_parameters(cfg, plan)}')
    print(f'# tokens per step: {_tokens(cfg)}')


def _parameters(cfg, plan=None) -> str:
  """The parameter count of the run's model, from jax.eval_shape over its init (abstract: no weights made);
  `plan`: a fine-tuning run's (bert_jax.finetuning.plan: the starting checkpoint's architecture, the task's head)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top  # heavy: only --print_config needs it
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.model import heads  # pylint: disable=g-import-not-at-top
  if plan is not None:
    if plan.build is None:
      return plan.what
    build, what = plan.build, plan.what
  else:
    model, what = cfg.phase_list()[-1].cfg.model, 'encoder + pretraining heads'
    build = lambda: heads.BertForPreTraining(model, rngs=nnx.Rngs(0), nsp_head=cfg.data.sentence_pairs)
  state = nnx.state(nnx.eval_shape(build), nnx.Param)
  count = sum(x.size for x in jax.tree.leaves(state))
  return f'{count:,} ({what}; counted with jax.eval_shape over the model init, no weights made)'


def _tokens(cfg) -> str:
  """batch x sequence length per optimizer step (grad_accum_steps split it into micro-batches), per phase."""
  accum = cfg.optim.grad_accum_steps
  split = f' in {accum} micro-batches of {cfg.batch_size // accum}' if accum > 1 else ''
  if hasattr(cfg, 'task'):
    return f'{cfg.batch_size * cfg.max_seq_length:,} row tokens ({cfg.batch_size} x {cfg.max_seq_length}{split})'
  phases = cfg.phase_list()
  return '; '.join(f'{p.label + ": " if len(phases) > 1 else ""}{p.cfg.batch_size * p.cfg.data.max_seq_length:,} '
                   f'row tokens ({p.cfg.batch_size} x {p.cfg.data.max_seq_length}{split})' for p in phases)
