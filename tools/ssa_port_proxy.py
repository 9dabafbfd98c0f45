"""A proxy to the API server for spark-submit on Kubernetes before 1.21: there, a
server-side apply of a Service whose ports name no `protocol` fails ("associative list with
keys has an element that omits key field protocol"; 1.21 defaults it, kubernetes#98576),
and Spark 4 applies its driver's Service server-side without one. This gives such ports
`protocol: TCP`, the API's own default, and passes everything else through unchanged.

tools/spark_submit.py runs it in the submission pod (stdlib only: the Spark image's Python)
when the API server is older than 1.21; spark-submit then talks to it as Spark's docs talk
to `kubectl proxy` (`--master k8s://http://127.0.0.1:PORT`). It authenticates as the pod's
service account, verifying the API server against the account's CA.

    python ssa_port_proxy.py PORT READY_FILE
"""

import http.client
import http.server
import json
import os
import ssl
import sys
from pathlib import Path

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
APPLY = "application/apply-patch+yaml"
HOP = {"host", "authorization", "connection", "content-length", "transfer-encoding",
       "keep-alive"}


def with_protocols(body: bytes) -> bytes:
    """A Service applied as JSON (fabric8 sends JSON, which is YAML) with TCP on ports that
    name no protocol; any other body as it came."""
    try:
        document = json.loads(body)
    except ValueError:
        return body
    if not isinstance(document, dict) or document.get("kind") != "Service":
        return body
    for port in (document.get("spec") or {}).get("ports") or []:
        port.setdefault("protocol", "TCP")
    return json.dumps(document).encode()


class Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def forward(self) -> None:
        body = self._body()
        if body is not None and self.headers.get("Content-Type", "").startswith(APPLY):
            body = with_protocols(body)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Authorization"] = "Bearer " + (ACCOUNT / "token").read_text().strip()
        upstream = http.client.HTTPSConnection(
            os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"]),
            context=ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt")), timeout=60)
        try:
            upstream.request(self.command, self.path, body, headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward


def main() -> None:
    port, ready = int(sys.argv[1]), Path(sys.argv[2])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Forward)
    ready.touch()
    server.serve_forever()


if __name__ == "__main__":
    main()
