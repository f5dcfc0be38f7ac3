#!/usr/bin/env python3
"""Write the seed corpora under fuzz/corpus/<target>/ from the project's own
examples: INFO texts in src/probe/testdata, ROLE replies of the unit tests,
configs from config/picket.toml, tests/it/config.rs and the bad configs
of tests/it/config/bad, kubeconfigs from the kubeconfig unit tests, and
Kubernetes objects shaped like harness/src/fake_kube.rs answers. Run from
the repository root; it rewrites only the seed_* files."""
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def path(*p):
    return os.path.join(ROOT, *p)


def resp(*args):
    """A command as an array of bulk strings."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def write(target, name, data):
    d = path("fuzz", "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def raw_strings(file):
    with open(path(file)) as f:
        return re.findall(r'r#"(.*?)"#', f.read(), re.S)


info = {}
for n in sorted(os.listdir(path("src", "probe", "testdata"))):
    with open(path("src", "probe", "testdata", n), "rb") as f:
        info[n[:-4]] = f.read()

ROLE = {
    "role_redis_master": b"*3\r\n$6\r\nmaster\r\n:3129659\r\n*2\r\n*3\r\n$9\r\n127.0.0.1\r\n$4\r\n9001\r\n$7\r\n3129242\r\n*3\r\n$9\r\n127.0.0.1\r\n$4\r\n9002\r\n$7\r\n3129543\r\n",
    "role_dragonfly_master": b"*2\r\n$6\r\nmaster\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n$5\r\n16380\r\n$11\r\nstable_sync\r\n",
    "role_redis_replica": b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.2\r\n:7380\r\n$9\r\nconnected\r\n:104\r\n",
    "role_dragonfly_replica": b"*4\r\n$7\r\nreplica\r\n$4\r\nhost\r\n$4\r\n9999\r\n$9\r\nfull_sync\r\n",
    "role_sentinel": b"*2\r\n$8\r\nsentinel\r\n*2\r\n$5\r\ncache\r\n$8\r\nsessions\r\n",
    "role_error": b"-NOAUTH Authentication required.\r\n",
}

# resp_decode: 3 header bytes (cap selector, chunk seed), then the stream.
HDR = b"\xff\x12\x34"
write("resp_decode", "command", HDR + resp("PING") + resp("SET", "a key", ""))
write("resp_decode", "simple_error_int_null", HDR + b"+OK\r\n-ERR no\r\n:42\r\n$-1\r\n*-1\r\n*0\r\n")
write("resp_decode", "nested", HDR + b"*2\r\n*2\r\n:1\r\n*1\r\n$1\r\nx\r\n+y\r\n")
write("resp_decode", "huge_prefix", b"\x00\x01\x02$1000000000\r\nxxxxxxxxxxxxxxxx")
write("resp_decode", "over_cap", b"\x00\x05\x06" + bulk(b"y" * 40))
write("resp_decode", "garbage", HDR + b"!!not resp\r\n")
write("resp_decode", "info_bulk", HDR + bulk(info["valkey8_replica"]))
for k, v in ROLE.items():
    write("resp_decode", k, HDR + v)

# api_dispatch: byte 0 % 4 picks the listener (0 open, 1 password "fuzzpw",
# 2 TLS with users, 3 the TLS port without a handshake).
hello = json.dumps({"id": "peer", "addr": "127.0.0.1:1", "current_epoch": 3,
                    "groups": [{"name": "cache", "master": "127.0.0.1:2",
                                "config_epoch": 2, "sdown": False}]})
API = {
    "ping": b"\x00" + resp("PING") + resp("PING", "hi"),
    "hello3_sentinel": b"\x00" + resp("HELLO", "3") + resp("SENTINEL", "get-master-addr-by-name", "cache")
    + resp("SENTINEL", "MYID") + resp("ROLE") + resp("QUIT"),
    "auth": b"\x01" + resp("PING") + resp("AUTH", "fuzzpw") + resp("PING"),
    "hello_auth": b"\x01" + resp("HELLO", "3", "AUTH", "default", "fuzzpw", "SETNAME", "x") + resp("ROLE"),
    "is_down": b"\x00" + resp("PICKET", "IS-DOWN", "cache", "127.0.0.1:2", "0", "0", "*")
    + resp("PICKET", "IS-DOWN", "cache", "127.0.0.1:2", "0", "1", "peer", "127.0.0.1:3"),
    "picket_hello": b"\x00" + resp("PICKET", "HELLO", hello),
    "reset": b"\x00" + resp("SENTINEL", "RESET", "c*"),
    "failover": b"\x00" + resp("SENTINEL", "FAILOVER", "cache") + resp("PICKET", "FAILOVER", "cache", "127.0.0.1:3"),
    "unknown": b"\x00" + resp("FLUSHALL", "a", "b", "c", "d") + b"*0\r\n" + b"*1\r\n:5\r\n",
    "protocol_error": b"\x00" + resp("PING") + b"!junk\r\n",
    "inline": b"\x00PING\r\n",
    "tls_client": b"\x02" + resp("AUTH", "fuzzpw") + resp("SENTINEL", "MASTERS")
    + resp("SENTINEL", "FAILOVER", "cache") + resp("CLIENT", "KILL", "TYPE", "normal"),
    "tls_operator": b"\x02" + resp("HELLO", "3", "AUTH", "ops", "opspw") + resp("SENTINEL", "RESET", "*")
    + resp("PICKET", "IS-DOWN", "cache", "127.0.0.1:2", "0", "1", "ops"),
    "tls_peer": b"\x02" + resp("AUTH", "peer", "peerpw") + resp("PICKET", "HELLO", hello)
    + resp("AUTH", "peer", "wrong") + resp("SENTINEL", "MYID"),
    "tls_no_handshake": b"\x03" + resp("PING"),
}
for k, v in API.items():
    write("api_dispatch", k, v)

# reply_encode: a recipe (kind byte, child count, then contents).
write("reply_encode", "map", b"\x07\x02\x00\x04name\x03\x01g\x02\x00\x01\x02\x03\x04\x05\x06\x07\x08")
write("reply_encode", "nested", b"\x06\x03\x08\x02\x04\x05\x09\x05a\r\nb\x01\x03\x06ERR x\n")
write("reply_encode", "texts", b"\x00\x00\x05OK\r\n\x00")

# peer_messages: NUL-separated IS-DOWN arguments, hello JSON, frames, addresses.
write("peer_messages", "is_down_args", b"cache\x00127.0.0.1:6379\x007\x008\x00*")
write("peer_messages", "is_down_vote", b"cache\x00[::1]:6379\x007\x008\x00picket-b\x00127.0.0.2:6380")
write("peer_messages", "hello", hello)
write("peer_messages", "is_down_reply", b"*3\r\n:1\r\n$8\r\npicket-a\r\n:12\r\n")
write("peer_messages", "epoch", b":42\r\n")
write("peer_messages", "addr_v6", b"[fd00::1]:26379")

# info_parse: INFO texts and ROLE replies.
for k, v in info.items():
    write("info_parse", k, v)
for k, v in ROLE.items():
    write("info_parse", k, v)

# config_parse: the first line is the path.
with open(path("config", "picket.toml")) as f:
    write("config_parse", "example", "/etc/picket/picket.toml\n" + f.read())
configs = [t for t in raw_strings(os.path.join("tests", "it", "config.rs")) if "[" in t]
bad = path("tests", "it", "config", "bad")
for n in sorted(os.listdir(bad)):
    with open(os.path.join(bad, n)) as f:
        configs.append(f.read())
for i, t in enumerate(configs):
    write("config_parse", "tests_config_%02d" % i, "picket.toml\n" + t)

# kube_json: API objects and answers, exec credentials, kubeconfigs.
pod = {"kind": "Pod", "apiVersion": "v1",
       "metadata": {"name": "cache-0", "namespace": "db", "resourceVersion": "17", "uid": "uid-cache-0",
                    "labels": {"app": "cache", "role": "master"},
                    "annotations": {"picket.io/epoch": "7"}},
       "spec": {"containers": [{"name": "server", "ports": [{"containerPort": 6379}]}]},
       "status": {"phase": "Running", "podIP": "10.0.0.1"}}
pod2 = json.loads(json.dumps(pod))
pod2["metadata"]["name"] = "cache-1"
pod2["metadata"]["labels"]["role"] = "replica"
slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
          "metadata": {"name": "cache-picket", "namespace": "db", "resourceVersion": "9",
                       "labels": {"kubernetes.io/service-name": "cache",
                                  "endpointslice.kubernetes.io/managed-by": "picket.io"},
                       "annotations": {"picket.io/epoch": "3"}},
          "addressType": "IPv4",
          "ports": [{"name": "redis", "port": 6379, "protocol": "TCP"}],
          "endpoints": [{"addresses": ["10.0.0.1"],
                         "conditions": {"ready": True, "serving": True, "terminating": False}}]}
write("kube_json", "pod", json.dumps(pod))
write("kube_json", "pod_list", json.dumps({"kind": "PodList", "apiVersion": "v1",
                                           "metadata": {"resourceVersion": "20"}, "items": [pod, pod2]}))
write("kube_json", "endpointslice", json.dumps(slice_))
write("kube_json", "status_conflict", json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                   "status": "Failure", "message": "the object has been modified",
                                                   "reason": "Conflict", "code": 409}))
write("kube_json", "exec_credential", json.dumps({"apiVersion": "client.authentication.k8s.io/v1",
                                                   "kind": "ExecCredential",
                                                   "status": {"token": "t0k3n",
                                                              "expirationTimestamp": "2030-01-02T05:04:05+02:00"}}))
write("kube_json", "exec_credential_cert", json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                        "kind": "ExecCredential",
                                                        "status": {"clientCertificateData": "-----BEGIN CERTIFICATE-----\n",
                                                                   "clientKeyData": "-----BEGIN PRIVATE KEY-----\n",
                                                                   "expirationTimestamp": "2030-01-02T03:04:05Z"}}))
kc = [t for t in raw_strings(os.path.join("src", "discovery", "kubernetes", "kubeconfig.rs")) if "clusters:" in t]
for i, t in enumerate(kc):
    write("kube_json", "kubeconfig_%02d" % i, t)
write("kube_json", "timestamp_offset", "2030-01-02T05:04:05+02:00")
