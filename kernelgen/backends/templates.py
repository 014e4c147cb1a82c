"""Kernel skeletons with named holes, in each backend's folder (``<backend>/templates/*.tmpl``).

Templates hold only the fixed skeleton of a kernel; loops and arithmetic for the holes are
rendered from the loop IR. ``string.Template.substitute`` raises on a missing hole.
"""
from __future__ import annotations

import hashlib
import string
from functools import cache
from importlib import resources


@cache
def _text(backend: str, name: str) -> str:
    return resources.files(__package__).joinpath(backend, "templates", f"{name}.tmpl").read_text()


def render(backend: str, template: str, **holes: str) -> str:
    """Fill ``<backend>/templates/<template>.tmpl``; every hole must be given. A hole alone on
    its line that is filled with nothing leaves no blank line."""
    text = _text(backend, template)
    for name, value in holes.items():
        if not value:
            text = text.replace(f"\n${name}\n", "\n")
    try:
        return string.Template(text).substitute(holes)
    except KeyError as exc:
        raise KeyError(f"template {backend}/{template}.tmpl needs hole {exc}") from None


@cache
def digest(backend: str) -> str:
    """A short hash of every template of ``backend``: tuned results measured with other
    skeletons (an older release, a local edit) must not be reused."""
    h = hashlib.sha256()
    folder = resources.files(__package__).joinpath(backend, "templates")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".tmpl"):
            h.update(entry.name.encode() + b"\0" + entry.read_bytes())
    return h.hexdigest()[:16]
