"""benchmarks/classroom.py's figures: latency percentiles against the goals, throughput, memory against its bound
per server (one, or each replica), weights unchanged, and whether the run is OK."""

from __future__ import annotations

import bisect
import math
from collections import Counter

from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL

# A key change's p95 goal, by pace: issue 32's for a classroom; the earlier goals at saturation (10 s if not named)
GOALS_P95_S = {"classroom": {DEFAULT_IMAGE_MODEL: 3.0, DEFAULT_PHOTO_MODEL: 6.0, DEFAULT_TEXT_MODEL: 6.0},
               "saturation": {DEFAULT_IMAGE_MODEL: 5.0}}
OTHER_GOAL_P95_S = 10.0
SESSION_BYTES = 24 << 20  # issue 32's memory bound: 2x the loaded float32 weights + 1 GiB + this per session


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def model_label(label: str) -> str:
    """"name/dtype" of a server's audit label ("name/dtype@replica" when replicas each hashed theirs)."""
    return label.split("@", 1)[0]


def replica_of(label: str) -> str:
    return label.split("@", 1)[1] if "@" in label else "server"


def _at(timeline: list[tuple[float, float]], moment: float) -> float:
    """The CPU seconds used by `moment`, interpolated between samples (clamped to the first and last)."""
    times = [t for t, _ in timeline]
    i = bisect.bisect_left(times, moment)
    if i == 0 or i == len(timeline):
        return timeline[min(i, len(timeline) - 1)][1]
    (t0, c0), (t1, c1) = timeline[i - 1], timeline[i]
    return c0 + (c1 - c0) * (moment - t0) / (t1 - t0) if t1 > t0 else c1


def throughput(records: list, cpu_timeline: list) -> dict:
    """Key changes per second (all, and per model) from the first one's start to the last one's end, and per
    CPU-second the servers (every replica) used in that window; the window also holds what sessions did around
    their key changes at its edges (opening Explore before, Check and Rotation after)."""
    changes = [r for r in records if r["interaction"] == "key change"]
    if not changes or len(cpu_timeline) < 2:
        return {}
    start, end = min(r["ended"] - r["seconds"] for r in changes), max(r["ended"] for r in changes)
    window, cpu = max(end - start, 1e-9), _at(cpu_timeline, end) - _at(cpu_timeline, start)
    return {"window_s": round(window, 1), "key_changes": len(changes), "per_second": round(len(changes) / window, 3),
            "per_model_per_second": {m: round(n / window, 3) for m, n in sorted(Counter(r["model"] for r in changes)
                                                                                  .items())},
            "server_cpu_seconds": round(cpu, 1), "per_server_cpu_second": round(len(changes) / cpu, 3) if cpu else None}


def memory_bounds(memory: dict, in_server: dict, weight_bytes: dict, students: Counter) -> dict:
    """Each server's peak against issue 32's bound: 2x the float32 weights of the models it loaded + 1 GiB +
    SESSION_BYTES per student it served; replicas are held to the sums over them (each replica's own for
    information: students are not spread evenly)."""
    servers = {}
    for name, peak in memory["replicas"].items():
        weights = sum(weight_bytes.get(model_label(label), 0) for label in in_server if replica_of(label) == name)
        bound = 2 * weights + 2**30 + SESSION_BYTES * students[name]
        servers[name] = {"peak_rss_bytes": peak, "weights_bytes": weights, "students": students[name],
                         "bound_bytes": bound, "within": peak <= bound}
    total_bound = sum(s["bound_bytes"] for s in servers.values())
    return {**memory, "replicas": servers, "bound_bytes": total_bound,
            "loaded_float32_weights_bytes": sum(s["weights_bytes"] for s in servers.values()),
            "within_bound": memory["server_peak_rss_bytes"] <= total_bound}


def summarize(args, sessions, records, measured, fresh, weight_bytes, same) -> dict:
    """measured: the servers' "memory", "server_errors", "cpu_timeline" and the weights they hashed ("in_server")."""
    latency = {}
    for record in records:
        latency.setdefault(record["model"], {}).setdefault(record["interaction"], []).append(record["seconds"])
    table = [{"model": model, "interaction": what, "n": len(values), "p50_s": round(percentile(values, 50), 2),
              "p95_s": round(percentile(values, 95), 2), "max_s": round(max(values), 2)}
             for model, by_what in sorted(latency.items()) for what, values in by_what.items()]
    goal_of = GOALS_P95_S[args.pace]
    goals = {row["model"]: {"p95_s": row["p95_s"], "goal_s": goal_of.get(row["model"], OTHER_GOAL_P95_S),
                            "met": row["p95_s"] <= goal_of.get(row["model"], OTHER_GOAL_P95_S)}
             for row in table if row["interaction"] == "key change"}
    errors = [f"session {s['session']} ({s['model']}): {e}" for s in sessions for e in s["errors"]]
    errors += [f"server log: {e}" for e in measured["server_errors"]]
    hashes = {label: {"loaded": h.get("loaded"), "at_exit": h.get("at_exit"),
                      "fresh_process": fresh.get(model_label(label))} for label, h in measured["in_server"].items()}
    unchanged = bool(hashes) and all(len({*h.values()}) == 1 and None not in h.values() for h in hashes.values())
    students = Counter(s.get("replica") or "server" for s in sessions)
    finished = sum("rotation" in s for s in sessions)
    replayed_same = all(v["same"] for v in same) and (bool(same) or args.samples == 0)
    return {"sessions": args.sessions, "seconds": args.seconds, "pace": args.pace, "replicas": args.replicas,
            "finished_sessions": finished, "latency": table, "key_change_goals": goals,
            "throughput": throughput(records, measured["cpu_timeline"]), "errors": errors,
            "memory": memory_bounds(measured["memory"], measured["in_server"], weight_bytes, students),
            "students_by_replica": dict(sorted(students.items())), "proxy_sessions": measured.get("proxy_sessions", {}),
            "weights": hashes, "weights_unchanged": unchanged,
            "same_as_alone": same, "all_same_as_alone": bool(same) and replayed_same,
            "ok": not errors and unchanged and finished == args.sessions and replayed_same}
