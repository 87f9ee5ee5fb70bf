"""An S3-compatible server inside this process, on 127.0.0.1 only (moto's ThreadedMotoServer), that counts the GET
requests it serves and can inject faults: a fraction of GETs answered 503, a fraction stalled, every GET of some
objects failed, answers cut mid-body (the connection dropped) or sent with one byte changed. Used by the remote-loader benchmark and the object-storage tests; nothing here leaves the machine.

Clients reach it through the standard chain: AWS_* credentials in the environment (dummy values) and fsspec's
FSSPEC_S3_ENDPOINT_URL, so that subprocesses (torchrun workers) find it too.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

DUMMY_ENV = {"AWS_ACCESS_KEY_ID": "dpot-test-key", "AWS_SECRET_ACCESS_KEY": "dpot-test-secret",
             "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class Faults:
    """What the server does to GETs of objects: fail `fail` of them with 503, stall `stall` of them `stall_s`
    seconds, and fail every GET whose path contains one of `always`."""

    fail: float = 0.0
    stall: float = 0.0
    stall_s: float = 0.0
    always: set[str] = field(default_factory=set)
    stall_on: set[str] = field(default_factory=set)  # paths whose range GETs from byte `stall_from` on always stall
    stall_from: int = 0
    cut_on: set[str] = field(default_factory=set)  # paths whose answers end (connection dropped) at object byte cut_at
    cut_at: int = 0
    cut_times: int = -1  # how many answers are cut (then they are whole again); -1: all
    flip_on: set[str] = field(default_factory=set)  # paths whose byte at object offset flip_at is sent inverted
    flip_at: int = 0
    seed: int = 0

    def stalls(self, path: str, range_header: str | None) -> bool:
        """Whether a GET of `path` with this Range header is one of the always-stalled ones."""
        if not any(p in path for p in self.stall_on):
            return False
        start = int(range_header.split("=", 1)[1].split("-", 1)[0]) if range_header else 0
        return start >= self.stall_from


class _Middleware:
    """WSGI wrapper of moto's app: counts object GETs (by path; range or whole) and HEADs, and applies the faults."""

    def __init__(self, app: Callable[..., Any], server: "LocalS3") -> None:
        self.app, self.server = app, server

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        s = self.server
        path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        if environ.get("REQUEST_METHOD") == "HEAD":
            with s.lock:
                s.heads[path] += 1
        if environ.get("REQUEST_METHOD") == "GET" and path.count("/") >= 2 and not query:
            with s.lock:
                s.gets[path] += 1
                s.range_gets[path] += "HTTP_RANGE" in environ
                roll, stall = s.rng.random(), s.rng.random()
                faults = s.faults
            if roll < faults.fail or any(a in path for a in faults.always):
                with s.lock:
                    s.failed += 1
                start_response("503 Service Unavailable", [("Content-Type", "application/xml")])
                return [b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable</Code>"
                        b"<Message>injected fault</Message></Error>"]
            if stall < faults.stall or faults.stalls(path, environ.get("HTTP_RANGE")):
                time.sleep(faults.stall_s)
            with s.lock:
                s.ranges[path].append(environ.get("HTTP_RANGE"))
            if any(p in path for p in faults.cut_on | faults.flip_on):
                return self._damaged(environ, start_response, path, faults)
        return self.app(environ, start_response)

    def _cut_now(self, faults: Faults) -> bool:
        """Whether this answer, which holds the byte at cut_at, is cut (counts down cut_times)."""
        with self.server.lock:
            if faults.cut_times == 0:
                return False
            if faults.cut_times > 0:
                faults.cut_times -= 1
            return True

    def _damaged(self, environ: dict[str, Any], start_response: Callable[..., Any], path: str,
                 faults: Faults) -> Iterator[bytes]:
        """moto's answer with the byte at `flip_at` inverted, or cut at `cut_at` (the connection is shut down there,
        after the headers promised the whole length)."""
        header = environ.get("HTTP_RANGE")
        at = int(header.split("=", 1)[1].split("-", 1)[0]) if header else 0  # object offset of the body's first byte
        cut = faults.cut_at if any(p in path for p in faults.cut_on) else None
        flip = faults.flip_at if any(p in path for p in faults.flip_on) else None
        for piece in self.app(environ, start_response):
            if flip is not None and at <= flip < at + len(piece):
                piece = piece[:flip - at] + bytes([piece[flip - at] ^ 0xFF]) + piece[flip - at + 1:]
            if cut is not None and at <= cut < at + len(piece) and self._cut_now(faults):
                yield piece[:cut - at]
                environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
                raise ConnectionAbortedError("injected: connection dropped mid-answer")
            at += len(piece)
            yield piece


