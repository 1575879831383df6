"""`phalanx k8s` refuses, in one line and before printing anything, what Kubernetes would
refuse or could not pull (an empty or malformed image, a PVC name that is no DNS-1123
subdomain, a relative mount path, a malformed quantity); what it prints is YAML that
reads back as the manifest, whatever the train arguments hold."""

from __future__ import annotations

import pytest

from phalanx import cli
from phalanx.cli import k8s
from phalanx.config.flags import resolve


def refused(capsys, tmp_path, *argv: str) -> str:
    manifest = tmp_path / "job.yaml"
    code = cli.main(["k8s", *argv, "--manifest", str(manifest)])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("phalanx: error: `--"), captured.err
    assert not manifest.exists()
    return captured.err


@pytest.mark.parametrize("argv,said", [
    (["--image", ""], "`--image` is empty"),
    (["--image", "   "], "`--image` is empty"),
    (["--image", "Reg/Phalanx:1"], "is not an image reference"),
    (["--image", "img:1\nx"], "`--image img:1\\nx` is not an image reference"),
    (["--image", "img 1"], "is not an image reference"),
    (["--image", "img:"], "is not an image reference"),
    (["--image", "img@sha256:xyz"], "is not an image reference"),
    (["--image", "img:tag\u00fc"], "is not an image reference"),
    (["--image", "img:1", "--volume-claim", "Runs"], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--volume-claim", "runs_1"], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--volume-claim=-runs"], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--volume-claim", "runs."], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--volume-claim", "r" * 254], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--volume-claim", ""], "is not a PersistentVolumeClaim name"),
    (["--image", "img:1", "--mount-path", "phalanx"], "`--mount-path phalanx` is not a"),
    (["--image", "img:1", "--mount-path", "./runs"], "is not a directory a volume can"),
    (["--image", "img:1", "--mount-path", ""], "is not a directory a volume can"),
    (["--image", "img:1", "--mount-path", "/"], "is not a directory a volume can"),
    (["--image", "img:1", "--mount-path", "/dev/shm"], "is not a directory a volume can"),
    (["--image", "img:1", "--mount-path", "/a\nb"], "is not a directory a volume can"),
    (["--image", "img:1", "--cpu-request", "lots"], "`--cpu-request lots` is not a Kuber"),
    (["--image", "img:1", "--cpu-request", ""], "is not a Kubernetes quantity"),
    (["--image", "img:1", "--memory-request", "8GB"], "is not a Kubernetes quantity"),
])
def test_a_value_kubernetes_would_refuse_is_refused_in_one_line(capsys, tmp_path, argv, said):
    assert said in refused(capsys, tmp_path, *argv)


@pytest.mark.parametrize("image", [
    "img", "img:1", "reg/phalanx:1", "registry.example.com:5000/team/phalanx:v1.0-rc_1",
    "localhost/x", "ghcr.io/o/p@sha256:" + "a" * 64, "a.b/c__d/e--f:Tag.1"])
def test_image_references_the_runtime_pulls_are_accepted(image):
    assert k8s._IMAGE.fullmatch(image)


HOSTILE = ["yes", "No", "on", "null", "~", "1e3", "0x10", "12:30", "0o7", ".inf", "- a",
           ": x", "a: b", "#c", "a #c", "'q'", '"q"', "x\ny", "tab\tx", "é", "\u2028",
           "{a: 1}", "[1]", "&anchor", "*alias", "!tag", "|", ">", "%x", "@x", "`x`", "",
           " lead", "trail ", "true", "False", "-", "--flag", "/path", "a/b-c_d.e"]


def test_the_yaml_reads_back_as_the_manifest_whatever_the_arguments_hold(capsys):
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest back")
    argv = ["--image", "img:1", "--nodes", "2"]
    argv += [f"--rdzv-id={value}" for value in HOSTILE]
    assert cli.main(["k8s", *argv]) == 0
    text = capsys.readouterr().out
    ns = cli.build_parser().parse_args(["k8s", *argv])
    expected = k8s.manifest(ns, resolve(ns), argv)
    assert yaml.safe_load(text) == expected
    command = expected["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["command"]
    assert command[4:] == [f"--rdzv-id={value}" for value in HOSTILE]
    assert text.startswith("# Rendered by `phalanx k8s`") and "{\n" not in text  # YAML


def test_to_yaml_round_trips_every_shape():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest back")
    value = {"a": [[1, "x"], [], {}, {"b": [{"c": "yes"}]}], "e": {}, "n": None,
             "t": True, "k:ey": "v", "num": 7, "s": HOSTILE}
    assert yaml.safe_load(k8s.to_yaml(value)) == value


def test_every_pod_gets_a_memory_backed_dev_shm_and_requests(capsys):
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest back")
    assert cli.main(["k8s", "--image", "img:1", "--nodes", "2", "--nproc-per-node", "3",
                     "--threads-per-rank", "4"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        [container] = pod["containers"]
        assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
        assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert container["resources"] == {"requests": {"cpu": "12", "memory": "12Gi"}}


def test_explicit_requests_win():
    ns = cli.build_parser().parse_args(["k8s", "--image", "img:1", "--gpus-per-node", "8",
                                        "--cpu-request", "500m", "--memory-request", "64Gi"])
    job = k8s.manifest(ns, resolve(ns), [])
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "64Gi"},
                                      "limits": {"nvidia.com/gpu": "8"}}
