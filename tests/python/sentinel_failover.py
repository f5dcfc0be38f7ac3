#!/usr/bin/env python3
"""redis-py's Sentinel support against picket, across kill -9 failovers.

Driven by tests/it/api_redis_py.rs over stdin/stdout, one command per line:

  check <master ip:port> <replica ip:port,...>
      discover_master / discover_slaves through every protocol must give
      exactly these; answers "ok" or "fail <why>".
  round-start <n>
      reset the round's counters (the driver kills the master next).
  round-end <n> <old ip:port> <new ip:port>
      wait (bounded) until every writer wrote to the new master and every
      subscriber got "+switch-master <name> <old> <new>", exactly once
      (a second copy, or another payload, fails the round); answers
      "round {json}" with the write gap and the errors by kind, or
      "fail <why>".
  quit
      answers "summary {json}" and exits.

Writers: one redis-py client per protocol (RESP3, the default, and
protocol=2) from Sentinel.master_for(), writing a key every ~5 ms with no
hidden retries (every failure is counted, by exception class). The write
gap of a round is the longest time between two successful writes.

Subscribers: on every daemon and in both protocols, SUBSCRIBE
+switch-master through the Sentinel connection.

Usage: sentinel_failover.py --sentinels ip:port,ip:port --service NAME
"""

import argparse
import json
import sys
import threading
import time
from collections import Counter

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

PROTOCOLS = (3, 2)


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def fmt(a):
    return f"{a[0]}:{a[1]}"


def sentinel_for(sentinels, protocol):
    return Sentinel(
        sentinels,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        protocol=protocol,
        sentinel_kwargs={
            "socket_timeout": 0.5,
            "socket_connect_timeout": 0.5,
            "protocol": protocol,
        },
    )


class Writer(threading.Thread):
    def __init__(self, sentinels, service, protocol):
        super().__init__(daemon=True)
        self.protocol = protocol
        self.lock = threading.Lock()
        self.stop = False
        s = sentinel_for(sentinels, protocol)
        self.client = s.master_for(
            service,
            socket_timeout=0.5,
            socket_connect_timeout=0.3,
            protocol=protocol,
            retry=Retry(NoBackoff(), 0),
        )
        self.reset()
        self.total_ok = 0
        self.total_errors = Counter()

    def reset(self):
        with self.lock:
            self.errors = Counter()
            self.max_gap = 0.0
            self.gap_start = None
            self.last_ok = time.monotonic()
            self.ok = 0
            self.last_addr = None

    def run(self):
        i = 0
        while not self.stop:
            i += 1
            try:
                self.client.set(f"redis-py:{self.protocol}:{i % 1000}", i)
                now = time.monotonic()
                with self.lock:
                    gap = now - self.last_ok
                    if gap > self.max_gap:
                        self.max_gap = gap
                    self.last_ok = now
                    self.ok += 1
                    self.total_ok += 1
                time.sleep(0.005)
            except Exception as e:  # every failure is counted by kind
                with self.lock:
                    self.errors[type(e).__name__] += 1
                    self.total_errors[type(e).__name__] += 1
                time.sleep(0.01)

    def master_addr(self):
        """The master address the client's pool last connected to."""
        a = self.client.connection_pool.master_address
        return fmt(a) if a else None


class Subscriber(threading.Thread):
    def __init__(self, sentinel_addr, protocol):
        super().__init__(daemon=True)
        self.protocol = protocol
        self.sentinel_addr = sentinel_addr
        self.messages = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.error = None

    def run(self):
        try:
            r = redis.Redis(
                host=self.sentinel_addr[0],
                port=self.sentinel_addr[1],
                protocol=self.protocol,
                socket_timeout=None,
                socket_connect_timeout=1,
            )
            p = r.pubsub()
            p.subscribe("+switch-master")
            while True:
                m = p.get_message(timeout=1.0)
                if m is None:
                    continue
                if m["type"] == "subscribe":
                    self.ready.set()
                    continue
                if m["type"] == "message":
                    with self.lock:
                        self.messages.append(
                            (m["channel"].decode(), m["data"].decode())
                        )
        except Exception as e:
            self.error = repr(e)
            self.ready.set()


