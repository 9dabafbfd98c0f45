#!/bin/sh
# What Spark's own image runs on Kubernetes (its entrypoint.sh, reduced to this image): the
# driver pod runs spark-submit in client mode, executor pods the executor backend; any
# other command (`spark-submit ...`, a shell) runs as given.
set -eu
case "${1:-}" in
  driver)
    shift
    exec spark-submit --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@" ;;
  executor)
    shift
    # shellcheck disable=SC2086  # the options are a list of words
    exec java -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" ${SPARK_JAVA_OPT:-} \
      -cp "$SPARK_HOME/conf:$SPARK_HOME/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME" ;;
  *)
    exec "$@" ;;
esac
