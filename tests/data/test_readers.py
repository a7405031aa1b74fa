"""Tests for reading corpora (bert_jax.data.readers and the corpus_files, corpus_formats, corpus_pieces and
sentence_split modules it reads with): formats, compression, pieces and units, sentence splitting, file resolution
and bad input."""

import bz2
import gzip
import json
import lzma
import os
import random
import re
import shutil

import pytest

from bert_jax.data import corpus_files, corpus_formats, corpus_pieces, readers, sentence_split
from bert_jax.errors import ConfigError, DataError

from harness.inputs import REPO

WIKITEXT_VALID = os.path.join(REPO, 'data', 'wikitext-2-raw', 'wiki.valid.raw')
ENWIKI = os.path.join(os.path.dirname(REPO), 'shared', 'data', 'enwiki-2015')
ENWIKI_00 = os.path.join(ENWIKI, 'wiki_00')
needs_enwiki = pytest.mark.skipif(
    not os.path.exists(ENWIKI_00),
    reason='shared/data/enwiki-2015/wiki_00 is not staged next to this checkout')

HARD_WRAPPED = corpus_formats.ReaderOptions(hard_wrapped=True)
COMPRESS = {'gzip': gzip.compress, 'bz2': bz2.compress, 'xz': lzma.compress}


def _write(path, text, mode='w'):
  with open(path, mode) as f:
    f.write(text)
  return str(path)


def _head(path, num_lines):
  with open(path, encoding='utf-8') as f:
    return ''.join(next(f) for _ in range(num_lines))


def _read(paths, opts=corpus_formats.ReaderOptions()):
  stats = {}
  docs = readers.read_all(paths, opts, stats)
  return docs, stats


def _one_line_error(excinfo, *parts):
  message = str(excinfo.value)
  assert '\n' not in message, message
  for part in parts:
    assert part in message, (part, message)


# Synthetic corpora of each format: 40 documents of varied length, so small units cut them.

def _sentences(i):
  # Commas: WikiExtractor drops a short line like 'Document 0 sentence 0.' as a heading.
  return ' '.join(f'Document {i}, sentence {j}, is here.' for j in range(1 + i % 4))


def _wikiextractor_text(n=40):
  return ''.join(f'<doc id="{i}" url="u" title="Title {i}">\nTitle {i}\n\n{_sentences(i)}\n'
                 f'Second paragraph of {i}.\n</doc>\n' for i in range(n))


def _wikitext_text(n=40):
  return ''.join(f' = Title {i} = \n \n {_sentences(i)} \n \n = = Part = = \n \n'
                 f' Part @-@ two of {i} .\n \n' for i in range(n))


def _plain_text(n=40):
  return '\n\n'.join(f'{_sentences(i)}\nAnother line of {i}.' for i in range(n)) + '\n'


def _wrapped_text(n=40):
  docs = []
  for i in range(n):
    docs.append(f'First paragraph of document {i}\nwraps here. It goes\non.\n\n'
                f'Second paragraph {i}\nalso wraps.')
  # Documents end at two or more blank lines, or at a form feed (on its own line or opening
  # the next document's first line).
  ends = {4: '\n\f\n', 2: '\n\f'}
  return ''.join(doc + ends.get(i % 5, '\n\n\n' + '\n' * (i % 2)) for i, doc in enumerate(docs))


def _jsonl_text(n=40, field='text'):
  return ''.join(json.dumps({'id': i, field: f'{_sentences(i)}\nLine two of {i}.'}) + '\n' +
                 ('\n' if i % 7 == 0 else '') for i in range(n))


SYNTHETIC = {
    'wikiextractor': (_wikiextractor_text, corpus_formats.ReaderOptions()),
    'wikitext': (_wikitext_text, corpus_formats.ReaderOptions()),
    'plain': (_plain_text, corpus_formats.ReaderOptions()),
    'plain-wrapped': (_wrapped_text, HARD_WRAPPED),
    'jsonl': (_jsonl_text, corpus_formats.ReaderOptions()),
    'jsonl-wrapped': (_jsonl_text, HARD_WRAPPED),
}


