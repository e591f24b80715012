"""A local stand-in for the Anthropic Messages API: serves recorded responses, records requests.

POST /v1/messages answers with the next recorded exchange of the queue: {"status": 200,
"headers": {...}, "body": {...}} (a Messages API response, or an error body). The recorded bodies
are the real API's JSON; `{{iv:N}}` in a body is replaced by the N-th distinct intervention id
(iv-<12 hex>) in the request's last user message, so a recorded ranking can name ids that are
content hashes. Every request (path, headers, JSON body) is kept in `requests`; an empty queue
answers 500 with an error body and is counted in `unexpected`.
"""
from __future__ import annotations

import json
import re
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anthropic"
_IV = re.compile(r"iv-[0-9a-f]{12}")


def load(name: str) -> list[dict]:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return data["exchanges"]


def _last_user_text(body: dict) -> str:
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            return json.dumps(content)
    return ""


def _fill(obj, ids: list[str]):
    if isinstance(obj, str):
        m = re.fullmatch(r"\{\{iv:(\d+)\}\}", obj)
        if m:
            k = int(m.group(1))
            return ids[k] if k < len(ids) else obj
        return obj
    if isinstance(obj, list):
        return [_fill(x, ids) for x in obj]
    if isinstance(obj, dict):
        return {k: _fill(v, ids) for k, v in obj.items()}
    return obj


class FakeAnthropic:
    def __init__(self):
        self.queue: deque[dict] = deque()
        self.requests: list[dict] = []
        self.unexpected = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    ex = fake.queue.popleft() if fake.queue else None
                    if ex is None:
                        fake.unexpected += 1
                if ex is None:
                    ex = {"status": 500, "body": {"type": "error", "error": {
                        "type": "api_error", "message": "fake server: no recorded response left"}}}
                ids = list(dict.fromkeys(_IV.findall(_last_user_text(body))))
                payload = json.dumps(_fill(ex.get("body", {}), ids)).encode()
                self.send_response(int(ex.get("status", 200)))
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.send_header("request-id", f"req_fake_{len(fake.requests)}")
                for k, v in (ex.get("headers") or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeAnthropic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def load(self, *names: str) -> FakeAnthropic:
        for name in names:
            self.queue.extend(load(name))
        return self

    def reset(self) -> None:
        with self._lock:
            self.queue.clear()
            self.requests.clear()
            self.unexpected = 0

    @property
    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests]
