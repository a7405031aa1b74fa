"""Prepared records stay byte-identical: caches of small corpora of several shapes against committed digests.

The digests in tests/fixtures/records_digests.json were recorded by this module's code on the
pipeline as it stood before its reader, pair construction and writing were vectorised (2026-11-25);
records.FORMAT_VERSION promises that the same inputs give the same records, so any change to them
must bump it (and re-record the fixture: `python3 tests/data/test_records_digests.py --write`).

The corpora are generated here from fixed text and `random.Random(<int>)` (stable across Python
versions): the bundled WikiText-2, long jsonl documents, short lines of documentation and code,
WikiExtractor pages with a one-document eval file, hard-wrapped plain text, NSP pairs and
FULL-SENTENCES records at seq 64 and 128. The tokenizer is a committed 1,000-piece SentencePiece
model, so the records depend on encoding only, never on how a tokenizer trains. Reader output on
odd text (every format, hard-wrapped or not) is digested too, since the records see it only
through a tokenizer.
"""

import hashlib
import json
import os
import random
import sys
import textwrap

import pytest

if __name__ == '__main__':  # run as a script to re-record the fixture: this checkout's bert_jax and harness
  _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]

from bert_jax.config import DataConfig  # noqa: E402
from bert_jax.data import corpus_files, corpus_formats, corpus_pieces, prepare, readers, records  # noqa: E402

from harness.inputs import FIXTURES, REPO  # noqa: E402

DIGESTS = os.path.join(FIXTURES, 'records_digests.json')
TOKENIZER = os.path.join(FIXTURES, 'records_spm.model')
VOCAB = 1000
BUNDLED = os.path.join(REPO, 'data', 'wikitext-2-raw')

# --------------------------------------------------------------------------- corpora

_WORDS = ('the a an of to in is it for on with as by this that value file path list item name type object '
          'module function class method return returns argument default error buffer stream socket thread '
          'lock queue event encoding bytes string number count index key mapping sequence iterator result '
          'option flag mode size time date zone locale handler logger record parser token node tree table '
          'row column cursor connection server client request response header body').split()
_CAPS = ('Return', 'Create', 'If', 'The', 'This', 'When', 'See', 'Note', 'Raise', 'Changed', 'New', 'Use',
         'For', 'Example', 'Otherwise', 'Only', 'Each', 'A', 'An', 'In')
_ODD = ('e.g.', 'i.e.', 'etc.', 'Mr.', 'No.', 'vol.', 'U.S.', 'approx.', 'Fig.', 'v.', 'p.')


def _phrase(rng: random.Random, n: int) -> str:
  words = [rng.choice(_WORDS) for _ in range(n)]
  if rng.random() < 0.3:
    words.insert(rng.randrange(len(words) + 1), rng.choice(_ODD))
  if rng.random() < 0.2:
    words.insert(rng.randrange(len(words) + 1), f'{rng.choice(_WORDS)}({rng.choice(_WORDS)}, {rng.randrange(100)})')
  if rng.random() < 0.1:
    words.insert(rng.randrange(len(words) + 1), rng.choice(('"quoted text."', "'x'", '(see below.)', '3.14',
                                                              'naïve', 'café', '–', '…', '\u00a0')))
  return f'{rng.choice(_CAPS)} {" ".join(words)}{rng.choice(".....!?:;")}'


def short_lines_text(rng: random.Random, num_docs: int) -> str:
  """Documentation pages with code: short lines, many short sentences, blank lines between pages."""
  docs = []
  for d in range(num_docs):
    lines = [f'{rng.choice(_WORDS)}.{rng.choice(_WORDS)}_{d}({rng.choice(_WORDS)}, *args, **kwargs)']
    for _ in range(rng.randrange(1, 30)):
      kind = rng.random()
      if kind < 0.45:
        lines.append(' '.join(_phrase(rng, rng.randrange(1, 9)) for _ in range(rng.randrange(1, 5))))
      elif kind < 0.6:
        lines.append(f'>>> {rng.choice(_WORDS)}.{rng.choice(_WORDS)}({rng.randrange(10)})')
        lines.append(str(rng.randrange(1000)))
      elif kind < 0.75:
        lines.append(f'    def {rng.choice(_WORDS)}(self, {rng.choice(_WORDS)}=None):')
        lines.append(f'        return self.{rng.choice(_WORDS)}[{rng.randrange(5)}]')
      elif kind < 0.85:
        lines.append(f'{rng.choice(_WORDS)} -- {_phrase(rng, rng.randrange(1, 6))}')
      elif kind < 0.9:
        lines.append(rng.choice(('Args:', 'Returns:', 'Raises:', '...', '*', '-' * rng.randrange(1, 40), '}',
                                 'See Also', 'x = 1; y = 2.', 'A.  B.', 'Hi!  "Go." Now.')))
      else:
        lines.append('\t' + _phrase(rng, rng.randrange(1, 12)) + rng.choice(('', ' ', '\t', '\r')))
    docs.append('\n'.join(lines))
  return '\n\n'.join(docs) + '\n'


