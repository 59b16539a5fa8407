"""The shipped presets as the web layer reads them on every request: the manifest
(``app/core/presets/manifest.json``), read and parsed once per process.

:func:`app.core.model.config.load_manifest` reads and parses the file on every call (~50 µs);
one page answer asked for it five times (the model lookup, the form's preset list, the config
download link). The package's files do not change while the server runs, so one read is the
same answer."""

from __future__ import annotations

from functools import lru_cache

from app.core.model.config import Preset, load_manifest


@lru_cache(maxsize=1)
def shipped_presets() -> tuple[Preset, ...]:
    """Every shipped preset, in the manifest's order."""
    return load_manifest()[1]


@lru_cache(maxsize=1)
def preset_names() -> tuple[str, ...]:
    """The shipped presets' ids, in the manifest's order (what ``preset_ids()`` returns)."""
    return tuple(p.id for p in shipped_presets())
