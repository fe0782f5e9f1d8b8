"""The bounded fan-out's Redis side, against a real redis-server: slots, handoffs, barrier."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from orchestrator.broker.redis_server import RedisServer
from orchestrator.coordination import events, fanout, keys

PHASE = fanout.FanOut("run-x", "a1", "draft")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private redis-server on a free TCP port, stopped by PID after the test."""
    with RedisServer(tcp=True) as running:
        yield running


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def test_a_phase_starts_pool_size_tickets_and_hands_on_in_order(r: redis.Redis) -> None:
    ids = [f"T-{i}" for i in range(5)]
    assert fanout.start(r, PHASE, ids, 2) == ["T-0", "T-1"]
    assert fanout.advance(r, PHASE, "T-1") == fanout.Handoff("T-2", barrier=False)
    assert fanout.advance(r, PHASE, "T-0") == fanout.Handoff("T-3", barrier=False)
    assert fanout.advance(r, PHASE, "T-3") == fanout.Handoff("T-4", barrier=False)
    assert fanout.advance(r, PHASE, "T-2") == fanout.Handoff(None, barrier=False)
    assert fanout.advance(r, PHASE, "T-4") == fanout.Handoff(None, barrier=True)


def test_start_and_advance_give_a_redelivered_task_the_same_answer(r: redis.Redis) -> None:
    ids = ["T-0", "T-1", "T-2"]
    first = fanout.start(r, PHASE, ids, 1)
    assert fanout.start(r, PHASE, ids, 1) == first == ["T-0"]
    handoff = fanout.advance(r, PHASE, "T-0")
    assert fanout.advance(r, PHASE, "T-0") == handoff == fanout.Handoff("T-1", False)
    fanout.advance(r, PHASE, "T-1")
    last = fanout.advance(r, PHASE, "T-2")
    assert last == fanout.advance(r, PHASE, "T-2") == fanout.Handoff(None, barrier=True)


def test_a_handoff_for_a_row_holds_the_next_ticket_as_hold_would(r: redis.Redis) -> None:
    """`advance(..., keep=True)` holds the next ticket for the delivery in the same round
    trip: a redelivery of that delivery holds it again, any other delivery is refused it,
    and a handoff asked for another delivery says it is not held."""
    fanout.start(r, PHASE, ["T-0", "T-1", "T-2"], 1)
    handoff = fanout.advance(r, PHASE, "T-0", "delivery-1", keep=True, ttl_s=60)
    assert handoff == fanout.Handoff("T-1", barrier=False, held=True)
    assert fanout.advance(r, PHASE, "T-0", "delivery-1", keep=True, ttl_s=60) == handoff
    assert fanout.hold(r, PHASE, "T-1", "delivery-1", 60)
    assert not fanout.hold(r, PHASE, "T-1", "delivery-2", 60)
    assert fanout.advance(r, PHASE, "T-0", "delivery-2", keep=True, ttl_s=60).held is False
    assert 0 < r.ttl(_owner("T-1")) <= 60
    with pytest.raises(ValueError):
        fanout.advance(r, PHASE, "T-0", "delivery-1", keep=True)  # held for no time


def test_a_handoff_sent_by_message_lets_go_of_this_deliverys_hold(r: redis.Redis) -> None:
    """A copy that held its next ticket and died: its redelivery, sending that ticket a
    message instead (its worker is stopping), lets go of the hold so the message runs it;
    another delivery's hold is left alone."""
    fanout.start(r, PHASE, ["T-0", "T-1", "T-2", "T-3"], 2)
    fanout.advance(r, PHASE, "T-0", "delivery-1", keep=True, ttl_s=60)  # holds T-2
    assert fanout.advance(r, PHASE, "T-0", "delivery-1") == fanout.Handoff("T-2", False)
    assert r.get(_owner("T-2")) is None
    assert fanout.hold(r, PHASE, "T-2", "message-for-T-2", 60)
    fanout.hold(r, PHASE, "T-3", "delivery-9", 60)
    fanout.advance(r, PHASE, "T-1", "delivery-1")  # hands T-3 on, held by another
    assert r.get(_owner("T-3")) == b"delivery-9"


def _owner(ticket: str) -> str:
    return keys.owner(PHASE.run_id, PHASE.attempt, PHASE.name, ticket)


def test_an_empty_phase_starts_nothing(r: redis.Redis) -> None:
    assert fanout.start(r, PHASE, [], 4) == []


def test_every_key_of_a_phase_expires(r: redis.Redis) -> None:
    fanout.start(r, PHASE, ["T-0", "T-1", "T-2"], 1)
    fanout.advance(r, PHASE, "T-0")
    fanout.hold(r, PHASE, "T-1", "delivery-1", 60)
    events.publish(r, "run-x", "node_end", node="route")
    names = [k.decode() for k in r.keys("*")]
    assert names and all(r.ttl(k) > 0 for k in names), {k: r.ttl(k) for k in names}


