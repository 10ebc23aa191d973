#!/usr/bin/env python3
"""deploy/replicas on loopback: two offgraph replicas behind nginx with conversation affinity.

Asserts that every turn of a conversation reaches the replica holding it, with cached_tokens from
turn 2 on; that conversations spread over both replicas; that a session header pins too; that
killing one replica mid-run (requests in flight) loses nothing: each request is answered, the
dead replica's conversations continue on the other, recomputed; and that each replica keeps its
own /metrics. Usage: replicas_test.py OFFGRAPH_BINARY SOURCE_DIR WORK_DIR
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

OFFGRAPH, SOURCE, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)


def free_port_block(n):
    """A port p such that p..p+n are free now (the replicas take p+1..p+n)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n + 1):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    raise RuntimeError("no free block of ports")


def post(port, route, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", route, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read()
    # $upstream_addr lists every replica tried ("dead:port, live:port" after a retry): the last
    # one answered.
    replica = (r.getheader("X-Offgraph-Replica") or "").split(",")[-1].strip() or None
    return r.status, replica, json.loads(data) if data else None


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


def main():
    os.makedirs(WORK, exist_ok=True)
    model = os.path.join(WORK, "replica-model.gguf")
    subprocess.run([OFFGRAPH, "synth", "-o", model, "--preset", "tiny", "--embd", "64", "--head-dim", "16",
                    "--window", "16", "--seed", "5"], check=True, stdout=subprocess.DEVNULL)
    port = free_port_block(2)
    run_dir = os.path.join(WORK, "run")
    deploy = subprocess.Popen([os.path.join(SOURCE, "deploy", "replicas"), "-n", "2", "-p", str(port), "-m", model,
                               "--offgraph", OFFGRAPH, "--run-dir", run_dir, "--fail-timeout", "30", "--",
                               "--ctx", "2048", "--parallel", "4", "-t", "1", "--cache-seqs", "32"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = deploy.stdout.readline()
        if "ready" not in line:
            raise RuntimeError("deploy/replicas did not start: " + line + deploy.stdout.read())
        print(line.strip(), flush=True)
        replicas = {f"127.0.0.1:{port + 1}": port + 1, f"127.0.0.1:{port + 2}": port + 2}

        def turn(convo, text, headers=None, max_tokens=12):
            convo["messages"].append({"role": "user", "content": text})
            status, replica, body = post(port, "/v1/chat/completions",
                                         {"messages": convo["messages"], "max_tokens": max_tokens, "temperature": 0},
                                         headers)
            check(status == 200, f"{convo['name']}: status {status}: {body}")
            if status != 200:
                return None, 0
            convo["messages"].append(body["choices"][0]["message"])
            cached = body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            return replica, cached

        # Eight conversations, three turns each.
        convos = [dict(name=f"c{k}", messages=[{"role": "system", "content": f"You are assistant number {k}."}])
                  for k in range(8)]
        home = {}
        for t in range(3):
            for c in convos:
                replica, cached = turn(c, f"Turn {t}: tell me about river {c['name']}.")
                check(replica in replicas, f"{c['name']} turn {t}: no replica header ({replica})")
                if t == 0:
                    home[c["name"]] = replica
                else:
                    check(replica == home[c["name"]], f"{c['name']} turn {t} went to {replica}, not {home[c['name']]}")
                    check(cached > 20, f"{c['name']} turn {t}: cached_tokens {cached}")
        used = set(home.values())
        check(len(used) == 2, f"conversations all went to {used}")
        if len(used) != 2:  # why nginx took a replica out (seen once, under load from other tests)
            for name in ("error.log", "replica-1.log", "replica-2.log"):
                path = os.path.join(run_dir, name)
                if os.path.exists(path):
                    print(f"--- {name} (tail)\n" + open(path, errors="replace").read()[-2000:], flush=True)
        print("homes:", home, flush=True)

        # A session header pins, whatever the messages.
        session_home = None
        for k in range(3):
            s = dict(name=f"session{k}", messages=[])
            replica, _ = turn(s, f"unrelated opening {k}", {"X-Session-Id": "agent-42"})
            session_home = session_home or replica
            check(replica == session_home, f"session turn {k} went to {replica}, not {session_home}")
        # So do the agents' own session headers (Claude Code's, Codex's).
        for header in ("X-Claude-Code-Session-Id", "session-id"):
            pinned = None
            for k in range(3):
                s = dict(name=f"{header}{k}", messages=[])
                replica, _ = turn(s, f"another unrelated opening {k}", {header: "agent-7"})
                pinned = pinned or replica
                check(replica == pinned, f"{header} turn {k} went to {replica}, not {pinned}")

        # The Responses API's prompt_cache_key pins too, whatever the input.
        pinned = None
        for k in range(3):
            status, replica, body = post(port, "/v1/responses",
                                         {"input": f"yet another opening {k}", "max_output_tokens": 4,
                                          "temperature": 0, "store": False, "prompt_cache_key": "thread-9"})
            check(status == 200, f"responses {k}: status {status}: {body}")
            pinned = pinned or replica
            check(replica == pinned, f"prompt_cache_key turn {k} went to {replica}, not {pinned}")

        # Each replica's own /metrics counts its own requests.
        for addr, p in replicas.items():
            n = sum(1 for h in home.values() if h == addr)
            check(metric(p, "offgraph_requests_total") >= 3 * n,
                  f"{addr}: {metric(p, 'offgraph_requests_total')} requests for {n} conversations")

        # Kill the replica holding c0 while every conversation has a long turn in flight (400 tokens:
        # about a second here, and the kill comes after 0.2 s).
        victim = home["c0"]
        pid = int(open(os.path.join(run_dir, f"replica-{replicas[victim] - port}.pid")).read())
        results = {}

        finished = {}

        def run(c):
            results[c["name"]] = turn(c, "Turn 3: and after the flood?", max_tokens=400)
            finished[c["name"]] = time.time()

        threads = [threading.Thread(target=run, args=(c,)) for c in convos]
        for th in threads:
            th.start()
        time.sleep(0.2)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        for th in threads:
            th.join()
        survivor = next(a for a in replicas if a != victim)
        for c in convos:
            replica, _ = results[c["name"]]
            check(replica is not None, f"{c['name']}: turn 3 was lost")
            # Cut off mid-answer on the dead replica, computed again on the survivor (unless the
            # answer was whole before the kill: an early end of text).
            if home[c["name"]] == victim and finished[c["name"]] > killed_at:
                check(replica == survivor, f"{c['name']}: turn 3 answered by {replica}, not the survivor")
        # Then the dead replica's conversations continue on the survivor.
        for c in convos:
            replica, cached = turn(c, "Turn 4: and then?")
            check(replica == survivor, f"{c['name']} turn 4 went to {replica}, not the survivor {survivor}")
            if home[c["name"]] == survivor:
                check(cached > 20, f"{c['name']} (stayed home) turn 4: cached_tokens {cached}")
        check(deploy.poll() is None, "deploy/replicas exited when a replica died")
    finally:
        os.killpg(deploy.pid, signal.SIGTERM)
        try:
            deploy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(deploy.pid, signal.SIGKILL)
    if failures:
        print(f"{len(failures)} failures", flush=True)
        sys.exit(1)
    print("replicas: every check passed", flush=True)


if __name__ == "__main__":
    main()
