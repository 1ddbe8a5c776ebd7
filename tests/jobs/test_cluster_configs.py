"""examples/cluster/: the launcher YAMLs against Ray's own cluster-config schema (no cloud
calls), and the KubeRay RayJob's structure (offline: not against KubeRay's CRD)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

CLUSTER = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cluster"
LAUNCHER = ["aws-spot.yaml", "gcp-preemptible.yaml"]


def _load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_yaml_passes_rays_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    import ray.autoscaler
    from ray.autoscaler._private.util import validate_config

    config = _load(name)
    schema = json.loads((pathlib.Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    # Ray's own check, as `ray up` runs it after filling defaults (cluster_synced_files is
    # one of those; the rest needs the cloud, so no provider is called).
    validate_config({**config, "cluster_synced_files": []})
    types = config["available_node_types"]
    head = config["head_node_type"]
    assert head == "head" and types[head]["resources"] == {"CPU": 0}
    workers = [t for t in types if t != head]
    assert workers and sum(types[t]["max_workers"] for t in workers) >= config["max_workers"]
    setup = " ".join(config["setup_commands"])
    assert "raylight" in setup
    for t in workers:
        node = types[t]["node_config"]
        if config["provider"]["type"] == "aws":
            assert node["InstanceMarketOptions"]["MarketType"] == "spot", t
            assert "InstanceMarketOptions" not in types[head]["node_config"]
        else:
            assert node["scheduling"] == [{"preemptible": True}], t
            assert "scheduling" not in types[head]["node_config"]
        # A node type with its own worker_setup_commands replaces the global ones.
        commands = " ".join(types[t]["worker_setup_commands"])
        assert "raylight" in commands and f"RAY_NODE_TYPE_NAME={t}" in commands
    text = (CLUSTER / name).read_text()
    assert "raylight submit --address" in text and "--price head=" in text


def test_kuberay_rayjob_structure():
    job = _load("kuberay-rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["metadata"]["name"]
    spec = job["spec"]
    assert spec["entrypoint"].startswith("raylight train ") and "--price" in spec["entrypoint"]
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert any("raylight" in p for p in env["pip"])
    from raylight.base.cost import prices_from_env

    assert prices_from_env(env["env_vars"]) == {"head": 0.19, "cpu-spot": 0.05}
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["template"]["spec"]["containers"][0]["image"].startswith("rayproject/ray:")
    groups = cluster["workerGroupSpecs"]
    assert groups and all({"groupName", "replicas", "minReplicas", "maxReplicas", "template"} <= set(g) for g in groups)
    for g in groups:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        container = g["template"]["spec"]["containers"][0]
        assert {"name": "RAY_NODE_TYPE_NAME", "value": g["groupName"]} in container["env"]
        assert container["resources"]["requests"]["cpu"]


def test_rays_check_catches_what_it_should():
    """The check above is not vacuous: a misspelt key, a node type without resources and
    an unknown head type are refused."""
    from ray.autoscaler._private.util import validate_config

    config = {**_load("aws-spot.yaml"), "cluster_synced_files": []}
    types = config["available_node_types"]
    for bad in (
        {**config, "max_worker": 3},
        {**config, "available_node_types": {**types, "x": {"node_config": {}}}},
        {**config, "head_node_type": "nope"},
    ):
        with pytest.raises(Exception, match=r"max_worker|resources|head_node_type"):
            validate_config(bad)
