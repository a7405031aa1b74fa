"""Screenshots of the attention explorer's three views (docs/attention_{head,model,neuron}.png).

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


def main(page: str) -> None:
  with chromium.Chromium(width=1280, height=820) as browser:
    browser.open(page)
    browser.click('#hv-svg text[data-side=left][data-index="10"]')  # hover "it": its lines
    print(browser.screenshot(os.path.join(DOCS, 'attention_head.png')))
    browser.click('nav button[data-view=model]')
    print(browser.screenshot(os.path.join(DOCS, 'attention_model.png')))
    browser.click('nav button[data-view=neuron]')
    browser.eval('(() => { const s = document.getElementById("nv-token"); s.value = 10; '
                 's.dispatchEvent(new Event("change")); })()')
    print(browser.screenshot(os.path.join(DOCS, 'attention_neuron.png')))


if __name__ == '__main__':
  main(sys.argv[1])
