"""Lanes: tasks spread over several benchmarkers (one thread each), results in the caller's thread."""

import collections
import threading
import time

import pytest

from cutlass_tune.search import LaneEvent, LaneLost, Lanes


class Gone(Exception):
    """What a benchmarker raises when its GPU can measure no more."""


class Recorder:
    """A benchmarker stand-in: `measure` yields two results per task, `delay` seconds each.

    A task is an int, or (int, first part) for what is left of one. `lose_after`: raise Gone
    instead of the result that would follow that many."""

    def __init__(self, name, delay=0.0, fail_on=None, lose_after=None):
        self.name, self.delay, self.fail_on, self.lose_after = name, delay, fail_on, lose_after
        self.tasks = []
        self.threads = set()
        self.results = 0

    def measure(self, task):
        self.tasks.append(task)
        self.threads.add(threading.current_thread().name)
        number, first = task if isinstance(task, tuple) else (task, 0)
        for part in range(first, 2):
            if number == self.fail_on:
                raise RuntimeError(f"planted failure on {task}")
            if self.results == self.lose_after:
                raise Gone(f"GPU {self.name} cannot start a worker")
            time.sleep(self.delay)
            self.results += 1
            yield (self.name, number, part)


def measure(bench, task):
    return bench.measure(task)


def remainder(task, taken):
    number, first = task if isinstance(task, tuple) else (task, 0)
    first += len(taken)
    return (number, first) if first < 2 else None


def parts(events):
    """(task number, part) -> lanes that took it."""
    took = collections.defaultdict(list)
    for e in events:
        if isinstance(e, LaneEvent) and e.result is not None:
            took[e.result[1:]].append(e.lane)
    return took


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


def test_a_lane_given_up_hands_the_rest_of_its_task_to_a_lane_that_had_run_dry():
    # The slow lane takes task 0 and is lost after its first result; by then the fast lane
    # has finished every other task, and must wait for what the lost lane hands back.
    slow, fast = Recorder("slow", 0.2, lose_after=1), Recorder("fast", 0.001)
    lanes = Lanes([slow, fast], retire_on=(Gone,))
    events = list(lanes.run(range(4), measure, remainder=remainder))
    took = parts(events)
    assert sorted(took) == [(t, p) for t in range(4) for p in (0, 1)]
    assert all(len(v) == 1 for v in took.values())  # nothing measured twice
    assert took[(0, 0)] == [0] and took[(0, 1)] == [1]
    assert [e for e in events if isinstance(e, LaneLost)] == [LaneLost(0, "GPU slow cannot start a worker")]
    ends = sorted((e.task for e in events if isinstance(e, LaneEvent) and e.result is None), key=str)
    assert ends == [(0, 1), 1, 2, 3]  # the rest of task 0 ends as a task of its own
    assert lanes.lost == {0: "GPU slow cannot start a worker"}


def test_a_lane_lost_after_the_last_result_of_its_task_ends_that_task():
    class LostAtEnd(Recorder):
        def measure(self, task):
            yield from super().measure(task)
            raise Gone("lost after its task")

    a, b = LostAtEnd("a"), Recorder("b", 0.05)
    events = list(Lanes([a, b], retire_on=(Gone,)).run([0, 1], measure, remainder=remainder))
    took = parts(events)
    assert sorted(took) == [(0, 0), (0, 1), (1, 0), (1, 1)] and all(len(v) == 1 for v in took.values())
    assert len(a.tasks) == 1 and [e.lane for e in events if isinstance(e, LaneLost)] == [0]
    ends = [(e.lane, e.task) for e in events if isinstance(e, LaneEvent) and e.result is None]
    assert sorted(ends) == [(0, a.tasks[0]), (1, b.tasks[0])]


def test_a_lane_given_up_takes_no_task_in_later_runs():
    a, b = Recorder("a", lose_after=0), Recorder("b")
    lanes = Lanes([a, b], retire_on=(Gone,))
    list(lanes.run(range(3), measure, remainder=remainder))
    a.lose_after = None  # even if it could measure again
    events = list(lanes.run(range(5), measure, remainder=remainder))
    assert {e.lane for e in events} == {1}
    events = list(lanes.run(["p"], measure, every_lane=True))
    assert [(e.lane, e.task) for e in events if e.result is None] == [(1, "p")]


def test_the_last_lane_is_not_given_up_its_error_is_raised():
    a, b = Recorder("a", lose_after=0), Recorder("b", 0.01, lose_after=3)
    lanes = Lanes([a, b], retire_on=(Gone,))
    with pytest.raises(Gone, match="GPU b"):
        list(lanes.run(range(6), measure, remainder=remainder))
    assert list(lanes.lost) == [0]


def test_an_every_lane_run_drops_the_tasks_of_a_lane_given_up():
    a, b = Recorder("a", lose_after=1), Recorder("b")
    events = list(Lanes([a, b], retire_on=(Gone,)).run(["p", "q"], measure, every_lane=True))
    assert sorted((e.lane, e.task) for e in events if isinstance(e, LaneEvent) and e.result is None) == [
        (1, "p"), (1, "q")]
    assert [e.lane for e in events if isinstance(e, LaneLost)] == [0]


def test_without_a_remainder_a_lane_is_not_given_up():
    a, b = Recorder("a", lose_after=0), Recorder("b", 0.01)
    lanes = Lanes([a, b], retire_on=(Gone,))
    with pytest.raises(Gone):
        list(lanes.run(range(4), measure))
    assert lanes.lost == {}


def test_errors_not_named_for_retirement_still_stop_the_run():
    bad, good = Recorder("bad", fail_on=1), Recorder("good")
    with pytest.raises(RuntimeError, match="planted failure"):
        list(Lanes([bad, good], retire_on=(Gone,)).run([1], measure, every_lane=True))
