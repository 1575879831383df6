"""The resume-conformance matrix (issue 46; docs/conformance.md): each library's script
(`<library>_script.py`, the task of common.py) is killed and resumed in each scenario of
conformance_scenarios.py, and its record is compared with an uninterrupted reference run's.

    python benchmarks/conformance/matrix.py --markdown                      # everything
    python benchmarks/conformance/matrix.py --libraries phalanx,torch --scenarios mid-epoch
    python benchmarks/conformance/matrix.py --table-only                   # the table so far

One run at a time, 2-4 gloo processes each, 120 s at most. Each cell's runs keep their
output in OUT/<scenario>/<library>/ (the references in OUT/_reference/); the cells go to
benchmarks/results/conformance.json (merged with the cells already there) with the library
versions and the command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conformance_cells import assemble, compare, life_failure, read_records, resume_notes  # noqa: E402
from conformance_runner import RunResult, launch  # noqa: E402
from conformance_scenarios import (  # noqa: E402
    BY_NAME,
    LIBRARIES,
    SCENARIOS,
    Scenario,
    command,
    script_args,
    written,
)

RESULTS = Path(__file__).resolve().parents[1] / "results" / "conformance.json"
DEFAULT_OUT = Path("/tmp/phalanx-conformance")
PACKAGES = ("torch", "torchdata", "accelerate", "lightning")


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def reference(library: str, scenario: Scenario, out: Path,
              cache: dict) -> tuple[RunResult, Path, Path]:
    """The uninterrupted run with the first life's settings (shared by the scenarios that
    have the same ones): (its result, its run directory, its evidence folder)."""
    first = scenario.lives[0]
    key = (library, first.world, first.batch, first.strategy, scenario.args)
    if key not in cache:
        slug = "-".join([f"w{first.world}", f"b{first.batch}", first.strategy,
                         *(a.lstrip("-") for a in scenario.args)])
        folder = out / "_reference" / library / slug
        shutil.rmtree(folder, ignore_errors=True)
        run_dir = folder / "run"
        result = launch(command(library, first.world, run_dir,
                                script_args(run_dir, scenario, first, None)),
                        folder, "reference")
        cache[key] = (result, run_dir, folder)
    return cache[key]


def run_lives(library: str, scenario: Scenario, folder: Path
              ) -> tuple[list[RunResult], str | None]:
    """Each life in turn in `folder/run`; stops at the first that fails (its cell)."""
    run_dir = folder / "run"
    results: list[RunResult] = []
    for i, life in enumerate(scenario.lives):
        result = launch(command(library, life.world, run_dir,
                                script_args(run_dir, scenario, life, i)), folder, f"life-{i}")
        results.append(result)
        failure = life_failure(result, read_records(run_dir), i, life.kill_after,
                               run_dir / "final.pt")
        if failure is not None:
            return results, failure
    return results, None


def run_cell(scenario: Scenario, library: str, out: Path, cache: dict) -> dict:
    """Run one cell (its reference if not run yet, then its lives) and decide it."""
    if not written(library):
        return {"cell": "not written"}
    if scenario.cuda_only:
        return {"cell": scenario.cuda_only}
    start = time.monotonic()
    ref_result, ref_dir, ref_folder = reference(library, scenario, out, cache)
    ref_records = read_records(ref_dir)
    cell: dict = {"reference": str(ref_folder), "runs": [ref_result.to_json()]}
    failure = life_failure(ref_result, ref_records, -1, 0, ref_dir / "final.pt")
    if failure is not None:
        return {**cell, "cell": failure + " (the reference run)"}
    folder = out / scenario.name / library
    shutil.rmtree(folder, ignore_errors=True)
    lives, failure = run_lives(library, scenario, folder)
    cell.update(dir=str(folder), runs=cell["runs"] + [r.to_json() for r in lives],
                seconds=round(time.monotonic() - start, 1))
    if failure is not None:
        return {**cell, "cell": f"{failure} (life {len(lives) - 1})"}
    records, ref = read_records(folder / "run"), assemble(ref_records)
    ended, notes = resume_notes(scenario, records, ref)
    text = ended or compare(ref, assemble(records), ref_dir / "final.pt",
                            folder / "run" / "final.pt", scenario.tolerant)
    return {**cell, "cell": "; ".join([text, *notes])}


def load_results(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"issue": 46, "cells": {}}


def save_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def markdown(results: dict, libraries: list[str]) -> str:
    """Rows: scenarios; columns: libraries; a cell never run says so."""
    rows = ["| scenario | " + " | ".join(libraries) + " |",
            "|---|" + "---|" * len(libraries)]
    for s in SCENARIOS:
        found = results.get("cells", {}).get(s.name, {})
        cells = []
        for lib in libraries:
            text = found.get(lib, {}).get("cell") or (
                "not written" if not written(lib) else
                s.cuda_only or "not run yet")
            cells.append(text.replace("|", "\\|"))
        rows.append(f"| {s.title} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libraries", default=",".join(LIBRARIES),
                   help=f"comma-separated, of: {', '.join(LIBRARIES)}")
    p.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                   help=f"comma-separated, of: {', '.join(s.name for s in SCENARIOS)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the runs are kept")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results JSON")
    p.add_argument("--markdown", action="store_true", help="print the table at the end")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing: print the table of the results JSON")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.libraries = [x for x in args.libraries.split(",") if x]
    args.scenarios = [x for x in args.scenarios.split(",") if x]
    unknown = [x for x in args.libraries if x not in LIBRARIES] + [
        x for x in args.scenarios if x not in BY_NAME]
    if unknown:
        p.error(f"unknown: {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    results = load_results(args.results)
    if not args.table_only:
        stamp = {"command": " ".join(["python", *sys.argv]), "versions": versions(),
                 "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        results.update(stamp)
        cache: dict = {}
        for name in args.scenarios:
            for library in args.libraries:
                cell = run_cell(BY_NAME[name], library, args.out, cache)
                cell.update(stamp)
                results["cells"].setdefault(name, {})[library] = cell
                save_results(args.results, results)
                print(f"{name} / {library}: {cell['cell']} ({cell.get('seconds', 0)} s)",
                      file=sys.stderr, flush=True)
    if args.markdown or args.table_only:
        print(markdown(results, list(LIBRARIES)))


if __name__ == "__main__":
    main()
