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


@dataclasses.dataclass(frozen=True)
class LaneLost:
    """Lane `lane` was given up during `Lanes.run` (its benchmarker raised one of the
    `retire_on` errors, `reason`); what remained of its task went to the other lanes."""

    lane: int
    reason: str


class Lanes(Generic[B]):
    """Runs tasks on several benchmarkers in parallel, at most one task per benchmarker at a time.

    Args:
        retire_on: errors that mean a benchmarker is gone for good (its GPU cannot start a
            worker again). While another lane is left, such a lane is given up: it takes no
            more tasks in this or later runs (`lost`), and its task goes back to the others.
            The last lane's error is raised like any other.

    Not thread-safe itself: call `run` from one thread, one run at a time.
    """

    def __init__(self, benches: Sequence[B], *, retire_on: tuple[type[BaseException], ...] = ()):
        if not benches:
            raise ValueError("Lanes needs at least one benchmarker")
        self.benches = tuple(benches)
        self.retire_on = retire_on
        self.lost: dict[int, str] = {}
        """Lanes given up, by index: the error that retired each."""

    def __len__(self) -> int:
        return len(self.benches)

    def run(self, tasks: Iterable[T], measure: Callable[[B, T], Iterator[M]], *,
            every_lane: bool = False, remainder: Callable[[T, list[M]], T | None] | None = None
            ) -> Iterator[LaneEvent[T, M] | LaneLost]:
        """Measure `tasks`: each once, on whichever lane is free (`every_lane`: each on every lane).

        `measure(bench, task)` runs in the lane's thread and yields the task's results. Events
        arrive as results are taken. Closing the iterator early stops the lanes after the
        result each is on (waiting at most STOP_WAIT_S per lane); results taken meanwhile are
        dropped.

        `remainder(task, results)` is what is left of `task` after `results` (None: nothing);
        a lane given up while on a task hands that back to the others. Without it a lane is
        not given up outside `every_lane` runs (where a lost lane's tasks are simply dropped).

        Raises:
            Whatever `measure` raised in a lane, KeyboardInterrupt included, re-raised here
            after the other lanes were stopped.
        """
        tasks = list(tasks)
        lanes = [i for i in range(len(self.benches)) if i not in self.lost]
        shared: queue.SimpleQueue = queue.SimpleQueue()
        queues: dict[int, queue.SimpleQueue] = {}
        for lane in lanes:
            queues[lane] = queue.SimpleQueue() if every_lane else shared
            if every_lane:
                for t in tasks:
                    queues[lane].put(t)
        if not every_lane:
            for t in tasks:
                shared.put(t)
        events: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        lock = threading.Lock()  # guards `busy`, `self.lost` and the hand-back of a lost task
        busy = 0  # tasks on a lane now, each of which may yet come back to the shared queue
        done, nothing = object(), object()  # end of a lane's thread; no task left for a lane

        def take(lane: int) -> object:
            nonlocal busy
            while not stop.is_set():
                with lock:
                    try:
                        task = queues[lane].get_nowait()
                    except queue.Empty:
                        if every_lane or not busy:
                            return nothing
                    else:
                        busy += 1
                        return task
                stop.wait(_POLL_S / 4)  # a lane being given up may hand its task back
            return nothing

        def give_up(lane: int, task: T, taken: list[M], exc: BaseException) -> bool:
            with lock:
                others = [i for i in lanes if i != lane and i not in self.lost]
                if not others or (remainder is None and not every_lane):
                    return False
                self.lost[lane] = str(exc)
                if not every_lane:
                    rest = remainder(task, taken)
                    if rest is None:
                        events.put(LaneEvent(lane, task, None))
                    else:
                        shared.put(rest)
            events.put(LaneLost(lane, str(exc)))
            return True

        def serve(lane: int) -> None:
            nonlocal busy
            try:
                while (task := take(lane)) is not nothing:
                    taken: list[M] = []
                    try:
                        results = measure(self.benches[lane], task)
                        try:
                            for r in results:
                                if stop.is_set():
                                    return
                                taken.append(r)
                                events.put(LaneEvent(lane, task, r))
                        finally:
                            close = getattr(results, "close", None)
                            if close is not None:
                                close()
                    except self.retire_on as exc:
                        if give_up(lane, task, taken, exc):
                            return
                        raise
                    finally:
                        with lock:
                            busy -= 1
                    events.put(LaneEvent(lane, task, None))
            except BaseException as exc:  # handed to the caller's thread, which re-raises it
                events.put(exc)
            finally:
                events.put(done)

        threads = [threading.Thread(target=serve, args=(i,), name=f"cutlass-tune-lane{i}", daemon=True)
                   for i in lanes]
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
