"""A local OpenAI-compatible chat endpoint on 127.0.0.1 for tests: records every request, answers with `reply(body)`."""
from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from contextlib import contextmanager


@contextmanager
def chat_server(reply: Callable[[dict], str], status: int = 200, raw: bytes | None = None):
    """Yields (base_url, seen): `seen` collects (path, Authorization header, JSON body) of every POST. The reply is
    `{"choices": [{"message": {"content": reply(body)}}]}` with `status`, or the bytes `raw` when given."""
    seen: list[tuple[str, str, dict]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers["Authorization"], body))
            out = raw if raw is not None else json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": reply(body)}}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