def test_wikitext_real_snippet(tmp_path):
  path = _write(tmp_path / 'wiki.raw', _head(WIKITEXT_VALID, 60))
  docs, stats = _read([path])
  assert stats['formats'] == {'wikitext': 1}
  assert len(docs) == 2  # ' = Homarus gammarus = ' and, from line 48, ' = Frank Headlam = '
  first = docs[0]
  assert first[0] == 'Homarus gammarus , known as the European lobster or common lobster , is a ' \
      'species of clawed lobster from the eastern Atlantic Ocean , Mediterranean Sea and parts ' \
      'of the Black Sea .'
  assert first[1] == 'It is closely related to the American lobster , H. americanus .'
  text = ' '.join(first)
  assert 'Homarus gammarus =' not in text and '= =' not in text  # titles and headings dropped
  assert '@' not in text and '0.7 – 2.2 kg' in text and '4,386 t' in text
  assert docs[1][0].startswith('Air Vice Marshal Frank Headlam ,')
  assert stats['documents'] == 2 and stats['sentences'] == len(first) + len(docs[1])
  assert stats['files'] == 1 and stats['bytes'] == os.path.getsize(path)
  assert len(first) > 20


def test_wikitext_articles_split_documents(tmp_path):
  text = (' \n = First = \n \n A sentence here . Another one .\n \n = = Part = = \n \n'
          ' More text .\n = Second = \n \n'
          ' Red @-@ tipped claws , 1 @,@ 000 of them , 0 @.@ 5 kg .\n')
  docs, _ = _read([_write(tmp_path / 'w.txt', text)])
  assert docs == [['A sentence here .', 'Another one .', 'More text .'],
                  ['Red-tipped claws , 1,000 of them , 0.5 kg .']]


def test_wikiextractor_synthetic(tmp_path):
  text = ('<doc id="1" url="u" title="Lobster">\nLobster\n\nLobsters live in the sea. They are '
          'blue.<br>\nEarly life.\n<dl>Tags go, leaving text.</dl>\n</doc>\n'
          '<doc id="2" url="u" title="Crab">\nCrab\n\n'
          'Crabs walk sideways. <ref>Smith 2001</ref> Really.\n</doc>\n')
  docs, stats = _read([_write(tmp_path / 'wiki_00', text)])
  assert stats['formats'] == {'wikiextractor': 1}
  # The title line and the section heading 'Early life.' are dropped.
  assert docs == [['Lobsters live in the sea.', 'They are blue.', 'Tags go, leaving text.'],
                  ['Crabs walk sideways.', 'Smith 2001 Really.']]


@needs_enwiki
def test_wikiextractor_real_document(tmp_path):
  with open(ENWIKI_00, encoding='utf-8') as f:
    lines = []
    for line in f:
      lines.append(line)
      if line.startswith('</doc>') and sum(l.startswith('<doc ') for l in lines) == 2:
        break
  docs, stats = _read([_write(tmp_path / 'wiki_00', ''.join(lines))])
  assert stats['formats'] == {'wikiextractor': 1} and len(docs) == 2
  assert docs[0][0].startswith('Anarchism is a political philosophy')  # title line dropped
  assert docs[0][1] == 'Anarchism holds the state to be undesirable, unnecessary, or harmful.'
  assert not any('<' in s and '>' in s for d in docs for s in d)


def test_plain_text_documents(tmp_path):
  text = 'First doc. Two sentences.\nA new line.\n\n\nSecond doc here!\n  \nThird.\n'
  docs, stats = _read([_write(tmp_path / 'p.txt', text)])
  assert stats['formats'] == {'plain': 1}
  assert docs == [['First doc.', 'Two sentences.', 'A new line.'], ['Second doc here!'],
                  ['Third.']]


