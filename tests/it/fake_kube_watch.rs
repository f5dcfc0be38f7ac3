//! The fake API server's pod LIST and WATCH (harness/src/fake_kube.rs),
//! spoken to raw over HTTPS as kube-apiserver 1.28 answers them.

use picket_harness::fake_kube;

use std::time::{Duration, Instant};

use fake_kube::{DEFAULT_TOKEN, EVENT_LOG_LEN, FakeKind, FakeKube};
use serde_json::{Value, json};

const NS: &str = "cache";
/// The longest any single wait in these tests may take.
const WAIT: Duration = Duration::from_secs(5);

fn http(fake: &FakeKube) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(fake.ca_pem().as_bytes()).unwrap())
        .no_proxy()
        .build()
        .unwrap()
}

fn pods_url(fake: &FakeKube, query: &str) -> String {
    format!("{}/api/v1/namespaces/{NS}/pods?{query}", fake.url())
}

/// A pod LIST: (its resourceVersion, the names listed).
async fn list(fake: &FakeKube, selector: &str) -> (u64, Vec<String>) {
    let r = http(fake)
        .get(pods_url(fake, &format!("labelSelector={selector}")))
        .bearer_auth(DEFAULT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["kind"], "PodList");
    let names = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let rv = v["metadata"]["resourceVersion"].as_str().unwrap();
    (rv.parse().unwrap(), names)
}

/// An open watch, read line by line.
struct Watch {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Watch {
    async fn open(fake: &FakeKube, query: &str) -> Watch {
        let resp = tokio::time::timeout(
            WAIT,
            http(fake)
                .get(pods_url(fake, query))
                .bearer_auth(DEFAULT_TOKEN)
                .send(),
        )
        .await
        .expect("watch not answered")
        .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert_eq!(resp.headers()["transfer-encoding"], "chunked");
        Watch {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next event, `None` once the body has ended cleanly (a cut
    /// connection fails the test); fails the test after [`WAIT`].
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line[..i]).expect("an event is JSON"));
            }
            let chunk = tokio::time::timeout(WAIT, self.resp.chunk())
                .await
                .expect("no event in time")
                .expect("the stream broke");
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c),
                None => {
                    assert!(self.buf.is_empty(), "a partial line at the end");
                    return None;
                }
            }
        }
    }

    /// The next event that is not a BOOKMARK.
    async fn next_change(&mut self) -> Value {
        loop {
            let ev = self.next().await.expect("the stream ended");
            if ev["type"] != "BOOKMARK" {
                return ev;
            }
        }
    }

    /// Every event until the end of the stream.
    async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(ev) = self.next().await {
            out.push(ev);
        }
        out
    }
}

