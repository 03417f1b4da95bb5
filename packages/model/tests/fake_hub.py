"""A local stand-in for the Hugging Face hub: serves directories as read-only model repos.

huggingface_hub talks to whatever `HF_ENDPOINT` names, so pointing it here tests downloads with
no internet: the repo-info and file-tree API routes, HEAD and ranged GET of `resolve/` URLs (the
Range requests are how huggingface_hub resumes a dropped transfer). `requests` records what was
asked; `fail_once` names files whose first GET answers 500, as a download cut short.

Used by the model tests (`FakeHub` in a thread) and by docker/test-image.sh, from the command line:

    python packages/model/tests/fake_hub.py --port 8765 owner/name=/path/to/checkpoint
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_INFO = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/?]+)")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/?]+)")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-$")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Repo:
    """One served directory: its files (flat), their hashes and a commit id derived from them."""

    root: Path
    files: dict[str, Path] = field(init=False)
    hashes: dict[str, str] = field(init=False)
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        self.files = {p.name: p for p in sorted(self.root.iterdir()) if p.is_file()}
        self.hashes = {name: _sha256(p) for name, p in self.files.items()}
        joined = "".join(f"{n}:{h}" for n, h in self.hashes.items())
        self.commit = hashlib.sha1(joined.encode()).hexdigest()

    def tree(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "file",
                "path": name,
                "size": path.stat().st_size,
                "oid": self.hashes[name][:40],
                "lfs": {"oid": self.hashes[name], "size": path.stat().st_size, "pointerSize": 134},
            }
            for name, path in self.files.items()
        ]


class FakeHub:
    """Serve `repos` (repo id -> directory) on 127.0.0.1:`port` (0: any free port) in a thread."""

    def __init__(
        self, repos: Mapping[str, Path], *, port: int = 0, fail_once: tuple[str, ...] = ()
    ) -> None:
        self.repos = {repo_id: Repo(Path(d)) for repo_id, d in repos.items()}
        self.fail_once = set(fail_once)
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._route(with_body=True)

        def do_HEAD(self) -> None:
            self._route(with_body=False)

        def _route(self, *, with_body: bool) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            path = self.path.split("?", 1)[0]
            if m := _INFO.match(path):
                self._info(m[1])
            elif m := _TREE.match(path):
                self._tree(m[1])
            elif m := _RESOLVE.match(path):
                self._file(m[1], m[3], with_body=with_body)
            else:
                self._json({"error": f"no route {path}"}, status=404)

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._json({"error": f"Repository {repo_id} not found"}, status=404,
                           headers={"X-Error-Code": "RepoNotFound"})  # fmt: skip
            return repo

        def _info(self, repo_id: str) -> None:
            if repo := self._repo(repo_id):
                siblings = [{"rfilename": name} for name in repo.files]
                self._json({"id": repo_id, "sha": repo.commit, "siblings": siblings})

        def _tree(self, repo_id: str) -> None:
            if repo := self._repo(repo_id):
                self._json(repo.tree())

        def _file(self, repo_id: str, name: str, *, with_body: bool) -> None:
            repo = self._repo(repo_id)
            if repo is None:
                return
            file = repo.files.get(name)
            if file is None:
                self._json({"error": f"{name} not found"}, status=404,
                           headers={"X-Error-Code": "EntryNotFound"})  # fmt: skip
                return
            if with_body and name in hub.fail_once:
                hub.fail_once.discard(name)
                self._json({"error": "the transfer broke off"}, status=500)
                return
            data = file.read_bytes()
            start = 0
            if (m := _RANGE.match(self.headers.get("Range") or "")) and with_body:
                start = int(m[1])
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{repo.hashes[name]}"')
            self.send_header("X-Repo-Commit", repo.commit)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def _json(
            self, value: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
        ) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, v in (headers or {}).items():
                self.send_header(key, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("repos", nargs="+", metavar="OWNER/NAME=DIR")
    args = parser.parse_args()
    repos = dict(spec.split("=", 1) for spec in args.repos)
    hub = FakeHub({k: Path(v) for k, v in repos.items()}, port=args.port)
    print(f"fake hub on {hub.url}: {', '.join(repos)}", flush=True)
    with hub:
        threading.Event().wait()


if __name__ == "__main__":
    main()
