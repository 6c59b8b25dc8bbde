"""Lanes: tasks spread over several benchmarkers (one thread each), results in the caller's thread."""

import collections
import threading
import time

import pytest

from cutlass_tune.search import Lanes


class Recorder:
    """A benchmarker stand-in: `measure` yields two results per task, `delay` seconds each."""

    def __init__(self, name, delay=0.0, fail_on=None):
        self.name, self.delay, self.fail_on = name, delay, fail_on
        self.tasks = []
        self.threads = set()

    def measure(self, task):
        self.tasks.append(task)
        self.threads.add(threading.current_thread().name)
        for part in (0, 1):
            if task == self.fail_on:
                raise RuntimeError(f"planted failure on {task}")
            time.sleep(self.delay)
            yield (self.name, task, part)


def measure(bench, task):
    return bench.measure(task)


def test_each_task_runs_once_on_one_lane_with_an_end_event():
    a, b = Recorder("a", 0.005), Recorder("b", 0.005)
    events = list(Lanes([a, b]).run(range(20), measure))
    results = [e for e in events if e.result is not None]
    ends = [e for e in events if e.result is None]
    assert sorted(e.task for e in ends) == list(range(20))
    assert sorted(a.tasks + b.tasks) == list(range(20))
    assert a.tasks and b.tasks  # both lanes worked
    assert a.threads.isdisjoint(b.threads)
    for e in results:  # a result names the lane whose benchmarker took it
        assert e.result[0] == "ab"[e.lane] and e.result[1] == e.task
    # the end of a task comes after both of its results
    seen = collections.Counter()
    for e in events:
        if e.result is None:
            assert seen[e.task] == 2
        else:
            seen[e.task] += 1


def test_a_slow_lane_does_not_hold_the_others_back():
    slow, fast = Recorder("slow", 0.2), Recorder("fast", 0.001)
    list(Lanes([slow, fast]).run(range(12), measure))
    assert len(slow.tasks) <= 2 < len(fast.tasks)


def test_every_lane_runs_every_task():
    a, b = Recorder("a"), Recorder("b")
    events = list(Lanes([a, b]).run(["p", "q"], measure, every_lane=True))
    assert a.tasks == b.tasks == ["p", "q"]
    assert sorted((e.lane, e.task) for e in events if e.result is None) == [(0, "p"), (0, "q"), (1, "p"), (1, "q")]


def test_an_error_in_a_lane_reaches_the_caller_and_stops_the_rest():
    bad, good = Recorder("bad", 0.01, fail_on=3), Recorder("good", 0.05)
    with pytest.raises(RuntimeError, match="planted failure on 3"):
        list(Lanes([bad, good]).run(range(40), measure))
    time.sleep(0.2)
    assert len(bad.tasks) + len(good.tasks) < 40  # the queue was not drained after the error


def test_closing_early_stops_the_lanes():
    a, b = Recorder("a", 0.02), Recorder("b", 0.02)
    run = Lanes([a, b]).run(range(100), measure)
    next(run)
    run.close()
    taken = len(a.tasks) + len(b.tasks)
    time.sleep(0.2)
    assert len(a.tasks) + len(b.tasks) == taken <= 4


def test_a_single_lane_keeps_the_task_order():
    a = Recorder("a")
    events = list(Lanes([a]).run(range(5), measure))
    assert [e.task for e in events if e.result is None] == list(range(5))


def test_no_benchmarker_is_refused():
    with pytest.raises(ValueError):
        Lanes([])
