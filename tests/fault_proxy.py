#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for the remote-data tests (stdlib only).

Forwards each request (one per connection; the response says Connection: close) to UPSTREAM and,
for a share --fail of them chosen from --seed, injects one fault instead:
  drop      close the connection without answering
  stall     answer nothing for --stall-s seconds, then close
  truncate  forward the status, headers and half of the body, then close (a short read)
  503       answer 503 Service Unavailable
After --outage-after requests, every request fails (drop or 503, alternately) for --outage-s seconds.
After --forbid-after requests, every request is answered 403 Forbidden (an expired session token).

Usage: fault_proxy.py --upstream HOST:PORT --port-file FILE [--fail 0.05] [--outage-after N]
       [--outage-s S] [--stall-s S] [--forbid-after N] [--seed N] [--stats FILE]
Writes the port it listens on (127.0.0.1) to --port-file, and the counts of what it did to --stats
(JSON) after every request.
"""
import argparse
import json
import random
import socket
import socketserver
import threading
import time

FAULTS = ["drop", "stall", "truncate", "503", "403"]


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.requests = 0
        self.outage_until = None
        self.counts = {k: 0 for k in FAULTS + ["ok", "outage"]}

    def decide(self):
        with self.lock:
            self.requests += 1
            now = time.monotonic()
            if self.args.forbid_after and self.requests > self.args.forbid_after:
                self.counts["403"] += 1
                return "403"
            if self.args.outage_after and self.requests == self.args.outage_after:
                self.outage_until = now + self.args.outage_s
            if self.outage_until is not None and now < self.outage_until:
                self.counts["outage"] += 1
                return "drop" if self.counts["outage"] % 2 else "503"
            fault = self.rng.choice(FAULTS[:4]) if self.rng.random() < self.args.fail else "ok"
            self.counts[fault] += 1
            return fault

    def save(self):
        if not self.args.stats:
            return
        with self.lock:
            text = json.dumps(dict(self.counts, requests=self.requests))
        with open(self.args.stats + ".tmp", "w") as f:
            f.write(text)
        import os
        os.replace(self.args.stats + ".tmp", self.args.stats)


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def with_close(head):
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        st = self.server.state
        head, rest = read_head(self.request)
        if head is None:
            return
        fault = st.decide()
        try:
            if fault == "drop":
                return
            if fault == "stall":
                time.sleep(st.args.stall_s)
                return
            if fault in ("503", "403"):
                reason = b"Service Unavailable" if fault == "503" else b"Forbidden"
                body = b"injected %s\n" % fault.encode()
                self.request.sendall(b"HTTP/1.1 %s %s\r\nContent-Length: %d\r\n"
                                     b"Connection: close\r\n\r\n%s" % (fault.encode(), reason, len(body), body))
                return
            self.forward(head, rest, truncate=fault == "truncate")
        finally:
            st.save()

    def forward(self, head, rest, truncate):
        host, port = self.server.upstream
        with socket.create_connection((host, port), timeout=30) as up:
            up.sendall(with_close(head) + rest)
            rhead, body = read_head(up)
            if rhead is None:
                return
            length = None
            for line in rhead.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            self.request.sendall(with_close(rhead))
            limit = length // 2 if truncate and length else None
            sent = 0
            while True:
                if limit is not None and sent + len(body) >= limit:
                    self.request.sendall(body[: limit - sent])
                    return
                self.request.sendall(body)
                sent += len(body)
                body = up.recv(65536)
                if not body:
                    return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--fail", type=float, default=0.05)
    p.add_argument("--outage-after", type=int, default=0)
    p.add_argument("--outage-s", type=float, default=30.0)
    p.add_argument("--stall-s", type=float, default=2.0)
    p.add_argument("--forbid-after", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stats", default="")
    args = p.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    srv = Server(("127.0.0.1", 0), Handler)
    srv.upstream = (host, int(port))
    srv.state = State(args)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