def check(sentinels, service, master, replicas):
    for proto in PROTOCOLS:
        s = sentinel_for(sentinels, proto)
        try:
            got = fmt(s.discover_master(service))
        except Exception as e:
            return f"protocol {proto}: discover_master: {e!r}"
        if got != master:
            return f"protocol {proto}: discover_master {got} != {master}"
        got_r = sorted(fmt(a) for a in s.discover_slaves(service))
        if got_r != sorted(replicas):
            return f"protocol {proto}: discover_slaves {got_r} != {sorted(replicas)}"
        # Every daemon answers alike.
        for one in sentinels:
            s1 = sentinel_for([one], proto)
            try:
                got = fmt(s1.discover_master(service))
            except Exception as e:
                return f"protocol {proto} on {fmt(one)}: {e!r}"
            if got != master:
                return f"protocol {proto} on {fmt(one)}: {got} != {master}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sentinels", required=True)
    ap.add_argument("--service", required=True)
    args = ap.parse_args()
    sentinels = [addr(a) for a in args.sentinels.split(",")]
    service = args.service

    subs = [Subscriber(a, p) for a in sentinels for p in PROTOCOLS]
    for s in subs:
        s.start()
    for s in subs:
        s.ready.wait(10)
        if s.error or not s.ready.is_set():
            print(f"fail subscriber {fmt(s.sentinel_addr)} RESP{s.protocol}: {s.error}", flush=True)
            return 1
    writers = [Writer(sentinels, service, p) for p in PROTOCOLS]
    for w in writers:
        w.start()
    print(f"ready redis-py {redis.__version__}", flush=True)

    rounds = []
    seen = {id(s): 0 for s in subs}
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd = parts[0]
        if cmd == "check":
            master = parts[1]
            replicas = parts[2].split(",") if len(parts) > 2 and parts[2] else []
            why = check(sentinels, service, master, replicas)
            print("ok" if why is None else f"fail {why}", flush=True)
        elif cmd == "round-start":
            for w in writers:
                w.reset()
            print("ok", flush=True)
        elif cmd == "round-end":
            n, old, new = int(parts[1]), parts[2], parts[3]
            want = f"{service} {old.replace(':', ' ')} {new.replace(':', ' ')}"
            deadline = time.monotonic() + 20
            why = None
            first_look = None
            while True:
                pending = []
                for w in writers:
                    if w.master_addr() != new or time.monotonic() - w.last_ok > 0.5:
                        pending.append(f"writer RESP{w.protocol} not writing to {new}")
                got = {}
                for s in subs:
                    with s.lock:
                        msgs = s.messages[seen[id(s)]:]
                    got[id(s)] = msgs
                delivered = [s for s in subs if any(m == ("+switch-master", want) for m in got[id(s)])]
                bad = [
                    (f"{fmt(s.sentinel_addr)} RESP{s.protocol}", m)
                    for s in subs
                    for m in got[id(s)]
                    if m[1] != want
                ]
                if bad:
                    why = f"unexpected +switch-master payloads {bad}, want {want!r}"
                    break
                twice = [
                    f"{fmt(s.sentinel_addr)} RESP{s.protocol}"
                    for s in subs
                    if len(got[id(s)]) > 1
                ]
                if twice:
                    why = f"+switch-master {want!r} received more than once by {twice}"
                    break
                # Every subscriber, not one per protocol: the round is
                # closed only once each has its message, so that a late one
                # is not counted in the next round (every daemon emits
                # +switch-master as it adopts the new master, and the
                # driver asks only once every daemon advertises it).
                late = [
                    f"{fmt(s.sentinel_addr)} RESP{s.protocol}"
                    for s in subs
                    if s not in delivered
                ]
                if late:
                    pending.append(f"+switch-master not yet received by {late}")
                # How many were still without it when one subscriber per
                # protocol had it and the writers had moved: the driver
                # used to close the round there, and a late one's message
                # then failed the next round as unexpected.
                per_proto = all(
                    any(s.protocol == p for s in delivered) for p in PROTOCOLS
                )
                writers_moved = not any(p.startswith("writer") for p in pending)
                if first_look is None and per_proto and writers_moved:
                    first_look = len(late)
                if not pending:
                    break
                if time.monotonic() > deadline:
                    why = "; ".join(pending)
                    break
                time.sleep(0.05)
            if why:
                print(f"fail {why}", flush=True)
                continue
            for s in subs:
                with s.lock:
                    seen[id(s)] = len(s.messages)
            r = {
                "round": n,
                "old": old,
                "new": new,
                "switch_master": want,
                "daemons_delivering": len({s.sentinel_addr for s in delivered}),
                "late_when_one_per_protocol_had_it": first_look,
                "writers": {
                    f"RESP{w.protocol}": {
                        "max_gap_ms": round(w.max_gap * 1000),
                        "errors": dict(w.errors),
                        "writes": w.ok,
                    }
                    for w in writers
                },
            }
            rounds.append(r)
            print("round " + json.dumps(r), flush=True)
        elif cmd == "quit":
            break
        else:
            print(f"fail unknown command {cmd}", flush=True)
    for w in writers:
        w.stop = True
    gaps = [w["max_gap_ms"] for r in rounds for w in r["writers"].values()]
    summary = {
        "rounds": len(rounds),
        "max_gap_ms": max(gaps) if gaps else None,
        "min_gap_ms": min(gaps) if gaps else None,
        "mean_gap_ms": round(sum(gaps) / len(gaps)) if gaps else None,
        "errors": {
            f"RESP{w.protocol}": dict(w.total_errors) for w in writers
        },
        "writes": {f"RESP{w.protocol}": w.total_ok for w in writers},
    }
    print("summary " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
