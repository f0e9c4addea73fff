"""A stand-in for the local backend's worker that only sleeps: it lets the
backend's process bookkeeping be tested without running a pipeline."""

import json
import sys
import time
from pathlib import Path

from kubeloop.pipelines.backends.local import write_state

run_dir = Path(sys.argv[1])
request = json.loads((run_dir / "request.json").read_text())
write_state(run_dir, phase="Running", progress="sleeping")
time.sleep(float(request["arguments"]["seconds"]))
write_state(run_dir, phase="Succeeded", outputs={"slept": request["arguments"]["seconds"]})
