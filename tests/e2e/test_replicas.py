"""The small classroom through HAProxy in front of two replicas, as `make serve REPLICAS=2` starts them
(serve/replicas.py): 3 sessions for 10 s of key changes, then Check and Rotation. No errors on any page or in
either replica's log, every model's weights hash as before in each replica and in a fresh process, and both
replicas served students: the proxy's cookie put students on each, each replica's own weights audit lists the
models its sessions loaded, and the proxy counted connections to each. Timings are not asserted.
"""

from tests.e2e.test_classroom import run_classroom


def test_three_students_through_the_proxy_on_two_replicas(tmp_path):
    figures = run_classroom(tmp_path, "--replicas", "2", "--sessions", "3", "--seconds", "10", "--samples", "0")
    assert figures["replicas"] == 2 and figures["finished_sessions"] == 3
    assert set(figures["students_by_replica"]) == {"r0", "r1"}, figures["students_by_replica"]
    audited_by = {label.rsplit("@", 1)[1] for label in figures["weights"]}
    assert audited_by == {"r0", "r1"}, figures["weights"]
    assert figures["proxy_sessions"]["r0"] > 0 and figures["proxy_sessions"]["r1"] > 0, figures["proxy_sessions"]
    memory = figures["memory"]
    assert set(memory["replicas"]) == {"r0", "r1"}
    assert memory["server_peak_rss_bytes"] == sum(r["peak_rss_bytes"] for r in memory["replicas"].values())
    assert all(r["peak_rss_bytes"] > r["weights_bytes"] > 0 for r in memory["replicas"].values())
