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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

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
        yield from _Run(self, list(tasks), measure, every_lane, remainder).events()


_DONE = object()  # a lane's thread has ended


class _Run(Generic[B, T, M]):
    """One `Lanes.run`: a thread per lane still measuring, their events passed to the caller."""

    def __init__(self, lanes: Lanes[B], tasks: list[T], measure: Callable[[B, T], Iterator[M]],
                 every_lane: bool, remainder: Callable[[T, list[M]], T | None] | None):
        self.lanes, self.measure, self.every_lane, self.remainder = lanes, measure, every_lane, remainder
        self.running = [i for i in range(len(lanes)) if i not in lanes.lost]
        self.shared: queue.SimpleQueue[T] = queue.SimpleQueue()
        self.queues: dict[int, queue.SimpleQueue[T]] = {
            lane: queue.SimpleQueue() if every_lane else self.shared for lane in self.running}
        for q in (self.queues.values() if every_lane else [self.shared]):
            for t in tasks:
                q.put(t)
        self.out: queue.SimpleQueue = queue.SimpleQueue()  # events, errors and _DONE, from the lanes
        self.stop = threading.Event()
        self.lock = threading.Lock()  # guards `busy`, `lanes.lost` and the hand-back of a lost task
        self.busy = 0  # tasks on a lane now, each of which may yet come back to the shared queue

    def events(self) -> Iterator[LaneEvent[T, M] | LaneLost]:
        threads = [threading.Thread(target=self._serve, args=(i,), name=f"cutlass-tune-lane{i}", daemon=True)
                   for i in self.running]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                try:
                    item = self.out.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            self.stop.set()
            for t in threads:
                t.join(STOP_WAIT_S)

    def _serve(self, lane: int) -> None:
        """A lane's thread: take tasks until none is left, the run stops or the lane is given up."""
        try:
            while (task := self._take(lane)) is not None:
                if not self._measure(lane, task):
                    return
                self.out.put(LaneEvent(lane, task, None))
        except BaseException as exc:  # handed to the caller's thread, which re-raises it
            self.out.put(exc)
        finally:
            self.out.put(_DONE)

    def _take(self, lane: int) -> T | None:
        """The next task for `lane`; None when none is left for it."""
        while not self.stop.is_set():
            with self.lock:
                try:
                    task = self.queues[lane].get_nowait()
                except queue.Empty:
                    if self.every_lane or not self.busy:
                        return None
                else:
                    self.busy += 1
                    return task
            self.stop.wait(_POLL_S / 4)  # a lane being given up may hand its task back
        return None

    def _measure(self, lane: int, task: T) -> bool:
        """Measure `task` on `lane`, passing on each result; False when the lane is to stop
        (the run is stopping, or the lane was given up)."""
        taken: list[M] = []
        try:
            results = self.measure(self.lanes.benches[lane], task)
            try:
                for r in results:
                    if self.stop.is_set():
                        return False
                    taken.append(r)
                    self.out.put(LaneEvent(lane, task, r))
            finally:
                close = getattr(results, "close", None)
                if close is not None:
                    close()
        except self.lanes.retire_on as exc:
            if self._give_up(lane, task, taken, exc):
                return False
            raise
        finally:
            with self.lock:
                self.busy -= 1
        return True

    def _give_up(self, lane: int, task: T, taken: list[M], exc: BaseException) -> bool:
        """Retire `lane` and hand what is left of `task` to the others; False when it may not
        be given up (it is the last lane, or no `remainder` says what is left)."""
        with self.lock:
            others = [i for i in self.running if i != lane and i not in self.lanes.lost]
            if not others or (self.remainder is None and not self.every_lane):
                return False
            self.lanes.lost[lane] = str(exc)
            if not self.every_lane:
                assert self.remainder is not None
                rest = self.remainder(task, taken)
                if rest is None:
                    self.out.put(LaneEvent(lane, task, None))
                else:
                    self.shared.put(rest)
        self.out.put(LaneLost(lane, str(exc)))
        return True
