"""A run that a person can watch: loss-spike and straggler warnings (2 gloo ranks, faults
planted), and the run report — one self-contained page, rebuilt by `phalanx report`,
photographed in headless Chromium (Debian's `chromium`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from test_fault_tolerance import train

from phalanx.cli.report import find_browser


@pytest.fixture(scope="module")
def watched(tmp_path_factory, small_corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("watched")
    faults = "rank=0,step=14,action=spike;rank=1,step=3,action=slow"
    proc = train(out, small_corpus_file, cache_dir, faults, "--max-steps", "30",
                 "--straggler-every", "10", "--log-every", "1", "--sample-tokens", "40")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_a_loss_spike_and_a_straggler_are_named_once(watched):
    out, proc = watched
    spikes = [line for line in proc.stdout.splitlines() if "a loss spike" in line]
    assert len(spikes) == 1 and spikes[0].startswith("phalanx: warning: step 15: loss "), spikes
    slow = [line for line in proc.stdout.splitlines() if "is a straggler" in line]
    assert len(slow) == 1, proc.stdout
    # named at the second check in a row that finds it slow: step 20 — or 30 on a loaded
    # machine, where the first window (slow from step 3 only) can miss the 2x factor
    # (a CI run named it at step 30, 3.1x the median)
    named = re.match(r"phalanx: warning: step (20|30): rank 1 on \S+ is a straggler: its own "
                     r"time \(the step minus its waits in collectives\) is [\d.]+ ms per "
                     r"step, [\d.]+× the median", slow[0])
    assert named, slow[0]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in events][:-1] == [  # (the injected fault: an
        ("fault", 0), ("spike", 15), ("straggler", int(named[1]))]  # event too, issue 41.6)
    assert events[-1]["kind"] == "goodput"  # when training ended (issue 45)


def test_the_report_is_one_self_contained_page(watched):
    out, proc = watched
    page = (out / "report.html").read_text()
    assert str(out / "report.html") in proc.stdout  # named on the `wrote:` line
    assert page.count("<svg") == 7  # loss, lr, throughput, step time, grad norm, rank
    # pace (the straggler check's), memory
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert "<script" not in page
    for needle in ("a loss spike", "is a straggler", "step-00000030", "[train]", "[dist]",
                   "torch", "complete"):
        assert needle in page, needle


def test_phalanx_report_rebuilds_it_and_chromium_renders_it(watched, tmp_path):
    out, _ = watched
    if find_browser() is None:
        pytest.skip("no Chromium here (Debian: `apt install chromium`); .ci/run installs it")
    png, html = tmp_path / "report.png", tmp_path / "again.html"
    done = subprocess.run([sys.executable, "-m", "phalanx", "report", str(out), "--out",
                           str(html), "--screenshot", str(png)], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    from PIL import Image

    with Image.open(png) as image:
        width, height = image.size
        colours = image.convert("RGB").resize((64, 64)).getcolors(4096)
    assert width == 1280 and 1500 < height < 9000, (width, height)  # cropped to the content
    assert len(colours) > 20  # drawn charts and tables, not a blank or error page


@pytest.mark.parametrize("case", ["missing", "empty"])
def test_report_of_no_run_is_a_user_error(tmp_path, case):
    target = tmp_path / "nothing"
    if case == "empty":
        target.mkdir()
    done = subprocess.run([sys.executable, "-m", "phalanx", "report", str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("phalanx: error: ") and line.endswith("."), line