def test_hard_wrapped_plain_text(tmp_path):
  text = ('NAME\n    ls - list\n    directory contents\n\nDESCRIPTION\n    List information\n'
          '    about the FILEs. Sort entries\n    alphabetically.\n\n \n\nCAT(1)\nConcatenate\n'
          'files.\n\fPage three\nstarts here.\n')
  path = _write(tmp_path / 'man.txt', text)
  docs, _ = _read([path], HARD_WRAPPED)
  # Lines of a paragraph join with spaces; two or more blank lines or a form feed end a document.
  assert docs == [['NAME ls - list directory contents', 'DESCRIPTION List information about the '
                   'FILEs.', 'Sort entries alphabetically.'],
                  ['CAT(1) Concatenate files.'], ['Page three starts here.']]
  # Without hard_wrapped every line is a paragraph and one blank line ends a document.
  docs, _ = _read([path])
  assert docs[0] == ['NAME', 'ls - list', 'directory contents']
  assert len(docs) == 3 and docs[2][-3:] == ['files.', 'Page three', 'starts here.']


def test_jsonl_custom_field(tmp_path):
  lines = [{'id': 1, 'body': 'One doc. Two sentences.\nSecond line here.'},
           {'id': 2, 'body': 'Hard wrapped\nparagraph. Here.\n\nNext paragraph.', 'text': 7}]
  path = _write(tmp_path / 'c.jsonl', json.dumps(lines[0]) + '\n\n' + json.dumps(lines[1]) + '\n')
  opts = corpus_formats.ReaderOptions(text_field='body')
  assert corpus_formats.detect_format(path, opts) == ('jsonl', '')
  docs, stats = _read([path], opts)
  assert stats['formats'] == {'jsonl': 1} and stats['documents'] == 2
  assert docs == [['One doc.', 'Two sentences.', 'Second line here.'],
                  ['Hard wrapped', 'paragraph.', 'Here.', 'Next paragraph.']]
  docs, _ = _read([path], corpus_formats.ReaderOptions(text_field='body', hard_wrapped=True))
  assert docs[1] == ['Hard wrapped paragraph.', 'Here.', 'Next paragraph.']


@pytest.mark.parametrize('name, text, expected', [
    ('wiki_00', '\n<doc id="1" url="u" title="T">\nT\nText.\n</doc>\n', 'wikiextractor'),
    ('w.raw', ' \n = Title = \n \n Text .\n', 'wikitext'),
    ('crlf.raw', 'Preamble\r\n = Title = \r\n', 'wikitext'),
    ('n.txt', ' = \n = x\n = = Heading = = \n', 'plain'),
    ('a.json', '\n{"text": "Hello."}\n', 'jsonl'),
    ('p.txt', '{not json}\n\nText.\n', 'plain'),
    ('l.txt', '[1, 2]\n', 'plain'),
    ('e.txt', '', 'plain'),
    ('b.txt', '\ufeff{"text": "A byte order mark."}\n', 'jsonl'),
])
def test_detect_format(tmp_path, name, text, expected):
  path = _write(tmp_path / name, text)
  assert corpus_formats.detect_format(path, corpus_formats.ReaderOptions()) == (expected, '')
  # An explicit format is taken as given.
  assert corpus_formats.detect_format(path, corpus_formats.ReaderOptions(format='wikitext')) == ('wikitext', '')


def test_byte_order_mark_is_not_text(tmp_path):
  path = _write(tmp_path / 'b.txt', '\ufeff{"text": "A byte order mark."}\n')
  assert _read([path])[0] == [['A byte order mark.']]


