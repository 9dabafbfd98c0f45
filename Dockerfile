# One image for the broker and the operator. Non-root, data on a volume.
#   broker (default):  docker run -p 1883:1883 -v data:/data durable-mqtt-broker:dev
#   operator:          command kopf run --standalone -m mqtt_operator.handlers ... (Helm chart)
# BASE: any Debian bookworm image whose python3 is 3.11 with venv support. With a registry,
# python:3.11-slim; without one, `make image` builds a stand-in from Debian's own packages
# (tools/image/base.sh). NATIVE=0 leaves the hot path in pure Python (no mypyc build).
ARG BASE=docker.io/library/python:3.11-slim

FROM ${BASE} AS build
ARG NATIVE=1
# A compiler and Python's headers for mypyc, in this stage only.
RUN if [ "$NATIVE" = 1 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends gcc libc6-dev $(python3 -c \
      "import os, sysconfig; os.path.exists(sysconfig.get_paths()['include'] + '/Python.h') or print('python3-dev')"); fi
WORKDIR /src
# The application's packages come from requirements.lock, hashes checked (tools/image/
# lock_subset.py cuts out what the image needs): /opt/venv gets what runs, /opt/build also
# what compiles (mypyc, setuptools) and never leaves this stage. kubernetes/aio is the
# client's asyncio half (68 MB), which neither the operator nor kopf imports.
# A build secret `ca` (tools/image/build.sh passes the host's CA bundle) is for hosts that
# reach PyPI through a TLS-inspecting proxy; it is never stored in a layer.
COPY requirements.lock pyproject.toml tools/image/lock_subset.py ./
# /opt/venv has no pip of its own (the build's installs into it): nothing in it runs pip.
RUN --mount=type=secret,id=ca,target=/run/secrets/ca.crt \
    if [ -s /run/secrets/ca.crt ]; then export PIP_CERT=/run/secrets/ca.crt; fi \
 && python3 lock_subset.py requirements.lock pyproject.toml > runtime.txt \
 && python3 lock_subset.py requirements.lock pyproject.toml --extra native --build-system > build.txt \
 && python3 -m venv /opt/build && /opt/build/bin/pip install -q --no-cache-dir --require-hashes -r build.txt \
 && python3 -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip --python /opt/venv/bin/python install -q --no-cache-dir --require-hashes -r runtime.txt \
 && rm -rf /opt/venv/lib/python3.11/site-packages/kubernetes/aio
COPY README.md ./
COPY tools/build_native.py ./tools/
COPY broker ./broker
COPY operator ./operator
RUN if [ "$NATIVE" = 1 ]; then /opt/build/bin/python tools/build_native.py; fi \
 && /opt/build/bin/pip wheel -q --no-deps --no-build-isolation -w /wheels . \
 && /opt/build/bin/pip --python /opt/venv/bin/python install -q --no-cache-dir --no-deps /wheels/*.whl

FROM ${BASE}
RUN useradd --create-home --uid 10001 mqtt && mkdir -p /data && chown 10001 /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1

# Numeric, so Kubernetes' runAsNonRoot can verify it without a pod-level runAsUser.
USER 10001
WORKDIR /home/mqtt
VOLUME ["/data"]
# MQTT, WebSocket, TLS, HTTP API + broker metrics, operator metrics
EXPOSE 1883 8083 8883 18083 9090
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18083/status', timeout=2)"
ENTRYPOINT ["broker"]
CMD ["run", "--set", "node.data_dir=/data"]
