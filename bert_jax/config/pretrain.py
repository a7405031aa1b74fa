"""A pretraining run's config: `PretrainConfig` (the shared training block, the model, the corpus and the phases),
its corpus block (`DataConfig`, with the values its choice fields take) and one phase's fields (`PhaseConfig`).
The phases resolved once into the run's plan (`PretrainConfig.plan`) are `bert_jax.config.phases`'s."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from bert_jax.config import phases as _phases
from bert_jax.config.fields import _f
from bert_jax.config.model_config import ModelConfig, preset
from bert_jax.config.phases import Phase, _steps_for_tokens
from bert_jax.config.training import TrainingConfig
from bert_jax.errors import ConfigError

# data.objective and data.masking (DataConfig).
OBJECTIVES = ('nsp', 'sop', 'none')
MASKINGS = ('token', 'whole_word', 'span')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Pretraining corpus, its preparation (bert_jax/data/prepare.py) and example construction."""

  # Comma-separated files, globs or directories; gzip/bz2/xz files are read as they are.
  train_files: str = _f('data/wikitext-2-raw', path=True, fingerprinted=True, layout=True)
  # A mixture: comma-separated weights, one per train_files entry (each entry a corpus, prepared on its own);
  # training rows come from the corpora in these proportions, whatever their sizes. '' = one corpus of all files.
  train_weights: str = _f('', layout=True)
  # Held-out files; when empty, documents are held out by a keyed hash of their text with
  # probability `eval_fraction`.
  eval_files: str = _f('', path=True, fingerprinted=True)
  eval_fraction: float = _f(0.05, records=True)
  # Corpus format (corpus_formats.FORMATS): 'auto' detects wikiextractor, jsonl, wikitext or plain per file.
  format: str = _f('auto', records=True)
  text_field: str = _f('text', records=True)  # jsonl: the field that holds a document's text
  # Plain/jsonl text wrapped at a fixed width: a paragraph is the lines up to a blank line (and
  # in plain files a document ends at two blank lines) instead of one line each.
  hard_wrapped: bool = _f(False, records=True)
  # A SentencePiece .model, or a Hugging Face WordPiece tokenizer (a checkpoint directory, its
  # tokenizer.json or vocab.txt: the ids of that checkpoint's own tokenizer). Empty: train a
  # SentencePiece model (vocab = model.vocab_size) on a sample of the training sentences.
  tokenizer: str = _f('', path=True, fingerprinted=True)
  tokenizer_sample_sentences: int = _f(1_000_000, records=True)
  lower_case: bool = _f(True, records=True)  # for a trained tokenizer; a given one keeps its own normalisation
  # Where prepared records (and a trained tokenizer) are cached, keyed by a fingerprint; '' (default): the user's
  # cache directory, $XDG_CACHE_HOME/bert_jax (~/.cache/bert_jax); caches in data/cache (earlier versions') are found.
  cache_dir: str = _f('', free=True, path=True)
  # Preparation works on units of whole documents of about this many MB of input, one worker
  # process each: memory grows with unit_mb x num_workers, not with the corpus.
  unit_mb: int = _f(16, records=True)
  num_workers: int = _f(0, free=True)  # preparation worker processes per host; 0 = every local core
  max_seq_length: int = _f(128, records=True, layout=True)
  # Masked-LM slots per sequence; 0 = derived: ceil(masked_lm_prob * max_seq_length) (20 at 128).
  max_predictions_per_seq: int = 0
  masked_lm_prob: float = _f(0.15, layout=True)
  # > 0: a mask-rate schedule, the rate moving linearly from masked_lm_prob at the first step to
  # this at the last (Ankner et al. 2023: 0.3 -> 0.15); held-out batches are masked at this rate.
  masked_lm_prob_end: float = _f(0.0, layout=True)
  # The sentence-level objective beside masked LM, on records built for it (its own cache):
  # 'nsp': BERT's pairs, B the next segment or (half of the time) one from another document;
  # 'sop': ALBERT's sentence order, A and B always consecutive and swapped half of the time
  #   (the same two-way head; label 1 = swapped; reported as sop_*);
  # 'none': masked LM only, on RoBERTa's FULL-SENTENCES inputs ([CLS] contiguous sentences [SEP],
  #   crossing document boundaries with a [SEP]; built once, as masking is dynamic), no pair head.
  objective: str = 'nsp'
  short_seq_prob: float = _f(0.1, records=True)  # NSP/SOP pairs only
  # Passes over the documents when building NSP/SOP pairs (each pass pairs differently).
  dupe_factor: int = _f(5, records=True)
  # What masked LM predicts: 'token' (BERT: any tokens), 'whole_word' (every piece of the words
  # chosen), 'span' (SpanBERT: runs of whole words, lengths geometric with span_p, at most
  # span_max_words; one 80/10/10 choice per span).
  masking: str = 'token'
  span_p: float = 0.2
  span_max_words: int = 10
  # Processes that build training batches beside the training loop (grain's multiprocessing
  # prefetch); 0 builds them in a thread of the training process; -1 = automatic: none on a
  # CPU backend (its cores train), else one per local accelerator, at most half the cores.
  loader_workers: int = _f(-1, free=True)
  # Training batches only: pack each global batch's examples (the same examples and masks as
  # unpacked) several per row, with per-example attention, positions and [CLS] pooling — the same
  # function on fewer rows. BERT pairs mostly fill max_seq_length, so the gain depends on the data
  # (the bundled corpus's: docs/results.md).
  pack: bool = False
  # Packed rows are rounded up to a multiple of this (few shapes to compile, but fewer rows saved:
  # 8 saves nothing at seq 128 batch 32); times the process count it must be a multiple of
  # optim.grad_accum_steps x the batch shards (mesh data x fsdp).
  pack_rows_multiple: int = 8
  # At most this many examples share a row (the width of the per-row NSP arrays). Rows hold as
  # many masked-LM slots as any such examples can need (data.loader.packed_mlm_width: 21 at
  # seq 128 with 20 predictions; 20 with 2 per row).
  max_segments_per_row: int = 4

  def __post_init__(self):
    problems = []
    if not 8 <= self.max_seq_length <= 65535:  # [CLS] A [SEP] B [SEP] with room for text; uint16 record lengths
      problems.append(f'data.max_seq_length={self.max_seq_length} must be in [8, 65535]')
    if self.max_predictions_per_seq < 0:
      problems.append(f'data.max_predictions_per_seq={self.max_predictions_per_seq} must be >= 0 (0 = derived)')
    if not 0 <= self.short_seq_prob <= 1:
      problems.append(f'data.short_seq_prob={self.short_seq_prob} must be in [0, 1]')
    for name in ('dupe_factor', 'unit_mb', 'tokenizer_sample_sentences'):
      if getattr(self, name) < 1:
        problems.append(f'data.{name}={getattr(self, name)} must be >= 1')
    if self.num_workers < 0:
      problems.append(f'data.num_workers={self.num_workers} must be >= 0 (0 = every local core)')
    if not self.eval_files and not 0 < self.eval_fraction < 1:
      problems.append(f'data.eval_fraction={self.eval_fraction} must be in (0, 1) when data.eval_files is empty')
    if self.pack and (self.pack_rows_multiple < 1 or self.max_segments_per_row < 1):
      problems.append(f'data.pack_rows_multiple={self.pack_rows_multiple} and data.max_segments_per_row='
                      f'{self.max_segments_per_row} must be positive')
    if self.train_weights:
      problems.extend(_weight_problems(self.train_weights, self.train_files))
    if problems:
      raise ConfigError('; '.join(problems))
    if self.objective not in OBJECTIVES:
      raise ConfigError(f'data.objective must be one of {", ".join(OBJECTIVES)}, got {self.objective!r}')
    if self.masking not in MASKINGS:
      raise ConfigError(f'data.masking must be one of {", ".join(MASKINGS)}, got {self.masking!r}')
    for name in ('masked_lm_prob', 'masked_lm_prob_end'):
      if not 0 <= getattr(self, name) < 1:
        raise ConfigError(f'data.{name} must lie in [0, 1), got {getattr(self, name)}')
    if not 0 < self.span_p <= 1 or self.span_max_words < 1:
      raise ConfigError(f'data.span_p must lie in (0, 1] and data.span_max_words be >= 1, got '
                        f'{self.span_p} and {self.span_max_words}')
    if self.max_predictions_per_seq == 0:  # frozen: the derived value is set once, here
      object.__setattr__(self, 'max_predictions_per_seq',
                         max(1, math.ceil(self.max_masked_lm_prob * self.max_seq_length - 1e-9)))
    if self.max_predictions_per_seq > self.max_seq_length:
      raise ConfigError(f'data.max_predictions_per_seq={self.max_predictions_per_seq} must be in '
                        f'(0, max_seq_length={self.max_seq_length}]')

  def mixture(self) -> list[tuple[str, float]]:
    """(files, share) per corpus of a mixture (shares sum to 1); [] without train_weights."""
    if not self.train_weights:
      return []
    weights = [float(w) for w in self.train_weights.split(',')]
    files = [f.strip() for f in self.train_files.split(',') if f.strip()]
    return [(f, w / sum(weights)) for f, w in zip(files, weights)]

  @property
  def sentence_pairs(self) -> bool:
    """Records are sentence pairs with a label (NSP or SOP) and the model has the two-way head."""
    return self.objective != 'none'

  @property
  def max_masked_lm_prob(self) -> float:
    """The highest masking rate of the run (the schedule's start or end)."""
    return max(self.masked_lm_prob, self.masked_lm_prob_end)

  def masked_lm_prob_at(self, fraction: float) -> float:
    """The masking rate `fraction` of the way through training (0 = first step, 1 = last)."""
    if not self.masked_lm_prob_end:
      return self.masked_lm_prob
    return self.masked_lm_prob + (self.masked_lm_prob_end - self.masked_lm_prob) * min(max(fraction, 0.0), 1.0)

  @property
  def eval_masked_lm_prob(self) -> float:
    """Held-out batches are masked at the rate training ends at."""
    return self.masked_lm_prob_end or self.masked_lm_prob


