"""config/kubernetes/daemonset.yaml and servicemonitor.yaml against the Kubernetes API schemas (kubernetes-validate
ships them: no network), what gpuwarden needs of the node, the conventions of issue 39 (pod security, no token,
GPU nodes only, the web config on, no Secret to overwrite, a ServiceMonitor), and the ConfigMap's configuration
through `gpuwarden check` with a real web config (openssl's certificate, a bcrypt hash)."""

import copy
import re
import subprocess
from pathlib import Path

import bcrypt
import kubernetes_validate
import pytest
import yaml
from helpers import GPUWARDEN, need

MANIFEST = Path(__file__).resolve().parents[2] / "config/kubernetes/daemonset.yaml"
MONITOR = MANIFEST.with_name("servicemonitor.yaml")
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())  # the oldest still in wide use, and the newest


def documents(path: Path = MANIFEST) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def validate(doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown field is an error too


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_against_the_schemas(version):
    docs = documents()
    assert set(docs) == {"Namespace", "ConfigMap", "DaemonSet"}
    for doc in docs.values():
        validate(doc, version)
    validate(documents(MONITOR)["Service"], version)  # the ServiceMonitor is a CRD: its own test below


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
    """With the Secrets' files where the pod mounts them (here: in tmp_path), made as the manifest's header says:
    an apprise TEXT config, and a web config with a certificate naming "gpuwarden" and a bcrypt hash."""
    docs = documents()
    (tmp_path / "apprise.txt").write_text("ntfys://ntfy.example.org/gpu-box\n")
    subprocess.run([need("openssl", "openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=gpuwarden", "-addext", "subjectAltName=DNS:gpuwarden",
                    "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    hashed = bcrypt.hashpw(b"scrape-password", bcrypt.gensalt(4)).decode()
    (tmp_path / "web.yml").write_text("tls_server_config: {cert_file: tls.crt, key_file: tls.key}\n"
                                      f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
    toml = tmp_path / "gpuwarden.toml"
    toml.write_text(docs["ConfigMap"]["data"]["gpuwarden.toml"].replace("/etc/gpuwarden-alerts/", f"{tmp_path}/")
                    .replace("/etc/gpuwarden-web/", f"{tmp_path}/"))
    result = subprocess.run([*GPUWARDEN, "check", str(toml), "--show"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"state_dir": "/var/lib/gpuwarden"' in result.stdout and '"listen": "0.0.0.0"' in result.stdout
    assert f'"web_config_file": "{tmp_path}/web.yml"' in result.stdout  # the port on the node's network: TLS, auth


def test_the_alert_urls_come_from_a_secret_not_the_configmap():
    """Issue 24: the alert URLs (tokens) were in the ConfigMap."""
    docs = documents()
    config = docs["ConfigMap"]["data"]["gpuwarden.toml"]
    assert not re.search(r"^\s*(urls|url)\s*=", config, re.M)
    assert 'config_file = "/etc/gpuwarden-alerts/apprise.txt"' in config
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/gpuwarden-alerts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "gpuwarden-alerts"
    assert volume["secret"]["defaultMode"] & 0o077 == 0 and mount["readOnly"]


def test_the_namespace_admits_privileged_pods_by_its_pod_security_label():
    labels = documents()["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # the pod is: hostPID, hostPath...


def test_the_pod_has_no_service_account_token():
    assert documents()["DaemonSet"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_pods_run_on_gpu_nodes_only_and_tolerate_only_gpu_taints():
    pod = documents()["DaemonSet"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"]}
    assert keys == {"nvidia.com/gpu.present", "gpuwarden.io/gpu-node"} and "nodeSelector" not in pod
    assert all(expr["operator"] == "In" and expr["values"] == ["true"]
               for term in terms for expr in term["matchExpressions"])
    for toleration in pod["tolerations"]:  # a keyless Exists tolerates every taint of every node
        assert toleration.get("key") in ("nvidia.com/gpu", "amd.com/gpu"), toleration


def test_the_exporter_on_the_nodes_network_takes_the_web_config_from_a_secret():
    docs = documents()
    config = docs["ConfigMap"]["data"]["gpuwarden.toml"]
    assert 'listen = "0.0.0.0"' in config and 'web_config_file = "/etc/gpuwarden-web/web.yml"' in config
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/gpuwarden-web"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "gpuwarden-web" and volume["secret"]["defaultMode"] & 0o077 == 0
    probe = pod["containers"][0]["livenessProbe"]
    assert "httpGet" not in probe and probe["tcpSocket"]["port"] == 10440  # /metrics answers 401 to a probe


def test_no_secret_is_shipped_to_overwrite_yours():
    """kubectl apply replaced a hand-made gpuwarden-alerts with the placeholder on every apply."""
    assert "Secret" not in documents() and "Secret" not in documents(MONITOR)
    header = MANIFEST.read_text().split("\napiVersion:")[0]
    assert "kubectl -n gpuwarden create secret generic gpuwarden-alerts" in header
    assert "kubectl -n gpuwarden create secret generic gpuwarden-web" in header


def test_the_servicemonitor_scrapes_the_pods_as_job_gpuwarden_over_tls_with_basic_auth():
    pods = documents()["DaemonSet"]["spec"]["template"]
    service, monitor = documents(MONITOR)["Service"], documents(MONITOR)["ServiceMonitor"]
    assert service["metadata"]["name"] == "gpuwarden"  # the job label: the rules watch up{job="gpuwarden"}
    assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert port["port"] == 10440 and port["targetPort"] in {p["name"] for p in pods["spec"]["containers"][0]["ports"]}
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpuwarden-web", "key": "tls.crt"}
    assert endpoint["tlsConfig"]["serverName"] == "gpuwarden" and "insecureSkipVerify" not in endpoint["tlsConfig"]
    assert {v["name"] for v in endpoint["basicAuth"].values()} == {"gpuwarden-scrape"}


def test_the_daemonset_names_the_image_the_dockerfile_builds():
    """The tag in the Dockerfile's `docker build -t` line, which tests/integration/test_image.py builds and runs."""
    from gpuwarden import __version__

    pod = documents()["DaemonSet"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [f"gpuwarden:{__version__}"]
    dockerfile = (MANIFEST.parents[2] / "Dockerfile").read_text()
    assert f"docker build -t gpuwarden:{__version__} ." in dockerfile
    assert pod["containers"][0]["command"][0] == "gpuwarden" and "ENV PATH=/opt/gpuwarden/bin:$PATH" in dockerfile
