"""NVIDIA's tritonclient as the load generator: closed-loop callers, each a
thread with its own client, sending tensors over HTTP as JSON or in
Triton's binary extension and asking for the answer the same way, or over
gRPC (raw tensors), against Triton direct and the front in alternating
rounds. The callers share this
process's GIL, so the process's CPU use is reported beside the figures: a
generator near one core is the limit, not the target."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from tests.bench.repeat import RUNS, Figure

ENCODINGS = ("json", "binary", "grpc")
ROWS = (1, 4)
CONCURRENCY = (1, 16)


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    grpc: str
    """host:port of its KServe v2 gRPC."""


def requests_of(x: np.ndarray, rows: int, encoding: str, output: str, count: int = 64) -> list[tuple]:
    """Prepared (inputs, outputs) pairs, reused by every caller: what a
    client sends is built once, as a load generator would."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    prepared = []
    for i in range(count):
        rows_of = x[i * rows:(i + 1) * rows]
        if encoding == "grpc":
            tensor = grpcclient.InferInput("features", [rows, x.shape[1]], "FP32")
            tensor.set_data_from_numpy(rows_of)
            prepared.append(([tensor], [grpcclient.InferRequestedOutput(output)]))
            continue
        binary = encoding == "binary"
        tensor = httpclient.InferInput("features", [rows, x.shape[1]], "FP32")
        tensor.set_data_from_numpy(rows_of, binary_data=binary)
        prepared.append(([tensor], [httpclient.InferRequestedOutput(output, binary_data=binary)]))
    return prepared


def client_of(target: Target, encoding: str):  # noqa: ANN201 - a tritonclient InferenceServerClient
    if encoding == "grpc":
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(target.grpc)
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(target.url.removeprefix("http://"), network_timeout=30)


def closed_loop(target: Target, encoding: str, prepared: list[tuple], concurrency: int, seconds: float) -> dict:
    """Requests per second, p50 and p99 ms, and the cores this process used."""
    latencies: list[float] = []
    failures: list[BaseException] = []
    deadline = time.perf_counter() + seconds

    def caller(offset: int) -> None:
        client = client_of(target, encoding)
        i = offset
        try:
            while time.perf_counter() < deadline:
                inputs, outputs = prepared[i % len(prepared)]
                start = time.perf_counter()
                client.infer(target.model, inputs, outputs=outputs)
                latencies.append(time.perf_counter() - start)
                i += concurrency
        except BaseException as exc:  # noqa: BLE001 - reported by the round, which then fails
            failures.append(exc)
        finally:
            client.close()

    cpu, wall = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=caller, args=(k,)) for k in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"tritonclient against {target.url}: {failures[0]!r}")
    ms = np.array(latencies) * 1000
    return {"requests_per_s": len(ms) / seconds, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "generator_cores": (time.process_time() - cpu) / (time.perf_counter() - wall)}


def cells(targets: dict[str, Target], x: np.ndarray, output: str, seconds: float) -> tuple[dict, list[Figure]]:
    """Every encoding, rows per request and concurrency: each target in
    turn over RUNS rounds, the order reversed every other round. The
    medians per cell and target, and the ratios of "front" to "triton"."""
    medians, figures = {}, []
    for encoding in ENCODINGS:
        for rows in ROWS:
            prepared = requests_of(x, rows, encoding, output)
            for concurrency in CONCURRENCY:
                cell = f"{encoding}, {rows} row{'s' if rows > 1 else ''}, c{concurrency}"
                rounds = []
                for index in range(RUNS):
                    names = list(targets) if index % 2 == 0 else list(reversed(targets))
                    rounds.append({n: closed_loop(targets[n], encoding, prepared, concurrency, seconds) for n in names})
                medians[cell] = {n: {k: round(float(np.median([r[n][k] for r in rounds])), 2) for k in rounds[0][n]}
                                 for n in targets}
                figures += [
                    Figure(f"tritonclient {cell}: front / triton throughput",
                           [r["front"]["requests_per_s"] / r["triton"]["requests_per_s"] for r in rounds], "x"),
                    Figure(f"tritonclient {cell}: front / triton p99",
                           [r["front"]["p99_ms"] / r["triton"]["p99_ms"] for r in rounds], "x")]
    return medians, figures
