"""Precision of `phalanx lint` on real public distributed-training code, repeatable.

    python benchmarks/lint_study.py --mirrors /work/.mirror [--json OUT]

For each project in benchmarks/lint_study/projects.json (repo, commit, paths) it checks
out exactly those paths at that commit (from a local mirror, `--mirrors DIR` laid out as
DIR/owner+name/<git dir>, else a blob-less clone from GitHub), runs
`python -m phalanx lint --format json` on them and scores the findings against
benchmarks/lint_study/judgments.json ({repo, path, line, code, text, verdict, why}).

Projects marked "held_out": true in projects.json were added after the linter was tuned
(it never saw them): the script prints the tuned set, the held-out set and both together,
each with its error and warning precision. Precision on the tuned set is optimistic; the
held-out numbers are the honest estimate.

Every error is judged; warnings are judged on a seeded sample, drawn per set: up to
--per-project each, raised until the sample holds --min-total, and every warning of a set
with at most --all-up-to of them (--all: every warning everywhere). A sample is ordered by a hash of
(seed, repo, path, code, source text), so it survives line shifts and a vanished
finding is replaced by the next one. A judgment matches a finding by repo+path+line+code,
else by repo+path+code+stripped source line. Findings without one are listed as
"unjudged"; judgments that match nothing any more are counted as "gone" (listed with
--verbose).
To pin a linter version: `git archive REV src | tar -x -C DIR` and run with PYTHONPATH=DIR/src.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "lint_study"


def find_git_dir(mirrors: Path, repo: str) -> Path | None:
    root = mirrors / repo.replace("/", "+")
    if not root.is_dir():
        return None
    for cand in [root, *sorted(root.glob("*")), *sorted(root.glob("*/*"))]:
        if (cand / "HEAD").is_file() and (cand / "objects").is_dir():
            return cand
    return None


def checkout_from_mirror(git_dir: Path, commit: str, paths: list[str], dest: Path) -> None:
    git = ["git", "--git-dir", str(git_dir)]
    out = subprocess.run([*git, "ls-tree", "-r", "-z", commit, "--", *paths],
                         check=True, capture_output=True).stdout.decode()
    seen = set()
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        _mode, kind, sha = meta.split()
        if kind != "blob" or not path.endswith(".py"):
            continue
        seen.update(p for p in paths if path == p or path.startswith(p.rstrip("/") + "/"))
        blob = subprocess.run([*git, "cat-file", "blob", sha], check=True, capture_output=True)
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
    missing = set(paths) - seen
    if missing:
        raise SystemExit(f"{git_dir}: no Python files at {commit} under {sorted(missing)}")


def checkout_from_github(repo: str, commit: str, paths: list[str], dest: Path) -> None:
    url = f"https://github.com/{repo}"
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", "--no-checkout", url, str(dest)],
                   check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", commit, "--", *paths], check=True)


def checkout(project: dict, work: Path, mirrors: Path | None) -> Path:
    dest = work / project["repo"].replace("/", "+") / project["commit"][:12]
    done = dest / ".lint_study_done"
    if done.exists():
        return dest
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    dest.mkdir(parents=True)
    git_dir = find_git_dir(mirrors, project["repo"]) if mirrors else None
    if git_dir is not None:
        checkout_from_mirror(git_dir, project["commit"], project["paths"], dest)
    else:
        checkout_from_github(project["repo"], project["commit"], project["paths"], dest)
    done.write_text(project["commit"] + "\n")
    return dest


def run_lint(dest: Path, paths: list[str]) -> tuple[int, list[dict], str]:
    cmd = [sys.executable, "-m", "phalanx", "lint", "--format", "json", *paths]
    proc = subprocess.run(cmd, cwd=dest, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        return 0, [], f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return 0, [], f"not JSON: {proc.stdout[:200]!r} {proc.stderr.strip()[-300:]}"
    findings = report["findings"]
    for f in findings:
        p = Path(f["path"])
        f["path"] = (p.relative_to(dest) if p.is_absolute() else p).as_posix()
    return report["files"], findings, ""


def count_lines(dest: Path, paths: list[str]) -> int:
    total = 0
    for p in paths:
        base = dest / p
        for f in [base] if base.is_file() else sorted(base.rglob("*.py")):
            total += f.read_bytes().count(b"\n")
    return total


def attach_text(dest: Path, findings: list[dict]) -> None:
    cache: dict[str, list[str]] = {}
    for f in findings:
        if f["path"] not in cache:
            raw = (dest / f["path"]).read_text(encoding="utf-8", errors="replace")
            cache[f["path"]] = raw.splitlines()
        lines = cache[f["path"]]
        f["text"] = lines[f["line"] - 1].strip() if 0 < f["line"] <= len(lines) else ""


def sample_key(seed: int, repo: str, f: dict) -> str:
    raw = f"{seed}|{repo}|{f['path']}|{f['code']}|{f['text']}|{f['line']}"
    return hashlib.sha1(raw.encode()).hexdigest()


def choose_samples(results: list[dict], seed: int, per_project: int, min_total: int,
                   all_up_to: int = 0) -> None:
    """Mark f['sampled'] on every error and on a seeded sample of each project's warnings.

    Every warning when the results hold at most `all_up_to` of them."""
    for r in results:
        r["warnings"] = sorted((f for f in r["findings"] if f["severity"] == "warning"),
                               key=lambda f: sample_key(seed, r["repo"], f))
    k = per_project
    most = max((len(r["warnings"]) for r in results), default=0)
    if sum(len(r["warnings"]) for r in results) <= all_up_to:
        k = most
    while sum(min(k, len(r["warnings"])) for r in results) < min_total and k < most:
        k += 1
    for r in results:
        for f in r["findings"]:
            f["sampled"] = f["severity"] == "error"
        for f in r["warnings"][:k]:
            f["sampled"] = True


def match_judgments(results: list[dict], judgments: list[dict]) -> list[dict]:
    """Set f['verdict']/f['why'] from the judgments; return the judgments nothing matched."""
    by_line = {(j["repo"], j["path"], j["line"], j["code"]): j for j in judgments}
    by_text: dict[tuple, list[dict]] = {}
    for j in judgments:
        by_text.setdefault((j["repo"], j["path"], j["code"], j.get("text", "")), []).append(j)
    used: set[int] = set()
    for r in results:
        for f in r["findings"]:
            j = by_line.get((r["repo"], f["path"], f["line"], f["code"]))
            if j is None or (j.get("text") and j["text"] != f["text"]):
                same = by_text.get((r["repo"], f["path"], f["code"], f["text"]), [])
                # several identical lines in one file: the unused one nearest the finding
                same = sorted(same, key=lambda c: (id(c) in used, abs(c["line"] - f["line"])))
                j = same[0] if same else j
            if j is not None:
                f["verdict"], f["why"] = j["verdict"], j.get("why", "")
                used.add(id(j))
    return [j for j in judgments if id(j) not in used]


def score(r: dict) -> dict:
    fs = r["findings"]
    sampled = [f for f in fs if f.get("sampled")]
    count = {(sev, v): sum(1 for f in sampled if f["severity"] == sev and f.get("verdict") == v)
             for sev in ("error", "warning") for v in ("true", "false")}
    judged_true = count["error", "true"] + count["warning", "true"]
    judged = judged_true + count["error", "false"] + count["warning", "false"]
    return {
        "files": r["files"], "lines": r["lines"],
        "errors": sum(f["severity"] == "error" for f in fs),
        "warnings": sum(f["severity"] == "warning" for f in fs),
        "infos": sum(f["severity"] == "info" for f in fs),
        "err_true": count["error", "true"], "err_false": count["error", "false"],
        "warn_true": count["warning", "true"], "warn_false": count["warning", "false"],
        "unjudged": sum(1 for f in sampled if f.get("verdict") not in ("true", "false")),
        "precision": judged_true / judged if judged else None,
    }


def pct(num: int, den: int) -> str:
    return f"{100 * num / den:.0f}%" if den else "-"


def print_table(results: list[dict], title: str = "") -> dict:
    if title:
        print(f"### {title}\n")
    cols = ["files", "lines", "errors", "warnings", "infos", "err T/F", "warn T/F", "unjudged",
            "precision"]
    print("| project | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    tot: dict = {}
    for r in results:
        s = r["score"]
        for key, val in s.items():
            if key != "precision":
                tot[key] = tot.get(key, 0) + val
        prec = "-" if s["precision"] is None else f"{100 * s['precision']:.0f}%"
        print(f"| {r['repo']} | {s['files']} | {s['lines']} | {s['errors']} | {s['warnings']} | "
              f"{s['infos']} | {s['err_true']}/{s['err_false']} | {s['warn_true']}/"
              f"{s['warn_false']} | {s['unjudged']} | {prec} |")
    judged_true = tot.get("err_true", 0) + tot.get("warn_true", 0)
    judged = judged_true + tot.get("err_false", 0) + tot.get("warn_false", 0)
    tot["precision"] = judged_true / judged if judged else None
    print(f"| **total** | {tot.get('files', 0)} | {tot.get('lines', 0)} | {tot.get('errors', 0)} "
          f"| {tot.get('warnings', 0)} | {tot.get('infos', 0)} | {tot.get('err_true', 0)}/"
          f"{tot.get('err_false', 0)} | {tot.get('warn_true', 0)}/{tot.get('warn_false', 0)} | "
          f"{tot.get('unjudged', 0)} | {pct(judged_true, judged)} |")
    et, ef = tot.get("err_true", 0), tot.get("err_false", 0)
    wt, wf = tot.get("warn_true", 0), tot.get("warn_false", 0)
    print(f"\nfalse errors: {ef} of {et + ef} (error precision {pct(et, et + ef)}); "
          f"sampled warnings: {wt} true / {wf} false of {tot.get('warnings', 0)} "
          f"(warning precision {pct(wt, wt + wf)})")
    per_rule: dict[str, list[int]] = {}
    for r in results:
        for f in r["findings"]:
            if f.get("sampled") and f.get("verdict") in ("true", "false"):
                per_rule.setdefault(f["code"], [0, 0])[f["verdict"] == "false"] += 1
    print("judged per rule (true/false): " + ", ".join(
        f"{code} {t}/{fl}" for code, (t, fl) in sorted(per_rule.items())) + "\n")
    return tot


def print_lists(results: list[dict], gone: list[dict], verbose: bool) -> None:
    for r in results:
        for f in r["findings"]:
            if f.get("sampled") and f.get("verdict") not in ("true", "false"):
                print(f"unjudged: {r['repo']} {f['path']}:{f['line']} {f['code']} "
                      f"{f['severity']}: {f['text'][:100]}")
            elif verbose and f.get("sampled"):
                print(f"{f['verdict']:5} {r['repo']} {f['path']}:{f['line']} {f['code']}: "
                      f"{f.get('why', '')}")
    for j in gone if verbose else []:
        print(f"gone: {j['repo']} {j['path']}:{j['line']} {j['code']} ({j['verdict']}): "
              f"{j.get('text', '')[:80]}")
    if gone and not verbose:
        print(f"{len(gone)} judgments match no finding any more (kept: they judge the finding "
              f"if it comes back); --verbose lists them")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirrors", type=Path, help="DIR/owner+name/<git dir> local mirrors")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lint_study")
    ap.add_argument("--projects", type=Path, default=HERE / "projects.json")
    ap.add_argument("--judgments", type=Path, default=HERE / "judgments.json")
    ap.add_argument("--only", action="append", help="only this repo (repeatable)")
    ap.add_argument("--seed", type=int, default=20261124)
    ap.add_argument("--per-project", type=int, default=6)
    ap.add_argument("--min-total", type=int, default=30,
                    help="raise the per-project cap until a set's sample holds this many")
    ap.add_argument("--all-up-to", type=int, default=100,
                    help="judge every warning of a set (tuned, held-out) with at most this many")
    ap.add_argument("--all", action="store_true", help="judge every warning")
    ap.add_argument("--json", type=Path, help="write scores and findings here")
    ap.add_argument("--verbose", action="store_true", help="list the judged findings too")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    projects = json.loads(args.projects.read_text())
    judgments = json.loads(args.judgments.read_text()) if args.judgments.exists() else []
    results, failed = [], False
    for p in projects:
        if args.only and p["repo"] not in args.only:
            continue
        dest = checkout(p, args.work, args.mirrors)
        files, findings, err = run_lint(dest, p["paths"])
        if err:
            print(f"{p['repo']}: phalanx lint failed: {err}", file=sys.stderr)
            failed = True
        attach_text(dest, findings)
        results.append({"repo": p["repo"], "commit": p["commit"], "files": files,
                        "held_out": bool(p.get("held_out")),
                        "lines": count_lines(dest, p["paths"]), "findings": findings})
    groups = [("tuned set (the linter was tuned on these: optimistic)",
               [r for r in results if not r["held_out"]]),
              ("held-out set (added after tuning)", [r for r in results if r["held_out"]])]
    for _title, rs in groups:
        choose_samples(rs, args.seed, args.per_project, args.min_total,
                       10**9 if args.all else args.all_up_to)
    considered = {r["repo"] for r in results}
    gone = [j for j in match_judgments(results, judgments) if j["repo"] in considered]
    for r in results:
        r["score"] = score(r)
    proc = subprocess.run([sys.executable, "-c", "import phalanx; print(phalanx.__file__)"],
                          capture_output=True, text=True)
    print(f"linter: {proc.stdout.strip() or proc.stderr.strip()[-200:]}\n")
    totals = {}
    for title, rs in groups:
        if rs:
            totals[title.split(" (")[0]] = print_table(rs, title)
    if all(rs for _t, rs in groups):
        totals["overall"] = print_table(results, "overall")
    print_lists(results, gone, args.verbose)
    if args.json:
        for r in results:
            r.pop("warnings", None)
        out = {"totals": totals, "projects": results, "gone": gone}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
