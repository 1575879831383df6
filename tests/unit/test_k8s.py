"""`phalanx k8s` (a Kubeflow PyTorchJob manifest) and what a pod of that job makes of the
operator's variables: it is its node's launcher, not a rank."""

from __future__ import annotations

import json

import pytest

from phalanx import cli
from phalanx.cluster.env import detect_launch_env
from phalanx.cluster.protocol import under_launcher
from phalanx.config.flags import resolve


def render(capsys, *argv: str) -> dict:
    """The manifest, read as kubectl reads it (YAML)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest back")
    assert cli.main(["k8s", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_the_manifest_is_a_pytorchjob_with_a_master_and_workers(capsys):
    job = render(capsys, "--nodes", "3", "--image", "reg/phalanx:1", "--nproc-per-node", "2",
                 "--max-steps", "100", "--out", "/phalanx/run1", "--volume-claim", "runs")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["spec"]["nprocPerNode"] == "2"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 2}
    pod = specs["Worker"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["name"] == "pytorch" and container["image"] == "reg/phalanx:1"
    assert container["command"] == ["python", "-m", "phalanx", "train", "--max-steps", "100",
                                    "--out", "/phalanx/run1"]  # the operator gives the rest
    assert container["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"},
                                         {"name": "runs", "mountPath": "/phalanx"}]
    assert pod["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory"}},
                              {"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}}]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
    assert specs["Master"]["restartPolicy"] == "OnFailure"



def against_the_operators_api(job: dict) -> None:
    """Read `job` as the training operator's API does (the models Kubeflow generates from
    the PyTorchJob CRD's OpenAPI schema): a missing required field or a wrong type raises,
    and a field the schema does not know is dropped, so the round trip must give `job`."""
    training = pytest.importorskip("kubeflow.training", reason="kubeflow-training (the test "
                                   "extra) holds the PyTorchJob API models")

    class Response:
        data = json.dumps(job)

    client = training.ApiClient()
    parsed = client.deserialize(Response, "KubeflowOrgV1PyTorchJob")
    assert client.sanitize_for_serialization(parsed) == job


@pytest.mark.parametrize("argv", [
    ["--nodes", "1", "--image", "img:1"],
    ["--nodes", "4", "--image", "img:1", "--gpus-per-node", "8", "--max-steps", "10",
     "--out", "/phalanx/r", "--volume-claim", "runs", "--name", "gpt-run-2"],
    ["--nodes", "2", "--image", "reg.example.com:5000/team/phalanx:1.0", "--cpu-request",
     "500m", "--memory-request", "1.5Gi", "--volume-claim", "runs.v1", "--mount-path",
     "/mnt/runs/", "--out", "/mnt/runs/r"]])
def test_the_manifest_validates_against_the_pytorchjob_schema(capsys, argv):
    against_the_operators_api(render(capsys, *argv))


def test_the_schema_check_rejects_what_the_operator_would(capsys):
    job = render(capsys, "--nodes", "2", "--image", "img:1")
    misspelt = json.loads(json.dumps(job))
    misspelt["spec"]["nprocsPerNode"] = misspelt["spec"].pop("nprocPerNode")
    with pytest.raises(AssertionError):  # an unknown field is not what the operator reads
        against_the_operators_api(misspelt)
    del job["spec"]["runPolicy"]
    with pytest.raises(ValueError, match="run_policy"):
        against_the_operators_api(job)

def pod_env(index: int, nodes: int = 3, procs: str = "2") -> dict:
    """What the training operator sets in pod `index` of a PyTorchJob (torchrun style)."""
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": procs,
            "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": "phalanx-master-0",
            "PET_MASTER_PORT": "23456", "MASTER_ADDR": "phalanx-master-0",
            "MASTER_PORT": "23456", "RANK": str(index), "WORLD_SIZE": str(nodes)}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_pod_is_its_nodes_launcher_with_the_operators_shape(monkeypatch, index):
    env = pod_env(index)
    assert not under_launcher(env)  # RANK there is the pod's index, not a process rank
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = resolve(cli.build_parser().parse_args(["train"]))
    d = cfg.dist
    assert (d.nnodes, d.node_rank, d.nproc_per_node, d.rdzv_endpoint) == \
        ("3", index, 2, "phalanx-master-0:23456")
    cfg = resolve(cli.build_parser().parse_args(["train", "--nproc-per-node", "1"]))
    assert cfg.dist.nproc_per_node == 1  # a flag still wins


def test_the_workers_the_pod_starts_are_ranks():
    """Inside the pod, Phalanx's elastic agent starts the workers: its variables win."""
    env = {**pod_env(1), "TORCHELASTIC_RUN_ID": "phalanx", "RANK": "3", "LOCAL_RANK": "1",
           "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2"}
    assert under_launcher(env)
    found = detect_launch_env(env)
    assert (found.rank, found.local_rank, found.world_size) == (3, 1, 6)