@pytest.mark.parametrize('compression', ['gzip', 'bz2', 'xz'])
@pytest.mark.parametrize('kind', ['wikiextractor', 'wikitext', 'plain-wrapped', 'jsonl'])
def test_compressed_files_read_like_uncompressed(tmp_path, kind, compression):
  make, opts = SYNTHETIC[kind]
  raw = make().encode()
  plain = _write(tmp_path / 'corpus', raw, 'wb')
  # Named .txt: compression is recognised by magic bytes, not by the name.
  packed = _write(tmp_path / 'packed.txt', COMPRESS[compression](raw), 'wb')
  fmt = kind.split('-')[0]
  assert corpus_formats.detect_format(packed, opts) == (fmt, compression)
  units = corpus_pieces.plan_units([packed], opts, unit_bytes=100)
  assert units == [[corpus_pieces.Piece(packed, 0, -1, fmt, compression)]]
  stats = {}
  docs = list(readers.read_documents(units[0], opts, stats))
  assert docs == _read([plain], opts)[0] and len(docs) == 40
  assert stats['bytes'] == len(raw) and stats['files'] == 1


def test_read_in_small_chunks(tmp_path, monkeypatch):
  """Pieces are parsed a few MiB at a time; tiny chunks must give the same documents."""
  paths = {kind: _write(tmp_path / kind, make()) for kind, (make, _) in SYNTHETIC.items()}
  expected = {kind: _read([paths[kind]], opts)[0] for kind, (_, opts) in SYNTHETIC.items()}
  monkeypatch.setattr(corpus_files, 'READ_BYTES', 7)
  monkeypatch.setattr(readers, '_CHUNK_BYTES', 50)
  for kind, (_, opts) in SYNTHETIC.items():
    assert _read([paths[kind]], opts)[0] == expected[kind], kind
    gz = _write(tmp_path / f'{kind}.gz', gzip.compress(open(paths[kind], 'rb').read()), 'wb')
    assert _read([gz], opts)[0] == expected[kind], kind
    # The planner also reads in small blocks.
    units = corpus_pieces.plan_units([paths[kind]], opts, unit_bytes=300)
    assert [d for u in units for d in readers.read_documents(u, opts)] == expected[kind], kind


def _pieces_read_like_whole_file(path, opts, unit_bytes):
  whole = [corpus_pieces.Piece(path, 0, os.path.getsize(path), *corpus_formats.detect_format(path, opts))]
  expected = list(readers.read_documents(whole, opts))
  units = corpus_pieces.plan_units([path], opts, unit_bytes)
  pieces = [p for u in units for p in u]
  # Pieces tile the file in order.
  assert pieces[0].start == 0 and pieces[-1].end == os.path.getsize(path)
  assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
  assert [d for u in units for d in readers.read_documents(u, opts)] == expected
  return expected, pieces


@pytest.mark.parametrize('unit_bytes', [1, 97, 1000, 10**9])
@pytest.mark.parametrize('kind', list(SYNTHETIC))
@pytest.mark.parametrize('newline', ['\n', '\r\n'])
def test_pieces_read_like_whole_file(tmp_path, kind, unit_bytes, newline):
  make, opts = SYNTHETIC[kind]
  path = _write(tmp_path / kind, make().replace('\n', newline).encode(), 'wb')
  docs, pieces = _pieces_read_like_whole_file(path, opts, unit_bytes)
  assert len(docs) == 40
  with open(path, 'rb') as f:
    data = f.read()
  for piece in pieces[1:]:  # every cut is at a document boundary
    assert data[piece.start - 1:piece.start] == b'\n'
    line = data[piece.start:data.index(b'\n', piece.start)]
    before = data[:piece.start].split(b'\n')[-3:-1]
    if kind == 'wikiextractor':
      assert line.startswith(b'<doc ')
    elif kind == 'wikitext':
      assert line.startswith(b' = Title ')
    elif kind == 'plain':
      assert before[-1].strip() == b'' and line.strip()
    elif kind == 'plain-wrapped':
      assert (b'\f' in before[-1] or line.startswith(b'\f') or
              [b.strip() for b in before] == [b'', b'']), (before, line)
  if unit_bytes == 1:  # a cut at every boundary
    assert len(pieces) == (40 if kind in ('wikiextractor', 'wikitext', 'plain', 'plain-wrapped')
                           else _jsonl_text().count('\n'))


