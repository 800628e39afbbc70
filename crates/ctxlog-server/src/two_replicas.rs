//! Two replicas of one store in this process, over HTTP on 127.0.0.1, whose views refresh
//! only when a request asks (no schedule decides what a test sees).

use std::time::Duration;

use bytes::Bytes;
use ctxlog::{StoreOptions, WriterId};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::{Running, ServeOptions};

const WITHIN: Duration = Duration::from_secs(30);

async fn replica(store: &str, writer: &str) -> Running {
    let mut options = ServeOptions::new(store, WriterId::new(writer).unwrap());
    options.listen = ([127, 0, 0, 1], 0).into();
    options.store_options = StoreOptions::default()
        .with_create_if_missing(true)
        .with_timeout(Duration::from_secs(10));
    let hour = Duration::from_secs(3600);
    (options.poll_min, options.idle_poll_max) = (hour, hour);
    crate::start(options).await.unwrap()
}

/// `method path` with `body` (JSON, or none for `Null`) to `at`: the status and the body.
async fn call(at: &Running, method: Method, path: &str, body: &Value) -> (StatusCode, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", at.addr()))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let answer = async {
        let response = client.request(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    };
    tokio::time::timeout(WITHIN, answer)
        .await
        .expect("an answer within the deadline")
}

fn records(prefix: &str, n: usize) -> Value {
    let records: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("{prefix}-{i}"), "role": "user", "text": "x"}))
        .collect();
    json!({ "records": records })
}

/// Rule 21 across replicas: records are appended through replica B, and a summary of B's
/// context view (its `covers` names B's shard at their seqs) is written through replica A,
/// whose view has not seen them. A must refresh its view before it checks what the summary
/// covers: taken, the summary governs the context view on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_of_another_replicas_records_waits_for_a_view_that_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let a = replica(&store, "replica-a").await;
    let b = replica(&store, "replica-b").await;
    let session = "/v1/bots/bot/sessions/c";
    // Whatever A's start asked of its view is done: from here A's view moves only when a
    // request through A asks it to.
    let (status, _) = call(&a, Method::GET, &format!("{session}/records"), &Value::Null).await;
    assert_eq!(status, StatusCode::OK);

    let (status, ack) = call(&b, Method::POST, &format!("{session}/records"), &records("r", 6)).await;
    assert_eq!(status, StatusCode::OK, "{ack}");
    let (status, view) = call(&b, Method::GET, &format!("{session}/context"), &Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["records"].as_array().map(Vec::len), Some(6), "{view}");
    let summary = json!({"records": [{"id": "sum", "role": "summary", "text": "six records",
                                      "kind": "summary", "covers": view["covers"]}]});
    let (status, answer) = call(&a, Method::POST, &format!("{session}/records"), &summary).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a summary of what replica B acknowledged ({ack}), written through A: {answer}"
    );

    for (name, replica) in [("A", &a), ("B", &b)] {
        let (status, view) = call(replica, Method::GET, &format!("{session}/context"), &Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(
            (
                view["summary"].clone(),
                view["covered"].clone(),
                view["records"][0]["id"].clone()
            ),
            (json!("sum"), json!(6), json!("sum")),
            "replica {name}'s context view: {view}"
        );
        assert_eq!(
            view["records"].as_array().map(Vec::len),
            Some(1),
            "replica {name}: {view}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}
