"""attention.py --html: the explorer page in headless Chromium, checked against the npz and the tokenizer."""

import base64
import json

import numpy as np
import pytest

from bert_jax import inference
from bert_jax.interop import pretrained

import chromium
# attention.py runs in this process (its main: flags, output, exit code); no check here is about a process.
from harness.entry_points import assert_one_line_error, run_main
from harness.inputs import minilm_dir_or_skip
from harness.numerics import tolerance
from tools import attention_page as attention_html

pytestmark = pytest.mark.slow  # a browser and real checkpoints

TEXT_A, TEXT_B = 'The cat sat on the mat, unbothered.', 'Then it fell asleep.'
# The README's example: which heads link "it" to "animal"?
EXAMPLE_A, EXAMPLE_B = "The animal didn't cross the street because it was too tired.", 'It lay down and slept.'
IT, ANIMAL = 10, 2  # token indices: [CLS] the animal didn ' t cross the street because it


def _last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def minilm_page(tmp_path_factory):
  """(html path, npz contents, PretrainedBert) for all-MiniLM-L6-v2 on a sentence pair, layer 3 head 7."""
  checkpoint = minilm_dir_or_skip()
  out = tmp_path_factory.mktemp('explorer')
  summary = _last_json(run_main('attention.py', f'--checkpoint={checkpoint}', f'--text={TEXT_A}',
                                f'--text_pair={TEXT_B}', f'--output={out / "maps"}',
                                f'--html={out / "minilm.html"}', '--layer=3', '--head=7'))
  assert summary['html'] == str(out / 'minilm.html')
  return summary['html'], np.load(summary['npz']), pretrained.load_pretrained(checkpoint)


@pytest.fixture(scope='module')
def example_page(tmp_path_factory):
  """(html path, npz contents) for all-MiniLM-L6-v2 on the README's example, as its command makes them."""
  checkpoint = minilm_dir_or_skip()
  out = tmp_path_factory.mktemp('example')
  summary = _last_json(run_main('attention.py', f'--checkpoint={checkpoint}', f'--text={EXAMPLE_A}',
                                f'--text_pair={EXAMPLE_B}', f'--output={out / "maps"}',
                                f'--html={out / "example.html"}', '--layer=3', '--head=1'))
  npz = np.load(summary['npz'])
  assert npz['tokens'][IT] == 'it' and npz['tokens'][ANIMAL] == 'animal'
  return summary['html'], npz


@pytest.fixture
def tiny_workdir(pretrained_run):
  """The shared tiny pretraining workdir (conftest.py), as the main job leaves one (SentencePiece tokenizer);
  read-only."""
  return pretrained_run.workdir


@pytest.fixture(scope='module')
def browser():
  if chromium.executable() is None:
    pytest.skip('chromium is not installed (.ci/run installs it: apt-get install chromium)')
  with chromium.Chromium() as b:
    yield b


def test_page_is_self_contained(minilm_page):
  html = open(minilm_page[0], encoding='utf-8').read()
  assert 'http://' not in html.replace('http://www.w3.org/2000/svg', '') and 'https://' not in html
  assert '<script src' not in html and '<link' not in html


def test_header_tokens_and_segments(minilm_page, browser):
  html, npz, model = minilm_page
  browser.open(html)
  ids, types, _ = model.tokenizer.encode_inputs(TEXT_A, TEXT_B, max_length=128)
  expected = [model.tokenizer.id_to_token(i) for i in ids]  # WordPiece pieces as the tokenizer made them
  assert list(npz['tokens']) == expected
  labels = browser.eval('[...document.querySelectorAll("#hv-svg text[data-side=left]")].map(e => e.textContent)')
  assert labels == expected
  classes = browser.eval('[...document.querySelectorAll("#hv-svg text[data-side=left]")].map(e => e.className.baseVal)')
  assert [('seg-b' if t else 'seg-a') in c for c, t in zip(classes, types)] == [True] * len(ids)
  assert [c.startswith('tok special') for c in classes] == [t in ('[CLS]', '[SEP]') for t in expected]
  header = browser.eval('document.getElementById("model").textContent + "|" + document.getElementById("texts").textContent')
  assert '6 layers × 12 heads' in header and TEXT_A in header and TEXT_B in header


