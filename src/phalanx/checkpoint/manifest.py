"""A committed checkpoint's manifest: the names every checkpoint holds, and the file list
read back with its shape and containment checked (nothing else read)."""

from __future__ import annotations

from pathlib import Path

from phalanx.checkpoint.digest import entry_digest, known_algorithms
from phalanx.paths import parse_json

MANIFEST, STATE, LATEST = "manifest.json", "train_state.json", "latest"


def listed_files(path: Path) -> tuple[dict[str, dict], str | None]:
    """The manifest's file list, checked for shape and containment (nothing read but the
    manifest and the directory listing); (files, None) or ({}, why not)."""
    manifest_path = Path(path) / MANIFEST
    if manifest_path.is_symlink() or not manifest_path.is_file():
        return {}, "no manifest (never committed, or written by something else)"
    try:
        files = parse_json(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError):
        return {}, "manifest is not valid JSON with a `files` table"
    if not isinstance(files, dict) or not all(
            isinstance(i, dict) and type(i.get("size")) is int and entry_digest(i) is not None
            for i in files.values()):
        return {}, (f"manifest's `files` table is malformed (each entry needs a size and a "
                    f"{known_algorithms()} checksum)")
    outside = [n for n in files if not plain_name(n)]
    if outside:
        return {}, (f"manifest names `{outside[0]}`, which is not a file directly inside the "
                    f"checkpoint; refused before reading anything it names")
    missing = [n for n in (".metadata", STATE) if n not in files]
    if missing:
        return {}, f"manifest does not list `{missing[0]}`"
    unlisted = sorted(p.name for p in Path(path).iterdir() if p.name != MANIFEST
                      and p.name not in files)
    if unlisted:
        return {}, f"`{unlisted[0]}` is in the checkpoint but not listed in its manifest"
    return files, None


def plain_name(name: object) -> bool:
    """A bare file name: no separator, not `.`/`..`, not empty, no NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name)
