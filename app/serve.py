"""``python -m app.serve``: the web app under uvicorn with several worker processes and the
slow-client limits of issue 9 (``make serve`` and the Dockerfile both start it this way).

Each uvicorn worker is a whole server process (its own event loop, its own pool of planner
workers, :mod:`app.web.workers`), so one busy process does not stall the others; all of them
share the upload store (SQLite in ``ISPLAN_DATA_DIR``, or PostgreSQL via ``ISPLAN_DATABASE_URL``
for several machines). Request heads must arrive within ``ISPLAN_HEADER_SECONDS`` (default 10),
bodies within ``ISPLAN_BODY_SECONDS`` (default 30): :func:`app.web.security.uvicorn_options`.
"""

from __future__ import annotations

import argparse
import os

DEFAULT_WORKERS = 2


def default_workers() -> int:
    """``ISPLAN_SERVER_WORKERS``, else :data:`DEFAULT_WORKERS`."""
    try:
        n = int(os.environ.get("ISPLAN_SERVER_WORKERS", DEFAULT_WORKERS))
    except ValueError:
        return DEFAULT_WORKERS
    return n if n >= 1 else DEFAULT_WORKERS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"server processes (default ISPLAN_SERVER_WORKERS, else {DEFAULT_WORKERS})")
    return parser


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from app.web.security import uvicorn_options

    args = build_parser().parse_args(argv)
    workers = args.workers if args.workers and args.workers >= 1 else default_workers()
    uvicorn.run("app.main:app", host=args.host, port=args.port, workers=workers, **uvicorn_options())


if __name__ == "__main__":
    main()
