"""Headless Chromium (the system's `chromium`, never a downloaded browser) over the DevTools protocol.

Enough of the protocol to open a local page, evaluate JavaScript in it, click like a user
(mouse events through the browser's input pipeline) and take screenshots. Used by
tests/experiments/test_attention_page.py and docs/make_screenshots.py.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import websocket  # websocket-client


def executable() -> str | None:
  return next((p for p in map(shutil.which, ('chromium', 'chromium-browser', 'google-chrome')) if p), None)


class Chromium:
  """One headless browser with one page; use as a context manager."""

  def __init__(self, width: int = 1400, height: int = 900, timeout: float = 60):
    exe = executable()
    if exe is None:
      raise FileNotFoundError('no chromium on PATH (Debian: apt-get install chromium)')
    self.timeout = timeout
    self.profile = tempfile.mkdtemp(prefix='chromium-')
    self.log = open(os.path.join(self.profile, 'stderr.log'), 'w')  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [exe, '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
         '--remote-debugging-port=0', f'--user-data-dir={self.profile}', f'--window-size={width},{height}',
         'about:blank'], stdout=subprocess.DEVNULL, stderr=self.log)
    port = self._port()
    with urllib.request.urlopen(f'http://127.0.0.1:{port}/json/list', timeout=timeout) as r:
      page = next(t for t in json.load(r) if t['type'] == 'page')
    self.ws = websocket.create_connection(page['webSocketDebuggerUrl'], timeout=timeout, suppress_origin=True)
    self.ids = itertools.count(1)
    self.send('Page.enable')
    self.send('Emulation.setDeviceMetricsOverride', width=width, height=height, deviceScaleFactor=1, mobile=False)

  def _port(self) -> int:
    marker = os.path.join(self.profile, 'DevToolsActivePort')  # written once the browser listens
    deadline = time.time() + self.timeout
    while time.time() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f'chromium exited with {self.proc.returncode}; see {self.log.name}')
      if os.path.exists(marker):
        with open(marker) as f:
          first = f.readline().strip()
        if first:
          return int(first)
      time.sleep(0.1)
    raise TimeoutError('chromium did not start')

  def send(self, method: str, **params):
    """One protocol command; its result (events arriving meanwhile are dropped)."""
    i = next(self.ids)
    self.ws.send(json.dumps({'id': i, 'method': method, 'params': params}))
    while True:
      message = json.loads(self.ws.recv())
      if message.get('id') == i:
        if 'error' in message:
          raise RuntimeError(f'{method}: {message["error"]}')
        return message.get('result', {})

  def eval(self, expression: str):
    """The value of a JavaScript expression in the page (JSON-able values)."""
    result = self.send('Runtime.evaluate', expression=expression, returnByValue=True, awaitPromise=True)
    if 'exceptionDetails' in result:
      raise RuntimeError(f'{expression[:80]}: {result["exceptionDetails"]}')
    return result['result'].get('value')

  def open(self, path: str, ready: str = 'document.body && document.body.dataset.ready === "1"',
           fragment: str | None = None) -> None:
    """Loads a local file (at `#fragment` when given) and waits until `ready` is true."""
    url = 'file://' + os.path.abspath(path)
    if fragment is not None:  # a fresh load: from the same page, only the hash would change
      self.send('Page.navigate', url='about:blank')
      url += '#' + fragment
    self.send('Page.navigate', url=url)
    deadline = time.time() + self.timeout
    while not self.eval(f'!!({ready})'):
      if time.time() > deadline:
        raise TimeoutError(f'{path} never became ready')
      time.sleep(0.05)

  def _point(self, selector: str, at: tuple[float, float] | None) -> list[float]:
    """Viewport coordinates of `at` (x, y from the element's top-left corner; default: its centre), in view."""
    return self.eval(f'(() => {{ const e = document.querySelector({json.dumps(selector)}); '
                     'e.scrollIntoView({block: "nearest"}); const r = e.getBoundingClientRect(); '
                     f'const at = {json.dumps(at)}; '
                     'return at ? [r.left + at[0], r.top + at[1]] : [r.left + r.width / 2, r.top + r.height / 2]; })()')

  def move(self, selector: str, at: tuple[float, float] | None = None) -> None:
    """Moves the mouse onto the first element matching `selector` (at `at`, see `click`), as a user's."""
    x, y = self._point(selector, at)
    self.send('Input.dispatchMouseEvent', type='mouseMoved', x=x, y=y)

  def click(self, selector: str, at: tuple[float, float] | None = None) -> None:
    """A left click on the first element matching `selector`, as a user's: at its centre, or at `at` (x, y in CSS
    pixels from its top-left corner, border included)."""
    x, y = self._point(selector, at)
    for kind in ('mouseMoved', 'mousePressed', 'mouseReleased'):
      self.send('Input.dispatchMouseEvent', type=kind, x=x, y=y, button='left', clickCount=1)

  def screenshot(self, path: str) -> str:
    """The viewport as a PNG file."""
    data = self.send('Page.captureScreenshot', format='png')['data']
    with open(path, 'wb') as f:
      f.write(base64.b64decode(data))
    return path

  def close(self) -> None:
    try:
      self.ws.close()
    finally:
      self.proc.terminate()
      try:
        self.proc.wait(10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
      self.log.close()
      shutil.rmtree(self.profile, ignore_errors=True)

  def __enter__(self) -> 'Chromium':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
