"""Render an HTML file in headless Chromium with the network cut, over the DevTools protocol
on a pipe (no port, so it works inside ``unshare --net``): the DOM's facts, each plot's
bounding box and a screenshot of each box.

The network is cut with ``unshare --net`` (a new network namespace without interfaces)
where the kernel allows it; otherwise Chromium gets ``--host-resolver-rules`` that resolve
every name to nothing, and callers assert that no ``src``/``href`` leaves the file.

Run as a script to measure a report: ``python tests/support/chromium.py r.html`` prints each plot's
pixel size and its share of non-background pixels.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PlotShot", "Render", "chromium", "network_cut_prefix", "render"]

# What the page reports once plotly has drawn: every plot div with its box and the number
# of marker points in each trace, and every src/href the DOM holds (scripts' text aside).
_PROBE = """JSON.stringify({
 plots: [...document.querySelectorAll('.plotly-graph-div')].map(d => {
   const r = d.getBoundingClientRect();
   return {id: d.id, x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height,
     traces: [...d.querySelectorAll('.scatterlayer .trace')].map(
       t => t.querySelectorAll('path.point').length),
     bars: d.querySelectorAll('.barlayer path').length};
 }),
 links: [...document.querySelectorAll('[src],[href]')].map(
   e => e.getAttribute('src') || e.getAttribute('href')),
 ready: document.readyState,
 width: document.documentElement.scrollWidth,
 height: document.documentElement.scrollHeight,
})"""


def chromium() -> str | None:
    """The Chromium executable, if installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def network_cut_prefix() -> list[str]:
    """``["unshare", "--net"]`` where this process may make a network namespace, else []."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10)
    return [unshare, "--net"] if ok.returncode == 0 else []


@dataclass
class PlotShot:
    id: str
    width: int
    height: int
    points: list[int]  # marker points per scatter trace
    bars: int
    png: bytes


@dataclass
class Render:
    plots: list[PlotShot]
    links: list[str]
    isolated: bool  # the network namespace was cut (not just name resolution)
    page: tuple[int, int] = (0, 0)
    log: list[str] = field(default_factory=list)


class _Pipe:
    """The DevTools protocol over Chromium's ``--remote-debugging-pipe`` (fd 3 in, 4 out)."""

    def __init__(self, argv: list[str]) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # fds >= 10 so dup2 onto 3 and 4 never hits an fd we still need
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child() -> None:  # dup2 clears close-on-exec on the copies
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.err = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            preexec_fn=child,
            close_fds=False,
        )
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> Any:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                self.err.seek(0)
                tail = self.err.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"chromium closed the DevTools pipe during {method}: {tail}")
            self._buf += chunk

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # already gone
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        for fd in (self._r, self._w):
            os.close(fd)
        self.err.close()


def render(path: Path, *, width: int = 1280, timeout_s: float = 60.0) -> Render:
    """Open ``path`` (a local file) headless, the network cut, and shoot every plot."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    prefix = network_cut_prefix()
    profile = tempfile.mkdtemp(prefix="autotune-chromium-")
    argv = [
        *prefix,
        exe,
        "--headless",
        "--disable-gpu",
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        f"--window-size={width},900",
        "--no-first-run",
        "--hide-scrollbars",
        # no name resolves: with unshare unavailable, nothing can be fetched by name
        "--host-resolver-rules=MAP * ~NOTFOUND",
        *(["--no-sandbox"] if os.geteuid() == 0 else []),  # Chromium refuses root otherwise
        "about:blank",
    ]
    pipe = _Pipe(argv)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        pipe.call("Page.enable", session=sid)
        pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=sid)
        deadline = time.monotonic() + timeout_s
        while True:
            answer = pipe.call(
                "Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=sid
            )
            value = answer["result"].get("value")  # none while the page is being replaced
            probe = json.loads(value) if isinstance(value, str) else {"ready": "", "plots": []}
            drawn = probe["plots"] and all(p["h"] > 0 for p in probe["plots"])
            if probe["ready"] == "complete" and drawn:
                break
            if "exceptionDetails" in answer and time.monotonic() > deadline:
                raise RuntimeError(f"the page probe failed: {answer['exceptionDetails']}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: the page did not finish drawing in {timeout_s} s")
            time.sleep(0.1)
        shots = []
        for p in probe["plots"]:
            clip = {"x": p["x"], "y": p["y"], "width": p["w"], "height": p["h"], "scale": 1}
            data = pipe.call(
                "Page.captureScreenshot",
                {"format": "png", "clip": clip, "captureBeyondViewport": True},
                session=sid,
            )["data"]
            shots.append(
                PlotShot(
                    p["id"],
                    round(p["w"]),
                    round(p["h"]),
                    p["traces"],
                    p["bars"],
                    base64.b64decode(data),
                )
            )
    finally:
        pipe.close()
        shutil.rmtree(profile, ignore_errors=True)
    return Render(shots, probe["links"], bool(prefix), (probe["width"], probe["height"]))


def ink(png: bytes) -> tuple[float, float]:
    """(share of pixels that differ from the background, the luminance variance); the
    background is the image's most common colour."""
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colors = img.getcolors(maxcolors=img.width * img.height) or []
    _, background = max(colors)
    other = sum(n for n, c in colors if c != background)
    return other / (img.width * img.height), float(ImageStat.Stat(img.convert("L")).var[0])


if __name__ == "__main__":
    result = render(Path(sys.argv[1]))
    print(f"network namespace cut: {result.isolated}; page {result.page[0]}x{result.page[1]} px")
    print("| plot | pixels (w x h) | non-background | luminance variance | points per trace |")
    print("|---|---|---|---|---|")
    for shot in result.plots:
        share, var = ink(shot.png)
        print(
            f"| {shot.id} | {shot.width} x {shot.height} | {100 * share:.1f} % | {var:,.0f} | "
            f"{shot.points} |"
        )
