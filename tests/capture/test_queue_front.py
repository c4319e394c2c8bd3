"""The capture queue's front in C (capture._take.QueueFront) against its Python reference (capture.queue_front).

Both are driven through the same offers and exchanges: what each queues, drops and counts,
when each wakes the writer thread, and what a take that fails does. The C taker's facts are
untracked by the garbage collector as they are taken, so a queue of them is never walked.
"""

from __future__ import annotations

import collections
import gc

import pytest

from kinspect.capture.facts import FactsTaker
from kinspect.capture.observer import CaptureObserver
from kinspect.capture.queue_front import QueueFront, queue_front
from kinspect.protocol.codec import Codec
from kinspect.proxy.observers import Dispatcher
from kinspect.session import Exchange
from tests.capture.test_capture import recorded_exchanges
from tests.capture.test_native_take import replayed
from tests.support.native import bytes_grown, native_module

_take, _MISSING = native_module("kinspect.capture._take")


def fronts(queue_rows: int, queue_bytes: int, take=None, wake_at=(1, 4)) -> list[tuple]:
    """(front, its queue, the wake-ups it made, the errors it handed on) for C and for Python."""
    if _take is None:
        pytest.fail(_MISSING)
    out = []
    for native in (True, False):
        queue, woken, errors = collections.deque(), [], []
        front = queue_front(queue, queue_rows, queue_bytes, wake_at, lambda w=woken, q=queue: w.append(len(q)), take,
                            errors.append, native=native)
        assert isinstance(front, _take.QueueFront if native else QueueFront)
        out.append((front, queue, woken, errors))
    return out


def counters(front) -> tuple:
    return (front.accepted, front.dropped, front.fact_errors, front.offered_bytes, front.taken_bytes)


def test_offers_are_queued_within_both_bounds_and_wake_the_writer_alike():
    sizes = [100, 300, 50, 1100, 10, 10, 2000, 5, 5, 5, 5, 5]
    seen = []
    for front, queue, woken, _ in fronts(queue_rows=6, queue_bytes=1500):
        accepted = [front.offer(("facts", n), n) for n in sizes[:8]]
        front.taken_bytes += 300  # the writer thread took the second exchange's bytes ...
        queue.remove(("facts", 300))  # ... and the exchange
        accepted += [front.offer(("facts", n), n) for n in sizes[8:]]
        front.closed = True
        accepted.append(front.offer(("late",), 0))  # closed: dropped whatever the room
        seen.append((accepted, list(queue), woken, counters(front)))
    assert seen[0] == seen[1]
    accepted, queued, woken, (n_in, n_out, errors, offered, taken) = seen[0]
    # 1,100 would pass 1,500 bytes, 2,000 too; then the rows' bound (6) holds until one is taken.
    assert accepted == [True, True, True, False, True, True, False, True, True, False, False, False, False]
    assert [n for _, n in queued] == [100, 50, 10, 10, 5, 5]
    assert (n_in, n_out, errors, offered - taken) == (7, 6, 0, 180)
    # Woken as the queue stopped being empty, and as it held a batch (4); the bytes never passed half.
    assert woken == [1, 4]


def test_the_writer_is_woken_as_the_bytes_held_pass_half_the_bound():
    seen = []
    for front, queue, woken, _ in fronts(queue_rows=100, queue_bytes=1000, wake_at=(1, 50)):
        for n in (100, 300, 200, 100, 200):
            front.offer(("facts", n), n)
        seen.append(woken)
    assert seen[0] == seen[1] == [1, 3]  # 400 -> 600 passes 500; 700 and 900 do not pass it again


