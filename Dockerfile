# One image for the broker (and, later, the operator). Non-root, data on a volume.
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 mqtt
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
RUN pip install --no-cache-dir . && mkdir -p /data && chown mqtt /data

USER mqtt
VOLUME ["/data"]
EXPOSE 1883 8083 8883 18083
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18083/status', timeout=2)"
ENTRYPOINT ["broker"]
CMD ["run", "--set", "node.data_dir=/data"]
