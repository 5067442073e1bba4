"""A local HTTP server that speaks enough of the Hugging Face Hub for huggingface_hub.

Tests point ``HF_ENDPOINT`` at it and download through the real client, over real
HTTP on 127.0.0.1, so nothing leaves the machine and nothing is mocked. It serves
what ``snapshot_download``, ``hf_hub_download`` and ``HfApi`` ask for:

* ``GET /api/models/{repo}[/revision/{rev}]``: the model info (``sha``, ``siblings``
  with sizes when ``?blobs=true``, ``gated``);
* ``GET /api/models/{repo}/tree/{rev}[/{path}]``: the file listing (``?recursive=``);
* ``HEAD`` / ``GET /{repo}/resolve/{rev}/{file}``: the file, with the headers the client
  needs (``ETag``, ``X-Repo-Commit``, ``Content-Length``, ``Accept-Ranges``) and HTTP
  Range requests answered ``206`` (the client resumes a ``.incomplete`` file with them);
* the Hub's errors, with its ``X-Error-Code`` header: ``RepoNotFound`` and
  ``RevisionNotFound`` / ``EntryNotFound`` (404), ``GatedRepo`` without a token (401)
  or with one that has no access (403).

A repo is a set of commits, each a ``{path: bytes}`` mapping, and refs (branches, tags)
naming them; :meth:`HubServer.add_directory` publishes a local checkpoint directory (a
tiny model of :mod:`glowlm.testing.tiny_models`, tiny GGUF files). Faults: the next
download of a file can be cut after some bytes, once (:meth:`HubServer.drop_once`) or
every time until :meth:`HubServer.heal` (:meth:`HubServer.drop_always`). Every request
is recorded (:attr:`HubServer.requests`) so tests can check what was fetched::

    with HubServer() as hub:
        hub.add_directory("acme/tiny-llama", make_tiny_model("llama", tmp / "m"))
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf")}
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: The token the server accepts for gated repos unless told otherwise.
TOKEN = "hf_glowlm_test_token"


@dataclass
class Repo:
    """One model repo: commits (sha -> files) and refs (branch or tag -> sha)."""

    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def commit(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision in self.commits else None


@dataclass(frozen=True)
class Request:
    """What the server was asked: method, path (decoded), Range header, token sent."""

    method: str
    path: str
    range: str | None
    token: str | None


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HubServer:
    """The server, started on a free port in a daemon thread (``with HubServer() as hub``)."""

    def __init__(self, tokens: tuple[str, ...] = (TOKEN,), tree_listing: bool = True) -> None:
        """``tokens``: the ones gated repos accept; ``tree_listing=False``: no ``/tree``
        route, as a mirror that serves only the revision and file routes."""
        self.tokens = set(tokens)
        self.tree_listing = tree_listing
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self._drops: dict[tuple[str, str], tuple[list[int], bool]] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- content ------------------------------------------------------------------

    def add_files(
        self, repo_id: str, files: dict[str, bytes], revision: str = "main", gated: bool = False
    ) -> str:
        """Publish a commit of ``files`` as ``revision`` (a branch or tag); return its sha."""
        repo = self.repos.setdefault(repo_id, Repo(repo_id))
        repo.gated = repo.gated or gated
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + _sha1(files[path]).encode())
        sha = digest.hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs[revision] = sha
        return sha

    def add_directory(
        self,
        repo_id: str,
        directory: str | Path,
        revision: str = "main",
        gated: bool = False,
        extra: dict[str, bytes] | None = None,
    ) -> str:
        """Publish every file under ``directory`` (plus ``extra``) as one commit."""
        root = Path(directory)
        files = {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
        return self.add_files(repo_id, {**files, **(extra or {})}, revision, gated)

    def drop_once(self, repo_id: str, path: str, after_bytes: int) -> None:
        """Cut the connection of the next download of ``path`` after ``after_bytes``."""
        self._drops[repo_id, path] = ([after_bytes], False)

    def drop_always(
        self, repo_id: str, path: str, after_bytes: int = 0, first_after: int | None = None
    ) -> None:
        """Cut every download of ``path`` after ``after_bytes`` (the first one after
        ``first_after`` when given) until :meth:`heal`. huggingface_hub retries a cut
        download a few times, and again whenever one brought bytes: cuts at 0 bytes
        make it give up, as a connection that is gone would."""
        cuts = [after_bytes] if first_after is None else [first_after, after_bytes]
        self._drops[repo_id, path] = (cuts, True)

    def heal(self) -> None:
        self._drops.clear()

    def downloads(self, path_suffix: str = "") -> list[Request]:
        """The GET requests of files (``/resolve/``) whose path ends with ``path_suffix``."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix)
        ]

    # -- lifecycle ----------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the server is not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- used by the handler --------------------------------------------------------

    def _take_drop(self, repo_id: str, path: str) -> int | None:
        with self._lock:
            drop = self._drops.get((repo_id, path))
            if drop is None:
                return None
            cuts, always = drop
            after = cuts.pop(0) if len(cuts) > 1 else cuts[0]
            if not always:
                del self._drops[repo_id, path]
            return after


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass  # the tests read HubServer.requests, not stderr

    # -- responses ----------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode())

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message})

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth.removeprefix("Bearer ").strip() or None

    # -- routing ------------------------------------------------------------------

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._route()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.hub.requests.append(
            Request(self.command, "/" + "/".join(parts), self.headers.get("Range"), self._token())
        )
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = f"{parts[2]}/{parts[3]}", parts[4:]
            if not rest or rest[0] == "revision":
                return self._model_info(repo_id, rest[1] if len(rest) > 1 else "main", query)
            if rest[0] == "tree" and len(rest) >= 2 and self.hub.tree_listing:
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), query)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        self._error(404, "NotFound", f"no route {url.path}")

    def _repo_at(self, repo_id: str, revision: str) -> tuple[Repo, str] | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        sha = repo.commit(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, sha

    def _model_info(self, repo_id: str, revision: str, query: dict[str, str]) -> None:
        found = self._repo_at(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        blobs = query.get("blobs", "").lower() == "true"
        siblings = []
        for path, data in sorted(repo.commits[sha].items()):
            entry: dict[str, Any] = {"rfilename": path}
            if blobs:
                entry.update(
                    size=len(data),
                    blobId=_sha1(data),
                    lfs={"size": len(data), "sha256": _sha256(data), "pointerSize": 134},
                )
            siblings.append(entry)
        self._json(
            {
                "_id": _sha1(repo_id.encode())[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": sha,
                "private": False,
                "disabled": False,
                "gated": "manual" if repo.gated else False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
            }
        )

    def _tree(self, repo_id: str, revision: str, under: str, query: dict[str, str]) -> None:
        found = self._repo_at(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        recursive = query.get("recursive", "").lower() == "true"
        prefix = f"{under}/" if under else ""
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()
        for path, data in sorted(repo.commits[sha].items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            for i in range(rest.count("/")):
                folders.add(prefix + "/".join(rest.split("/")[: i + 1]))
            entries.append(
                {
                    "type": "file",
                    "oid": _sha1(data),
                    "size": len(data),
                    "path": path,
                    "lfs": {"oid": _sha256(data), "size": len(data), "pointerSize": 134},
                }
            )
        entries += [
            {"type": "directory", "oid": _sha1(f.encode()), "size": 0, "path": f}
            for f in sorted(folders)
        ]
        self._json(entries)

    def _file(self, repo_id: str, revision: str, path: str) -> None:
        found = self._repo_at(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        if repo.gated:
            token = self._token()
            if token is None:
                return self._error(
                    401,
                    "GatedRepo",
                    "Access to model "
                    f"{repo_id} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
            if token not in self.hub.tokens:
                return self._error(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is "
                    "restricted and you are not in the authorized list.",
                )
        data = repo.commits[sha].get(path)
        if data is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
        start, status = 0, 200
        headers = {"ETag": f'"{_sha256(data)}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start = int(first or 0)
            end = int(last) if last else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        drop = self.hub._take_drop(repo_id, path) if self.command == "GET" else None
        if drop is None:
            return self._send(status, data, headers, "application/octet-stream")
        # Promise the whole body, send part of it, and hang up: a dropped connection.
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data[:drop])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True