def test_exchanges_are_taken_and_queued_and_a_failing_take_is_counted_once_logged():
    codec = Codec()
    exchanges = recorded_exchanges(codec, 6)
    calls = []

    def take(x):
        calls.append(x)
        if x is exchanges[2]:
            raise RuntimeError("a bug in taking facts")
        if x is exchanges[3]:
            return "not a pair"
        return ("facts", x.request.header.correlation_id), 10

    seen = []
    for front, queue, _, errors in fronts(queue_rows=10, queue_bytes=10_000, take=take):
        for x in exchanges:
            assert front(x) is None  # never raises into the loop
        seen.append((list(queue), counters(front), [type(e) for e in errors]))
    assert seen[0] == seen[1]
    queued, (n_in, n_out, n_errors, offered, _), logged = seen[0]
    assert [c for _, c in queued] == [x.request.header.correlation_id for i, x in enumerate(exchanges) if i not in (2, 3)]
    assert (n_in, n_out, n_errors, offered) == (4, 0, 2, 40)
    assert logged == [RuntimeError]  # the first failure only
    assert len(calls) == 2 * len(exchanges)


def test_an_interrupt_is_not_swallowed():
    def take(x):
        raise KeyboardInterrupt

    for front, _, _, _ in fronts(queue_rows=10, queue_bytes=10_000, take=take):
        with pytest.raises(KeyboardInterrupt):
            front(object())
        assert front.fact_errors == 0


def test_the_capture_observer_hands_exchanges_to_the_c_front_with_the_c_taker(tmp_path):
    if _take is None:
        pytest.fail(_MISSING)
    codec = Codec()
    observer = CaptureObserver(tmp_path, codec)
    front = observer.writer.front
    assert isinstance(front, _take.QueueFront) and isinstance(front.take, _take.Taker)
    assert observer.handlers == {Exchange: front}  # the dispatcher calls C: no Python frame an exchange
    exchanges = replayed(codec)
    Dispatcher([observer]).dispatch(exchanges)
    reference = FactsTaker(codec, native=False).take
    assert list(observer.writer._queue) == [reference(x)[0] for x in exchanges]
    assert observer.writer.queued_bytes == sum(reference(x)[1] for x in exchanges)
    assert observer.writer.rows_accepted == len(exchanges) and observer.writer.rows_dropped == 0
    observer.close()


def test_queued_facts_are_untracked_so_no_collection_walks_the_queue():
    codec = Codec()
    exchanges = replayed(codec)
    take = FactsTaker(codec).take
    if _take is None or not isinstance(take, _take.Taker):
        pytest.fail(_MISSING or "the C taker is built but FactsTaker does not use it")
    for _ in range(2):  # the second time, each SCAN kept for its api is one taken before
        taken = [take(x)[0] for x in exchanges]
        assert not any(gc.is_tracked(f) for f in taken)
        sides = [s for f in taken for s in (f[19], f[28]) if type(s) is tuple]
        assert len(sides) > len(exchanges) and not any(gc.is_tracked(s) for s in sides)


def test_no_reference_leaks():
    if _take is None:
        pytest.fail(_MISSING)
    codec = Codec()
    exchanges = replayed(codec)[:60]
    take = FactsTaker(codec).take

    def rounds() -> None:
        queue = collections.deque()
        front = queue_front(queue, 40, 1 << 30, (1, 10), lambda: None, take, lambda e: None)
        for x in exchanges:  # 40 queued, 20 dropped
            front(x)
        front.offer(("facts",), 5)
        front(object())  # a failing take: counted

    assert bytes_grown(rounds, 20) < 20_000


def test_a_dropped_capture_is_collected_with_its_taker_and_front(tmp_path):
    """The C taker's fallback is a method of the FactsTaker that holds the taker, and the front holds the
    taker: cycles only the collector frees, so both C types take part in collections."""
    import weakref

    if _take is None:
        pytest.fail(_MISSING)
    codec = Codec()
    facts = FactsTaker(codec)
    assert isinstance(facts.take, _take.Taker)
    for x in replayed(codec)[:20]:
        facts.take(x)  # SCANs kept per api
    gone = weakref.ref(facts)
    del facts
    gc.collect()
    assert gone() is None

    class Holder:  # what an observer with a method as on_error would be
        def log(self, exc):
            pass

    holder = Holder()
    holder.front = queue_front(collections.deque(), 10, 1000, (1, 5), lambda: None, FactsTaker(codec).take,
                               holder.log)
    assert isinstance(holder.front, _take.QueueFront)
    gone = weakref.ref(holder)
    del holder
    gc.collect()
    assert gone() is None
