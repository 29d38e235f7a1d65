"""A headless Chromium driven over its DevTools protocol: open a page, evaluate JavaScript in it.

Enough to see what a reader sees after the page's scripts and its search worker ran (a
`--dump-dom` is taken before a web worker answers). Headless, without the sandbox (the tests
run as root), with a private profile, and every wait bounded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import websocket


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is missing: `make setup` installs the Debian chromium package"
    return found


class Browser:
    def __init__(self, profile: Path, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,900",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout_s,
                                              suppress_origin=True)
        self._id = 0

    def _call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, url: str) -> None:
        self._call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str):
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {self.timeout_s:.0f} s: {expression}")
            time.sleep(0.2)

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self._call("Page.captureScreenshot")["data"]))

    def close(self) -> None:
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
