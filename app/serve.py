"""``python -m app.serve``: the web app under uvicorn with several worker processes and the
slow-client limits of issues 9 and 20 (``make serve`` and the Dockerfile both start it this way).

Each uvicorn worker is a whole server process (its own event loop, its own pool of planner
workers, :mod:`app.web.workers`), so one busy process does not stall the others; all of them
share the upload store (SQLite in ``ISPLAN_DATA_DIR``, or PostgreSQL via ``ISPLAN_DATABASE_URL``
for several machines). Request heads must arrive within ``ISPLAN_HEADER_SECONDS`` (default 10),
bodies within ``ISPLAN_BODY_SECONDS`` (default 30), one peer may hold at most
``ISPLAN_CONNECTIONS_PER_CLIENT`` connections per process: :func:`app.web.security.uvicorn_options`.

Every ``ISPLAN_*`` setting is checked before the server starts (:class:`app.settings.Settings`):
a bad value is one line naming the variable and exit code 2, not a traceback from each worker.
"""

from __future__ import annotations

import argparse
import sys

from app.settings import Settings, SettingsError

DEFAULT_WORKERS = 2



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"server processes (default ISPLAN_SERVER_WORKERS, else {DEFAULT_WORKERS})")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"python -m app.serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    import uvicorn

    from app.web.security import uvicorn_options

    workers = args.workers if args.workers and args.workers >= 1 else settings.server_workers
    try:
        uvicorn.run("app.main:app", host=args.host, port=args.port, workers=workers, **uvicorn_options())
    finally:
        _reap_helpers()


def _reap_helpers() -> None:
    """Stop (and wait for) the multiprocessing helper processes this process started - with
    several workers, uvicorn's spawn context starts a resource tracker - so none outlives the
    server as an orphan (issue 20: nothing left after a stop). The single-process server stops
    its planner pool and forkserver in the app's lifespan (:func:`app.web.workers.shutdown_default_pool`)."""
    import contextlib
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):
        resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
