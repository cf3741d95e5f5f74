"""A real headless Chromium driven through the Chrome DevTools Protocol, for the report tests.

No npm, no Playwright download: Debian's ``chromium`` package, started with remote debugging on
an ephemeral port, and a websocket client (``websocket-client``) speaking CDP in flat session
mode.  ``Browser.load(path)`` opens one file in a fresh tab with traps installed before any of
the page's own code runs, and returns everything the page did:

* console calls (``Runtime.consoleAPICalled``), uncaught exceptions (``Runtime.exceptionThrown``)
  and browser log entries (``Log.entryAdded``: CSP violations, failed loads...);
* every request (``Network.requestWillBeSent``): anything but the file itself left the page;
* the trap record: calls of ``alert``/``prompt``/``confirm``/``print``/``open``/``fetch``/
  ``XMLHttpRequest``/``navigator.sendBeacon``/``eval``/``Function``, and every DOM mutation
  after the document was parsed (a payload that ran and touched the page).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
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


class BrowserUnavailable(RuntimeError):
    pass


@dataclass
class PageResult:
    url: str
    console: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_entries: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    traps: list[str] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)
    dom_findings: list[str] = field(default_factory=list)
    text: str = ""
    """The page's text content, script and style elements left out."""
    visible_text: str = ""
    screenshot: bytes | None = None

    @property
    def outside_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url]

    @property
    def errors(self) -> list[str]:
        return (
            self.exceptions
            + [c for c in self.console if c.startswith(("error", "assert"))]
            + [e for e in self.log_entries if e.startswith("error")]
        )


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


class Browser:
    """One headless Chromium for a test session; ``load`` opens each page in a fresh tab."""

    def __init__(self, binary: str, *, timeout: float = 30.0) -> None:
        import websocket  # websocket-client, in the test extra

        self._profile = tempfile.mkdtemp(prefix="oomlens-chromium-")
        self._timeout = timeout
        self._process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile}",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-first-run",
                "--no-default-browser-check",
                "--mute-audio",
                "--hide-scrollbars",
                "--window-size=1280,1600",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or len(port_file.read_text().split("\n")) < 2:
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserUnavailable("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().split("\n")[:2]
        self._socket = websocket.create_connection(
            f"ws://127.0.0.1:{port}{path}", timeout=timeout, suppress_origin=True
        )
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ protocol

    def _send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            reply = json.loads(self._socket.recv())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self._events.append(reply)
        raise TimeoutError(method)

    def _wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + self._timeout
        for event in self._events:
            if event.get("method") == method and event.get("sessionId") == session:
                return
        while time.monotonic() < deadline:
            event = json.loads(self._socket.recv())
            self._events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return
        raise TimeoutError(method)

    def _evaluate(self, expression: str, session: str) -> Any:
        reply = self._send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"evaluation failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    # ------------------------------------------------------------------ pages

    def load(
        self,
        path: Path,
        *,
        screenshot: bool = False,
        dark: bool = False,
        settle: float = 0.3,
        width: int = 1280,
        height: int = 1600,
    ) -> PageResult:
        """Open ``path`` in a new tab, let it settle, and collect what it did."""
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self._events.clear()
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                self._send(f"{domain}.enable", {}, session)
            self._send("Page.addScriptToEvaluateOnNewDocument", {"source": TRAPS}, session)
            self._send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session,
            )
            self._send(
                "Emulation.setEmulatedMedia",
                {
                    "features": [
                        {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}
                    ]
                },
                session,
            )
            url = path.resolve().as_uri()
            self._events.clear()
            self._send("Page.navigate", {"url": url}, session)
            self._wait_for("Page.loadEventFired", session)
            time.sleep(settle)  # timers and late handlers a payload may have set
            result = PageResult(url=url)
            result.traps = list(
                self._evaluate("window.__oomlensTraps || ['no traps installed']", session)
            )
            result.mutations = list(self._evaluate("window.__oomlensMutations || []", session))
            result.dom_findings = list(self._evaluate(DOM_AUDIT, session))
            result.text = self._evaluate(
                "(() => { const c = document.body.cloneNode(true);"
                " c.querySelectorAll('script,style').forEach(e => e.remove());"
                " return c.textContent; })()",
                session,
            )
            result.visible_text = self._evaluate("document.body.innerText", session)
            if screenshot:
                shot = self._send(
                    "Page.captureScreenshot",
                    {"format": "png", "captureBeyondViewport": False},
                    session,
                )
                result.screenshot = base64.b64decode(shot["data"])
            # drain what arrived meanwhile
            self._send("Runtime.evaluate", {"expression": "1"}, session)
            for event in self._events:
                if event.get("sessionId") != session:
                    continue
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    args = " ".join(
                        str(a.get("value", a.get("description", "")))
                        for a in params.get("args", [])
                    )
                    result.console.append(f"{params.get('type')}: {args}")
                elif method == "Runtime.exceptionThrown":
                    details = params.get("exceptionDetails", {})
                    result.exceptions.append(
                        str(details.get("exception", {}).get("description") or details.get("text"))
                    )
                elif method == "Log.entryAdded":
                    entry = params.get("entry", {})
                    result.log_entries.append(f"{entry.get('level')}: {entry.get('text')}")
                elif method == "Network.requestWillBeSent":
                    result.requests.append(params.get("request", {}).get("url", ""))
            return result
        finally:
            self._send("Target.closeTarget", {"targetId": target})

    def print_pdf(self, path: Path) -> bytes:
        """``path`` printed to PDF (print media, backgrounds off), as a person's browser would."""
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        try:
            self._send("Page.enable", {}, session)
            self._events.clear()
            self._send("Page.navigate", {"url": path.resolve().as_uri()}, session)
            self._wait_for("Page.loadEventFired", session)
            reply = self._send("Page.printToPDF", {"printBackground": False}, session)
            return base64.b64decode(reply["data"])
        finally:
            self._send("Target.closeTarget", {"targetId": target})

    def close(self) -> None:
        try:
            if getattr(self, "_socket", None) is not None:
                self._socket.close()
        finally:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=10)
            shutil.rmtree(self._profile, ignore_errors=True)


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
