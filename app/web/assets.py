"""Where the templates and static files are: inside the installed package (``app.templates`` /
``app.static``, mapped from the repository's top-level ``templates/`` and ``static/`` by
pyproject.toml), or in the repository when running from a checkout."""

from __future__ import annotations

from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def asset_dir(name: str) -> Path:
    """``name`` is ``templates`` or ``static``."""
    packaged = Path(__file__).resolve().parents[1] / name
    if packaged.is_dir():
        return packaged
    try:
        from importlib.resources import files

        found = Path(str(files(f"app.{name}")))
        if found.is_dir():
            return found
    except (ModuleNotFoundError, TypeError):
        pass
    return _REPO / name
