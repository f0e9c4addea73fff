"""A stand-in for tritonserver that only starts answering /v2/health/live once
a file exists: lets a test hold a server in its "starting" state as long as
it likes, without sleeping."""

import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

go, port = Path(sys.argv[1]), int(sys.argv[2])
while not go.exists():
    time.sleep(0.05)


class Live(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):  # noqa: ANN002
        pass


HTTPServer(("127.0.0.1", port), Live).serve_forever()
