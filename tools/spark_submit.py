"""Runs one SparkApplication the way the Kubeflow Spark operator's controller would, where
that controller is not installed (the test bed): spark-submit in a pod of the application's
own image and service account (the controller runs it in its pod), with the arguments
mqtt_operator.sparksubmit derives from the application, then the driver pod watched to its
end and the application's status written as the controller writes it (SUBMITTED, RUNNING,
COMPLETED or FAILED; SUBMISSION_FAILED when spark-submit fails), so the MQTT operator sees
its applications finish.

    KUBECONFIG=... python tools/spark_submit.py -n NAMESPACE APPLICATION [--timeout 900]

The API server is the `kubernetes` Service's ClusterIP (what KUBERNETES_SERVICE_HOST is in
a pod), also for the driver: on a cluster without DNS `kubernetes.default.svc`, Spark's
default, does not resolve. Before Kubernetes 1.21 spark-submit goes through
tools/ssa_port_proxy.py in its pod (Spark 4's server-side apply of the driver's Service
fails there otherwise). One attempt: restartPolicy's retries are not made. Exit status 0
when the application completed, 1 when not.
"""

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from mqtt_operator import sparkapp, sparksubmit

TEMPLATE_DIR = "/tmp/spark/templates"  # in the submission pod, from a ConfigMap
PROXY = Path(__file__).with_name("ssa_port_proxy.py")
PROXY_PORT = 8001
# In the submission pod: the proxy started, spark-submit once it listens ($0: the proxy).
PROXIED = (f'python "$0" {PROXY_PORT} /tmp/proxy.ready & '
           'while [ ! -e /tmp/proxy.ready ]; do sleep 0.1; done; exec spark-submit "$@"')
POLL = 2.0


def kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kubectl", *args], input=stdin, text=True, capture_output=True,
                          timeout=120, check=False)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def get(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return json.loads(kubectl("get", kind, name, "-n", namespace, "-o", "json"))
    except RuntimeError as error:
        if "NotFound" in str(error):
            return None
        raise


def set_status(app: dict[str, Any], state: str, **fields: Any) -> None:
    meta = app["metadata"]
    status = {"applicationState": {"state": state}, **fields}
    kubectl("patch", "sparkapplication", meta["name"], "-n", meta["namespace"],
            "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def api_server() -> str:
    service = json.loads(kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json"))
    port = next(p["port"] for p in service["spec"]["ports"] if p.get("name") == "https")
    return f"https://{service['spec']['clusterIP']}:{port}"


def needs_proxy() -> bool:
    """An API server before 1.21 (see tools/ssa_port_proxy.py)."""
    version = json.loads(kubectl("version", "-o", "json"))["serverVersion"]
    major, minor = (int(re.match(r"\d+", version[part]).group()) for part in ("major", "minor"))
    return (major, minor) < (1, 21)


def submission_pod(app: dict[str, Any], submission: sparksubmit.Submission,
                   submission_id: str, proxied: bool) -> list[dict[str, Any]]:
    """The ConfigMap of pod templates (and the proxy, if `proxied`) and the pod that runs
    spark-submit, both owned by the application (deleted with it)."""
    meta, spec = app["metadata"], app["spec"]
    name = f"{meta['name'][:40]}-submit-{submission_id[:8]}"
    owner = {"apiVersion": sparkapp.API_VERSION, "kind": sparkapp.KIND, "name": meta["name"],
             "uid": meta["uid"]}
    labels = {sparksubmit.LABEL_APP_NAME: meta["name"],
              sparksubmit.LABEL_SUBMISSION_ID: submission_id}
    common = {"name": name, "namespace": meta["namespace"], "labels": labels,
              "ownerReferences": [owner]}
    files = {file: json.dumps(template) for file, template in submission.templates.items()}
    command = ["spark-submit", *submission.argv]
    if proxied:
        files[PROXY.name] = PROXY.read_text()
        command = ["sh", "-c", PROXIED, f"{TEMPLATE_DIR}/{PROXY.name}", *submission.argv]
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": common, "data": files}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": common, "spec": {
        "serviceAccountName": spec["driver"].get("serviceAccount", "default"),
        "restartPolicy": "Never",
        "containers": [{
            "name": "spark-submit", "image": spec["image"],
            "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
            "args": command,
            # spark-submit's JVM only talks to the API server: a small share of a core
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
            "volumeMounts": [{"name": "templates", "mountPath": TEMPLATE_DIR}]}],
        "volumes": [{"name": "templates", "configMap": {"name": name}}]}}
    return [config, pod]


def wait_pod(name: str, namespace: str, deadline: float,
             running: Any = None) -> dict[str, Any]:
    """The pod once Succeeded or Failed; `running()` once when it first runs."""
    while True:
        pod = get("pod", name, namespace)
        phase = (pod or {}).get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return pod  # type: ignore[return-value]
        if phase == "Running" and running is not None:
            running()
            running = None
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name} still {phase or 'absent'}")
        time.sleep(POLL)


def run(namespace: str, name: str, timeout: float) -> str:
    """Submits the application and follows it to its end; returns its final state."""
    deadline = time.monotonic() + timeout
    app = get("sparkapplication", name, namespace)
    if app is None:
        raise SystemExit(f"no SparkApplication {namespace}/{name}")
    submission_id = str(uuid.uuid4())
    server, proxied = api_server(), needs_proxy()
    master = f"k8s://http://127.0.0.1:{PROXY_PORT}" if proxied else f"k8s://{server}"
    try:
        submission = sparksubmit.submission(app, master, submission_id, TEMPLATE_DIR,
                                            driver_master=server)
    except ValueError as refused:
        set_status(app, "SUBMISSION_FAILED", submissionID=submission_id,
                   errorMessage=str(refused))
        return "SUBMISSION_FAILED"
    objects = submission_pod(app, submission, submission_id, proxied)
    kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                   "items": objects}))
    submitter = wait_pod(objects[1]["metadata"]["name"], namespace, deadline)
    if submitter["status"]["phase"] != "Succeeded":
        log = kubectl("logs", "-n", namespace, submitter["metadata"]["name"])
        print(log, file=sys.stderr)
        set_status(app, "SUBMISSION_FAILED", submissionID=submission_id,
                   errorMessage=log[-2000:])
        return "SUBMISSION_FAILED"
    driver = sparksubmit.driver_pod_name(app)
    info = {"submissionID": submission_id, "driverInfo": {"podName": driver}}
    set_status(app, "SUBMITTED", **info)
    ended = wait_pod(driver, namespace, deadline,
                     running=lambda: set_status(app, "RUNNING", **info))
    state = "COMPLETED" if ended["status"]["phase"] == "Succeeded" else "FAILED"
    set_status(app, state, **info)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("application")
    parser.add_argument("-n", "--namespace", required=True)
    parser.add_argument("--timeout", type=float, default=900, help="seconds, in all")
    args = parser.parse_args(argv)
    state = run(args.namespace, args.application, args.timeout)
    print(json.dumps({"application": args.application, "state": state}))
    return 0 if state == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
