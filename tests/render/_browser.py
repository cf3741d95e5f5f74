"""A real headless Chromium driven by Playwright, for the report tests.

Playwright for Python (from PyPI) drives Debian's ``chromium`` package (``executable_path``):
no browser download.  ``Browser.load(path)`` opens one file in a fresh context with traps
installed before any of the page's own code runs, and returns everything the page did:

* console messages (Chromium reports CSP violations and failed loads there too) and uncaught
  exceptions;
* every request: anything but the file itself left the page;
* the layout at the window's width (1280 px by default): words broken mid-word, chart labels
  over each other, a copy button over its text, anything past the right edge or clipped;
* the trap record: calls of ``alert``/``prompt``/``confirm``/``print``/``open``/``fetch``/
  ``XMLHttpRequest``/``navigator.sendBeacon``/``eval``/``Function``, and every DOM mutation
  after the document was parsed (a payload that ran and touched the page).

It replaced a hand-written DevTools-protocol client (a websocket and ~200 lines of protocol):
the same checks, in the tool Python projects use for real-browser tests, and no slower: the 23
browser tests took 51.8 s and 42.1 s with it against 57.9 s and 43.6 s with the hand-written
client (alternating runs on the 2-core development machine, under load).  Reading the page's
state goes through Playwright's DevTools session, because ``page.evaluate`` calls the page's
own ``window.eval``, which the traps record.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRAPS = r"""
(() => {
  const record = [];
  Object.defineProperty(window, "__oomlensTraps", {value: record});
  const trap = (name) => function (...args) {
    record.push(name + ":" + String(args[0]).slice(0, 200));
    return undefined;
  };
  for (const name of ["alert", "prompt", "confirm", "print", "open"]) {
    try { Object.defineProperty(window, name, {value: trap(name), configurable: false}); }
    catch (e) { record.push("could not trap " + name); }
  }
  window.fetch = function (...args) {
    record.push("fetch:" + String(args[0]));
    return Promise.reject(new Error("blocked by the test"));
  };
  const open = XMLHttpRequest.prototype.open;
  XMLHttpRequest.prototype.open = function (...args) {
    record.push("xhr:" + String(args[1]));
    return open.apply(this, args);
  };
  if (navigator.sendBeacon) {
    navigator.sendBeacon = function (url) { record.push("beacon:" + String(url)); return false; };
  }
  const realEval = window.eval;
  window.eval = function (code) {
    record.push("eval:" + String(code).slice(0, 200));
    return realEval(code);
  };
  const RealFunction = window.Function;
  window.Function = function (...args) {
    record.push("Function:" + args.join(",").slice(0, 200));
    return RealFunction(...args);
  };
  const mutations = [];
  Object.defineProperty(window, "__oomlensMutations", {value: mutations});
  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver((list) => {
      for (const m of list) {
        if (m.type === "attributes") {
          mutations.push("attr " + m.target.nodeName + " " + m.attributeName);
        }
        for (const n of m.addedNodes) { mutations.push("added " + n.nodeName); }
      }
    }).observe(document, {childList: true, subtree: true, attributes: true, characterData: true});
  });
})();
"""

#: Checks run in the loaded page: what a payload that slipped through escaping would leave.
DOM_AUDIT = r"""
(() => {
  const found = [];
  const scripts = document.querySelectorAll("script");
  if (scripts.length !== 1) found.push(scripts.length + " script elements");
  for (const tag of ["iframe", "frame", "object", "embed", "applet", "base", "form", "img",
                     "video", "audio", "source", "link", "math", "foreignObject", "textarea",
                     "input", "marquee", "template", "portal", "image"]) {
    const n = document.getElementsByTagName(tag).length;
    if (n) found.push(n + " <" + tag + ">");
  }
  const metas = document.querySelectorAll("meta[http-equiv]");
  for (const meta of metas) {
    if (meta.getAttribute("http-equiv").toLowerCase() !== "content-security-policy") {
      found.push("meta http-equiv " + meta.getAttribute("http-equiv"));
    }
  }
  if (metas.length > 1) found.push(metas.length + " meta http-equiv elements");
  if (document.querySelectorAll("style").length !== 1) found.push("extra style element");
  for (const el of document.querySelectorAll("*")) {
    for (const attr of el.attributes) {
      const name = attr.name.toLowerCase();
      const value = attr.value.trim().toLowerCase();
      if (name.startsWith("on")) found.push("handler " + el.nodeName + "." + name);
      if (name === "style") found.push("style attribute on " + el.nodeName);
      if (["href", "src", "xlink:href", "action", "formaction", "data", "srcdoc"].includes(name)
          && !(name === "href" && value.startsWith("#"))) {
        found.push("url attribute " + el.nodeName + "." + name + "=" + value.slice(0, 60));
      }
    }
  }
  return found;
})()
"""

#: Layout defects a reader sees at the window's width: a plain word broken mid-word (a table
#: column squeezed below the word), chart labels drawn over each other, a copy button over the
#: text it copies, content past the right edge or clipped.
LAYOUT_AUDIT = r"""
(() => {
  const found = [];
  const shown = (el) => { const s = getComputedStyle(el);
    return s.display !== "none" && s.visibility !== "hidden" && el.getClientRects().length > 0; };
  const cross = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
    && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  const range = document.createRange();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let node;
  while ((node = walker.nextNode())) {
    const parent = node.parentElement;
    if (!parent || parent.closest("script,style,svg") || !shown(parent)) continue;
    // plain words only (a break after a hyphen, or inside a path, is fine)
    const re = /(^|[\s(\[,;:"'-])([A-Za-z]{2,})(?=$|[\s)\],.;:!?"'-])/g;
    let m;
    while ((m = re.exec(node.textContent))) {
      const start = m.index + m[1].length;
      range.setStart(node, start);
      range.setEnd(node, start + m[2].length);
      const tops = new Set(Array.from(range.getClientRects())
        .filter((r) => r.width > 0).map((r) => Math.round(r.top)));
      if (tops.size > 1) found.push("word broken: " + m[2] + " in <" + parent.nodeName + ">");
    }
  }
  for (const svg of document.querySelectorAll("svg")) {
    const labels = Array.from(svg.querySelectorAll("text")).filter((t) => t.textContent.trim())
      .map((t) => [t.textContent.trim(), t.getBoundingClientRect()]);
    for (let i = 0; i < labels.length; i++) {
      for (let j = i + 1; j < labels.length; j++) {
        if (cross(labels[i][1], labels[j][1])) {
          found.push("labels overlap: '" + labels[i][0] + "' and '" + labels[j][0] + "'");
        }
      }
    }
  }
  for (const button of document.querySelectorAll("button.copy")) {
    const pre = button.parentElement && button.parentElement.querySelector("pre");
    if (!pre || !shown(button)) continue;
    range.selectNodeContents(pre);
    if (Array.from(range.getClientRects()).some((r) => cross(r, button.getBoundingClientRect()))) {
      found.push("copy button over: " + pre.textContent.slice(0, 60));
    }
  }
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > width + 1) {
    found.push("page wider than the window: " + document.documentElement.scrollWidth + "px");
  }
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest("svg") || !shown(el)) continue;
    const style = getComputedStyle(el);
    if (["hidden", "clip"].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1) {
      found.push("clipped: <" + el.nodeName + " class=" + el.className + ">");
    }
  }
  return Array.from(new Set(found));
})()
"""


class BrowserUnavailable(RuntimeError):
    pass


@dataclass
class PageResult:
    url: str
    console: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    traps: list[str] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)
    dom_findings: list[str] = field(default_factory=list)
    text: str = ""
    """The page's text content, script and style elements left out."""
    visible_text: str = ""
    layout: list[str] = field(default_factory=list)
    """What ``LAYOUT_AUDIT`` found at the window's width."""
    screenshot: bytes | None = None

    @property
    def outside_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url]

    @property
    def errors(self) -> list[str]:
        return self.exceptions + [c for c in self.console if c.startswith(("error", "assert"))]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def ensure_chromium() -> str:
    """The browser binary; installs Debian's ``chromium`` when missing and running as root.

    Raises BrowserUnavailable with the reason otherwise.
    """
    found = find_chromium()
    if found:
        return found
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BrowserUnavailable(
            "no chromium on PATH and not root with apt-get to install it (apt-get install chromium)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            raise BrowserUnavailable(f"{' '.join(command)} failed: {done.stderr[-500:]}")
    found = find_chromium()
    if not found:
        raise BrowserUnavailable("apt-get installed chromium but it is not on PATH")
    return found


_ARGS = ["--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio"]
_TEXT = (
    "(() => { const c = document.body.cloneNode(true);"
    " c.querySelectorAll('script,style').forEach(e => e.remove());"
    " return c.textContent; })()"
)


class Browser:
    """One headless Chromium for a test session; ``load`` opens each page in a fresh context."""

    def __init__(self, binary: str, *, timeout: float = 30.0) -> None:
        from playwright.sync_api import Error, sync_playwright

        self._timeout_ms = timeout * 1000
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=binary, args=_ARGS, timeout=self._timeout_ms
            )
        except Error as exc:
            self._playwright.stop()
            raise BrowserUnavailable(f"{binary} did not start under Playwright: {exc}") from exc

    def load(
        self,
        path: Path,
        *,
        screenshot: bool = False,
        dark: bool = False,
        settle: float = 0.3,
        width: int = 1280,
        height: int = 1600,
        full_page: bool = False,
    ) -> PageResult:
        """Open ``path`` in a new context, let it settle, and collect what it did."""
        url = path.resolve().as_uri()
        result = PageResult(url=url)
        context = self._browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme="dark" if dark else "light",
        )
        try:
            context.add_init_script(TRAPS)
            page = context.new_page()
            page.set_default_timeout(self._timeout_ms)
            page.on(
                "console", lambda message: result.console.append(f"{message.type}: {message.text}")
            )
            page.on("pageerror", lambda error: result.exceptions.append(str(error)))
            page.on("request", lambda request: result.requests.append(request.url))
            page.goto(url, wait_until="load")
            page.wait_for_timeout(settle * 1000)  # timers and late handlers a payload may set
            # Read through the DevTools protocol: page.evaluate goes through the page's own
            # window.eval, which the traps record.
            devtools = context.new_cdp_session(page)
            result.traps = list(_value(devtools, "window.__oomlensTraps || ['no traps installed']"))
            result.mutations = list(_value(devtools, "window.__oomlensMutations || []"))
            result.dom_findings = list(_value(devtools, DOM_AUDIT))
            result.text = str(_value(devtools, _TEXT))
            result.visible_text = str(_value(devtools, "document.body.innerText"))
            result.layout = list(_value(devtools, LAYOUT_AUDIT))
            if screenshot:
                result.screenshot = page.screenshot(type="png", full_page=full_page)
            return result
        finally:
            context.close()

    def print_pdf(self, path: Path) -> bytes:
        """``path`` printed to PDF (print media, backgrounds off), as a person's browser would."""
        context = self._browser.new_context()
        try:
            page = context.new_page()
            page.goto(path.resolve().as_uri(), wait_until="load")
            return page.pdf(print_background=False)
        finally:
            context.close()

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()


def _value(devtools: Any, expression: str) -> Any:
    reply = devtools.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
    if "exceptionDetails" in reply:
        raise RuntimeError(f"evaluation failed: {reply['exceptionDetails']}")
    return reply["result"].get("value")


def png_is_not_blank(data: bytes) -> bool:
    """A PNG whose decoded pixels are not all one colour (pure Python: zlib over the IDAT)."""
    import struct
    import zlib

    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    offset = 8
    width = height = 0
    idat = b""
    colour_type = bit_depth = 0
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            width, height, bit_depth, colour_type = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    if not width or not height or bit_depth != 8:
        return False
    channels = {2: 3, 6: 4, 0: 1, 4: 2}.get(colour_type, 0)
    if not channels:
        return False
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    rows = [raw[i * stride + 1 : (i + 1) * stride] for i in range(0, height, max(1, height // 200))]
    # filters change bytes but not whether a row is uniform: compare decoded row 0 (filter 0
    # or 1 rows are uniform exactly when all their bytes after the first pixel are equal)
    distinct = set()
    for row in rows:
        distinct.update(
            row[i : i + channels] for i in range(0, len(row), channels * max(1, width // 100))
        )
        if len(distinct) > 8:
            return True
    return len(distinct) > 8
