"""The spark-submit invocation the Kubeflow Spark operator derives from a SparkApplication
(its internal/controller/sparkapplication/submission.go, `buildSparkSubmitArgs`), for
where its controller is not installed: tools/spark_submit.py runs it on the cluster.

Pure: the application object (a dict as the API server returns it) in, argv and the pod
templates to write out. The same options in the same order as submission.go; its maps
(sparkConf, labels, env) come out sorted, where Go's iteration order is random. Fields this
submitter does not translate make it refuse the application, naming them, rather than
run something other than what was asked for.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqtt_operator import sparkapp

# submission.go's constants (pkg/common/spark.go)
PREFIX = "sparkoperator.k8s.io/"
LABEL_APP_NAME = PREFIX + "app-name"
LABEL_LAUNCHED = PREFIX + "launched-by-spark-operator"
LABEL_MUTATED = PREFIX + "mutated-by-spark-operator"
LABEL_SUBMISSION_ID = PREFIX + "submission-id"
DRIVER_POD_NAME = "spark.kubernetes.driver.pod.name"
DRIVER_MASTER = "spark.kubernetes.driver.master"
TEMPLATE_FILES = {"driver": "driver-pod-template.yaml",
                  "executor": "executor-pod-template.yaml"}
# What spec, driver and executor may hold: what the operator renders and the plain options
# next to it. Anything else (secrets, dynamic allocation, deps, ...) is refused.
SPEC_FIELDS = frozenset({
    "type", "pythonVersion", "mode", "image", "imagePullPolicy", "imagePullSecrets",
    "mainClass", "mainApplicationFile", "arguments", "sparkVersion", "sparkConf",
    "hadoopConf", "nodeSelector", "memoryOverheadFactor", "restartPolicy", "driver",
    "executor", "proxyUser", "timeToLiveSeconds"})
ROLE_FIELDS = frozenset({
    "cores", "coreRequest", "coreLimit", "memory", "memoryOverhead", "image",
    "serviceAccount", "javaOptions", "labels", "annotations", "envVars", "template",
    "kubernetesMaster", "instances", "deleteOnTermination", "podName", "serviceLabels",
    "serviceAnnotations"})


@dataclass(frozen=True)
class Submission:
    argv: list[str]  # spark-submit's arguments (without the command)
    templates: dict[str, dict[str, Any]]  # file name in the template dir -> pod template


def driver_pod_name(app: Mapping[str, Any]) -> str:
    """util.GetDriverPodName: spec.driver.podName, else sparkConf's, else <name>-driver."""
    spec = app["spec"]
    return (spec["driver"].get("podName") or (spec.get("sparkConf") or {}).get(DRIVER_POD_NAME)
            or f"{app['metadata']['name']}-driver")


def submission(app: Mapping[str, Any], master: str, submission_id: str, template_dir: str,
               driver_master: str | None = None) -> Submission:
    """`master`: `k8s://https://host:port`, the API server as the submitter reaches it
    (submission.go: KUBERNETES_SERVICE_HOST and _PORT of its pod). `template_dir`: where
    the caller writes `templates` before running spark-submit. `driver_master`: the API
    server as the driver reaches it, when `https://kubernetes.default.svc` (Spark's
    default) does not resolve and the application names none (driver.kubernetesMaster)."""
    meta, spec = app["metadata"], app["spec"]
    _refuse_unknown(spec)
    name = meta["name"]
    conf: list[tuple[str, str]] = [("spark.kubernetes.namespace", meta["namespace"])]
    if spec.get("image"):
        conf.append(("spark.kubernetes.container.image", spec["image"]))
    if spec.get("imagePullPolicy"):
        conf.append(("spark.kubernetes.container.image.pullPolicy", spec["imagePullPolicy"]))
    if spec.get("imagePullSecrets"):
        conf.append(("spark.kubernetes.container.image.pullSecrets",
                     ",".join(spec["imagePullSecrets"])))
    if spec.get("pythonVersion"):
        conf.append(("spark.kubernetes.pyspark.pythonVersion", spec["pythonVersion"]))
    if spec.get("memoryOverheadFactor"):
        conf.append(("spark.kubernetes.memoryOverheadFactor", spec["memoryOverheadFactor"]))
    # the operator watches the driver pod instead of spark-submit waiting for it
    conf.append(("spark.kubernetes.submission.waitAppCompletion", "false"))
    conf += [(key, str(value)) for key, value in sorted((spec.get("sparkConf") or {}).items())
             if key != DRIVER_POD_NAME]
    conf += [(f"spark.hadoop.{key}", str(value))
             for key, value in sorted((spec.get("hadoopConf") or {}).items())]
    conf.append((DRIVER_POD_NAME, driver_pod_name(app)))
    conf += _role_conf(app, "driver", submission_id)
    if driver_master and not spec["driver"].get("kubernetesMaster") and DRIVER_MASTER not in (
            spec.get("sparkConf") or {}):
        conf.append((DRIVER_MASTER, driver_master))
    conf += _role_conf(app, "executor", submission_id)
    conf += [(f"spark.kubernetes.node.selector.{key}", value)
             for key, value in sorted((spec.get("nodeSelector") or {}).items())]
    templates: dict[str, dict[str, Any]] = {}
    for role, container in sparkapp.ROLES.items():
        templates[TEMPLATE_FILES[role]] = _template(app, role, container)
        conf += [(f"spark.kubernetes.{role}.podTemplateFile",
                  f"{template_dir}/{TEMPLATE_FILES[role]}"),
                 (f"spark.kubernetes.{role}.podTemplateContainerName", container)]
    argv = ["--master", master, "--deploy-mode", spec.get("mode", "cluster")]
    if spec.get("mainClass"):
        argv += ["--class", spec["mainClass"]]
    argv += ["--name", name]
    for key, value in conf:
        argv += ["--conf", f"{key}={value}"]
    if spec.get("proxyUser"):
        argv += ["--proxy-user", spec["proxyUser"]]
    if spec.get("mainApplicationFile"):
        argv.append(spec["mainApplicationFile"])
    return Submission(argv + [str(arg) for arg in spec.get("arguments") or ()], templates)


