"""actors/seat_pool.py: engine seats by group age, with a hold for an episode's next turn (pure asyncio)."""
from __future__ import annotations

import asyncio

import pytest

from actors.seat_pool import SeatPool


async def take(pool: SeatPool, session: str, priority: int, order: list[str]) -> None:
    await pool.acquire(session, priority)
    order.append(session)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(coro)


def test_waiting_requests_are_served_oldest_group_first_then_by_arrival():
    async def main():
        pool, order = SeatPool(2, hold_s=0.0), []
        await take(pool, "a", 5, order)
        await take(pool, "b", 5, order)
        waiters = [asyncio.ensure_future(take(pool, s, p, order)) for s, p in
                   (("new", 9), ("old-1", 1), ("old-2", 1), ("oldest", 0))]
        await settle()
        assert pool.in_use == 2 and pool.waiting == 4
        for session in ("a", "b", "oldest", "old-1"):
            pool.release(session, 5)
            await settle()
        await asyncio.gather(*waiters)
        return order, pool

    order, pool = run(main())
    assert order == ["a", "b", "oldest", "old-1", "old-2", "new"]
    assert pool.in_use == 2


def test_a_freed_seat_waits_for_the_episodes_next_turn_not_a_newer_group():
    async def main():
        pool, order = SeatPool(1, hold_s=30.0), []
        await take(pool, "ep", 1, order)
        newer = asyncio.ensure_future(take(pool, "newer", 9, order))
        await settle()
        pool.release("ep", 1)  # the env steps; the newer group's turn must not take the seat meanwhile
        await settle()
        assert order == ["ep"] and pool.held == 1 and not newer.done()
        await take(pool, "ep", 1, order)  # the next turn: the held seat, at once
        assert pool.held_turns == 1 and pool.held == 0
        pool.release("ep", 1)
        pool.end("ep")  # the episode ended: its hold goes, the newer group's turn gets the seat
        await asyncio.wait_for(newer, 1)
        return order, pool

    order, pool = run(main())
    assert order == ["ep", "ep", "newer"]
    assert pool.in_use == 1 and pool.held == 0


def test_a_hold_serves_an_older_group_but_not_a_newer_one():
    async def main():
        pool, order = SeatPool(1, hold_s=30.0), []
        await take(pool, "mid", 5, order)
        pool.release("mid", 5)
        newer = asyncio.ensure_future(take(pool, "newer", 6, order))
        await settle()
        assert not newer.done(), "a newer group's turn took a seat held for an older group"
        await asyncio.wait_for(take(pool, "older", 2, order), 1)  # older than the holder: takes it
        newer.cancel()
        return order, pool

    order, pool = run(main())
    assert order == ["mid", "older"] and pool.held_turns == 1


def test_a_hold_expires_after_hold_s_and_the_seat_goes_to_the_waiting_turn():
    async def main():
        pool, order = SeatPool(1, hold_s=0.2), []
        await take(pool, "ep", 1, order)
        pool.release("ep", 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(take(pool, "newer", 9, order), 5)
        return loop.time() - started, pool

    waited, pool = run(main())
    assert 0.15 <= waited < 2.0
    assert pool.in_use == 1 and pool.held == 0 and pool.wait_s >= 0.15


def test_a_seat_goes_straight_to_a_waiting_turn_at_least_as_old_without_a_hold():
    async def main():
        pool, order = SeatPool(1, hold_s=30.0), []
        await take(pool, "new", 9, order)
        older = asyncio.ensure_future(take(pool, "older", 3, order))
        await settle()
        pool.release("new", 9)
        await asyncio.wait_for(older, 1)
        return order, pool

    order, pool = run(main())
    assert order == ["new", "older"] and pool.held == 0 and pool.in_use == 1


def test_a_request_cancelled_while_waiting_takes_no_seat():
    async def main():
        pool, order = SeatPool(1, hold_s=0.0), []
        await take(pool, "a", 1, order)
        gone = asyncio.ensure_future(take(pool, "gone", 0, order))
        stays = asyncio.ensure_future(take(pool, "stays", 5, order))
        await settle()
        gone.cancel()
        await settle()
        assert pool.waiting == 1
        pool.release("a", 1)
        await asyncio.wait_for(stays, 1)
        pool.release("stays", 5)
        return order, pool

    order, pool = run(main())
    assert order == ["a", "stays"] and pool.in_use == 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="seats"):
        SeatPool(0, 1.0)
    with pytest.raises(ValueError, match="hold_s"):
        SeatPool(1, -1.0)