# Pieces that parse differently from the whole file would show up on odd inputs: mixes of
# blank lines, form feeds, '\r', Unicode line and space separators and half-formed markup.
_FUZZ_TOKENS = ['Word. ', 'Next one', '\n', '\n', '\n', ' ', '\f', '\r', '\r\n', '\xa0', '\u2028',
                '\x85', ' = T = ', ' = = H = = ', '<doc id="1" title="T">', '</doc>', '<doc ', 'é']


@pytest.mark.parametrize('fmt', ['wikiextractor', 'wikitext', 'plain'])
@pytest.mark.parametrize('hard_wrapped', [False, True])
def test_pieces_and_chunks_of_odd_text(tmp_path, monkeypatch, fmt, hard_wrapped):
  rng = random.Random(0)
  opts = corpus_formats.ReaderOptions(format=fmt, hard_wrapped=hard_wrapped)
  path = str(tmp_path / 'odd')
  for _ in range(60):
    text = ''.join(rng.choice(_FUZZ_TOKENS) for _ in range(rng.randint(1, 120)))
    _write(path, text.encode(), 'wb')
    whole = [corpus_pieces.Piece(path, 0, os.path.getsize(path), fmt, '')]
    expected = list(readers.read_documents(whole, opts))
    for unit_bytes in (1, 4, 15):
      units = corpus_pieces.plan_units([path], opts, unit_bytes)
      assert [d for u in units for d in readers.read_documents(u, opts)] == expected, text
    with monkeypatch.context() as m:
      m.setattr(corpus_files, 'READ_BYTES', 3)
      m.setattr(readers, '_CHUNK_BYTES', 10)
      assert list(readers.read_documents(whole, opts)) == expected, text


def test_pieces_of_real_corpora():
  docs, pieces = _pieces_read_like_whole_file(WIKITEXT_VALID, corpus_formats.ReaderOptions(), 50_000)
  assert len(pieces) > 15 and len(docs) > 50
  if os.path.exists(ENWIKI_00):
    docs, pieces = _pieces_read_like_whole_file(ENWIKI_00, corpus_formats.ReaderOptions(), 50_000)
    assert len(pieces) > 15 and len(docs) > 30


def test_plan_units_groups_small_files(tmp_path):
  opts = corpus_formats.ReaderOptions()
  paths = [_write(tmp_path / f'{i:02d}.txt', f'Man page {i}. ' * (1 + i % 3) + '\n')
           for i in range(12)]
  empty = _write(tmp_path / 'empty.txt', '')
  big = _write(tmp_path / 'big.txt', 'One long paragraph without a blank line. ' * 10 + '\n')
  sizes = {p: os.path.getsize(p) for p in paths + [big]}
  units = corpus_pieces.plan_units(paths[:6] + [empty, big] + paths[6:], opts, unit_bytes=100)
  pieces = [p for u in units for p in u]
  # Files keep their order; an empty file gives no piece; a file without a boundary after
  # its nominal cuts stays whole.
  assert [p.path for p in pieces] == paths[:6] + [big] + paths[6:]
  assert all(p.start == 0 and p.end == sizes[p.path] and p.format == 'plain' for p in pieces)
  # Greedy packing: each unit is at most unit_bytes unless it is one larger piece, and the
  # next piece did not fit.
  totals = [sum(p.end - p.start for p in u) for u in units]
  assert all(t <= 100 or len(u) == 1 for t, u in zip(totals, units))
  assert [u for u in units if u[0].path == big] == [[pieces[6]]] and sizes[big] > 100
  for unit, following in zip(units, units[1:]):
    assert sum(p.end - p.start for p in unit) + following[0].end - following[0].start > 100
  assert max(len(u) for u in units) >= 3
  # Deterministic, and a function of the files' bytes only.
  assert corpus_pieces.plan_units(paths[:6] + [empty, big] + paths[6:], opts, 100) == units
  copy = tmp_path / 'copy'
  shutil.copytree(tmp_path, copy, ignore=shutil.ignore_patterns('copy'))
  moved = corpus_pieces.plan_units([str(copy / os.path.basename(p)) for p in
                              paths[:6] + [empty, big] + paths[6:]], opts, 100)
  assert [[(p.start, p.end, p.format, os.path.basename(p.path)) for p in u] for u in moved] == \
      [[(p.start, p.end, p.format, os.path.basename(p.path)) for p in u] for u in units]


