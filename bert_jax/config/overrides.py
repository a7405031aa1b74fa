"""FIELD=VALUE overrides given as text (a ladder's rungs and tasks; a sweep's grid is shell words too): split as a
shell splits words, each set into a config (an ml_collections ConfigDict) converted to its field's type, as the
command line's --config.FIELD would be, and the result checked against its config class."""

from __future__ import annotations

import re
import shlex

from bert_jax.config.finetune import field_readers
from bert_jax.config.migration import RENAMED
from bert_jax.errors import ConfigError

KEY = re.compile(r'[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*')  # a dotted field name


def shell_words(where: str, text: str) -> list[str]:
  """`text` split as a shell splits words (quotes keep spaces: path='/my data'); ConfigError for open quotes."""
  try:
    return shlex.split(text)
  except ValueError as e:  # shlex: 'No closing quotation' / 'No escaped character'
    raise ConfigError(f'{where}: {e} in {text!r} (quote a value with spaces as a shell would: key=\'a b\')') from None


def parse_overrides(where: str, text: str) -> tuple[tuple[str, str], ...]:
  """FIELD=VALUE words, split and quoted as a shell does (a value with spaces: data.train_files='/my data')."""
  out = []
  for word in shell_words(where, text):
    key, sep, value = word.partition('=')
    if not sep or not KEY.fullmatch(key):
      raise ConfigError(f'{where}: {word!r} is not FIELD=VALUE (shell words, e.g. "data.objective=sop '
                        'num_train_steps=150")')
    out.append((key, value))
  return tuple(out)


def set_override(cfg, key: str, value: str, where: str) -> None:
  """One FIELD=VALUE into a ConfigDict, converted to the field's type (as the command line would)."""
  node, parts = cfg, key.split('.')
  for i, part in enumerate(parts):
    if part not in node:
      readers = field_readers(key) if i == 0 else None
      hint = (f' (it is now {RENAMED[key]})' if key in RENAMED else
              f' ({key} is a field of {readers}, not of this config\'s task)' if readers else '')
      raise ConfigError(f'{where}: the config has no field {".".join(parts[:i + 1])}{hint}')
    node = node[part] if i < len(parts) - 1 else node
  old = node[parts[-1]]
  if not isinstance(old, (bool, int, float, str)):
    raise ConfigError(f'{where}: {key} is not a single value (a {type(old).__name__}): give its fields')
  try:
    if isinstance(old, bool) and value.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(value)
    node[parts[-1]] = value.lower() in ('true', '1') if isinstance(old, bool) else type(old)(value)
  except ValueError:
    raise ConfigError(f'{where}: {key}={value!r} is not a {type(old).__name__}') from None


def apply_overrides(cfg, overrides: tuple[tuple[str, str], ...], schema, where: str) -> None:
  """Sets each (FIELD, VALUE) into `cfg` (`set_override`) and checks that the result builds `schema` (its
  `from_dict`); ConfigError beginning with `where` for an unknown field, a value of the wrong type or a bad config."""
  for key, value in overrides:
    set_override(cfg, key, value, where)
  try:
    schema.from_dict(cfg.to_dict())
  except ConfigError as e:
    raise ConfigError(f'{where}: {e}') from None
