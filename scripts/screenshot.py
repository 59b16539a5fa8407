"""Screenshot of the dashboard's default page: ``python -m scripts.screenshot docs/screenshot.png``.

Starts the app like the browser tests do (uvicorn on a free 127.0.0.1 port, a temporary
``ISPLAN_DATA_DIR``), opens ``/`` in headless Chromium (``ISPLAN_CHROMIUM``, default
``/usr/bin/chromium``) at 1440x1800, device scale 1, waits until Plotly drew every figure, writes a
full-page PNG and stops the server. The launcher is shared with the tests
(``tests/browser_support.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _support():
    """``tests/browser_support.py`` loaded by path (``tests`` is not a package)."""
    name = "isplan_browser_support"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "browser_support.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.screenshot", description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="docs/screenshot.png", help="PNG path (default docs/screenshot.png)")
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--height", type=int, default=1800)
    ap.add_argument("--viewport-only", action="store_true", help="only the viewport, not the full page")
    args = ap.parse_args(argv)
    support = _support()
    reason = support.chromium_missing_reason()
    if reason:
        print(f"screenshot: {reason}", file=sys.stderr)
        return 2
    out = support.screenshot(Path(args.out), width=args.width, height=args.height, full_page=not args.viewport_only)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