def test_plan_units_counts_compressed_files_on_disk(tmp_path):
  opts = corpus_formats.ReaderOptions()
  text = ''.join(f'Paragraph {i} of a long file.\n\n' for i in range(200)).encode()
  gz = _write(tmp_path / 'a.gz', gzip.compress(text), 'wb')
  small = _write(tmp_path / 'b.txt', 'Small.\n')
  on_disk = os.path.getsize(gz)
  assert on_disk < 1000 < len(text)
  units = corpus_pieces.plan_units([gz, small], opts, unit_bytes=on_disk + 7)
  assert units == [[corpus_pieces.Piece(gz, 0, -1, 'plain', 'gzip'),
                    corpus_pieces.Piece(small, 0, 7, 'plain', '')]]
  assert len(corpus_pieces.plan_units([gz, small], opts, unit_bytes=on_disk + 6)) == 2
  # A compressed empty file gives no pieces either.
  assert corpus_pieces.plan_units([_write(tmp_path / 'e.gz', gzip.compress(b''), 'wb')], opts, 10) == []


def test_multi_file_units_read_like_whole_files(tmp_path):
  opts = corpus_formats.ReaderOptions()
  paths = [_write(tmp_path / f'{i}.txt', _plain_text(5 + i)) for i in range(4)]
  paths.append(_write(tmp_path / 'w.raw', _wikitext_text(9)))
  expected = _read(paths, opts)[0]
  for unit_bytes in (50, 400, 2000):
    units = corpus_pieces.plan_units(paths, opts, unit_bytes)
    stats = {}
    assert [d for u in units for d in readers.read_documents(u, opts, stats)] == expected
    # Summed over units, each file counts once; formats count pieces.
    assert stats['files'] == 5 and stats['documents'] == len(expected)
    assert stats['bytes'] == sum(os.path.getsize(p) for p in paths)
    assert sum(stats['formats'].values()) == sum(len(u) for u in units)


@pytest.mark.parametrize('text, expected', [
    ('It is big . It is blue .', ['It is big .', 'It is blue .']),
    ('Related to the American lobster , H. americanus . It grows .',
     ['Related to the American lobster , H. americanus .', 'It grows .']),
    ('Mr. Smith met Dr. Jones at St. Mary. Then they left.',
     ['Mr. Smith met Dr. Jones at St. Mary.', 'Then they left.']),
    ('The U.S. Army came, e.g. Col. Brown. It was No. 5 in line. He said no. Then left.',
     ['The U.S. Army came, e.g. Col. Brown.', 'It was No. 5 in line.', 'He said no.',
      'Then left.']),
    ('Is it? Yes! "Really." She laughed. (It was 1990.) Next.',
     ['Is it?', 'Yes!', '"Really."', 'She laughed.', '(It was 1990.)', 'Next.']),
    ('Prices rose 3.5 percent in 2001. 2002 was worse. apples etc. and pears.',
     ['Prices rose 3.5 percent in 2001.', '2002 was worse. apples etc. and pears.']),
    ('He said " go away . " Then he left . " The Song " is old .',
     ['He said " go away . "', 'Then he left .', '" The Song " is old .']),
])
def test_split_sentences(text, expected):
  assert sentence_split.split_sentences(text) == expected


