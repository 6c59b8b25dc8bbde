"""Measuring on several GPUs at once: one thread per benchmarker, tasks taken from a shared queue.

Each benchmarker (one per GPU) already isolates its kernels in a worker process, so a thread
here only feeds jobs to that process and reads its results back. Results come back to the
caller's thread, in the order they are taken; the caller alone touches the store and the
studies. A kernel's ratio is always taken on the GPU that measured it: a task runs on one lane
from its first variant to its last.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Callable, Generic, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")
B = TypeVar("B")
M = TypeVar("M")

STOP_WAIT_S = 10.0
"""How long stopping early (an interrupt, an error) waits for each lane to finish the
measurement it is on; a lane stuck longer (a hang) is left to its worker's own timeout."""
_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class LaneEvent(Generic[T, M]):
    """One result of `Lanes.run`: `result` is a measurement of `task` taken on lane `lane`,
    or None when the task is done (all its results have come before)."""

    lane: int
    task: T
    result: M | None


class Lanes(Generic[B]):
    """Runs tasks on several benchmarkers in parallel, at most one task per benchmarker at a time.

    Not thread-safe itself: call `run` from one thread, one run at a time.
    """

    def __init__(self, benches: Sequence[B]):
        if not benches:
            raise ValueError("Lanes needs at least one benchmarker")
        self.benches = tuple(benches)

    def __len__(self) -> int:
        return len(self.benches)

    def run(self, tasks: Iterable[T], measure: Callable[[B, T], Iterator[M]], *,
            every_lane: bool = False) -> Iterator[LaneEvent[T, M]]:
        """Measure `tasks`: each once, on whichever lane is free (`every_lane`: each on every lane).

        `measure(bench, task)` runs in the lane's thread and yields the task's results. Events
        arrive as results are taken. Closing the iterator early stops the lanes after the
        result each is on (waiting at most STOP_WAIT_S per lane); results taken meanwhile are
        dropped.

        Raises:
            Whatever `measure` raised in a lane, KeyboardInterrupt included, re-raised here
            after the other lanes were stopped.
        """
        tasks = list(tasks)
        shared: queue.SimpleQueue = queue.SimpleQueue()
        queues = []
        for _ in self.benches:
            if every_lane:
                own: queue.SimpleQueue = queue.SimpleQueue()
                for t in tasks:
                    own.put(t)
                queues.append(own)
            else:
                queues.append(shared)
        if not every_lane:
            for t in tasks:
                shared.put(t)
        events: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        done = object()

        def serve(lane: int) -> None:
            try:
                while not stop.is_set():
                    try:
                        task = queues[lane].get_nowait()
                    except queue.Empty:
                        break
                    results = measure(self.benches[lane], task)
                    try:
                        for r in results:
                            if stop.is_set():
                                return
                            events.put(LaneEvent(lane, task, r))
                    finally:
                        close = getattr(results, "close", None)
                        if close is not None:
                            close()
                    events.put(LaneEvent(lane, task, None))
            except BaseException as exc:  # handed to the caller's thread, which re-raises it
                events.put(exc)
            finally:
                events.put(done)

        threads = [threading.Thread(target=serve, args=(i,), name=f"cutlass-tune-lane{i}", daemon=True)
                   for i in range(len(self.benches))]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                try:
                    item = events.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if item is done:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            stop.set()
            for t in threads:
                t.join(STOP_WAIT_S)