def _wikitext_articles() -> list[list[str]]:
  """The bundled validation file's articles as lists of paragraphs."""
  return readers.read_all([os.path.join(BUNDLED, 'wiki.valid.raw')])


def jsonl_text(articles: list[list[str]], rng: random.Random, hard_wrapped: bool) -> str:
  """Long documents: several articles' paragraphs per JSON object (field 'body'), unicode escaped."""
  out, i = [], 0
  while i < len(articles):
    k = rng.randrange(1, 6)
    paragraphs = []
    for a in articles[i:i + k]:
      j = 0
      while j < len(a):
        n = rng.randrange(1, 8)
        paragraphs.append(' '.join(a[j:j + n]))
        j += n
    if hard_wrapped:
      body = '\n\n'.join(textwrap.fill(p, 72) for p in paragraphs)
    else:
      body = '\n'.join(paragraphs)
    out.append(json.dumps({'id': i, 'body': body, 'extra': [i, None]}))
    i += k
  return '\n'.join(out) + '\n'


def wikiextractor_text(articles: list[list[str]], rng: random.Random, first: int, num: int) -> str:
  docs = []
  for i in range(first, first + num):
    a = articles[i % len(articles)]
    title = f'Title {i}'
    body = [title, '']
    for sentence in a:
      body.append(sentence.replace(' @-@ ', '-'))
      if rng.random() < 0.2:
        body.append('Early life.')  # a heading: dropped
      if rng.random() < 0.1:
        body.append('<a href="x">linked</a> text <br/> goes on.')
    docs.append(f'<doc id="{i}" url="https://x/?curid={i}" title="{title}">\n' + '\n'.join(body) + '\n</doc>\n')
  return ''.join(docs)


def wrapped_plain_text(articles: list[list[str]], rng: random.Random) -> str:
  """Hard-wrapped pages: a blank line between paragraphs, two (or a form feed) between documents."""
  out = []
  for a in articles:
    paragraphs = [textwrap.fill(' '.join(a[j:j + 3]), rng.randrange(40, 90)) for j in range(0, len(a), 3)]
    out.append('\n\n'.join(paragraphs) + rng.choice(('\n\n\n', '\n\f\n', '\n\n\n\n')))
  return ''.join(out)


def write_corpora(directory: str) -> dict[str, str]:
  """Writes every corpus the cases read; returns name -> path (a file or a directory)."""
  articles = _wikitext_articles()
  paths = {'wikitext': BUNDLED}
  def write(name, text, binary=False):
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb' if binary else 'w', encoding=None if binary else 'utf-8', newline='' if not binary else None) as f:
      f.write(text)
    return path
  os.makedirs(os.path.join(directory, 'short'), exist_ok=True)
  write('short/a.txt', short_lines_text(random.Random(1), 700))
  # A byte order mark, '\r\n' line ends, invalid UTF-8 and odd separators in the second file.
  odd = short_lines_text(random.Random(2), 500).replace('\n', '\r\n', 200).encode()
  odd = b'\xef\xbb\xbf' + odd[:5000] + b' bad \xff\xfe bytes \xe2\x82 here. ' + odd[5000:]
  odd = odd.replace(b'Return', 'Return\u2028'.encode(), 30).replace(b'Create', b'Create\x0c', 5)
  write('short/b.txt', odd, binary=True)
  paths['short'] = os.path.join(directory, 'short')
  paths['jsonl'] = write('jsonl/long.jsonl', jsonl_text(articles, random.Random(3), False))
  paths['jsonl_wrapped'] = write('jsonl_wrapped/long.jsonl', jsonl_text(articles, random.Random(4), True))
  paths['wikiextractor'] = write('wikiextractor/wiki_00', wikiextractor_text(articles, random.Random(5), 0, 120))
  paths['wikiextractor_eval'] = write('wikiextractor_eval/wiki_99',
                                      wikiextractor_text(articles, random.Random(6), 500, 1))
  paths['wrapped'] = write('wrapped/book.txt', wrapped_plain_text(articles, random.Random(7)))
  return paths


