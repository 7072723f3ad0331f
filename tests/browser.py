"""Open a page in a real headless Chromium and look at it: the DOM after its scripts ran, every console message
and uncaught exception, every network request it made, and screenshots.

Chromium is driven over the Chrome DevTools Protocol through a pipe (``--remote-debugging-pipe``: commands on fd
3, answers on fd 4, each a JSON text ending in NUL), so no websocket, port or client library is needed. Debian's
``chromium`` package provides the browser (``.ci/run`` installs it); :func:`chromium_problem` says why the
browser tests skip when it is missing.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Optional[str]:
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_problem() -> str:
    """Why no browser test can run here ("" when one can)."""
    if find_chromium() is None:
        return ("no Chromium on PATH (looked for " + ", ".join(_NAMES) + "): install Debian's `chromium` package "
                "(`apt-get install -y chromium`; .ci/run does) to run the report page's browser tests")
    return ""


@dataclass
class PageView:
    """What the browser saw of one page."""

    dom: str
    console: List[Dict[str, Any]] = field(default_factory=list)     # {"type", "text"}
    exceptions: List[str] = field(default_factory=list)
    log_errors: List[str] = field(default_factory=list)            # Log.entryAdded of level error
    requests: List[str] = field(default_factory=list)              # every URL requested, the page's own included
    probe: Any = None                                              # the value of the probe expression
    screenshot: bytes = b""                                        # the whole page, PNG
    graph_png: bytes = b""                                         # the first graph's box, PNG

    @property
    def errors(self) -> List[str]:
        return ([f"console.{m['type']}: {m['text']}" for m in self.console if m["type"] in ("error", "assert")]
                + [f"exception: {x}" for x in self.exceptions] + [f"log: {x}" for x in self.log_errors])


class _Pipe:
    def __init__(self, executable: str, profile: str):
        to_browser_r, self._write = os.pipe()
        self._read, from_browser_w = os.pipe()
        keep = (to_browser_r, from_browser_w)

        def wire() -> None:   # in the child: the protocol's fds 3 (commands in) and 4 (answers out)
            a, b = os.dup(keep[0]), os.dup(keep[1])
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--disable-extensions", "--no-first-run", "--no-default-browser-check",
                "--hide-scrollbars", "--mute-audio", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                "about:blank"]
        # close_fds=False: the fds wire() makes are closed by no one (subprocess closes fds after preexec_fn, but
        # only inheritable ones survive exec -- Python's own fds are not inheritable, so nothing else leaks)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=wire, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: List[Dict[str, Any]] = []

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None,
             timeout: float = 30.0) -> Dict[str, Any]:
        self._next += 1
        message: Dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result") or {}
            self.events.append(reply)

    def wait_for(self, method: str, session: Optional[str], timeout: float = 30.0) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self._receive(deadline)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def _receive(self, deadline: float) -> Dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise ConnectionError("Chromium closed the DevTools pipe")
                self._buffer += chunk
        text, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(text)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - it is going away anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


_GRAPH_BOX = """(() => { const s = document.querySelector('#graph-0 svg');
  if (!s) return null; const r = s.getBoundingClientRect();
  return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; })()"""


def open_page(path: Path, *, width: int = 1200, height: int = 1600, probe: Optional[str] = None,
              media: Optional[str] = None) -> PageView:
    """Load ``path`` (file://) in a fresh headless Chromium; return what it saw (:class:`PageView`). ``probe``: a
    JavaScript expression evaluated after load (its JSON value in ``probe``); ``media``: emulate ``"print"``."""
    executable = find_chromium()
    if executable is None:
        raise RuntimeError(chromium_problem())
    with tempfile.TemporaryDirectory(prefix="mindguard_chromium_") as profile:
        pipe = _Pipe(executable, profile)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                              "deviceScaleFactor": 1, "mobile": False},
                      session=session)
            if media:
                pipe.call("Emulation.setEmulatedMedia", {"media": media}, session=session)
            pipe.events.clear()
            pipe.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
            pipe.wait_for("Page.loadEventFired", session, timeout=60)
            # what the page's scripts queued during load (a 0 ms timer that logs) runs before this promise's own
            # timer, and its console messages come back through the pipe before the reply
            pipe.call("Runtime.evaluate", {"expression": "new Promise(done => setTimeout(done, 0))",
                                           "awaitPromise": True}, session=session)

            def evaluate(expression: str) -> Any:
                result = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   session=session)
                return (result.get("result") or {}).get("value")

            view = PageView(dom=evaluate("document.documentElement.outerHTML") or "")
            if probe:
                view.probe = evaluate(probe)
            metrics = pipe.call("Page.getLayoutMetrics", session=session)
            size = metrics.get("cssContentSize") or metrics.get("contentSize")
            full = {"x": 0, "y": 0, "width": width, "height": min(int(size["height"]), 12000), "scale": 1}
            view.screenshot = base64.b64decode(pipe.call("Page.captureScreenshot", {
                "format": "png", "clip": full, "captureBeyondViewport": True}, session=session)["data"])
            box = evaluate(_GRAPH_BOX)
            if box and box["width"] > 0 and box["height"] > 0:
                clip = dict(box, scale=1)
                view.graph_png = base64.b64decode(pipe.call("Page.captureScreenshot", {
                    "format": "png", "clip": clip, "captureBeyondViewport": True}, session=session)["data"])
            for event in pipe.events:
                method, params = event.get("method"), event.get("params") or {}
                if method == "Runtime.consoleAPICalled":
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args") or [])
                    view.console.append({"type": params.get("type"), "text": text})
                elif method == "Runtime.exceptionThrown":
                    details = params.get("exceptionDetails") or {}
                    view.exceptions.append(str((details.get("exception") or {}).get("description")
                                               or details.get("text")))
                elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
                    view.log_errors.append(str(params["entry"].get("text")))
                elif method == "Network.requestWillBeSent":
                    view.requests.append(str((params.get("request") or {}).get("url")))
            return view
        finally:
            pipe.close()


# ------------------------------------------------------------------------------------------- PNG reading
def read_png(data: bytes) -> Tuple[int, int, int, List[bytes]]:
    """``(width, height, bytes per pixel, rows)`` of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium
    writes), rows unfiltered."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows: List[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            for i in range(stride):
                line[i] = (line[i] + previous[i]) & 0xFF
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = previous[i]
                c = previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, bpp, rows


def ink(png: bytes) -> Tuple[float, int]:
    """``(share of pixels that differ from the most common colour, number of distinct colours)``: a blank box
    has ~0 and 1."""
    width, height, bpp, rows = read_png(png)
    counts: Dict[bytes, int] = {}
    for row in rows:
        for x in range(0, width * bpp, bpp):
            pixel = row[x:x + 3]
            counts[pixel] = counts.get(pixel, 0) + 1
    background = max(counts.values())
    total = width * height
    return (total - background) / total, len(counts)
