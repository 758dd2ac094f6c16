"""The shared event queue: time order, then rank, then push order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from energyopt.sim.events import EventQueue


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.integers(min_value=0, max_value=3)),
        max_size=40,
    )
)
def test_events_pop_in_time_then_rank_then_push_order(pushes: list[tuple[float, int]]) -> None:
    queue: EventQueue[int] = EventQueue()
    for i, (t, rank) in enumerate(pushes):
        queue.push(t, i, rank=rank)
    assert len(queue) == len(pushes)
    popped = []
    while queue:
        assert queue.next_time() == min(
            t for t, _ in (pushes[i] for i in range(len(pushes)) if i not in popped)
        )
        t, i = queue.pop()
        assert t == pushes[i][0]
        popped.append(i)
    expected = sorted(range(len(pushes)), key=lambda i: (pushes[i][0], pushes[i][1], i))
    assert popped == expected
    assert queue.next_time() == float("inf")
