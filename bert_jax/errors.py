"""The one exception type for bad user input (files, flags, configs, checkpoints), and Preempted.

Entry points print a BertJaxError's message as a single line and exit non-zero; anything else is a
bug and keeps its traceback. Preempted is not bad input: code that cleans up after bad input (a
half-built data cache, say) must let it pass and keep what was finished.
"""


class BertJaxError(Exception):
  """Bad input: the message alone tells the user what to fix."""


class ConfigError(BertJaxError, ValueError):
  """A configuration value or key is invalid."""


class DataError(BertJaxError, ValueError):
  """A corpus, tokenizer or dataset file is missing, empty or unusable."""


class CheckpointError(BertJaxError, ValueError):
  """A workdir or checkpoint does not match the model being built."""


class UnusableCheckpoint(CheckpointError):
  """A checkpoint whose own bytes do not read back, or that holds a non-finite or exploded state."""


class CheckpointGone(CheckpointError):
  """A checkpoint deleted while it was read (a running run's rotation), which says nothing of its bytes."""


class CheckpointWriteError(CheckpointError):
  """Saving failed on the filesystem (full disk, quota, read-only); the last complete checkpoint is kept.

  `reason` is the filesystem's own words ('No space left on device'), for a caller that says the rest itself.
  """

  def __init__(self, message: str, reason: str = ''):
    super().__init__(message)
    self.reason = reason


class Preempted(Exception):
  """The run stopped on a signal after saving (or keeping) what it finished; rerunning the command resumes."""
