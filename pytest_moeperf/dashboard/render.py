"""Pure: the dashboard's files as text. Every page is one HTML shell: its data inline (a JSON literal), the sessions
they share in ``data/sessions.js``, and the drawing in ``static/dashboard.js`` (uPlot for the metric charts, plain
SVG for the index's sparklines). Scripts load with ``<script src>``, which a browser allows from ``file://`` where
``fetch`` is refused: the site opens from disk, with no network, as well as from any web server."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

STATIC = ("dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE")
MANIFEST = "moeperf-dashboard.json"
FORMAT = 2  # 2: the manifest lists the files the build wrote
OWN = ("index.html", MANIFEST, "m/", "data/", "static/")  # what a build of format 1 (no list) is taken to have written


def static_files() -> dict[str, bytes]:
    """The shipped assets, by name (the package data of ``pytest_moeperf.dashboard``)."""
    folder = resources.files("pytest_moeperf.dashboard") / "static"
    return {name: (folder / name).read_bytes() for name in STATIC}


def script_json(value: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``</script>`` or ``<!--`` can end or change the element."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def sessions_js(payload: dict[str, Any]) -> str:
    return f"window.MOEPERF_SESSIONS = {script_json(payload)};\n"


def page(title: str, payload: dict[str, Any], depth: int) -> str:
    """One page; ``depth`` folders below the site's root (the metric pages live in ``m/``)."""
    up = "../" * depth
    uplot = (f'<link rel="stylesheet" href="{up}static/uPlot.min.css">'
             f'<script src="{up}static/uPlot.iife.min.js"></script>') if payload.get("kind") == "metric" else ""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f'<link rel="stylesheet" href="{up}static/dashboard.css">{uplot}',
        "</head><body>",
        f'<header><a class="home" href="{up}index.html">moeperf dashboard</a><h1 id="title">{html.escape(title)}</h1>'
        '<form id="filters" aria-label="filters"></form></header>',
        '<div id="error" hidden></div><main id="main"><noscript>This dashboard draws with JavaScript: allow it for '
        "this page (it fetches nothing).</noscript></main>",
        '<footer id="footer"></footer>',
        f'<script src="{up}data/sessions.js"></script>',
        f"<script>window.MOEPERF_PAGE = {script_json(payload)};</script>",
        f'<script src="{up}static/dashboard.js"></script>', "</body></html>", ""])


def manifest(payload: dict[str, Any], files: Iterable[str]) -> str:
    """What marks a folder as a dashboard (``--out`` replaces only such a folder), what it was built from, and the
    ``files`` the build wrote (a rebuild keeps the others: a ``CNAME``, a ``.nojekyll``)."""
    return json.dumps({"format": FORMAT, **payload, "files": sorted(set(files) | {MANIFEST})}, indent=2,
                      sort_keys=True) + "\n"


def written(text: str) -> Callable[[str], bool]:
    """Whether a path (relative, ``/``-separated) of a site is one its build wrote, by the site's manifest ``text``:
    listed in it; a manifest with no list (format 1, or unreadable): `OWN`'s files and folders."""
    try:
        listed = json.loads(text).get("files")
    except (ValueError, AttributeError):
        listed = None
    if isinstance(listed, list) and all(isinstance(name, str) for name in listed):
        names = frozenset(listed) | {MANIFEST}
        return names.__contains__
    return lambda path: any(path == own or (own.endswith("/") and path.startswith(own)) for own in OWN)
