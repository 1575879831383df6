"""`phalanx report RUN_DIR [--out FILE] [--screenshot PNG]`: rebuild a run's report.html
from its files; optionally photograph it with headless Chromium."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import RunDir, atomic_write

SUMMARY = "Rebuild a run directory's report.html (and optionally a screenshot of it)."
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a `phalanx train --out` directory")
    parser.add_argument("--out", metavar="FILE", default=None,
                        help="where the page goes (default: RUN_DIR/report.html)")
    parser.add_argument("--screenshot", metavar="PNG", default=None,
                        help="also save a PNG of the page as headless Chromium renders it")
    parser.add_argument("--width", type=int, default=1280, metavar="PX",
                        help="the screenshot's width in pixels (default: 1280)")


def run_report(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.report.run_report import build_report

    run_dir = Path(ns.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"`{ns.run_dir}` is not a directory; expected a run directory "
                        "(`phalanx train --out DIR`).")
    names = RunDir(run_dir)
    if not any(p.exists() for p in (names.metrics, names.run_config, names.checkpoints)):
        raise UserError(f"`{ns.run_dir}` holds no run: no metrics.jsonl, run_config.json or "
                        "checkpoints/. Give the directory `phalanx train --out` wrote.")
    page = build_report(run_dir, Path(ns.out) if ns.out else None)
    print(f"wrote: {page}")
    if ns.screenshot:
        print(f"wrote: {screenshot(page, Path(ns.screenshot), ns.width)}")
    return 0


def find_browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 9000) -> Path:
    """Render `page` in headless Chromium in a `width` × `height` window, save a PNG of
    it, and crop the empty background below the content."""
    browser = find_browser()
    if browser is None:
        raise UserError("no Chromium found for --screenshot (looked for "
                        f"{', '.join(BROWSERS)}); install it, e.g. `apt install chromium`.")
    with tempfile.TemporaryDirectory(prefix="phalanx-chromium-") as profile:
        shot = Path(profile) / "page.png"  # rendered in private, then renamed into place:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={shot}", page.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not shot.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"Chromium could not render `{page}` (exit {done.returncode}): "
                            f"{tail[0]}.")
        atomic_write(png, crop_background(shot.read_bytes()))  # a link at `png`: replaced
    return png


def crop_background(png: bytes, margin: int = 24) -> bytes:
    """The PNG without the rows below the last one that differs from the background."""
    import io

    from PIL import Image, ImageChops

    with Image.open(io.BytesIO(png)) as image:
        rgb = image.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((0, rgb.height - 1)))
    box = ImageChops.difference(rgb, background).getbbox()
    if box is None or box[3] + margin >= rgb.height:
        return png
    out = io.BytesIO()
    rgb.crop((0, 0, rgb.width, box[3] + margin)).save(out, format="PNG")
    return out.getvalue()
