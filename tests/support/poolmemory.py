"""A pool's members' memory, sampled while a test sends its traffic."""

from __future__ import annotations

import threading

from kubeloop.front.memory import private_mib


class MemorySampler:
    """Each member's memory over its empty self (the tritonserver's, with
    its backends' processes: what the pool's front budgets), every 100 ms,
    on a thread of its own. members: name -> the tritonserver's pid."""

    def __init__(self, members: dict[str, int]):
        self.members = members
        self.empty = {name: private_mib(pid) for name, pid in members.items()}
        self.peak = dict.fromkeys(members, 0.0)
        self.stop = threading.Event()

    def __enter__(self) -> "MemorySampler":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for name, pid in self.members.items():
                self.peak[name] = max(self.peak[name], private_mib(pid) - self.empty[name])

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