# Sentence-boundary material: abbreviations, initials, quotes, brackets, numbers, odd whitespace.
_SENTENCE_FUZZ = ['Word. ', 'Next one', 'e.g. This', 'Mr. Smith. ', '"Quoted." ', '(1990.) ', 'No. 5 ', 'no. 5',
                  '...', '?! ', '. " ', ' " ', '"', 'A.', 'U.S. ', 'H. ', '\n', ' ', '\t', '\f', '\r', '\xa0',
                  '\u2028', '\x85', 'é', ' . ', '.)', '.” ', '.’ ', "'", '“', '‘', '(', '[', 'Zz', '9',
                  'x' * 45 + '. ', 'etc.', 'vol.', 'Fig. 3', '!.', '.?"', ') ', ']. ']


def test_document_sentences_are_split_sentences_of_each_paragraph():
  rng = random.Random(0)
  for _ in range(3000):
    text = ''.join(rng.choice(_SENTENCE_FUZZ) for _ in range(rng.randint(1, 40)))
    paragraphs = [p for p in (corpus_formats._clean(line) for line in text.split('\n')) if p]
    expected = [s for p in paragraphs for s in sentence_split.split_sentences(p)]
    assert sentence_split.document_sentences(paragraphs) == expected


def test_last_word_is_what_the_regex_captures():
  regex = re.compile(r'(\S*)\.["\'”’)\]]*$')
  rng = random.Random(0)
  for _ in range(20000):
    text = ''.join(rng.choice(['.', 'a', 'Mr', ' ', '\t', '\xa0', '"', "'", ')', ']', '”', '(', '?']) for _ in range(rng.randint(0, 8)))
    m = regex.search(text)
    assert sentence_split._last_word(text) == (m.group(1) if m else ''), repr(text)


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
  raw = 'Good text. Fine.\n\n'.encode() + b'Bad \xff\xfe bytes \xe2\x82 here. Legit \xef\xbf\xbd.\n'
  path = _write(tmp_path / 'bad.txt', raw, mode='wb')
  docs, stats = _read([path])
  assert stats['invalid_utf8'] == 3  # \xff, \xfe, truncated \xe2\x82; the real U+FFFD is text
  assert stats['invalid_utf8_first'] == path  # the preparation names it in its one warning line
  assert docs[1] == ['Bad \ufffd\ufffd bytes \ufffd here.', 'Legit \ufffd.']


def test_resolve_files(tmp_path):
  for name in ['b/2.txt', 'b/1.txt', 'a.txt', 'b/.hidden', 'b/README.md', '.git/x', 'b/c/3.gz']:
    os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
    _write(tmp_path / name, 'x')
  d = str(tmp_path)
  assert corpus_files.resolve_files(d) == [f'{d}/a.txt', f'{d}/b/1.txt', f'{d}/b/2.txt',
                                      f'{d}/b/c/3.gz']
  assert corpus_files.resolve_files(f'{d}/b/*.txt, {d}/a.txt,{d}/b/1.txt') == [
      f'{d}/b/1.txt', f'{d}/b/2.txt', f'{d}/a.txt']
  assert corpus_files.resolve_files(f'{d}/**/*.gz') == [f'{d}/b/c/3.gz']
  with pytest.raises(DataError, match='missing.txt.*does not exist'):
    corpus_files.resolve_files(f'{d}/a.txt,{d}/missing.txt')
  with pytest.raises(DataError, match=r'\*.xyz.*matches no files'):
    corpus_files.resolve_files(f'{d}/*.xyz')
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(DataError, match='matches no files'):
    corpus_files.resolve_files(f'{d}/empty')
  with pytest.raises(DataError, match='names no files'):
    corpus_files.resolve_files(' , ')


def test_resolve_bundled_corpus():
  files = corpus_files.resolve_files(os.path.join(REPO, 'data', 'wikitext-2-raw'))
  assert [os.path.basename(f) for f in files] == ['wiki.test.raw', 'wiki.valid.raw']