fn rv_of(ev: &Value) -> u64 {
    ev["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn name_of(ev: &Value) -> &str {
    ev["object"]["metadata"]["name"].as_str().unwrap()
}

async fn patch_labels(fake: &FakeKube, name: &str, labels: Value) {
    let r = http(fake)
        .patch(format!("{}/api/v1/namespaces/{NS}/pods/{name}", fake.url()))
        .bearer_auth(DEFAULT_TOKEN)
        .header("content-type", "application/merge-patch+json")
        .body(json!({"metadata": {"labels": labels}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn watch_from_the_lists_revision_sees_every_change_in_order() {
    let fake = FakeKube::start().await;
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    fake.add_pod(NS, "web-0", "10.0.0.9", &[("app", "web")]);
    // The controller's slice writes share the revision but are no pod events.
    fake.add_service(NS, "cache", &[("app", "cache")], 6379);

    let (rv, names) = list(&fake, "app%3Dcache").await;
    assert_eq!(names, ["cache-0"]);
    assert_eq!(rv, fake.revision());
    let mut w = Watch::open(
        &fake,
        &format!("watch=1&labelSelector=app%3Dcache&resourceVersion={rv}"),
    )
    .await;

    fake.add_pod(NS, "cache-1", "10.0.0.2", &[("app", "cache")]);
    let ev = w.next_change().await;
    assert_eq!(
        (ev["type"].as_str(), name_of(&ev)),
        (Some("ADDED"), "cache-1")
    );
    assert_eq!(ev["object"]["kind"], "Pod");
    assert_eq!(ev["object"]["apiVersion"], "v1");
    assert_eq!(ev["object"]["status"]["podIP"], "10.0.0.2");
    let mut last = rv_of(&ev);
    assert!(last > rv);
    let mut step = |ev: &Value, t: &str, name: &str| {
        assert_eq!((ev["type"].as_str(), name_of(ev)), (Some(t), name), "{ev}");
        assert!(rv_of(ev) > last, "revisions go up: {ev}");
        last = rv_of(ev);
    };

    fake.set_pod_ready(NS, "cache-1", false);
    let ev = w.next_change().await;
    step(&ev, "MODIFIED", "cache-1");
    assert_eq!(ev["object"]["status"]["conditions"][0]["status"], "False");

    fake.set_pod_ip(NS, "cache-1", "10.0.0.3");
    let ev = w.next_change().await;
    step(&ev, "MODIFIED", "cache-1");
    assert_eq!(ev["object"]["status"]["podIP"], "10.0.0.3");
    assert_eq!(
        ev["object"]["status"]["podIPs"],
        json!([{"ip": "10.0.0.3"}])
    );

    // Changes outside the selector are not sent; into it is ADDED, out of
    // it DELETED with the new object.
    fake.set_pod_ready(NS, "web-0", false);
    patch_labels(&fake, "web-0", json!({"app": "cache"})).await;
    let ev = w.next_change().await;
    step(&ev, "ADDED", "web-0");
    patch_labels(&fake, "cache-1", json!({"app": "gone"})).await;
    let ev = w.next_change().await;
    step(&ev, "DELETED", "cache-1");
    assert_eq!(ev["object"]["metadata"]["labels"]["app"], "gone");

    fake.mark_pod_deleting(NS, "cache-0", 30);
    let ev = w.next_change().await;
    step(&ev, "MODIFIED", "cache-0");
    let stamp = ev["object"]["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap();
    assert!(
        stamp.len() == 20 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
        "{stamp}"
    );
    assert_eq!(ev["object"]["metadata"]["deletionGracePeriodSeconds"], 30);

    let gone = fake.delete_pod(NS, "cache-0").unwrap();
    assert!(fake.object(FakeKind::Pod, NS, "cache-0").is_none());
    let ev = w.next_change().await;
    step(&ev, "DELETED", "cache-0");
    assert_eq!(ev["object"], gone);
    // The deletion has its own revision (the controller may have written since).
    assert!(rv_of(&ev) <= fake.revision());
    assert!(fake.delete_pod(NS, "cache-0").is_none());

    // DELETE over HTTP: 200 with the object, then a DELETED event.
    let r = http(&fake)
        .delete(format!("{}/api/v1/namespaces/{NS}/pods/web-0", fake.url()))
        .bearer_auth(DEFAULT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["metadata"]["name"], "web-0");
    let ev = w.next_change().await;
    step(&ev, "DELETED", "web-0");
    assert_eq!(ev["object"], body);
    let r = http(&fake)
        .delete(format!("{}/api/v1/namespaces/{NS}/pods/web-0", fake.url()))
        .bearer_auth(DEFAULT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // The controller followed the pods through the same log; EndpointSlice
    // GETs still work.
    let r = http(&fake)
        .get(format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/cache-ctrl",
            fake.url()
        ))
        .bearer_auth(DEFAULT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    assert_eq!(fake.pod_lists().len(), 1);
    let watches = fake.pod_watches();
    assert_eq!(watches.len(), 1);
    assert_eq!(watches[0].status, 200);
    assert!(watches[0].is_watch());
    assert_eq!(fake.open_watches(), 1);
    drop(w);
    let deadline = Instant::now() + WAIT;
    // The fake notices the client leaving at once (no event needed).
    while fake.open_watches() != 0 {
        assert!(Instant::now() < deadline, "the watch stayed open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn watch_without_a_revision_starts_with_what_exists() {
    let fake = FakeKube::start().await;
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    fake.add_pod(NS, "cache-1", "10.0.0.2", &[("app", "cache")]);
    fake.add_pod(NS, "web-0", "10.0.0.9", &[("app", "web")]);
    fake.add_pod("elsewhere", "cache-9", "10.0.0.8", &[("app", "cache")]);
    for query in [
        "watch=true&labelSelector=app%3Dcache",
        "watch=1&labelSelector=app%3Dcache&resourceVersion=0",
    ] {
        let mut w = Watch::open(&fake, query).await;
        let a = w.next_change().await;
        let b = w.next_change().await;
        assert_eq!(
            [(&a["type"], name_of(&a)), (&b["type"], name_of(&b))],
            [(&json!("ADDED"), "cache-0"), (&json!("ADDED"), "cache-1")],
            "{query}"
        );
        fake.set_pod_ready(NS, "cache-0", true);
        let ev = w.next_change().await;
        assert_eq!(
            (ev["type"].as_str(), name_of(&ev)),
            (Some("MODIFIED"), "cache-0")
        );
        assert_eq!(rv_of(&ev), fake.revision());
    }
    // Without a selector: every pod of the namespace.
    let mut w = Watch::open(&fake, "watch=1").await;
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(name_of(&w.next_change().await).to_string());
    }
    assert_eq!(names, ["cache-0", "cache-1", "web-0"]);
}

#[tokio::test]
async fn bookmarks_only_when_allowed_with_the_revision() {
    let fake = FakeKube::start().await;
    fake.set_bookmark_period(Duration::from_millis(100));
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    let (rv, _) = list(&fake, "app%3Dcache").await;
    let q =
        format!("watch=1&labelSelector=app%3Dcache&resourceVersion={rv}&allowWatchBookmarks=true");
    let mut w = Watch::open(&fake, &q).await;
    let bm = w.next().await.unwrap();
    assert_eq!(
        bm,
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"resourceVersion": rv.to_string()}}})
    );
    // A write outside the selector moves the bookmarks on too (the
    // revision is the store's).
    fake.add_pod(NS, "web-0", "10.0.0.9", &[("app", "web")]);
    fake.add_pod(NS, "cache-1", "10.0.0.2", &[("app", "cache")]);
    let added = w.next_change().await;
    assert_eq!(name_of(&added), "cache-1");
    let bm = w.next().await.unwrap();
    assert_eq!(bm["type"], "BOOKMARK");
    assert_eq!(rv_of(&bm), rv + 2);
    let bm2 = w.next().await.unwrap();
    assert_eq!(bm2["type"], "BOOKMARK");
    assert_eq!(rv_of(&bm2), rv + 2);

    // Not allowed: none, in a second of watching.
    let mut w = Watch::open(
        &fake,
        &format!("watch=1&resourceVersion={rv}&timeoutSeconds=1"),
    )
    .await;
    let events = w.rest().await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| e["type"] == "ADDED"), "{events:?}");
}

#[tokio::test]
async fn watch_from_a_compacted_revision_gets_410_and_ends() {
    let fake = FakeKube::start().await;
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    let (old, _) = list(&fake, "app%3Dcache").await;
    let mut open = Watch::open(&fake, &format!("watch=1&resourceVersion={old}")).await;
    fake.set_pod_ready(NS, "cache-0", false);
    fake.compact();
    let now = fake.revision();
    assert_eq!(fake.log_start_rv(), now);

    let mut w = Watch::open(&fake, &format!("watch=1&resourceVersion={old}")).await;
    assert_eq!(
        w.next().await.unwrap(),
        json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {old} ({now})"),
            "reason": "Expired", "code": 410,
        }})
    );
    assert_eq!(w.next().await, None, "the stream ends after the ERROR");
    assert_eq!(fake.pod_watches()[1].status, 200);

    // From the current revision: fine. An open watch is not affected.
    let mut fresh = Watch::open(&fake, &format!("watch=1&resourceVersion={now}")).await;
    fake.set_pod_ready(NS, "cache-0", true);
    let ev = fresh.next_change().await;
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(open.next_change().await["type"], "MODIFIED");
    assert_eq!(open.next_change().await, ev);
    drop((open, fresh));

    // The log keeps the last EVENT_LOG_LEN events.
    let start = fake.revision();
    for i in 0..=EVENT_LOG_LEN {
        fake.set_pod_ready(NS, "cache-0", i % 2 == 0);
    }
    assert_eq!(fake.log_start_rv(), start + 1);
    let mut w = Watch::open(&fake, &format!("watch=1&resourceVersion={start}")).await;
    assert_eq!(w.next().await.unwrap()["object"]["code"], 410);
    let mut w = Watch::open(&fake, &format!("watch=1&resourceVersion={}", start + 1)).await;
    let first = w.next().await.unwrap();
    assert_eq!(first["type"], "MODIFIED");
    assert_eq!(rv_of(&first), start + 2);
}

