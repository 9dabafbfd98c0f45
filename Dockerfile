# One image for the broker and the operator. Non-root, data on a volume.
#   broker (default):  docker run -p 1883:1883 -v data:/data durable-mqtt-broker:dev
#   operator:          command kopf run --standalone -m mqtt_operator.handlers ... (Helm chart)
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 mqtt
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY operator ./operator
COPY tools ./tools
# The hot path compiled with mypyc (the compiler goes again after the build).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir "mypy>=2.4,<3" && python tools/build_native.py \
    && pip install --no-cache-dir . && pip uninstall -y mypy \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown 10001 /data

# Numeric, so Kubernetes' runAsNonRoot can verify it without a pod-level runAsUser.
USER 10001
VOLUME ["/data"]
# MQTT, WebSocket, TLS, HTTP API + broker metrics, operator metrics
EXPOSE 1883 8083 8883 18083 9090
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18083/status', timeout=2)"
ENTRYPOINT ["broker"]
CMD ["run", "--set", "node.data_dir=/data"]
