"""The app as N Streamlit replicas behind one HAProxy with sticky sessions (docs/deployment.md).

    python serve/replicas.py --replicas 2 [--port 8501] [--address 127.0.0.1] [--first-replica-port 8601]
        [--upstream HOST:PORT ...] [--no-proxy] [--replica-address 127.0.0.1] [--run-dir DIR] [--audit-dir DIR]
    python serve/replicas.py --stop [--port 8501]       # stops the one started with that --port

Replicas run `streamlit run app.py` with make run's environment (offline, two malloc arenas), one shared cookie
secret, and torch's threads split among them; every replica reads the models from the same on-disk cache
(TRANSFORMER_SYMMETRY_CACHE, else the user's). HAProxy listens on --address:--port and sends each browser to one
replica (local ones, and --upstream replicas on other hosts), keeping it there by a cookie. The filled-in config,
logs and state.json (pids, ports) go to the run directory. Ctrl-C or SIGTERM stops the proxy, then the replicas;
if any of them exits on its own, everything stops and the exit status is 1.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perm_core.run.malloc import SERVER_ENVIRONMENT  # noqa: E402

TEMPLATE = Path(__file__).with_name("haproxy.cfg.template")
HEALTHY_WITHIN_S = 300  # a replica imports torch and transformers; on two busy cores that takes a while
STOP_WITHIN_S = 120  # a replica with TSE_WEIGHTS_HASH_FILE hashes every model it loaded before it exits
PR_SET_PDEATHSIG = 1
STOPPING: list[int] = []  # the signals received: the supervisor stops at the next look


def default_run_dir(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"tse-serve-{port}"


def bound_port(log_text: str) -> int | None:
    """The port a Streamlit server says it bound ("... server started on ADDRESS:PORT"); None until it has. A
    replica started on port 0 gets a free one from the kernel as it binds: no port chosen beforehand can be taken
    by another process in between."""
    found = re.search(r"server started on \S+:(\d+)", log_text)
    return int(found.group(1)) if found else None


def wait_bound_port(process: subprocess.Popen, log: Path) -> int:
    deadline = time.time() + HEALTHY_WITHIN_S
    while time.time() < deadline and not STOPPING:
        port = bound_port(log.read_text())
        if port is not None:
            return port
        if process.poll() is not None:
            raise SystemExit(f"{log.name}: exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise SystemExit("stopped" if STOPPING else f"{log.name}: no port bound within {HEALTHY_WITHIN_S} s")


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise SystemExit("HAProxy is not installed: make serve installs Debian's (apt-get install haproxy)")
    return found


def _die_with_parent() -> None:
    """In the child: SIGTERM when the supervisor dies, however it dies (children run in their own session, so a
    terminal's Ctrl-C reaches the supervisor only, which stops them in order)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)


def replica_environment(count: int, cookie_secret: str, audit_dir: Path | None, name: str) -> dict:
    # One secret for all (the caller's, to share it with other hosts): a browser moved to another replica (its own
    # went down) keeps a valid XSRF token.
    env = {"STREAMLIT_SERVER_COOKIE_SECRET": cookie_secret, **os.environ, "HF_HUB_OFFLINE": "1", **SERVER_ENVIRONMENT}
    # torch's intra-op threads: the host's cores shared among the local replicas, unless the caller chose.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // count)))
    if audit_dir is not None:  # ui/runtime/weights_audit.py, ui/runtime/memory_audit.py: one file per replica
        env["TSE_WEIGHTS_HASH_FILE"] = str(audit_dir / f"weights-{name}.json")
        env["TSE_MEMORY_AUDIT_FILE"] = str(audit_dir / f"memory-{name}.json")
    return env


def wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + HEALTHY_WITHIN_S
    while time.time() < deadline and not STOPPING:
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
            return
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"{log.name}: exited with {process.returncode}:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.5)
    raise SystemExit("stopped" if STOPPING else f"{url} did not become healthy within {HEALTHY_WITHIN_S} s ({log})")


def write_config(run_dir: Path, bind: str, upstreams: list[tuple[str, str]]) -> Path:
    servers = "\n".join(f"    server {name} {address} check inter 2s fall 3 rise 2 cookie {name}"
                        for name, address in upstreams)
    text = string.Template(TEMPLATE.read_text()).substitute(
        bind=bind, stats_socket=run_dir / "haproxy.sock", servers=servers)
    config = run_dir / "haproxy.cfg"
    config.write_text(text)
    return config


def stop_all(proxy: subprocess.Popen | None, replicas: list[subprocess.Popen]) -> None:
    """The proxy first (no new requests), then every replica at once, each given STOP_WITHIN_S to exit."""
    if proxy is not None and proxy.poll() is None:
        proxy.terminate()
        proxy.wait(timeout=10)
    for process in replicas:
        if process.poll() is None:
            process.terminate()
    for process in replicas:
        try:
            process.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve(args) -> int:
    run_dir = args.run_dir or default_run_dir(args.port)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "state.json").unlink(missing_ok=True)
    if args.audit_dir:
        args.audit_dir.mkdir(parents=True, exist_ok=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _: STOPPING.append(signum))
    cookie_secret, replicas, processes, proxy = secrets.token_hex(32), [], [], None
    try:
        for index in range(args.replicas):
            name = f"r{index}"
            port = args.first_replica_port + index if args.first_replica_port else 0
            log = run_dir / f"replica-{name}.log"
            cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.address",
                   args.replica_address, "--server.port", str(port), "--server.headless", "true",
                   "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
            process = start(cmd, log, replica_environment(args.replicas, cookie_secret, args.audit_dir, name))
            processes.append(process)
            replicas.append({"name": name, "pid": process.pid, "port": port, "log": str(log)})
        for replica, process in zip(replicas, processes, strict=True):
            replica["port"] = replica["port"] or wait_bound_port(process, Path(replica["log"]))
            replica["url"] = f"http://{args.replica_address}:{replica['port']}"
            wait_healthy(replica["url"], process, Path(replica["log"]))
        state = {"supervisor_pid": os.getpid(), "replicas": replicas, "upstreams": args.upstream}
        if not args.no_proxy:
            upstreams = [(r["name"], f"{args.replica_address}:{r['port']}") for r in replicas]
            upstreams += [(f"u{i}", address) for i, address in enumerate(args.upstream)]
            config = write_config(run_dir, f"{args.address}:{args.port}", upstreams)
            proxy_log = run_dir / "haproxy.log"
            proxy = start([haproxy_binary(), "-db", "-f", str(config)], proxy_log)
            url = f"http://{args.address}:{args.port}"
            wait_healthy(url, proxy, proxy_log)
            state.update(url=url, proxy={"pid": proxy.pid, "config": str(config), "log": str(proxy_log),
                                         "stats_socket": str(run_dir / "haproxy.sock")})
        (run_dir / "state.tmp").write_text(json.dumps(state, indent=2))
        (run_dir / "state.tmp").rename(run_dir / "state.json")
        where = state.get("url", "replicas only, no proxy")
        print(f"serving {where}: {len(replicas)} replicas ({', '.join(r['url'] for r in replicas)})"
              f"{' + ' + ', '.join(args.upstream) if args.upstream else ''}; logs in {run_dir}; Ctrl-C stops",
              flush=True)
        while not STOPPING:
            named = [("haproxy", proxy), *((r["name"], p) for r, p in zip(replicas, processes, strict=True))]
            exited = [(name, p.returncode) for name, p in named if p is not None and p.poll() is not None]
            if exited:
                print(f"{exited[0][0]} exited with {exited[0][1]}: stopping everything", flush=True)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not interrupt the stopping
        stop_all(proxy, processes)
        (run_dir / "state.json").unlink(missing_ok=True)


