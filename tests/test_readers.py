"""Tests for bert_jax.corpus: formats, sentence splitting, resolution and bad input."""

import logging
import os

import pytest

from bert_jax.data import readers as corpus
from bert_jax.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIKITEXT_VALID = os.path.join(REPO, 'data', 'wikitext-2-raw', 'wiki.valid.raw')
ENWIKI_00 = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data', 'enwiki-2015',
                         'wiki_00')


def _write(path, text, mode='w'):
  with open(path, mode) as f:
    f.write(text)
  return str(path)


def _head(path, num_lines):
  with open(path, encoding='utf-8') as f:
    return ''.join(next(f) for _ in range(num_lines))


def test_wikitext_real_snippet(tmp_path):
  path = _write(tmp_path / 'wiki.raw', _head(WIKITEXT_VALID, 60))
  docs, stats = corpus.read_documents([path])
  assert stats['formats'] == {'wikiextractor': 0, 'wikitext': 1, 'plain': 0}
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
  assert len(first) > 20


def test_wikitext_articles_split_documents(tmp_path):
  text = (' \n = First = \n \n A sentence here . Another one .\n \n = = Part = = \n \n'
          ' More text .\n = Second = \n \n'
          ' Red @-@ tipped claws , 1 @,@ 000 of them , 0 @.@ 5 kg .\n')
  docs, _ = corpus.read_documents([_write(tmp_path / 'w.txt', text)])
  assert docs == [['A sentence here .', 'Another one .', 'More text .'],
                  ['Red-tipped claws , 1,000 of them , 0.5 kg .']]


def test_wikiextractor_synthetic(tmp_path):
  text = ('<doc id="1" url="u" title="Lobster">\nLobster\n\nLobsters live in the sea. They are '
          'blue.<br>\nEarly life.\n<dl>Tags go, leaving text.</dl>\n</doc>\n'
          '<doc id="2" url="u" title="Crab">\nCrab\n\n'
          'Crabs walk sideways. <ref>Smith 2001</ref> Really.\n</doc>\n')
  docs, stats = corpus.read_documents([_write(tmp_path / 'wiki_00', text)])
  assert stats['formats']['wikiextractor'] == 1
  # The title line and the section heading 'Early life.' are dropped.
  assert docs == [['Lobsters live in the sea.', 'They are blue.', 'Tags go, leaving text.'],
                  ['Crabs walk sideways.', 'Smith 2001 Really.']]


@pytest.mark.skipif(not os.path.exists(ENWIKI_00),
                    reason='shared/data/enwiki-2015/wiki_00 is not staged next to this checkout')
def test_wikiextractor_real_document(tmp_path):
  with open(ENWIKI_00, encoding='utf-8') as f:
    lines = []
    for line in f:
      lines.append(line)
      if line.startswith('</doc>') and sum(l.startswith('<doc ') for l in lines) == 2:
        break
  docs, stats = corpus.read_documents([_write(tmp_path / 'wiki_00', ''.join(lines))])
  assert stats['formats']['wikiextractor'] == 1 and len(docs) == 2
  assert docs[0][0].startswith('Anarchism is a political philosophy')  # title line dropped
  assert docs[0][1] == 'Anarchism holds the state to be undesirable, unnecessary, or harmful.'
  assert not any('<' in s and '>' in s for d in docs for s in d)


def test_plain_text_documents(tmp_path):
  text = 'First doc. Two sentences.\nA new line.\n\n\nSecond doc here!\n  \nThird.\n'
  docs, stats = corpus.read_documents([_write(tmp_path / 'p.txt', text)])
  assert stats['formats']['plain'] == 1
  assert docs == [['First doc.', 'Two sentences.', 'A new line.'], ['Second doc here!'],
                  ['Third.']]


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
  assert corpus.split_sentences(text) == expected


def test_invalid_utf8_is_replaced_and_counted(tmp_path, caplog):
  raw = 'Good text. Fine.\n\n'.encode() + b'Bad \xff\xfe bytes \xe2\x82 here. Legit \xef\xbf\xbd.\n'
  path = _write(tmp_path / 'bad.txt', raw, mode='wb')
  with caplog.at_level(logging.WARNING):
    docs, stats = corpus.read_documents([path])
  assert stats['invalid_utf8'] == 3  # \xff, \xfe, truncated \xe2\x82; the real U+FFFD is text
  assert docs[1] == ['Bad \ufffd\ufffd bytes \ufffd here.', 'Legit \ufffd.']
  assert any('bad.txt' in r.getMessage() and '3 invalid UTF-8' in r.getMessage()
             for r in caplog.records)


def test_resolve_files(tmp_path):
  for name in ['b/2.txt', 'b/1.txt', 'a.txt', 'b/.hidden', 'b/README.md', '.git/x']:
    os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
    _write(tmp_path / name, 'x')
  d = str(tmp_path)
  assert corpus.resolve_files(d) == [f'{d}/a.txt', f'{d}/b/1.txt', f'{d}/b/2.txt']
  assert corpus.resolve_files(f'{d}/b/*.txt, {d}/a.txt,{d}/b/1.txt') == [
      f'{d}/b/1.txt', f'{d}/b/2.txt', f'{d}/a.txt']
  with pytest.raises(DataError, match='missing.txt.*does not exist'):
    corpus.resolve_files(f'{d}/a.txt,{d}/missing.txt')
  with pytest.raises(DataError, match=r'\*.xyz.*matches no files'):
    corpus.resolve_files(f'{d}/*.xyz')
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(DataError, match='matches no files'):
    corpus.resolve_files(f'{d}/empty')
  with pytest.raises(DataError, match='names no files'):
    corpus.resolve_files(' , ')


def test_empty_corpus(tmp_path):
  empty = _write(tmp_path / 'empty.txt', '')
  blank = _write(tmp_path / 'blank.txt', ' \n\n \t\n')
  with pytest.raises(DataError, match='empty.txt, .*blank.txt has no text'):
    corpus.read_documents([empty, blank])
  real = _write(tmp_path / 'real.txt', 'Some text. More.\n')
  docs, stats = corpus.read_documents([empty, real, blank])
  assert stats['empty_files'] == 2 and docs == [['Some text.', 'More.']]