#[tokio::test]
async fn watch_ends_after_timeout_seconds_and_when_down() {
    let fake = FakeKube::start().await;
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    let t0 = Instant::now();
    let mut w = Watch::open(&fake, "watch=1&timeoutSeconds=1").await;
    let events = w.rest().await;
    let took = t0.elapsed();
    assert_eq!(events.len(), 1);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(fake.open_watches(), 0);

    let (rv, _) = list(&fake, "").await;
    let mut w = Watch::open(
        &fake,
        &format!("watch=1&resourceVersion={rv}&allowWatchBookmarks=1"),
    )
    .await;
    assert_eq!(w.next().await.unwrap()["type"], "BOOKMARK");
    fake.set_down(true);
    assert_eq!(
        w.rest().await,
        Vec::<Value>::new(),
        "ends cleanly when down"
    );

    let fake = FakeKube::start().await;
    let mut w = Watch::open(&fake, "watch=1&resourceVersion=1").await;
    drop(fake);
    assert_eq!(
        w.next().await,
        None,
        "ends cleanly when the fake is dropped"
    );
}

#[tokio::test]
async fn watch_requests_meet_auth_and_faults() {
    let fake = FakeKube::start().await;
    let get = |query: &str, token: Option<&str>| {
        let mut r = http(&fake).get(pods_url(&fake, query));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let code = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(code(get("watch=1", None).await.unwrap()), 401);
    assert_eq!(code(get("watch=1", Some("wrong")).await.unwrap()), 401);
    fake.fail_next(1, 503);
    assert_eq!(
        code(get("watch=1", Some(DEFAULT_TOKEN)).await.unwrap()),
        503
    );
    fake.throttle_next(1, 2);
    let r = get("watch=1", Some(DEFAULT_TOKEN)).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let r = get("watch=1&labelSelector=app%3D(x", Some(DEFAULT_TOKEN))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = get("watch=1&resourceVersion=abc", Some(DEFAULT_TOKEN))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // `watch=false` is a LIST; resourceVersion and resourceVersionMatch
    // are taken (the answer is the consistent read).
    let r = get("watch=false", Some(DEFAULT_TOKEN)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["kind"], "PodList");
    fake.add_pod(NS, "cache-0", "10.0.0.1", &[("app", "cache")]);
    let q = "resourceVersion=1&resourceVersionMatch=NotOlderThan";
    let list: Value = get(q, Some(DEFAULT_TOKEN))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        list["metadata"]["resourceVersion"],
        fake.revision().to_string()
    );
    assert_eq!(list["items"][0]["metadata"]["name"], "cache-0");

    let statuses: Vec<u16> = fake.pod_watches().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [401, 401, 503, 429, 400, 400]);
    assert_eq!(fake.pod_lists().len(), 2);
    assert_eq!(fake.open_watches(), 0);
}