def stop(args) -> int:
    state_file = (args.run_dir or default_run_dir(args.port)) / "state.json"
    if not state_file.exists():
        print(f"nothing to stop: no {state_file}")
        return 0
    pid = json.loads(state_file.read_text())["supervisor_pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + STOP_WITHIN_S + 20
    while time.time() < deadline and state_file.exists():
        time.sleep(0.5)
    return 0 if not state_file.exists() else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2, help="Streamlit replicas on this host")
    parser.add_argument("--port", type=int, default=8501, help="the proxy's port: the one address students open")
    parser.add_argument("--address", default="127.0.0.1", help="the proxy's address (0.0.0.0: every interface)")
    parser.add_argument("--first-replica-port", type=int, default=0,
                        help="replica i listens on this + i (0: free ports chosen by the system)")
    parser.add_argument("--replica-address", default="127.0.0.1",
                        help="where replicas listen: loopback behind a local proxy, else an address the proxy reaches")
    parser.add_argument("--upstream", action="append", default=[], metavar="HOST:PORT",
                        help="a replica on another host, also behind the proxy (repeatable)")
    parser.add_argument("--no-proxy", action="store_true", help="replicas only, for a proxy on another host")
    parser.add_argument("--run-dir", type=Path, help="config, logs and state.json (default: TMPDIR/tse-serve-PORT)")
    parser.add_argument("--audit-dir", type=Path, help="each replica's weights and memory audit files (benchmarks)")
    parser.add_argument("--stop", action="store_true", help="stop the replicas and proxy started with this --port")
    args = parser.parse_args(argv)
    if args.stop:
        return stop(args)
    if args.replicas < 1 and not args.upstream:
        parser.error("nothing to serve: --replicas 0 and no --upstream")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
