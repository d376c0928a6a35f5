"""The time a lost worker's arrivals pass to others is the one run.json names, to the µs."""

import numpy as np

from loadgen.runtime.accounting import TAKEOVER_LEAD_S, handover_s


def test_the_handover_is_on_a_whole_millisecond_at_least_the_lead_away() -> None:
    rng = np.random.default_rng(7)
    for now_s in [0.0, 5.2230004, 5.2235, 5.22351, *rng.uniform(0, 3600, 2000)]:
        t = handover_s(float(now_s))
        # What run.json says (three decimals) is the cut itself, not a neighbour of it.
        assert round(t, 3) == t
        assert now_s + TAKEOVER_LEAD_S <= t < now_s + TAKEOVER_LEAD_S + 0.001 + 1e-9


def test_every_arrival_sent_after_the_handover_is_scheduled_at_or_after_the_time_run_json_names() -> None:
    # An arrival just after the cut, its schedule recorded in whole µs as a worker does
    # (loadgen.engine.session): it is never before the published arrivals_from_s. Rounded to the
    # nearest ms (as it once was) the published time could be up to 0.5 ms after such an arrival.
    rng = np.random.default_rng(11)
    for now_s in rng.uniform(0, 600, 5000):
        cut = handover_s(float(now_s))
        offset_s = cut + float(rng.uniform(0, 0.0005))
        t_sched_us = int(offset_s * 1e9) // 1000
        assert t_sched_us / 1e6 >= cut