class LocalS3(ThreadedMotoServer):
    """ThreadedMotoServer on 127.0.0.1 with a free port, GET counting and fault injection."""

    def __init__(self, faults: Faults | None = None) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.lock = threading.Lock()
        self.gets: Counter[str] = Counter()
        self.range_gets: Counter[str] = Counter()
        self.heads: Counter[str] = Counter()  # HEAD requests (s3fs `info`) by object path
        self.ranges: dict[str, list[str | None]] = defaultdict(list)  # Range header of each object GET, by path
        self.failed = 0
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)

    def _server_entry(self) -> None:
        app = _Middleware(DomainDispatcherApplication(create_backend_app), self)
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def set_faults(self, faults: Faults) -> None:
        """Change the faults (and reseed their random choices)."""
        with self.lock:
            self.faults, self.rng = faults, random.Random(faults.seed)

    def reset_counts(self) -> None:
        with self.lock:
            self.gets.clear()
            self.range_gets.clear()
            self.heads.clear()
            self.ranges.clear()
            self.failed = 0

    def shard_gets(self) -> dict[str, int]:
        """GETs of .tar objects since the last reset, by object path."""
        with self.lock:
            return {p: n for p, n in self.gets.items() if p.endswith(".tar")}

    def shard_requests(self) -> dict[str, int]:
        """GETs and HEADs of .tar objects since the last reset, by object path."""
        with self.lock:
            both = self.gets + self.heads
            return {p: n for p, n in both.items() if p.endswith(".tar")}

    def client_env(self) -> dict[str, str]:
        """Environment variables that point s3fs at this server (dummy credentials, fsspec endpoint)."""
        return {**DUMMY_ENV, "FSSPEC_S3_ENDPOINT_URL": self.endpoint}


def configure_this_process(server: LocalS3, read_timeout: float = 60.0) -> None:
    """Point this process's s3fs at `server`: environment credentials and fsspec's s3 defaults. botocore's own
    retries are turned off (one attempt; s3fs retries only SlowDown, which the server never answers) so that the
    retries measured are dpot's."""
    import fsspec.config

    os.environ.update(server.client_env())
    fsspec.config.conf["s3"] = {"endpoint_url": server.endpoint,
                                "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                                                  "read_timeout": read_timeout}}
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


def unconfigure_this_process(server: LocalS3) -> None:
    """Undo configure_this_process."""
    import fsspec.config
    from s3fs import S3FileSystem

    for key in server.client_env():
        os.environ.pop(key, None)
    fsspec.config.conf.pop("s3", None)
    S3FileSystem.clear_instance_cache()


def start(faults: Faults | None = None, bucket: str = "dpot") -> LocalS3:
    """A started server with an empty bucket, this process configured to use it."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = LocalS3(faults)
    server.start()
    configure_this_process(server)
    import fsspec

    fs = fsspec.filesystem("s3")
    if fs.exists(bucket):  # moto's backends live per process: a server started before in this process left it
        fs.rm(bucket, recursive=True)
    fs.mkdir(bucket)
    return server


def upload(local: str, url: str) -> None:
    """Copy a local ingest output folder to `url` (s3://bucket/prefix)."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.put(local.rstrip("/") + "/", url.rstrip("/") + "/", recursive=True)
    fs.invalidate_cache()