def test_empty_corpus(tmp_path):
  empty = _write(tmp_path / 'empty.txt', '')
  blank = _write(tmp_path / 'blank.txt', ' \n\n \t\n')
  with pytest.raises(DataError, match='empty.txt, .*blank.txt has no text'):
    readers.read_all([empty, blank])
  real = _write(tmp_path / 'real.txt', 'Some text. More.\n')
  docs, stats = _read([empty, real, blank])
  assert docs == [['Some text.', 'More.']]
  assert stats['files'] == 2 and stats['documents'] == 1  # the empty file has no piece


def test_unknown_format():
  with pytest.raises(ConfigError) as e:
    corpus_formats.ReaderOptions(format='markdown')
  _one_line_error(e, "'markdown'", 'auto, wikiextractor, wikitext, plain, jsonl')
  with pytest.raises(ConfigError):
    corpus_formats.ReaderOptions(text_field='')
  with pytest.raises(ConfigError, match='unit_bytes'):
    corpus_pieces.plan_units([], corpus_formats.ReaderOptions(), 0)


@pytest.mark.parametrize('line, message', [
    ('{"id": 3, "body": "x"}', "line {n}: no 'text' field (it has 'id', 'body')"),
    ('{"text": ["a", "b"]}', "line {n}: field 'text' is a JSON array, not a string"),
    ('{"text": "unterminated', 'line {n}: not a JSON object (Unterminated string'),
    ('[1, 2]', 'line {n}: not a JSON object but a list'),
])
@pytest.mark.parametrize('unit_bytes', [10**9, 200])
def test_bad_jsonl_lines(tmp_path, line, message, unit_bytes):
  good = [json.dumps({'text': f'Document {i}.'}) for i in range(30)]
  path = _write(tmp_path / 'c.jsonl', '\n'.join(good[:25] + [line] + good[25:]) + '\n')
  opts = corpus_formats.ReaderOptions(format='jsonl')
  units = corpus_pieces.plan_units([path], opts, unit_bytes)
  assert len(units) == (1 if unit_bytes > 10**6 else 4)
  with pytest.raises(DataError) as e:
    for unit in units:
      list(readers.read_documents(unit, opts))
  # The line number counts from the start of the file, whichever piece holds the line.
  _one_line_error(e, path, message.format(n=26))


@pytest.mark.parametrize('damage', ['truncated', 'overwritten'])
@pytest.mark.parametrize('compression', ['gzip', 'bz2', 'xz'])
def test_corrupt_compressed_file(tmp_path, monkeypatch, compression, damage):
  data = COMPRESS[compression](_plain_text(2000).encode())
  middle = len(data) // 2
  data = data[:middle] if damage == 'truncated' else (
      data[:middle] + bytes(range(256))[:64] + data[middle + 64:])
  path = _write(tmp_path / 'corpus.txt', data, 'wb')
  opts = corpus_formats.ReaderOptions()
  with pytest.raises(DataError) as e:
    pieces = [p for u in corpus_pieces.plan_units([path], opts, 1000) for p in u]
    list(readers.read_documents(pieces, opts))
  _one_line_error(e, path, f'corrupt {compression} data (')
  # Damage past the head that format detection reads surfaces when the documents are read
  # (bz2 decodes 900 kB blocks, so there detection already fails).
  monkeypatch.setattr(corpus_formats, '_HEAD_BYTES', 100)
  with pytest.raises(DataError) as e:
    fmt, found = corpus_formats.detect_format(path, opts)
    assert (fmt, found) == ('plain', compression) and compression != 'bz2'
    list(readers.read_documents([corpus_pieces.Piece(path, 0, -1, fmt, found)], opts))
  _one_line_error(e, path, f'corrupt {compression} data (')


def test_unreadable_file(tmp_path):
  path = str(tmp_path / 'gone.txt')
  with pytest.raises(DataError) as e:
    list(readers.read_documents([corpus_pieces.Piece(path, 0, 10, 'plain', '')], corpus_formats.ReaderOptions()))
  _one_line_error(e, 'cannot read corpus file', path)
