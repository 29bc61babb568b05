"""A headless Chromium driven over the Chrome DevTools Protocol, just enough to load a page and judge it.

    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(Path("report.html").as_uri(), width=1280)
        page.evaluate("document.images.length")
        page.screenshot(tmp_path / "shot.png")

Chromium picks a free port (--remote-debugging-port=0) and writes it to DevToolsActivePort in its
profile; we poll for that file with a deadline, list the page target over HTTP and talk to it with
websocket-client. Console messages, uncaught exceptions and log entries of level error are collected
while the page loads.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

from lab.poll import poll

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
SETUP_HINT = "bash scripts/setup.sh --extra browser"

# The flags every run needs: headless as root, no network chatter beyond the page itself.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


class BrowserError(RuntimeError):
    """Chromium did not start, or a DevTools command failed."""


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Page:
    """One tab, connected over its DevTools websocket."""

    ws: websocket.WebSocket
    errors: list[str] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def _collect(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(
                f"exception: {details.get('text')} {details.get('exception', {}).get('description')}"
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one command and return its result, collecting events that arrive meanwhile."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise BrowserError(f"{method}: no answer within {timeout} s") from None
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._collect(message)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the event ``method``, collecting the others."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserError(f"no {method} event within {timeout} s")
            self.ws.settimeout(remaining)
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise BrowserError(f"no {method} event within {timeout} s") from None
            if message.get("method") == method:
                params: dict[str, Any] = message.get("params", {})
                return params
            self._collect(message)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page; raises on a JavaScript exception."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluating {expression!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not just the viewport) written to ``path``."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@dataclass
class Browser:
    """A running headless Chromium and its DevTools HTTP endpoint."""

    process: subprocess.Popen[bytes]
    port: int
    pages: list[Page] = field(default_factory=list)

    @classmethod
    @contextmanager
    def start(cls, profile: Path, timeout: float = 30.0) -> Iterator[Browser]:
        """Start Chromium with a fresh profile directory; stop it (and only it) on exit."""
        binary = find_chromium()
        if binary is None:
            raise BrowserError(f"no Chromium on PATH; install it with `{SETUP_HINT}`")
        profile.mkdir(parents=True, exist_ok=True)
        log = (profile.parent / "chromium.log").open("wb")
        process = subprocess.Popen(
            [binary, *_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            port_file = profile / "DevToolsActivePort"

            def port() -> int | None:
                if process.poll() is not None:
                    log_path = profile.parent / "chromium.log"
                    raise BrowserError(f"chromium exited with status {process.returncode}; see {log_path}")
                text = port_file.read_text() if port_file.exists() else ""
                first = text.splitlines()[0] if text.strip() else ""
                return int(first) if first.isdigit() else None

            browser = cls(process, poll(timeout, port, "Chromium's DevToolsActivePort"))
            try:
                yield browser
            finally:
                for page in browser.pages:
                    page.ws.close()
        finally:
            # Chromium runs in its own session (start_new_session): its group is ours alone to end.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            log.close()

    def _targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=5) as answer:
            targets: list[dict[str, Any]] = json.load(answer)
            return targets

    def open(self, url: str, width: int = 1280, height: int = 900, timeout: float = 60.0) -> Page:
        """Load ``url`` in the first tab at the given viewport size and wait for its load event."""
        deadline = time.monotonic() + timeout
        target = poll(max(0.0, deadline - time.monotonic()),
                      lambda: next((t for t in self._targets() if t.get("type") == "page"), None), "a page target")
        ws = websocket.create_connection(
            target["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True
        )
        page = Page(ws)
        self.pages.append(page)
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            page.call(domain)
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.call("Page.navigate", url=url)
        page.wait_event("Page.loadEventFired", timeout=max(1.0, deadline - time.monotonic()))
        return page
