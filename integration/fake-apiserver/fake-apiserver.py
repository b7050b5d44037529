#!/usr/bin/python3
"""A stand-in for the Kubernetes API server, for the tests of `vmletctl install --node`:
HTTPS on loopback with the given certificate, one bearer token, and Nodes whose labels a
JSON merge patch (PATCH /api/v1/nodes/NAME) changes, as the real server does.

fake-apiserver.py CERT KEY TOKEN STATE NODE...
Listens on 127.0.0.1 at a free port and writes it to STATE/port; after each request it
writes every node's labels to STATE/labels.json and appends the request line to
STATE/requests.log.
"""
import http.server
import json
import os
import ssl
import sys

cert, key, token, state = sys.argv[1:5]
nodes = {name: {} for name in sys.argv[5:]}


def status(code, reason, message):
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                  "message": message, "reason": reason, "code": code}


def merge(target, patch):
    """RFC 7386."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            merge(target.setdefault(k, {}), v)
        else:
            target[k] = v


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        with open(os.path.join(state, "requests.log"), "a") as log:
            log.write(f"{self.command} {self.path} {code}\n")
        with open(os.path.join(state, "labels.json.tmp"), "w") as out:
            json.dump(nodes, out)
        os.rename(os.path.join(state, "labels.json.tmp"), os.path.join(state, "labels.json"))

    def do_PATCH(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        prefix = "/api/v1/nodes/"
        if self.headers.get("Authorization") != f"Bearer {token}":
            return self.answer(*status(401, "Unauthorized", "Unauthorized"))
        if not self.path.startswith(prefix):
            return self.answer(*status(404, "NotFound", "the server could not find the requested resource"))
        name = self.path[len(prefix):]
        if name not in nodes:
            return self.answer(*status(404, "NotFound", f'nodes "{name}" not found'))
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.answer(*status(415, "UnsupportedMediaType", "merge patches only"))
        try:
            patch = json.loads(body)
        except ValueError as e:
            return self.answer(*status(400, "BadRequest", str(e)))
        node = {"metadata": {"labels": nodes[name]}}
        merge(node, patch)
        nodes[name] = node["metadata"].get("labels") or {}
        self.answer(200, {"kind": "Node", "apiVersion": "v1",
                          "metadata": {"name": name, "labels": nodes[name]}})

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(os.path.join(state, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(state, "port.tmp"), os.path.join(state, "port"))
server.serve_forever()
