"""KIP-13's arithmetic (coordinator/quota_manager.py), on a simulated clock: a client over its
quota is delayed by (bytes in the window − quota × window) ÷ quota, so that a client that
waits as told runs at its quota; one without a quota is never delayed; a changed quota counts
at the next request; the empty client id shares the default entity's quota."""
from __future__ import annotations

import pytest

from pyspark_kafkalog.cluster.quotas import FETCH, PRODUCE, quota_for
from pyspark_kafkalog.coordinator.quota_manager import QuotaManager


def run(m, client, rate_wanted, seconds, chunk=10_000, kind=PRODUCE):
    """A client sending ``chunk`` bytes at a time as fast as ``rate_wanted`` allows, obeying
    every delay; returns its measured rate and total throttle."""
    now, sent, throttled = 0.0, 0, 0.0
    while now < seconds:
        delay = m.record(client, kind, chunk, now)
        sent += chunk
        now += chunk / rate_wanted + delay
        throttled += delay
    return sent / now, throttled


@pytest.mark.parametrize("quota", [50_000.0, 1_000_000.0])
def test_a_client_that_obeys_runs_at_its_quota(quota):
    quotas = {"a": {"producer_byte_rate": str(quota)}}
    m = QuotaManager(lambda c, k: quota_for(quotas, c, k))
    # 600 s: the burst a fresh client may make ((num - 1) windows, and as much again each time
    # a burst leaves the 11 s window) is 1/6 of a 60 s run, under 2% of this one
    rate, throttled = run(m, "a", rate_wanted=quota * 10, seconds=600, chunk=int(quota / 20))
    assert rate == pytest.approx(quota, rel=0.05) and throttled > 0
    top, avg, n = m.throttle_stats("a", PRODUCE)
    assert 0 < avg < top and n > 1
    rate_b, throttled_b = run(m, "b", rate_wanted=quota * 10, seconds=20)   # no quota
    assert throttled_b == 0 and rate_b == pytest.approx(quota * 10, rel=0.01)


def test_the_first_burst_is_judged_over_the_whole_window_and_excess_waits_at_the_quota():
    m = QuotaManager(lambda c, k: 1000.0, window_num=11, window_size_s=1.0)
    assert m.record("a", PRODUCE, 9_000, 0.0) == 0.0          # 9,000 B within 10 s x 1,000 B/s
    # 12,000 B over Kafka's Rate.windowSize: the 10 whole windows short of num - 1, plus the
    # current window's 0.1 s so far: 1,900 B too many
    assert m.record("a", PRODUCE, 3_000, 0.1) == pytest.approx(1.9)


def test_a_changed_quota_counts_at_the_next_request():
    quotas = {"a": {"producer_byte_rate": "1000"}}
    m = QuotaManager(lambda c, k: quota_for(quotas, c, k))
    assert m.record("a", PRODUCE, 20_000, 0.0) > 0
    quotas["a"]["producer_byte_rate"] = "1000000"
    assert m.record("a", PRODUCE, 1, 0.1) == 0.0
    del quotas["a"]
    assert m.record("a", PRODUCE, 10**9, 0.2) == 0.0


def test_old_windows_are_forgotten():
    m = QuotaManager(lambda c, k: 1000.0, window_num=3, window_size_s=1.0)
    assert m.record("a", PRODUCE, 5_000, 0.0) > 0
    assert m.record("a", PRODUCE, 100, 10.0) == 0.0            # the burst left the window
    assert m.rate("a", PRODUCE, 10.0) == pytest.approx(50.0)


def test_the_empty_client_id_shares_the_default():
    quotas = {"<default>": {"producer_byte_rate": "1000"}, "x": {"producer_byte_rate": "1e9"}}
    m = QuotaManager(lambda c, k: quota_for(quotas, c, k))
    assert m.record("", PRODUCE, 50_000, 0.0) > 0
    assert m.record("x", PRODUCE, 50_000, 0.0) == 0.0
    with pytest.raises(ValueError):
        QuotaManager(lambda c, k: None, window_num=1)


@pytest.mark.parametrize("tasks", [1, 2, 4])
def test_concurrent_tasks_of_one_client_id_share_its_quota(tasks):
    """Tasks of one job report 1 MB fetches at once and each waits what it is told: together
    they run at the quota. (Bytes counted on arrival let each task's request in flight escape
    the window: 4 tasks ran at 1.25 x.)"""
    import heapq
    quota, chunk = 4e6, 1 << 20
    m = QuotaManager(lambda c, k: quota, window_num=2, window_size_s=1.0)
    events = [(i * 0.01, i) for i in range(tasks)]
    sent, end = [], 0.0
    while events:
        now, i = heapq.heappop(events)
        now += 0.02                                   # reading the fetch
        delay = m.record("job", FETCH, chunk, now)
        sent.append(now)
        end = max(end, now + delay)
        if now < 20:
            heapq.heappush(events, (now + delay, i))
    settled = [t for t in sent if t >= 3.0]           # after the first window's burst
    rate = len(settled) * chunk / (end - settled[0])
    assert rate == pytest.approx(quota, rel=0.10)


def test_client_ids_without_a_request_for_an_hour_are_forgotten():
    """As Kafka's quota sensors expire: a coordinator runs for weeks, and client ids may be
    made per job, so their samples and throttle stats must not pile up."""
    m = QuotaManager(lambda c, k: 1000.0, window_num=2, window_size_s=1.0)
    assert m.inactive_expiry_s == 3600.0
    assert m.record("old", PRODUCE, 50_000, 0.0) > 0
    assert m.record("busy", PRODUCE, 10, 0.0) == 0.0
    for t in range(600, 3600, 600):   # "busy" keeps asking, "old" never again
        m.record("busy", PRODUCE, 10, float(t))
    assert ("old", PRODUCE) in m.clients() and m.throttle_stats("old", PRODUCE)[2] == 1
    m.record("busy", PRODUCE, 10, 3600.0)
    assert m.clients() == [("busy", PRODUCE)]
    assert m.throttle_stats("old", PRODUCE) == (0.0, 0.0, 0)
    assert m.throttle_stats("busy", PRODUCE)[2] == 7
    # asking about a client id (ClientUsage, the metrics) does not make it one
    assert m.rate("nobody", PRODUCE, 3600.0) == 0.0 and ("nobody", PRODUCE) not in m.clients()
    # a forgotten client id starts afresh, with a new window (its old bytes are gone)
    assert m.record("old", PRODUCE, 500, 3601.0) == 0.0
    # never shorter than the quota window itself
    assert QuotaManager(lambda c, k: 1.0, window_num=11, window_size_s=1000.0,
                        inactive_expiry_s=1.0).inactive_expiry_s == 11_000.0