def _weight_problems(weights: str, files: str) -> list[str]:
  """What is wrong with data.train_weights for data.train_files (one weight per comma-separated entry)."""
  try:
    values = [float(w) for w in weights.split(',')]
  except ValueError:
    return [f'data.train_weights={weights!r} must be comma-separated numbers, one per data.train_files entry']
  entries = [f for f in files.split(',') if f.strip()]
  if len(values) != len(entries):
    return [f'data.train_weights gives {len(values)} weight(s) for {len(entries)} data.train_files entries '
            f'({files!r}): one per entry']
  if not all(math.isfinite(v) and v > 0 for v in values):
    return [f'data.train_weights={weights!r}: each weight must be a positive number']
  return []


@dataclasses.dataclass(frozen=True)
class PhaseConfig:
  """One phase of a pretraining run: its length and what changes at its start (0 or '': as the phase before;
  the first phase starts from the run's own fields).

  The optimizer state, step, RNG and data position carry across phases; each phase reads records
  prepared at its own sequence length (and files) from the data position its first step is at.
  """

  order: int = 0  # its place in the run: 1, 2, ... (config dicts keep no order of their own)
  steps: int = 0  # the phase's length in optimizer steps (> 0), or:
  # its length in row tokens (batch rows x max_seq_length, its ramp's included): steps = the fewest that train
  # at least this many. The resolved steps are saved beside it.
  tokens: int = 0
  max_seq_length: int = 0  # data.max_seq_length from this phase on (context extension; packing as data.pack)
  batch_size: int = 0
  # A batch-size ramp at the phase's start: from ramp_batch_size rows, doubling, up to batch_size, each size
  # training an equal share of ramp_tokens tokens (rows x max_seq_length, rounded up to whole steps); the
  # phase's steps include the ramp's.
  ramp_batch_size: int = 0
  ramp_tokens: int = 0
  # The masking rate: constant, or a linear ramp over this phase to masked_lm_prob_end (> 0). Unset
  # (-1), a phase masks at the rate the phase before ended with.
  masked_lm_prob: float = -1.0
  masked_lm_prob_end: float = -1.0
  rope_theta: float = 0.0  # RoPE theta of the global layers (context extension raises it)
  local_rope_theta: float = 0.0  # ... and of the local layers
  # '': the run's learning-rate schedule goes on; 'decay': optim.schedule='wsd' decays from this phase's
  # first step to the run's last (the phase after the stable ones).
  lr: str = ''
  # optim.learning_rate (the peak) from this phase on, the schedule scaled by it / the run's (0: the phase before's)
  learning_rate: float = 0.0
  train_files: str = _f('', path=True)  # data.train_files from this phase on (comma-separated files)
  # data.train_weights from this phase on: one weight per train_files entry, each a corpus sampled in that
  # proportion. A phase that gives train_files gives their weights here too ('': one corpus of all of them).
  train_weights: str = ''

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PretrainConfig(TrainingConfig):
  """A pretraining run: the shared training block, the model and its corpus, and optionally its phases.

  `phases` (name -> PhaseConfig, run in their `order`; empty: one phase of num_train_steps) lays the run out as
  data: e.g. a stable phase at 128 tokens, an extension to 1,024 with a larger global RoPE theta, then a
  WSD decay. The run's length is then the sum of the phases' steps (num_train_steps 0 or that sum).
  """

  model: ModelConfig = _f(factory=lambda: preset('mini', vocab_size=8000))
  data: DataConfig = _f(factory=DataConfig)
  phases: dict[str, PhaseConfig] = _f(factory=dict, branch=True)
  # A branch run: this run continues another run's checkpoint (a pretraining workdir, only ever read) with
  # its whole state (parameters, optimizer, step, RNG, data position), e.g. a WSD decay started from a
  # checkpoint of the stable phase. Its config may differ from the other run's in `phases`, the run's
  # length and the schedule's decay; anything else as resume_allow allows.
  branch_from: str = _f('', path=True, branch=True)
  branch_step: int = _f(-1, branch=True)  # the checkpoint of branch_from: -1 = its latest
  # Held-out evaluation reads at most this many batches of eval_batch_size rows, spread evenly over the held-out
  # split, the same rows at every evaluation (5% of a large corpus is millions of rows); 0 = the whole split.
  max_eval_batches: int = _f(0, free=True, evaluation=True)

  def __post_init__(self):
    phases = {}
    for name, phase in (self.phases or {}).items():
      get = phase.get if isinstance(phase, dict) else lambda k, _, phase=phase: getattr(phase, k)
      steps, tokens = get('steps', 0), get('tokens', 0)
      if not isinstance(tokens, int) or tokens < 0:
        raise ConfigError(f'phases.{name}.tokens must be a whole number of tokens >= 0, got {tokens!r}')
      if not isinstance(steps, int) or steps < 0 or not (steps or tokens):
        raise ConfigError(f'phases.{name}.steps must be a positive number of steps (or give phases.{name}.tokens), '
                          f'got {steps!r}')
      if isinstance(phase, dict):
        try:
          phase = PhaseConfig(**phase)
        except TypeError:
          known = ', '.join(f.name for f in dataclasses.fields(PhaseConfig))
          raise ConfigError(f'phases.{name}: unknown key(s) '
                            f'{", ".join(sorted(set(phase) - set(known.split(", "))))}; '
                            f'a phase takes {known}') from None
      phases[name] = phase
    orders = sorted(p.order for p in phases.values())
    if orders != list(range(1, len(phases) + 1)):
      raise ConfigError('phases: give each phase its place in the run, order=1, 2, ... '
                        f'({", ".join(f"{n}: {p.order}" for n, p in phases.items())})')
    phases = dict(sorted(phases.items(), key=lambda item: item[1].order))
    batch, seq = self.batch_size, self.data.max_seq_length
    for name, p in phases.items():  # lengths in tokens -> steps, at each phase's batch size and length
      batch, seq = p.batch_size or batch, p.max_seq_length or seq
      if p.tokens and batch > 0 and seq > 0:  # (bad sizes are reported below)
        steps = _steps_for_tokens(f'phases.{name}', p, batch, seq)
        if p.steps and p.steps != steps:
          raise ConfigError(f'phases.{name}: its length is steps={p.steps} or tokens={p.tokens} ({steps} steps of '
                            f'{batch} x {seq}), not both: set phases.{name}.steps=0 to give it in tokens')
        phases[name] = dataclasses.replace(p, steps=steps)
    object.__setattr__(self, 'phases', phases)
    if phases and self.num_train_steps == 0 and self.num_train_epochs == 0:
      object.__setattr__(self, 'num_train_steps', sum(p.steps for p in phases.values()))  # checked below
    # Before the shared checks: keep_best's own need (eval_every > 0) is beside the point with phases.
    if phases and (self.keep_best or self.early_stopping_patience):
      what = 'keep_best ranks' if self.keep_best else 'early stopping compares'
      raise ConfigError(f'{what} checkpoints by one held-out metric, but each phase evaluates on its own '
                        'records and masking rate: drop it, or compare steps with experiments/evaluate.py')
    super().__post_init__()
    if self.max_eval_batches < 0:
      raise ConfigError(f'max_eval_batches must be >= 0 (0 = the whole held-out split), got {self.max_eval_batches}')
    if phases:
      self.plan  # pylint: disable=pointless-statement  # resolved now: a bad phase is refused at once
    if self.num_train_epochs and (self.data.train_weights or any(p.train_weights for p in phases.values())):
      raise ConfigError('an epoch of a mixture (data.train_weights) is no corpus\'s epoch: give num_train_steps '
                        '(or the phases\' steps or tokens)')
    if self.branch_from and self.init_checkpoint:
      raise ConfigError('branch_from continues another run with its whole state; init_checkpoint starts a new one '
                        'from weights: give one of them')

  @functools.cached_property
  def plan(self) -> _phases.Plan:
    """The run's phase plan, resolved once (`phases.resolve`): a cache beside the fields, not one of them."""
    return _phases.resolve(self)

  # Views of the plan, as earlier versions named them.
  def phase_list(self) -> list[Phase]:
    """The plan's stages (one phase named 'train' without `phases`)."""
    return list(self.plan.stages)

  def learning_rate_levels(self) -> list[tuple[int, float]] | None:
    """`Plan.lr_levels`: (first step, peak / optim.learning_rate) per stage when a phase sets its own peak."""
    return None if self.plan.lr_levels is None else list(self.plan.lr_levels)

  def decay_start(self) -> int | None:
    """`Plan.decay_start`: the first lr='decay' phase's first step (None: the schedule's default)."""
    return self.plan.decay_start

  def phase_at(self, step: int) -> Phase:
    """`Plan.at`: the stage that trains step `step` + 1 (the last from its end on)."""
    return self.plan.at(step)

  def phase_before(self, step: int) -> Phase:
    """`Plan.before`: the stage whose training produced the state at `step`."""
    return self.plan.before(step)