# Each case: the corpus, then DataConfig fields over the defaults below.
_COMMON = dict(unit_mb=1, max_predictions_per_seq=10, eval_fraction=0.1, num_workers=1)
CASES = {
    'wikitext_nsp64': ('wikitext', dict(max_seq_length=64, dupe_factor=1)),
    'wikitext_mlm128': ('wikitext', dict(max_seq_length=128, objective='none')),
    'jsonl_nsp128': ('jsonl', dict(max_seq_length=128, dupe_factor=2, short_seq_prob=0.3, text_field='body')),
    'jsonl_wrapped_mlm64': ('jsonl_wrapped', dict(max_seq_length=64, objective='none', text_field='body',
                                                  hard_wrapped=True)),
    'short_nsp64': ('short', dict(max_seq_length=64, dupe_factor=2)),
    'short_mlm128': ('short', dict(max_seq_length=128, objective='none')),
    'wikiextractor_eval_nsp128': ('wikiextractor', dict(max_seq_length=128, dupe_factor=3,
                                                        eval_files='wikiextractor_eval')),
    'wrapped_nsp64': ('wrapped', dict(max_seq_length=64, dupe_factor=1, short_seq_prob=0.5, hard_wrapped=True,
                                      eval_fraction=0.3)),
}

# Odd text for the readers: separators, markup and quotes in every mix.
_FUZZ = ['Word. ', 'Next one', 'e.g. This', 'Mr. Smith. ', '"Quoted." ', '(1990.) ', 'No. 5 ', '...', '?! ',
         '\n', '\n', '\n', ' ', '\t', '\f', '\r', '\r\n', '\xa0', '\u2028', '\x85', ' = T = ', ' = = H = = ',
         '<doc id="1" title="T">', '</doc>', '<doc ', 'é', '{"text": "A b. C d."}', ' @-@ ', 'Heading.']


def _reader_digests(directory: str) -> dict[str, str]:
  """sha256 of the documents `read_documents` gives for odd text, per format, whole and in small chunks."""
  rng = random.Random(8)
  texts = [''.join(rng.choice(_FUZZ) for _ in range(rng.randint(1, 400))) for _ in range(40)]
  os.makedirs(directory, exist_ok=True)
  paths = []
  for i, text in enumerate(texts):
    paths.append(os.path.join(directory, f'odd{i}'))
    with open(paths[-1], 'w', encoding='utf-8', newline='') as f:
      f.write(text)
  out = {}
  for fmt in ('wikiextractor', 'wikitext', 'plain'):
    for hard_wrapped in (False, True):
      opts = corpus_formats.ReaderOptions(format=fmt, hard_wrapped=hard_wrapped)
      docs = [list(readers.read_documents([corpus_pieces.Piece(p, 0, os.path.getsize(p), fmt, '')], opts))
              for p in paths]
      out[f'{fmt}{"_wrapped" if hard_wrapped else ""}'] = _sha(json.dumps(docs).encode())
  return out


# --------------------------------------------------------------------------- digests


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def cache_digests(directory: str) -> dict[str, str]:
  """sha256 of every file of a cache but build.json; meta.json without what names the machine's paths."""
  out = {}
  for name in sorted(os.listdir(directory)):
    if name == records.BUILD_FILE:
      continue
    with open(os.path.join(directory, name), 'rb') as f:
      data = f.read()
    if name == records.META_FILE:
      meta = json.loads(data)
      meta.pop('fingerprint')  # a hash of the corpus paths, which are temporary here
      for field in ('train_files', 'eval_files', 'tokenizer'):
        meta['data_config'][field] = os.path.basename(meta['data_config'][field])
      data = json.dumps(meta, sort_keys=True).encode()
    out[name] = _sha(data)
  return out


