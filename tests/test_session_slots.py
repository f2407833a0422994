"""Admission of episodes to a generator: slots kept across turns, FIFO waiting, release and idle expiry."""
from __future__ import annotations

import asyncio

import pytest

from actors.session_slots import SessionSlots


def test_sessions_keep_their_slot_and_new_ones_wait_in_order():
    async def main():
        slots = SessionSlots(capacity=2, idle_s=60)
        order = []
        await slots.acquire("a")
        slots.done("a")
        await slots.acquire("b")
        slots.done("b")
        assert slots.active == 2

        async def newcomer(name):
            await slots.acquire(name)
            order.append(name)

        waiting = [asyncio.ensure_future(newcomer(n)) for n in ("c", "d")]
        await asyncio.sleep(0.05)
        assert slots.waiting == 2 and order == []
        await slots.acquire("a")  # a holder's next turn never queues
        slots.done("a")
        assert slots.release("b")
        await asyncio.sleep(0.05)
        assert order == ["c"] and slots.waiting == 1
        slots.release("a")
        await asyncio.gather(*waiting)
        assert order == ["c", "d"] and slots.active == 2
        assert not slots.release("nobody")

    asyncio.run(main())


def test_idle_sessions_lose_their_slot_but_busy_ones_do_not():
    async def main():
        slots = SessionSlots(capacity=1, idle_s=0.2)
        await slots.acquire("busy")  # a request in flight for longer than idle_s
        newcomer = asyncio.ensure_future(slots.acquire("new"))
        await asyncio.sleep(0.5)
        assert not newcomer.done()  # a session with a request in flight is never expired
        slots.done("busy")  # now idle; expires after idle_s
        await asyncio.wait_for(newcomer, 3)
        assert slots.expired == 1 and slots.active == 1
        # The expired session queues again on its next turn.
        again = asyncio.ensure_future(slots.acquire("busy"))
        await asyncio.sleep(0.05)
        assert not again.done()
        slots.done("new")
        slots.release("new")
        await asyncio.wait_for(again, 1)

    asyncio.run(main())


def test_a_cancelled_waiter_gives_nothing_away():
    async def main():
        slots = SessionSlots(capacity=1, idle_s=60)
        await slots.acquire("a")
        waiter = asyncio.ensure_future(slots.acquire("b"))
        await asyncio.sleep(0.02)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert slots.waiting == 0
        slots.done("a")
        slots.release("a")
        await slots.acquire("c")
        assert slots.active == 1

    asyncio.run(main())


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        SessionSlots(0, 1.0)


def test_resize_wakes_waiters_and_shrinking_keeps_holders():
    async def main():
        slots = SessionSlots(capacity=1, idle_s=60)
        await slots.acquire("a")
        waiter = asyncio.ensure_future(slots.acquire("b"))
        await asyncio.sleep(0.02)
        slots.resize(2)
        await asyncio.wait_for(waiter, 1)
        slots.resize(1)  # both keep their slots; a newcomer waits until one leaves and they fit again
        newcomer = asyncio.ensure_future(slots.acquire("c"))
        await asyncio.sleep(0.02)
        assert slots.active == 2 and not newcomer.done()
        slots.done("a")
        slots.release("a")
        await asyncio.sleep(0.02)
        assert not newcomer.done()  # 1 holder == capacity 1
        slots.done("b")
        slots.release("b")
        await asyncio.wait_for(newcomer, 1)

    asyncio.run(main())
