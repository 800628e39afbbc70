//! The serve soak's HTTP/1 client: one request with a deadline (an answer, or why there was
//! none), and a server-sent events reader for watch streams.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// How a request ended.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The server answered: its status and body (JSON, or `Null`).
    Status(u16, Value),
    /// No answer: the connection failed or was lost.
    Lost(String),
    /// No answer within the deadline; the request was dropped (the connection with it).
    TimedOut,
}

#[derive(Clone)]
pub(crate) struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    pub(crate) fn new() -> Http {
        Http {
            // Replicas die and come back on other ports: keep idle connections briefly.
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(2))
                .pool_max_idle_per_host(8)
                .build_http(),
        }
    }

    /// `method url` with `body`, within `deadline`.
    pub(crate) async fn call(&self, method: Method, url: &str, body: Option<Bytes>, deadline: Duration) -> Answer {
        let mut req = Request::builder().method(method).uri(url);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = match req.body(Full::new(body.unwrap_or_default())) {
            Ok(r) => r,
            Err(e) => return Answer::Lost(format!("bad request: {e}")),
        };
        let go = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{e:?}"))?;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.map_err(|e| format!("{e}"))?.to_bytes();
            Ok::<_, String>((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
        };
        match tokio::time::timeout(deadline, go).await {
            Ok(Ok((status, v))) => Answer::Status(status, v),
            Ok(Err(e)) => Answer::Lost(e),
            Err(_) => Answer::TimedOut,
        }
    }

    /// The body of `GET url` as text (empty when there is no answer).
    pub(crate) async fn text(&self, url: &str, deadline: Duration) -> String {
        let Ok(req) = Request::builder().uri(url).body(Full::new(Bytes::new())) else {
            return String::new();
        };
        let go = async {
            let resp = self.client.request(req).await.ok()?;
            let bytes = resp.into_body().collect().await.ok()?.to_bytes();
            Some(String::from_utf8_lossy(&bytes).into_owned())
        };
        tokio::time::timeout(deadline, go)
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Open a watch stream at `url`, resuming after `last_event_id`.
    pub(crate) async fn watch(
        &self,
        url: &str,
        last_event_id: Option<&str>,
        deadline: Duration,
    ) -> Result<Events, String> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(url)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let req = req.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(deadline, self.client.request(req))
            .await
            .map_err(|_| format!("no answer within {deadline:?}"))?
            .map_err(|e| format!("{e:?}"))?;
        if resp.status() != hyper::StatusCode::OK {
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(format!("{status} {}", String::from_utf8_lossy(&body)));
        }
        Ok(Events {
            body: resp.into_body(),
            buf: String::new(),
        })
    }
}

/// One server-sent event.
#[derive(Clone, Debug, Default)]
pub(crate) struct Event {
    pub(crate) event: String,
    pub(crate) id: String,
    pub(crate) data: Value,
}

/// A server-sent events stream.
pub(crate) struct Events {
    body: hyper::body::Incoming,
    buf: String,
}

impl Events {
    /// The next event (comments skipped); `None` when the stream ended.
    pub(crate) async fn next(&mut self) -> Result<Option<Event>, String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                if let Some(ev) = parse(&block) {
                    return Ok(Some(ev));
                }
                continue;
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                None => return Ok(None),
            }
        }
    }
}

/// One event block; `None` for a comment (keep-alive).
fn parse(block: &str) -> Option<Event> {
    let mut ev = Event::default();
    let mut data = String::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            ev.event = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("id:") {
            ev.id = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if ev.event.is_empty() && data.is_empty() {
        return None;
    }
    if ev.event.is_empty() {
        ev.event = "message".into();
    }
    ev.data = serde_json::from_str(&data).unwrap_or(Value::Null);
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_blocks_parse_and_comments_are_skipped() {
        let ev = parse("event: record\nid: abc\ndata: {\"id\":\"x\"}\n\n").unwrap();
        assert_eq!(
            (ev.event.as_str(), ev.id.as_str(), &ev.data["id"]),
            ("record", "abc", &Value::from("x"))
        );
        assert!(parse(":\n\n").is_none());
    }
}