def _refuse_unknown(spec: Mapping[str, Any]) -> None:
    unknown = sorted(f"spec.{key}" for key in spec if key not in SPEC_FIELDS) + sorted(
        f"spec.{role}.{key}" for role in ("driver", "executor")
        for key in spec.get(role) or {} if key not in ROLE_FIELDS)
    if unknown:
        raise ValueError(f"this submitter does not translate {', '.join(unknown)}: run the"
                         " application with the Spark operator")


def _role_conf(app: Mapping[str, Any], role: str, submission_id: str) -> list[tuple[str, str]]:
    """driverConfOption / executorConfOption: the operator's labels, image, resources,
    service account, the application's and the role's labels and annotations."""
    spec, values = app["spec"], app["spec"].get(role) or {}
    label, k8s = f"spark.kubernetes.{role}.label.", f"spark.kubernetes.{role}."
    conf = [(label + LABEL_APP_NAME, app["metadata"]["name"]), (label + LABEL_LAUNCHED, "true")]
    if "template" not in values:  # submission.go: a role without a template wants the webhook
        conf.append((label + LABEL_MUTATED, "true"))
    conf.append((label + LABEL_SUBMISSION_ID, submission_id))
    if role == "executor" and values.get("instances") is not None:
        conf.append(("spark.executor.instances", str(values["instances"])))
    if values.get("image") or spec.get("image"):
        conf.append((k8s + "container.image", values.get("image") or spec["image"]))
    for field, key in (("cores", f"spark.{role}.cores"),
                       ("coreRequest", k8s + "request.cores"),
                       ("coreLimit", k8s + "limit.cores"),
                       ("memory", f"spark.{role}.memory"),
                       ("memoryOverhead", f"spark.{role}.memoryOverhead")):
        if values.get(field) is not None:
            conf.append((key, str(values[field])))
    if values.get("serviceAccount"):
        conf.append((f"spark.kubernetes.authenticate.{role}.serviceAccountName",
                     values["serviceAccount"]))
    if role == "driver":
        if values.get("javaOptions"):
            conf.append(("spark.driver.extraJavaOptions", values["javaOptions"]))
        if values.get("kubernetesMaster"):
            conf.append((DRIVER_MASTER, values["kubernetesMaster"]))
    elif values.get("deleteOnTermination") is not None:
        conf.append((k8s + "deleteOnTermination", str(values["deleteOnTermination"]).lower()))
    for source in (app["metadata"].get("labels") or {}, values.get("labels") or {}):
        conf += [(label + key, value) for key, value in sorted(source.items())
                 if not key.startswith("kueue.x-k8s.io/")]
    conf += [(f"{k8s}annotation.{key}", value)
             for key, value in sorted((values.get("annotations") or {}).items())]
    if role == "driver":
        for field, key in (("serviceLabels", "service.label."),
                           ("serviceAnnotations", "service.annotation.")):
            conf += [(k8s + key + k, v) for k, v in sorted((values.get(field) or {}).items())]
    if role == "executor" and values.get("javaOptions"):
        conf.append(("spark.executor.extraJavaOptions", values["javaOptions"]))
    env = "spark.kubernetes.driverEnv." if role == "driver" else "spark.executorEnv."
    return conf + [(env + key, value)
                   for key, value in sorted((values.get("envVars") or {}).items())]


def _template(app: Mapping[str, Any], role: str, container: str) -> dict[str, Any]:
    """buildDriverPodTemplate / buildExecutorPodTemplate: the role's template (a container
    named as Spark's when none is given) owned by the application; executors' reference is
    not a controller one, so other controllers may recognise them as the application's."""
    given = (app["spec"].get(role) or {}).get("template")
    template: dict[str, Any] = dict(given) if given else {
        "spec": {"containers": [{"name": container}]}}
    meta = dict(template.get("metadata") or {})
    owner = {"apiVersion": sparkapp.API_VERSION, "kind": sparkapp.KIND,
             "name": app["metadata"]["name"], "uid": app["metadata"].get("uid", "")}
    if role == "driver":
        owner |= {"controller": True, "blockOwnerDeletion": True}
    references = list(meta.get("ownerReferences") or [])
    if owner not in references:
        references.append(owner)
    return {**template, "apiVersion": "v1", "kind": "Pod",
            "metadata": {**meta, "ownerReferences": references}}