def test_a_ticket_is_held_by_one_delivery(r: redis.Redis) -> None:
    assert fanout.hold(r, PHASE, "T-0", "delivery-1", 60)
    assert fanout.hold(r, PHASE, "T-0", "delivery-1", 60)  # the same message, redelivered
    assert not fanout.hold(r, PHASE, "T-0", "delivery-2", 60)  # a duplicate message


def test_events_arrive_in_order_through_a_blocking_read(r: redis.Redis) -> None:
    assert events.next_event(r, "run-x", 0.05) is None
    events.publish(r, "run-x", "node_end", node="route")
    events.publish(r, "run-x", "run_end", exit_code=1)
    assert events.next_event(r, "run-x", 1) == {"event": "node_end", "node": "route"}
    assert events.next_event(r, "run-x", 1) == {"event": "run_end", "exit_code": 1}


def _slot_holder(port: int, seed: int, results: multiprocessing.Queue) -> None:
    """Finish tickets as they come: pop a started ticket, advance it, queue what it hands on."""
    client = redis.Redis(port=port)
    rng = random.Random(seed)
    while (item := client.lpop("test:running")) is not None:
        ticket = item.decode()
        handoff = fanout.advance(client, PHASE, ticket)
        if rng.random() < 0.2:  # a redelivery: the same question, the same answer
            assert fanout.advance(client, PHASE, ticket) == handoff
        results.put((ticket, handoff.next_ticket, handoff.barrier))
        if handoff.next_ticket is not None:
            client.rpush("test:running", handoff.next_ticket)


def test_racing_processes_hand_each_ticket_out_once_and_fire_the_barrier_once(
    server: RedisServer, r: redis.Redis
) -> None:
    ids = [f"T-{i:03d}" for i in range(300)]
    pool = 8
    first = fanout.start(r, PHASE, ids, pool)
    r.rpush("test:running", *first)
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_slot_holder, args=(server.port, seed, results)) for seed in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    finished = [results.get(timeout=5) for _ in ids]
    handed = [nxt for _t, nxt, _b in finished if nxt is not None]
    assert sorted(t for t, _n, _b in finished) == ids  # every ticket finished exactly once
    assert sorted(first + handed) == ids  # and was started exactly once
    assert [b for _t, _n, b in finished].count(True) == 1


def test_a_sweep_finds_what_was_sent_and_never_taken(r: redis.Redis) -> None:
    """T-0 was taken (held) and T-1 finished; T-2 was sent and never taken: lost. Once every
    ticket is done, a barrier that nobody took is lost too; a taken one is not."""
    assert fanout.start(r, PHASE, ["T-0", "T-1", "T-2"], 3) == ["T-0", "T-1", "T-2"]
    assert fanout.sweep(r, PHASE, 3600) == fanout.Lost([], barrier=False)  # too recent
    assert fanout.hold(r, PHASE, "T-0", "d0", 60)
    fanout.advance(r, PHASE, "T-1")
    assert fanout.sweep(r, PHASE, 0) == fanout.Lost(["T-2"], barrier=False)
    fanout.advance(r, PHASE, "T-0")
    fanout.advance(r, PHASE, "T-2")
    assert fanout.sweep(r, PHASE, 0) == fanout.Lost([], barrier=True)
    fanout.take_barrier(r, PHASE)
    assert fanout.sweep(r, PHASE, 0) == fanout.Lost([], barrier=False)


def test_a_restarted_broker_without_its_data_is_noticed_not_fired(r: redis.Redis) -> None:
    """After FLUSHALL (a restart without persistence) a finishing ticket must not fire the
    barrier as if it were the last: the phase is reported lost."""
    fanout.start(r, PHASE, ["T-0", "T-1"], 2)
    r.flushall()
    assert fanout.advance(r, PHASE, "T-0") == fanout.Handoff(None, False, lost=True)


def test_a_process_client_serves_as_many_threads_as_call_at_once(server: RedisServer) -> None:
    """150 threads each in a blocking call at the same moment (a worker process at pool 512
    has 256): every one gets a connection of the process's one client; none is refused."""
    client = keys.client(server.url)
    assert client is keys.client(server.url)  # one per broker URL in a process
    failed: list[BaseException] = []
    got: list[object] = []

    def wait_on_the_broker() -> None:
        try:
            got.append(client.blpop(["tg:test:release"], timeout=60))
        except BaseException as exc:  # collected for the assertion
            failed.append(exc)

    threads = [threading.Thread(target=wait_on_the_broker) for _ in range(150)]
    for thread in threads:
        thread.start()
    # All 150 are blocked in Redis at once before any is let go: Redis counts them.
    watcher = server.client()
    deadline = time.monotonic() + 30
    blocked = 0
    while blocked < 150 and time.monotonic() < deadline and not failed:
        blocked = int(watcher.info("clients")["blocked_clients"])
        time.sleep(0.05)
    watcher.rpush("tg:test:release", *range(150))
    for thread in threads:
        thread.join(30)
    watcher.close()
    assert failed == []
    assert blocked == 150
    assert len(got) == 150 and None not in got
