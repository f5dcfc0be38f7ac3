#!/usr/bin/env python3
"""redis-py's Sentinel client with ssl=True against picket daemons with TLS.

Driven by tests/it/tls.rs over stdin/stdout, one command per line:

  master
      answers "master <ip:port>" (Sentinel.discover_master through the
      TLS sentinel connections) or "error <why>".
  write <key>
      SET <key> 1 on the master found through master_for(); answers "ok"
      or "error <why>".
  quit

The data servers are plaintext: only the sentinel connections use TLS
(sentinel_kwargs), with a client certificate, AUTH <user> <password> and
certificate verification against --ca.

Usage: sentinel_tls.py --sentinels ip:port,... --service NAME --ca CA
       --cert CERT --key KEY --user USER --password PASSWORD
"""

import argparse
import sys

from redis.sentinel import Sentinel


def main():
    p = argparse.ArgumentParser()
    for a in ("--sentinels", "--service", "--ca", "--cert", "--key", "--user", "--password"):
        p.add_argument(a, required=True)
    args = p.parse_args()
    sentinels = []
    for s in args.sentinels.split(","):
        host, port = s.rsplit(":", 1)
        sentinels.append((host, int(port)))
    sentinel = Sentinel(
        sentinels,
        socket_timeout=1.0,
        sentinel_kwargs={
            "socket_timeout": 1.0,
            "socket_connect_timeout": 1.0,
            "ssl": True,
            "ssl_ca_certs": args.ca,
            "ssl_certfile": args.cert,
            "ssl_keyfile": args.key,
            "username": args.user,
            "password": args.password,
        },
    )
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "master":
                host, port = sentinel.discover_master(args.service)
                print(f"master {host}:{port}", flush=True)
            elif cmd[0] == "write":
                sentinel.master_for(args.service, socket_timeout=1.0).set(cmd[1], "1")
                print("ok", flush=True)
            elif cmd[0] == "quit":
                return
            else:
                print(f"error unknown command {cmd[0]}", flush=True)
        except Exception as e:  # every failure is an answer, never a hang
            print(f"error {type(e).__name__}: {e}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
