#!/bin/sh
# What Spark's own image runs on Kubernetes (its entrypoint.sh, reduced to this image): the
# driver pod runs spark-submit in client mode, executor pods the executor backend; any
# other command (`spark-submit ...`, a shell) runs as given.
set -eu
case "${1:-}" in
  driver)
    shift
    # The driver advertises its pod IP (Spark gives it as SPARK_DRIVER_BIND_ADDRESS, from
    # status.podIP), not its Service's DNS name: executors then reach it on clusters
    # without cluster DNS too. A --conf here overrides the submitted properties file.
    exec spark-submit --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.driver.host=$SPARK_DRIVER_BIND_ADDRESS" --deploy-mode client "$@" ;;
  executor)
    shift
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... (one word each,
    # spaces kept): collected in order as the arguments before the class name.
    set --
    i=0
    while eval "[ -n \"\${SPARK_JAVA_OPT_$i+set}\" ]"; do
      eval "set -- \"\$@\" \"\$SPARK_JAVA_OPT_$i\""
      i=$((i + 1))
    done
    exec java -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" "$@" \
      -cp "$SPARK_HOME/conf:$SPARK_HOME/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME" ;;
  *)
    exec "$@" ;;
esac
