"""The ordering policy's parts on their own: virtual time, lifting, the bounded tenants, and
the queue's pick (the gate suite runs the policy through every backend)."""

from __future__ import annotations

from router.gate import Share
from router.gate.fair_share import MAX_TENANTS, FairQueue, Hold, VirtualTime, Waiter, holding


def test_node_time_is_charged_divided_by_the_weight() -> None:
    virtual = VirtualTime()
    virtual.charge(Share("a"), 6.0)
    virtual.charge(Share("b", weight=3.0), 6.0)
    assert virtual.of("a") == 6.0
    assert virtual.of("b") == 2.0


def test_an_idle_tenant_is_lifted_to_the_clock_and_keeps_its_debt() -> None:
    virtual = VirtualTime()
    virtual.charge(Share("idle"), 1.0)
    virtual.charge(Share("debtor"), 50.0)
    virtual.served_at(10.0)
    virtual.lift("idle")  # its second's credit is not kept against those who waited
    virtual.lift("debtor")
    assert virtual.of("idle") == 10.0
    assert virtual.of("debtor") == 50.0
    virtual.served_at(5.0)  # the clock never goes back
    assert virtual.clock == 10.0


def test_the_tenants_kept_are_bounded_and_the_biggest_debts_stay() -> None:
    virtual = VirtualTime()
    for i in range(3 * MAX_TENANTS):
        virtual.charge(Share(f"t{i}"), float(i + 1))
    assert len(virtual) <= MAX_TENANTS + 1
    assert virtual.of(f"t{3 * MAX_TENANTS - 1}") == 3 * MAX_TENANTS  # the biggest debt stays
    assert virtual.of("t0") == virtual.clock  # forgotten: at the clock


def test_a_node_held_counts_at_least_the_typical_hold() -> None:
    holds = [Hold(Share("a"), since=99.0), Hold(Share("a"), since=80.0), Hold(Share("b", 2.0), 0)]
    assert holding(holds, now=100.0, typical_s=5.0) == {"a": (2, 25.0), "b": (1, 50.0)}


def make_waiter(name: str, tenant: str, due: float, priority: float = 0.0) -> Waiter:
    return Waiter((due, int(due * 1000)), priority, Share(tenant), name)


def test_the_pick_takes_the_least_virtual_tenant_then_its_earliest_due() -> None:
    queue: FairQueue[Waiter] = FairQueue()
    for waiter in [
        make_waiter("a-late", "a", 3.0),
        make_waiter("a-soon", "a", 1.0),
        make_waiter("b-first", "b", 0.5),
    ]:
        queue.push(waiter)
    virtual = {"a": 1.0, "b": 2.0}
    picked = [w.holder for w in iter(lambda: queue.pick(lambda _: True, virtual.__getitem__), None)]
    assert picked == ["a-soon", "a-late", "b-first"]
    assert len(queue) == 0


def test_the_pick_passes_over_capped_tenants_and_given_up_waiters() -> None:
    queue: FairQueue[Waiter] = FairQueue()
    gone = make_waiter("gone", "a", 0.0, priority=9)
    capped = make_waiter("capped", "c", 0.0, priority=5)
    later = make_waiter("later", "b", 1.0)
    for waiter in (gone, capped, later):
        queue.push(waiter)
    queue.discard(gone)
    picked = queue.pick(lambda share: share.tenant != "c", lambda _: 0.0)
    assert picked is later
    assert len(queue) == 1  # the capped one waits on
    assert queue.pick(lambda _: True, lambda _: 0.0) is capped