def test_model_view_draws_every_head_and_a_click_opens_it_in_the_head_view(minilm_page, browser):
  html, npz, _ = minilm_page
  browser.open(html)
  layers, heads = npz['probs'].shape[:2]
  browser.click('nav button[data-view=model]')
  # Every thumbnail exists and has ink on it (not just an empty canvas).
  inked = browser.eval('[...document.querySelectorAll("#mv-grid canvas")].map(c => { '
                       'const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; '
                       'let dark = 0; for (let i = 0; i < d.length; i += 4) dark += d[i] < 200; '
                       'return [+c.dataset.layer, +c.dataset.head, dark]; })')
  assert sorted((l, h) for l, h, _ in inked) == [(l, h) for l in range(layers) for h in range(heads)]
  assert all(dark > 0 for _, _, dark in inked)
  assert browser.eval('document.getElementById("model-view").classList.contains("active")')
  browser.click('#mv-grid canvas[data-layer="4"][data-head="9"]')
  assert browser.eval('document.getElementById("head-view").classList.contains("active")')
  assert browser.eval('document.getElementById("hv-layer").value') == '4'
  shown = browser.eval('[...new Set([...document.querySelectorAll("#hv-lines line")].map(l => +l.dataset.head))]')
  assert shown == [9]
  # The drawn lines are that head's weights (those >= 0.01), with the npz's values as opacity.
  lines = browser.eval('[...document.querySelectorAll("#hv-lines line")].map(l => '
                       '[+l.dataset.from, +l.dataset.to, +l.getAttribute("stroke-opacity")])')
  probs = npz['probs'][4, 9]
  assert sorted((t, s) for t, s, _ in lines) == sorted(zip(*np.nonzero(probs >= 0.01)))
  assert all(abs(w - probs[t, s]) <= 5e-4 for t, s, w in lines)


def test_hovering_a_token_isolates_its_lines(minilm_page, browser):
  browser.open(minilm_page[0])
  browser.click('#hv-all')
  before = browser.eval('document.querySelectorAll("#hv-lines line").length')
  browser.click('#hv-svg text[data-side=left][data-index="2"]')  # moves the mouse onto the token first
  visible = browser.eval('[...document.querySelectorAll("#hv-lines line")].filter(l => l.style.display !== "none")'
                         '.map(l => +l.dataset.from)')
  assert visible and set(visible) == {2} and len(visible) < before


def test_neuron_view_softmax_row_is_the_npz_attention_row(minilm_page, browser):
  html, npz, _ = minilm_page
  browser.open(html)
  browser.click('nav button[data-view=neuron]')
  for layer, head, token in ((3, 7, 0), (5, 11, 4), (0, 0, 9)):
    browser.eval(f'(() => {{ for (const [id, v] of [["nv-layer", {layer}], ["nv-head", {head}], ["nv-token", {token}]]) '
                 '{ const s = document.getElementById(id); s.value = v; s.dispatchEvent(new Event("change")); } })()')
    row = browser.eval('[...document.querySelectorAll("#nv-table td.softmax")].map(td => +td.dataset.value)')
    np.testing.assert_allclose(row, npz['probs'][layer, head, token], rtol=0, atol=1e-6)
    scores = np.array(browser.eval('[...document.querySelectorAll("#nv-table td.score")].map(td => +td.dataset.value)'))
    # float64 here, XLA's float32 softmax there: its rounding grows with the scores' size (exp(s - max)).
    np.testing.assert_allclose(np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum(),
                               npz['probs'][layer, head, token],
                               atol=tolerance(np.float32, len(scores), magnitude=max(1.0, np.abs(scores).max())))
    cells = browser.eval('[document.querySelectorAll("#nv-table td.query span").length, '
                         'document.querySelectorAll("#nv-table td.key").length, '
                         'document.querySelectorAll("#nv-table td.product").length]')
    t = npz['probs'].shape[-1]
    assert cells == [32, t, t]  # MiniLM's head size; one key and one q x k row per token


