"""Screenshots of the attention explorer (docs/attention_{head,model,search,neuron}.png), each opened from a URL hash.

  python3 experiments/attention.py --checkpoint=$MINILM --text="The animal didn't cross the street because it \
      was too tired." --text_pair="It lay down and slept." --html=/tmp/attn.html --layer=3 --head=1 \
      --title=all-MiniLM-L6-v2
  python3 docs/make_screenshots.py /tmp/attn.html

Needs the system's chromium (apt-get install chromium) and websocket-client.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests'))

import chromium  # pylint: disable=g-import-not-at-top,wrong-import-position

DOCS = os.path.dirname(os.path.abspath(__file__))
IT, ANIMAL = 10, 2  # token indices of "it" and "animal" in the example


def main(page: str) -> None:
  with chromium.Chromium(width=1280, height=820) as browser:
    def shoot(name: str) -> None:
      print(browser.screenshot(os.path.join(DOCS, f'attention_{name}.png')))

    # Head view: layer 3, head 1 with the lines of "it" (the search's pair underlined).
    browser.open(page, fragment=f'view=head&layer=3&head=1&token={IT}&from={IT}&to={ANIMAL}')
    shoot('head')
    # The search: "it" → "animal" ranks every layer × head.
    browser.open(page, fragment=f'view=model&from={IT}&to={ANIMAL}')
    shoot('search')
    # Model view: the grid with the strongest heads marked, hovering the best one's it → animal cell.
    browser.eval('document.getElementById("mv-grid").scrollIntoView({block: "end"})')
    thumbnail = '#mv-grid canvas[data-layer="5"][data-head="11"]'
    border, cell = browser.eval(f'[document.querySelector(\'{thumbnail}\').clientLeft, '
                                f'+document.querySelector(\'{thumbnail}\').dataset.cell]')
    browser.move(thumbnail, at=(border + (ANIMAL + 0.5) * cell, border + (IT + 0.5) * cell))
    shoot('model')
    browser.open(page, fragment=f'view=neuron&layer=3&head=1&token={IT}')
    shoot('neuron')


if __name__ == '__main__':
  main(sys.argv[1])