def build_case(name: str, corpora: dict[str, str], cache_dir: str) -> dict[str, str]:
  corpus, fields = CASES[name]
  fields = {**_COMMON, **fields}
  if 'eval_files' in fields:
    fields['eval_files'] = corpora[fields['eval_files']]
  cfg = DataConfig(train_files=corpora[corpus], cache_dir=os.path.join(cache_dir, name), tokenizer=TOKENIZER,
                   **fields)
  data = prepare.prepare_pretraining_data(cfg, vocab_size=VOCAB, seed=0, log=lambda _: None)
  return cache_digests(data.dir)


def all_digests(tmp: str) -> dict:
  corpora = write_corpora(os.path.join(tmp, 'corpora'))
  out = dict(format_version=records.FORMAT_VERSION, readers=_reader_digests(os.path.join(tmp, 'odd')),
             corpora={k: _sha(_tree_bytes(v)) for k, v in sorted(corpora.items()) if k != 'wikitext'})
  out['caches'] = {name: build_case(name, corpora, os.path.join(tmp, 'caches')) for name in CASES}
  return out


def _tree_bytes(path: str) -> bytes:
  paths = [path] if os.path.isfile(path) else sorted(os.path.join(path, n) for n in os.listdir(path))
  data = b''
  for p in paths:
    with open(p, 'rb') as f:
      data += os.path.basename(p).encode() + b'\0' + f.read()
  return data


# --------------------------------------------------------------------------- the test


@pytest.fixture(scope='module')
def recorded():
  with open(DIGESTS, encoding='utf-8') as f:
    return json.load(f)


@pytest.fixture(scope='module')
def corpora(tmp_path_factory):
  return write_corpora(str(tmp_path_factory.mktemp('corpora')))


def test_the_corpora_and_readers_are_byte_identical_to_the_recorded_digests(recorded, corpora, tmp_path):
  assert records.FORMAT_VERSION == recorded['format_version'], 'a new format: re-record the fixture'
  # The generated corpora themselves first: a difference there is this module's, not the pipeline's.
  assert {k: _sha(_tree_bytes(v)) for k, v in sorted(corpora.items()) if k != 'wikitext'} == recorded['corpora']
  assert _reader_digests(str(tmp_path / 'odd')) == recorded['readers']
  assert sorted(CASES) == sorted(recorded['caches']), 'cases added or removed: re-record the fixture'


# One test per case (all of them in one test took 3.5-5.3 s, over the fast tier's 5 s in a slow hour).
@pytest.mark.parametrize('name', list(CASES))
def test_records_are_byte_identical_to_the_recorded_digests(name, recorded, corpora, tmp_path):
  assert build_case(name, corpora, str(tmp_path / 'caches')) == recorded['caches'][name], name


if __name__ == '__main__':
  import tempfile  # pylint: disable=g-import-not-at-top
  if sys.argv[1:] != ['--write']:
    sys.exit('usage: python3 tests/data/test_records_digests.py --write  (re-records the fixture)')
  if not os.path.exists(TOKENIZER):
    from bert_jax.data import tokenization  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      corpora = write_corpora(tmp)
      sample = [s for key in ('short', 'jsonl', 'wikiextractor') for p in corpus_files.resolve_files(corpora[key])
                for d in readers.read_all([p], corpus_formats.ReaderOptions(text_field='body')) for s in d]
      # Identity normalisation: no 240 KB NFKC table in the committed model.
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top
      train = spm.SentencePieceTrainer.train
      spm.SentencePieceTrainer.train = lambda **kw: train(**{**kw, 'normalization_rule_name': 'identity'})
      tokenization.train_sentencepiece(sample, TOKENIZER, VOCAB, lower_case=False, seed=0)
      spm.SentencePieceTrainer.train = train
  with tempfile.TemporaryDirectory() as tmp:
    digests = all_digests(tmp)
  with open(DIGESTS, 'w', encoding='utf-8') as f:
    json.dump(digests, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'wrote {DIGESTS}: {len(digests["caches"])} caches')