def test_screenshots_of_each_view(minilm_page, browser, tmp_path):
  browser.open(minilm_page[0])
  for view in ('head', 'model', 'neuron'):
    browser.click(f'nav button[data-view={view}]')
    with open(browser.screenshot(str(tmp_path / f'{view}.png')), 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def _ranking(browser):
  return browser.eval('[...document.querySelectorAll("#mv-rank tr[data-layer]")].map(r => '
                      '[+r.dataset.layer, +r.dataset.head, +r.dataset.weight])')


def _expected_ranking(probs, source, target):
  """Every (layer, head, weight) from the npz, strongest first (ties in layer, head order, as the page sorts)."""
  weights = probs[:, :, source, target]
  return [(*divmod(int(i), weights.shape[1]), float(weights.flat[i])) for i in np.argsort(-weights, None, 'stable')]


def _assert_ranking(shown, expected):
  assert [(l, h) for l, h, _ in shown] == [(l, h) for l, h, _ in expected]
  np.testing.assert_allclose([w for *_, w in shown], [w for *_, w in expected], rtol=0, atol=1e-6)


def _visible_lines(browser):
  """[head, from, to, opacity] of each line the head view shows now."""
  return browser.eval('[...document.querySelectorAll("#hv-lines line")].filter(l => l.style.display !== "none")'
                      '.map(l => [+l.dataset.head, +l.dataset.from, +l.dataset.to, '
                      '+l.getAttribute("stroke-opacity")])')


def _select(browser, element_id, value):
  browser.eval(f'(() => {{ const s = document.getElementById("{element_id}"); s.value = "{value}"; '
               's.dispatchEvent(new Event("change")); })()')


def test_one_click_on_a_token_pair_ranks_every_head_and_finds_it_to_animal(example_page, browser):
  html, npz = example_page
  probs = npz['probs']
  browser.open(html)
  browser.click('nav button[data-view=model]')
  margin, cell = browser.eval('[+document.getElementById("mv-pairs").dataset.margin, '
                              '+document.getElementById("mv-pairs").dataset.cell]')
  assert margin > 0 and cell >= 6  # token labels on both axes
  browser.click('#mv-pairs', at=(margin + (ANIMAL + 0.5) * cell, margin + (IT + 0.5) * cell))  # the one click
  expected = _expected_ranking(probs, IT, ANIMAL)
  _assert_ranking(_ranking(browser), expected)
  best_layer, best_head, best_weight = expected[0]
  assert (best_layer, best_head) == (5, 11) and best_weight > 0.5  # MiniLM's "it" -> "animal" head (then 3/1)
  assert browser.eval('[document.getElementById("mv-from").value, document.getElementById("mv-to").value]') == [
      str(IT), str(ANIMAL)]
  assert browser.eval('document.getElementById("mv-summary").textContent').startswith(
      f'it → animal: strongest in layer 5, head 11 ({best_weight:.4f})')
  # The model view marks the strongest five, the best apart.
  marked = browser.eval('[...document.querySelectorAll("#mv-grid td.best canvas, #mv-grid td.top canvas")].map(c => '
                        '[+c.dataset.layer, +c.dataset.head, c.parentNode.className])')
  assert sorted(marked) == sorted([[l, h, 'best' if i == 0 else 'top'] for i, (l, h, _) in enumerate(expected[:5])])
  assert 'from=10&to=2' in browser.eval('location.hash')
  # A result opens its head in the head view with the "from" token's lines alone.
  browser.click('#mv-rank tr[data-layer]')
  assert browser.eval('document.getElementById("head-view").classList.contains("active")')
  assert browser.eval('document.getElementById("hv-layer").value') == '5'
  lines = _visible_lines(browser)
  assert {(h, t) for h, t, _, _ in lines} == {(11, IT)}
  assert [abs(w - best_weight) <= 5e-4 for _, _, s, w in lines if s == ANIMAL] == [True]
  assert browser.eval('location.hash') == f'#view=head&layer=5&head=11&token={IT}&from={IT}&to={ANIMAL}'


def test_search_with_the_select_boxes(example_page, browser):
  html, npz = example_page
  probs = npz['probs']
  browser.open(html)
  browser.click('nav button[data-view=model]')
  assert _ranking(browser) == []
  _select(browser, 'mv-from', 16)  # the second sentence's "it"
  assert _ranking(browser) == []  # no "to" yet
  _select(browser, 'mv-to', ANIMAL)
  _assert_ranking(_ranking(browser), _expected_ranking(probs, 16, ANIMAL))
  browser.click('#mv-clear')
  assert _ranking(browser) == [] and 'from=' not in browser.eval('location.hash')
  assert not browser.eval('document.querySelectorAll("#mv-grid td.best, #mv-grid td.top").length')


def test_hovering_a_thumbnail_cell_shows_its_tokens_and_weight(example_page, browser):
  html, npz = example_page
  probs, tokens = npz['probs'], npz['tokens']
  browser.open(html)
  browser.click('nav button[data-view=model]')
  thumbnail = '#mv-grid canvas[data-layer="3"][data-head="1"]'
  border, cell = browser.eval(f'[document.querySelector(\'{thumbnail}\').clientLeft, '
                              f'+document.querySelector(\'{thumbnail}\').dataset.cell]')
  for t, s in ((IT, ANIMAL), (0, 0), (22, 15)):
    browser.move(thumbnail, at=(border + (s + 0.5) * cell, border + (t + 0.5) * cell))
    card = browser.eval('(() => { const c = document.getElementById("mv-card"); return [getComputedStyle(c).display, '
                        'c.textContent, +c.dataset.from, +c.dataset.to, '
                        '+document.getElementById("mv-card-canvas").dataset.margin]; })()')
    assert card[:4] == ['block', f'layer 3, head 1: {tokens[t]} → {tokens[s]}: {probs[3, 1, t, s]:.4f}', t, s]
    assert card[4] > 0  # the enlarged head has its token labels
  browser.move('h1')
  assert browser.eval('getComputedStyle(document.getElementById("mv-card")).display') == 'none'


def test_url_hash_opens_a_chosen_view_and_follows_changes(minilm_page, browser):
  html, npz, _ = minilm_page
  probs = npz['probs']
  browser.open(html, fragment='view=neuron&layer=2&head=5&token=4')
  assert browser.eval('document.getElementById("neuron-view").classList.contains("active")')
  assert browser.eval('["nv-layer", "nv-head", "nv-token"].map(id => document.getElementById(id).value)') == [
      '2', '5', '4']
  row = browser.eval('[...document.querySelectorAll("#nv-table td.softmax")].map(td => +td.dataset.value)')
  np.testing.assert_allclose(row, probs[2, 5, 4], rtol=0, atol=1e-6)
  browser.click('nav button[data-view=head]')
  assert browser.eval('location.hash') == '#view=head&layer=2&head=5&token=4'
  browser.open(html, fragment='view=head&layer=4&head=3&heads=0,3&token=6')
  assert browser.eval('document.getElementById("head-view").classList.contains("active")')
  assert browser.eval('document.getElementById("hv-layer").value') == '4'
  lines = _visible_lines(browser)
  assert {h for h, *_ in lines} == {0, 3} and {t for _, t, *_ in lines} == {6}
  _select(browser, 'hv-layer', 1)
  assert browser.eval('location.hash') == '#view=head&layer=1&head=3&heads=0,3&token=6'
  browser.click('nav button[data-view=model]')
  browser.click('#mv-grid canvas[data-layer="5"][data-head="2"]')
  assert browser.eval('location.hash') == '#view=head&layer=5&head=2&token=6'
  # A hash changed in place (a pasted link, back and forward) is followed; nonsense falls back to the defaults.
  browser.eval('new Promise(done => { addEventListener("hashchange", () => setTimeout(done), {once: true}); '
               'location.hash = "#view=model&from=3&to=1"; })')
  assert browser.eval('document.getElementById("model-view").classList.contains("active")')
  _assert_ranking(_ranking(browser), _expected_ranking(probs, 3, 1))
  browser.open(html, fragment='view=nope&layer=99&head=x&from=-1')
  assert browser.eval('[document.querySelector("nav button.active").dataset.view, location.hash]') == [
      'head', '#view=head&layer=3&head=7']


def test_main_job_style_workdir_page(tiny_workdir, tmp_path):
  """A bert_jax workdir (SentencePiece pieces) renders too, with the npz's numbers embedded exactly."""
  model = pretrained.load_pretrained(tiny_workdir)
  details = inference.attention_details(model, 'The game began development in 2010 .')
  html = attention_html.render(details, model_name='tiny', text_a='The game began development in 2010 .',
                               text_b=None, layer=-1, head=1)
  data = json.loads(html.split('<script type="application/json" id="attention-data">')[1].split('</script>')[0])
  assert data['tokens'] == details.tokens and data['layer'] == model.config.num_layers - 1 and data['text_b'] is None
  probs = np.frombuffer(base64.b64decode(data['probs']), '<f4').reshape(details.probs.shape)
  np.testing.assert_array_equal(probs, details.probs)


def test_any_text_renders_even_markup_that_would_end_the_script(tiny_workdir, browser, tmp_path):
  model = pretrained.load_pretrained(tiny_workdir)
  text = 'a <!--<script> b </script> c & <b>d</b>'
  details = inference.attention_details(model, text)
  path = attention_html.write(details, str(tmp_path / 'markup.html'), model_name='tiny <x>', text_a=text,
                              text_b=None)
  browser.open(path)
  labels = browser.eval('[...document.querySelectorAll("#hv-svg text[data-side=left]")].map(e => e.textContent)')
  assert labels == list(details.tokens)  # the page ran: every token drawn
  assert text in browser.eval('document.getElementById("texts").textContent')


@pytest.mark.e2e
@pytest.mark.parametrize('args, message', [
    (('--text= ',), 'must hold some text'),
    (('--text=Hi .', '--layer=9'), 'out of range'),
    (('--text=Hi .', '--head=99'), 'out of range'),
    (('--text=Hi .',), 'give --output'),
])
def test_bad_input_is_one_line_before_model_work(tiny_workdir, tmp_path, args, message):
  html = tmp_path / 'page.html'
  extra = () if message == 'give --output' else (f'--html={html}',)
  assert_one_line_error(run_main('attention.py', f'--checkpoint={tiny_workdir}', *args, *extra), message)
  assert not html.exists()


@pytest.mark.e2e
def test_html_path_that_is_a_directory(tiny_workdir, tmp_path):
  r = run_main('attention.py', '--checkpoint=/nonexistent', '--text=Hi .', f'--html={tmp_path}')
  assert_one_line_error(r, 'is a directory')  # refused before the (missing) checkpoint is even read
