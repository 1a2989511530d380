"""config/kubernetes/daemonset.yaml against the Kubernetes API schemas (kubernetes-validate ships them: no
network), what gpuwarden needs of the node, and its ConfigMap's configuration through `gpuwarden check`."""

import copy
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers import GPUWARDEN

MANIFEST = Path(__file__).resolve().parents[2] / "config/kubernetes/daemonset.yaml"
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())  # the oldest still in wide use, and the newest


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def validate(doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown field is an error too


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_against_the_schemas(version):
    docs = documents()
    assert set(docs) == {"Namespace", "Secret", "ConfigMap", "DaemonSet"}
    for doc in docs.values():
        validate(doc, version)


@pytest.mark.parametrize("breakage", ["a misspelled field", "a wrong type", "a missing required field"])
def test_a_broken_manifest_fails_validation(breakage):
    daemonset = copy.deepcopy(documents()["DaemonSet"])
    pod = daemonset["spec"]["template"]["spec"]
    if breakage == "a misspelled field":
        pod["hostPid"] = pod.pop("hostPID")
    elif breakage == "a wrong type":
        pod["containers"][0]["securityContext"]["privileged"] = "yes"
    else:
        del pod["containers"][0]["name"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset, VERSIONS[-1])


def test_the_pod_gets_what_gpuwarden_needs_of_the_node():
    docs = documents()
    spec = docs["DaemonSet"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    assert pod["hostPID"] and pod["hostNetwork"]  # the engines' processes and sockets are the node's
    [container] = pod["containers"]
    assert container["securityContext"]["privileged"] and container["securityContext"]["runAsUser"] == 0
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert {m["name"] for m in mounts.values()} <= set(volumes)
    host = {path: volumes[m["name"]].get("hostPath", {}).get("path") for path, m in mounts.items()}
    assert host["/dev/kmsg"] == "/dev/kmsg" and volumes[mounts["/dev/kmsg"]["name"]]["hostPath"]["type"] == "CharDevice"
    assert host["/sys"] == "/sys" and mounts["/sys"]["mountPropagation"] == "Bidirectional"  # the guard's mounts
    assert host["/var/lib/gpuwarden"] == "/var/lib/gpuwarden" and not mounts["/var/lib/gpuwarden"].get("readOnly")
    config = volumes[mounts["/etc/gpuwarden"]["name"]]["configMap"]["name"]
    assert config == docs["ConfigMap"]["metadata"]["name"]
    assert container["command"][-1] == "run" and "/etc/gpuwarden/gpuwarden.toml" in container["command"]
    assert "limits" not in container["resources"] or "cpu" not in container["resources"]["limits"]


def test_the_configmaps_configuration_passes_gpuwarden_check(tmp_path):
    """With the Secret's apprise config where the pod mounts it (here: in tmp_path)."""
    docs = documents()
    secret = tmp_path / "apprise.txt"
    secret.write_text(docs["Secret"]["stringData"]["apprise.txt"])
    toml = tmp_path / "gpuwarden.toml"
    toml.write_text(docs["ConfigMap"]["data"]["gpuwarden.toml"].replace("/etc/gpuwarden-alerts/apprise.txt",
                                                                        str(secret)))
    result = subprocess.run([*GPUWARDEN, "check", str(toml), "--show"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"state_dir": "/var/lib/gpuwarden"' in result.stdout and '"listen": "0.0.0.0"' in result.stdout


def test_the_alert_urls_come_from_a_secret_not_the_configmap():
    """Issue 24: the alert URLs (tokens) were in the ConfigMap."""
    docs = documents()
    config = docs["ConfigMap"]["data"]["gpuwarden.toml"]
    assert not re.search(r"^\s*(urls|url)\s*=", config, re.M)
    assert 'config_file = "/etc/gpuwarden-alerts/apprise.txt"' in config
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/gpuwarden-alerts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == docs["Secret"]["metadata"]["name"]
    assert volume["secret"]["defaultMode"] & 0o077 == 0 and mount["readOnly"]


def test_the_daemonset_names_the_image_the_dockerfile_builds():
    """The tag in the Dockerfile's `docker build -t` line, which tests/integration/test_image.py builds and runs."""
    from gpuwarden import __version__

    pod = documents()["DaemonSet"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [f"gpuwarden:{__version__}"]
    dockerfile = (MANIFEST.parents[2] / "Dockerfile").read_text()
    assert f"docker build -t gpuwarden:{__version__} ." in dockerfile
    assert pod["containers"][0]["command"][0] == "gpuwarden" and "ENV PATH=/opt/gpuwarden/bin:$PATH" in dockerfile
