"""The picture of an eval's HTML report in the documentation (``docs/assets/eval-report.png``),
drawn by headless Chromium (:mod:`tests.browser`) from a ``report.html`` that ``callbox eval``
wrote, with every request outside the file refused (the report must need none).

Run as ``python -m tests.docs.eval_picture REPORT.html [PNG]`` after the documented command
(``docs/eval.md``), e.g.::

    callbox eval examples/eval/tasks.toml --transcripts examples/eval/transcripts --concurrency 2 --out /tmp/ev
    .venv/bin/python -m tests.docs.eval_picture /tmp/ev/report.html
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.browser import chromium

ROOT = Path(__file__).resolve().parents[2]
PICTURE = ROOT / "docs" / "assets" / "eval-report.png"
WIDTH, HEIGHT = 1100, 1500


def render(report: Path, png: Path, *, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    """Draw ``report`` into ``png`` (its top ``height`` pixels, the first acceptance check's call opened); the
    requests it made to anything but itself (none, for a self-contained report)."""
    url = report.resolve().as_uri()
    elsewhere: list[str] = []

    def route(request: Any) -> None:
        if request.request.url == url:
            request.continue_()
        else:
            elsewhere.append(request.request.url)
            request.abort()

    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        page.route("**/*", route)
        page.goto(url)
        checks = page.locator('section.task details.call[id^="call-accept-"]')  # the acceptance check's call
        if checks.count():
            checks.first.evaluate("element => element.open = true")
        page.screenshot(path=str(png), full_page=False)
        page.close()
    return elsewhere


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    png = Path(argv[1]) if len(argv) == 2 else PICTURE
    elsewhere = render(Path(argv[0]), png)
    if elsewhere:
        print(f"the report asked for {elsewhere}: it must need nothing but itself", file=sys.stderr)
        return 1
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
