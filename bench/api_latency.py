"""REST API latency under load: p50/p99 of mixed reads at a fixed request rate against the real server
(uvicorn + the app over a cache of N jobs), loopback only.

Open loop: request i is due at t0 + i/rate whatever happened before, and its latency is counted from that due
time, so a server (or client) that falls behind shows the queueing instead of hiding it (no coordinated
omission). The mix: job lists (first page, by namespace, by phase, both, later pages), job detail, events,
timeline, /healthz. Peer: the same load against a bare FastAPI/uvicorn app replaying the same bytes per URL
(bench/api_serve.py), the floor of the stack. Each round runs ours, then the peer; the headline is the median
round's p99 (a busy neighbour on a shared machine can stall one round), ratio = ours / the peer's.

    python -m bench.api_latency                   # 200 req/s, 500 jobs, 3 rounds of 20 s each (~2.5 min)
    python -m bench.api_latency --quick           # 1 round of 3 s
    python -m bench.api_latency --rate 400 --clients 2 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.api_jobs import NAMESPACES, PHASES, key
from bench.common import median, percentile, write_result

REPO = Path(__file__).resolve().parents[1]
GOAL_MS = 50.0
TOKEN = "bench-token-0123456789"
REQUEST_TIMEOUT_S = 5.0
WARMUP_S = 1.0


def workload(count: int, jobs: int, seed: int) -> list[str]:
    """`count` URLs of the read mix, the same for a given seed (so ours and the peer serve identical requests)."""
    rng, urls = random.Random(seed), []
    for _ in range(count):
        ns, name = key(rng.randrange(jobs))
        r = rng.random()
        if r < 0.08:
            url = "/v1/jobs"
        elif r < 0.14:
            url = f"/v1/jobs?namespace={rng.choice(NAMESPACES)}"
        elif r < 0.19:
            url = f"/v1/jobs?phase={rng.choice(PHASES)}"
        elif r < 0.22:
            url = f"/v1/jobs?namespace={rng.choice(NAMESPACES)}&phase={rng.choice(PHASES)}"
        elif r < 0.25:
            url = f"/v1/jobs?limit=50&offset={50 * rng.randrange(max(1, jobs // 50))}"
        elif r < 0.55:
            url = f"/v1/jobs/{ns}/{name}"
        elif r < 0.70:
            url = f"/v1/jobs/{ns}/{name}/events"
        elif r < 0.85:
            url = f"/v1/jobs/{ns}/{name}/timeline"
        else:
            url = "/healthz"
        urls.append(url)
    return urls


async def _load(base: str, urls: list[str], rate: float, start_wall: float, connections: int) -> dict[str, Any]:
    """Send urls[i] at start + i/rate (this process's share of the schedule); per request: seconds late the send
    was, latency from the due time, and the status (0 for a transport error)."""
    t0, cpu0 = time.monotonic() + (start_wall - time.time()), time.process_time()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    late, latency, status, errors = [0.0] * len(urls), [0.0] * len(urls), [0] * len(urls), []

    async def one(client: httpx.AsyncClient, i: int, due: float) -> None:
        late[i] = time.monotonic() - due
        try:
            resp = await client.get(urls[i])
            status[i] = resp.status_code if resp.content else -1
            if resp.status_code != 200:
                errors.append(f"{urls[i]}: {resp.status_code} {resp.text[:120]}")
        except httpx.HTTPError as err:
            errors.append(f"{urls[i]}: {type(err).__name__} {err}")
        latency[i] = time.monotonic() - due

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=REQUEST_TIMEOUT_S,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        tasks = []
        for i in range(len(urls)):
            due = t0 + i / rate
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(client, i, due)))
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 5)
        unfinished = sum(not t.done() for t in tasks)
        for t in tasks:
            t.cancel()
    return {"late": late, "latency": latency, "status": status, "errors": errors[:20] + [
        f"{unfinished} requests unfinished"] * bool(unfinished), "error_count": len(errors) + unfinished,
        "client_cpu_s": time.process_time() - cpu0}


def _client_main(argv: list[str]) -> int:
    """A load process (--clients > 1): its share of the URLs from stdin, results as JSON on stdout."""
    base, rate, start_wall, connections = argv[0], float(argv[1]), float(argv[2]), int(argv[3])
    urls = json.load(sys.stdin)
    json.dump(asyncio.run(_load(base, urls, rate, start_wall, connections)), sys.stdout)
    return 0


def drive(base: str, urls: list[str], rate: float, clients: int, connections: int) -> dict[str, Any]:
    """The whole schedule, split round-robin over `clients` processes (1: in this process). Client k sends
    urls[k::clients] at rate/clients, offset by k/rate, so together they keep the one schedule."""
    start = time.time() + 0.5 + 0.3 * (clients > 1)
    if clients == 1:
        return asyncio.run(_load(base, urls, rate, start, connections))
    procs = []
    for k in range(clients):
        p = subprocess.Popen([sys.executable, "-m", "bench.api_latency", "--client", base, str(rate / clients),
                              str(start + k / rate), str(max(1, connections // clients))], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        p.stdin.write(json.dumps(urls[k::clients]))  # type: ignore[union-attr]
        p.stdin.close()  # type: ignore[union-attr]
        procs.append(p)
    parts = [json.loads(p.stdout.read()) for p in procs]  # type: ignore[union-attr]
    for p in procs:
        p.wait(30)
    merged: dict[str, Any] = {"late": [], "latency": [], "status": [], "errors": [], "error_count": 0,
                              "client_cpu_s": sum(part["client_cpu_s"] for part in parts)}
    for i in range(len(urls)):  # back into schedule order, so the warm-up cut is by due time
        part, j = parts[i % clients], i // clients
        for field in ("late", "latency", "status"):
            merged[field].append(part[field][j])
    for part in parts:
        merged["errors"] += part["errors"]
        merged["error_count"] += part["error_count"]
    return merged


def _cpu_seconds(pid: int) -> float | None:
    try:  # utime + stime of the server process, in clock ticks (Linux)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _achieved_rate(late: list[float], rate: float) -> float:
    """Requests sent per second between the first and the last send (send i = due i + how late it went out)."""
    span = (len(late) - 1) / rate + late[-1] - late[0] if len(late) > 1 else 0.0
    return (len(late) - 1) / span if span > 0 else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(kind: str, jobs: int, seed: int, urls: list[str], rate: float, clients: int, connections: int,
               workdir: Path) -> dict[str, Any]:
    """Start one server, wait for it, drive the schedule, stop it; the stats of the measured part."""
    port = _free_port()
    cmd = [sys.executable, "-m", "bench.api_serve", kind, "--port", str(port), "--jobs", str(jobs), "--seed",
           str(seed), "--token-file", str(workdir / "tokens.csv"), "--urls", str(workdir / "urls.json")]
    server = subprocess.Popen(cmd, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # the peer renders every URL through our app before it serves
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} server did not start (exit {server.returncode})")
            time.sleep(0.1)
        cpu0, began, load0 = _cpu_seconds(server.pid), time.monotonic(), os.getloadavg()[0]
        raw = drive(base, urls, rate, clients, connections)
        cpu1, wall, load1 = _cpu_seconds(server.pid), time.monotonic() - began, os.getloadavg()[0]
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    skip = int(WARMUP_S * rate)  # the first second warms connections and code paths: not counted
    lat = [x * 1000 for x in raw["latency"][skip:]]
    late = [x * 1000 for x in raw["late"][skip:]]
    measured = len(urls) - skip
    return {"server": kind, "requests": measured, "errors": raw["error_count"], "error_samples": raw["errors"],
            "p50_ms": percentile(lat, 0.50), "p90_ms": percentile(lat, 0.90), "p99_ms": percentile(lat, 0.99),
            "max_ms": max(lat, default=float("nan")), "mean_ms": sum(lat) / max(1, len(lat)),
            "send_late_p99_ms": percentile(late, 0.99), "send_late_max_ms": max(late, default=float("nan")),
            "offered_rate": rate, "achieved_rate": _achieved_rate(raw["late"], rate),
            "server_cpu_ms_per_request": (cpu1 - cpu0) * 1000 / len(urls) if cpu0 is not None and cpu1 else None,
            "client_cpu_ms_per_request": raw["client_cpu_s"] * 1000 / len(urls),
            "load_average_1m": [load0, load1],  # this machine may be shared: a busy neighbour shows here
            "wall_s": wall, "latencies_ms": lat}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """The headline is the median round's p99 (and p50): a neighbour's burst on a shared machine stalls one
    round, and the median keeps that from deciding the result; `pooled_*` and every round stay in the record."""
    lat = [x for r in rounds for x in r["latencies_ms"]]
    return {"p50_ms": median([r["p50_ms"] for r in rounds]), "p99_ms": median([r["p99_ms"] for r in rounds]),
            "pooled_p50_ms": percentile(lat, 0.50), "pooled_p99_ms": percentile(lat, 0.99),
            "max_ms": max(lat, default=0.0), "requests": len(lat), "errors": sum(r["errors"] for r in rounds)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return _client_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (open loop)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per server per round")
    parser.add_argument("--jobs", type=int, default=500, help="jobs in the cache")
    parser.add_argument("--rounds", type=int, default=3, help="ours then the peer, per round")
    parser.add_argument("--clients", type=int, default=1, help="load processes (1: this one)")
    parser.add_argument("--connections", type=int, default=32, help="HTTP connection pool size, all clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = min(args.duration, 3.0), 1
    count = int(args.rate * (args.duration + WARMUP_S))
    urls = workload(count, args.jobs, args.seed)
    kinds = ["ours"] + ([] if args.no_peer else ["peer"])
    load_before = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="api-latency-") as tmp:
        workdir = Path(tmp)
        (workdir / "tokens.csv").write_text(f"{TOKEN},bench,bench-uid\n")
        (workdir / "urls.json").write_text(json.dumps(urls))
        for r in range(args.rounds):
            for kind in kinds:
                stats = run_server(kind, args.jobs, args.seed, urls, args.rate, args.clients, args.connections,
                                   workdir)
                rounds[kind].append(stats)
                print(f"round {r + 1} {kind:4}: p50 {stats['p50_ms']:.1f} ms  p99 {stats['p99_ms']:.1f} ms  "
                      f"max {stats['max_ms']:.1f} ms  {stats['requests']} requests  {stats['errors']} errors  "
                      f"send late p99 {stats['send_late_p99_ms']:.1f} ms  server cpu "
                      f"{stats['server_cpu_ms_per_request'] or float('nan'):.2f} ms/req, client cpu "
                      f"{stats['client_cpu_ms_per_request']:.2f} ms/req, load {stats['load_average_1m'][0]:.1f}",
                      flush=True)
                for sample in stats["error_samples"][:5]:
                    print(f"  error: {sample}")
    ours = _summary(rounds["ours"])
    peer = _summary(rounds["peer"]) if "peer" in rounds else None
    for rs in rounds.values():
        for s in rs:
            del s["latencies_ms"]
    passed = ours["p99_ms"] <= GOAL_MS and ours["errors"] == 0
    path = write_result(
        "api_latency", metric=f"p99 latency at {args.rate:g} req/s mixed reads, {args.jobs} jobs (median round)",
        value=ours["p99_ms"],
        unit="ms", peer="bare FastAPI/uvicorn replaying the same bytes (framework floor)",
        peer_value=peer["p99_ms"] if peer else float("nan"), goal=f"p99 <= {GOAL_MS:g} ms, 0 errors",
        passed=passed, quick=args.quick,
        runs={"ours": ours, "peer": peer, "rounds": rounds, "load_average_before": load_before,
              "config": {"rate": args.rate, "duration_s": args.duration, "jobs": args.jobs, "rounds": args.rounds,
                         "clients": args.clients, "connections": args.connections, "seed": args.seed,
                         "warmup_s": WARMUP_S, "requests_per_round": count}})
    print(f"ours: p50 {ours['p50_ms']:.1f} ms, p99 {ours['p99_ms']:.1f} ms, max {ours['max_ms']:.1f} ms, "
          f"{ours['errors']} errors" + (f"; peer p50 {peer['p50_ms']:.1f} ms, p99 {peer['p99_ms']:.1f} ms"
                                        if peer else "") + f" -> {'PASS' if passed else 'FAIL'}; wrote {path}")
    return 1 if ours["errors"] else 0  # the numbers are judged from the record; a failed request is a bug


if __name__ == "__main__":
    sys.exit(main())
