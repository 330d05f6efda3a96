//! rmcp's own streamable-HTTP client, carried in-process: every POST, GET and DELETE is an
//! `http::Request` handed to the axum `Router` as a `tower::Service`, and the answer (JSON or
//! an SSE stream) is read back exactly as the network client reads it. Nothing between the
//! client and the server is simulated but the socket, so the storm demo runs under tokio's
//! paused clock and is the same every time.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};
use tower::ServiceExt;

const SESSION: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

/// A failure of the in-process transport itself (a body that could not be read).
#[derive(Debug)]
pub(crate) struct TransportError(String);

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TransportError {}

type Error = StreamableHttpError<TransportError>;

/// The client side of an in-process connection to `router`.
#[derive(Clone)]
pub(crate) struct InProcess {
    router: Router,
    session: Arc<Mutex<Option<String>>>,
}

impl InProcess {
    /// A client that sends every request to `router`.
    pub(crate) fn new(router: Router) -> Self {
        InProcess {
            router,
            session: Arc::default(),
        }
    }

    /// The `Mcp-Session-Id` the server gave this client, once it has.
    pub(crate) fn session(&self) -> Option<String> {
        self.session.lock().unwrap().clone()
    }

    async fn send(
        &self,
        method: Method,
        uri: &str,
        session: Option<&str>,
        auth: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
        body: Body,
    ) -> Result<Response<Body>, Error> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "localhost")
            .header(header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"))
            .header(header::CONTENT_TYPE, JSON);
        if let Some(session) = session {
            req = req.header(SESSION, session);
        }
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, format!("Bearer {auth}"));
        }
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let req = req
            .body(body)
            .map_err(|e| StreamableHttpError::Client(TransportError(e.to_string())))?;
        let response = self.router.clone().oneshot(req).await;
        Ok(response.unwrap_or_else(|never| match never {}))
    }
}

fn content_type(response: &Response<Body>) -> &str {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn session_of(response: &Response<Body>) -> Option<String> {
    response
        .headers()
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn sse(body: Body) -> BoxStream<'static, Result<Sse, SseError>> {
    SseStream::new(body).boxed()
}

async fn unexpected(response: Response<Body>) -> Error {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!("HTTP {status}: {body}")))
}

impl StreamableHttpClient for InProcess {
    type Error = TransportError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let body = Body::from(serde_json::to_vec(&message)?);
        let response = self
            .send(
                Method::POST,
                &uri,
                session_id.as_deref(),
                auth_header,
                custom_headers,
                body,
            )
            .await?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = session_of(&response);
        if let Some(id) = &session {
            *self.session.lock().unwrap() = Some(id.clone());
        }
        let ct = content_type(&response);
        if status.is_success() && ct.starts_with(EVENT_STREAM) {
            return Ok(StreamableHttpPostResponse::Sse(
                sse(response.into_body()),
                session,
            ));
        }
        if ct.starts_with(JSON) {
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| StreamableHttpError::Client(TransportError(e.to_string())))?
                .to_bytes();
            let message: ServerJsonRpcMessage = serde_json::from_slice(&bytes)?;
            return Ok(StreamableHttpPostResponse::Json(message, session));
        }
        Err(unexpected(response).await)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let response = self
            .send(
                Method::DELETE,
                &uri,
                Some(&session_id),
                auth_header,
                custom_headers,
                Body::empty(),
            )
            .await?;
        if response.status().is_success() || response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        Err(unexpected(response).await)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        if let Some(id) = last_event_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
            custom_headers.insert(HeaderName::from_static(LAST_EVENT_ID), id);
        }
        let response = self
            .send(
                Method::GET,
                &uri,
                session_id.as_deref(),
                auth_header,
                custom_headers,
                Body::empty(),
            )
            .await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if response.status().is_success() && content_type(&response).starts_with(EVENT_STREAM) {
            return Ok(sse(response.into_body()));
        }
        Err(unexpected(response).await)
    }
}
