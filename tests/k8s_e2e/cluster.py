"""What the end-to-end tests do to a release: helm, waiting for broker pods, MQTT clients
(mosquitto's) from this machine to Service and pod IPs, and the brokers' HTTP API."""

import base64
import json
import subprocess
import urllib.request
from typing import Any

from tests.k8s.conftest import Testbed, eventually
from tests.k8s_e2e.conftest import CHART


def helm(node: Testbed, *args: str) -> str:
    done = subprocess.run(["helm", *args], env=node.env, text=True, capture_output=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def install(node: Testbed, namespace: str, name: str, *settings: str) -> None:
    helm(node, "install", name, str(CHART), "-n", namespace,
         *(arg for setting in settings for arg in ("--set", setting)))


def scale(node: Testbed, namespace: str, name: str, replicas: int) -> None:
    """What the chart's README says to do: helm upgrade --set cluster.replicas=N."""
    helm(node, "upgrade", name, str(CHART), "-n", namespace, "--reuse-values",
         "--set", f"cluster.replicas={replicas}")


def brokers(node: Testbed, namespace: str, name: str) -> list[dict[str, Any]]:
    return sorted(node.items("pods", namespace,
                             f"app.kubernetes.io/instance={name},"
                             "app.kubernetes.io/name=mqtt-broker"),
                  key=lambda pod: pod["metadata"]["name"])


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def wait_brokers(node: Testbed, namespace: str, name: str, count: int,
                 timeout: float = 180) -> list[dict[str, Any]]:
    """Exactly `count` broker pods, all Running and Ready (Ready = joined, contract §4)."""
    def check() -> list[dict[str, Any]] | None:
        pods = brokers(node, namespace, name)
        if len(pods) == count and all(ready(p) and not p["metadata"].get("deletionTimestamp")
                                      for p in pods):
            return pods
        return None
    try:
        return eventually(check, timeout=timeout, what=f"{count} ready broker pods")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(node, namespace)}") from error


def describe(node: Testbed, namespace: str) -> str:
    """What went wrong, for a failure message: pods, events, the operator's log tail."""
    pods = node.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    events = node.kubectl("get", "events", "-n", namespace, check=False).stdout[-3000:]
    logs = [node.kubectl("logs", "-n", namespace, "-l", selector, "--tail", "20",
                         "--prefix", check=False)
            for selector in ("app.kubernetes.io/component=operator",
                             "app.kubernetes.io/name=mqtt-broker")]
    return f"{pods}\n{events}\n" + "\n".join(log.stdout + log.stderr for log in logs)


def service_ip(node: Testbed, namespace: str, name: str) -> str:
    return str(node.get("service", name, namespace)["spec"]["clusterIP"])


def run_mosquitto(tool: str, host: str, *args: str, stdin: str | None = None,
                  timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A mosquitto client as it ended; later options (`-p 8883`) override the defaults."""
    return subprocess.run([tool, "-h", host, "-p", "1883", "-V", "mqttv5", *args], input=stdin,
                          text=True, capture_output=True, timeout=timeout, check=False)


def mosquitto(tool: str, host: str, *args: str, stdin: str | None = None,
              timeout: float = 60) -> str:
    done = run_mosquitto(tool, host, *args, stdin=stdin, timeout=timeout)
    assert done.returncode == 0, f"{tool} -h {host} {args}: {done.returncode}\n{done.stderr}"
    return done.stdout


def secret_value(node: Testbed, namespace: str, name: str, key: str) -> str:
    return base64.b64decode(node.get("secret", name, namespace)["data"][key]).decode()


def api_key(node: Testbed, namespace: str, name: str) -> str:
    """The viewer key of the release's API key Secret, as HTTP Basic credentials."""
    pair = ":".join(secret_value(node, namespace, f"{name}-api-key", key)
                    for key in ("username", "password"))
    return base64.b64encode(pair.encode()).decode()


def ask(pod: dict[str, Any], path: str, key: str) -> Any:
    """A broker's HTTP API at its pod IP."""
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:18083{path}",
                                     headers={"Authorization": f"Basic {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
